"""A simulated instance admits its waiting interactive requests in the ScalingPolicy's
`spec.instanceScheduling` order (SageServe v3 §6.5), and in arrival order by default.

Why: under FCFS an IW-F request queued behind IW-N work waits as long as they do and misses
its 1 s SLO; PF and EDF let it overtake, which is what Fig. 15 measures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sageserve.core.types import IW_F, IW_N, NIW, Request, Tier
from sageserve.dispatch.instance_order import InstanceScheduling, OrderPolicy
from sageserve.sim.instance import Instance, Job
from sageserve.sim.scenario import load_scenario, with_policy_settings
from tests.sim.helpers import flat_perf
from tests.sim.test_instance import Driver


def _run(policy: OrderPolicy | None, queued: list[tuple[Tier, float]]) -> list[float]:
    """One busy instance (a long prompt being prefilled from t = 0, one sequence at a
    time), then `queued` requests; their first-token times."""
    d = Driver()
    order = InstanceScheduling(policy) if policy is not None else None
    perf = flat_perf(prefill_s=1.0, decode_s=0.01)
    inst = Instance("i", perf, "r1", d, order=order)
    inst.max_seqs = 1  # one request at a time: the order alone decides who goes next
    inst.enqueue(Job(Request(0, 0.0, "m", IW_N, "r1", 100, 2), 0), 0.0)
    jobs = []
    for i, (tier, t) in enumerate(queued, start=1):
        job = Job(Request(i, t, "m", tier, "r1", 100, 2), 1 if tier is NIW else 0)
        inst.enqueue(job, t)
        jobs.append(job)
    d.run()
    return [j.first_token for j in jobs]


QUEUE = [(IW_N, 0.1), (IW_N, 0.2), (IW_F, 0.3)]


@pytest.mark.parametrize("policy", [None, OrderPolicy.FCFS])
def test_fcfs_serves_in_arrival_order(policy: OrderPolicy | None) -> None:
    n1, n2, f = _run(policy, QUEUE)
    assert n1 < n2 < f


@pytest.mark.parametrize("policy", [OrderPolicy.PF, OrderPolicy.EDF, OrderPolicy.DPA])
def test_iw_f_overtakes_queued_iw_n(policy: OrderPolicy) -> None:
    n1, n2, f = _run(policy, QUEUE)
    assert f < n1 < n2


def test_batch_stays_behind_interactive_under_every_order() -> None:
    for policy in OrderPolicy:
        b, n = _run(policy, [(NIW, 0.1), (IW_N, 0.2)])
        assert n < b, policy


def test_an_instance_without_an_order_keeps_no_order_object() -> None:
    """FCFS costs nothing: the instance holds no order and never sorts its queue."""
    inst = Instance("i", flat_perf(), "r1", Driver(), order=InstanceScheduling())
    assert inst.order is None


FIXTURE = Path(__file__).parent / "fixtures" / "tiny"


def test_the_scenarios_policy_sets_the_order_and_its_tiers_their_rank() -> None:
    """`sageserve simulate --set instanceScheduling.policy=dpa` reaches every instance; the
    tiers keep their declared priority (IW-F 0, IW-N 1) so PF and DPA tell them apart."""
    sc = load_scenario(FIXTURE)
    assert sc.sim_config().instance_scheduling.policy is OrderPolicy.FCFS
    assert (sc.tiers["iw-f"].priority, sc.tiers["iw-n"].priority) == (0, 1)
    dpa = with_policy_settings(
        sc, ["instanceScheduling.policy=dpa", "instanceScheduling.urgentWithinSeconds=5"]
    ).sim_config()
    assert dpa.instance_scheduling == InstanceScheduling(OrderPolicy.DPA, urgent_within_s=5.0)


def test_a_policy_the_api_server_would_refuse_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="instanceScheduling"):
        with_policy_settings(load_scenario(FIXTURE), ["instanceScheduling.policy=lifo"])
