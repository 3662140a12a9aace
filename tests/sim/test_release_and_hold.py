"""The simulator releases batch work and holds requests as the router does: a signal round
every second (and when a released batch request completes) with the router's EMU
estimate, at most 16 promotions a round, and requests for a model with nothing serving
held at most 120 s."""

from __future__ import annotations

from collections import Counter

from sageserve.core.types import IW_F, NIW, Request, Tier, TierKind
from sageserve.dispatch.queue_manager import PROMOTED_PER_SIGNAL, release_count
from sageserve.pace import make_strategy
from sageserve.sim.cluster import Delays, Endpoint
from sageserve.sim.engine import RunResult, Simulation
from sageserve.sim.instance import Job
from sageserve.sim.results import comparison_rows, policy_summary, summary
from tests.sim.helpers import config, flat_perf


class Recording(Simulation):
    """Records every dispatch: (time, region, tier, a trough release?)."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.sent: list[tuple[float, str, str, bool]] = []

    def _dispatch(self, job: Job, ep: Endpoint, t: float, check_scaling: bool) -> None:
        self.sent.append((t, ep.key.region, job.req.tier.name, check_scaling))
        super()._dispatch(job, ep, t, check_scaling)


def batch(n: int, tier: Tier = NIW, prompt: int = 1000, output: int = 2000) -> list[Request]:
    return [Request(i, i * 1e-3, "m", tier, "r1", prompt, output) for i in range(n)]


def test_a_batch_backlog_is_released_at_most_the_rules_count_per_endpoint_each_second() -> None:
    # 300 long batch requests at once on two idle endpoints: none completes in the first
    # 15 s, so only the 1-second signal rounds release, each by the endpoint's EMU
    perf = flat_perf(decode_s=0.01, kv=100_000)
    cfg = config(perf, regions=("r1", "r2"), initial=1, lo=1, hi=1, end_s=60.0, drain_s=0.0)
    sim = Recording(cfg, make_strategy("reactive"), batch(300, prompt=10_000))
    sim.run()
    early = [(t, r) for t, r, _tier, trough in sim.sent if trough and t < 15.0]
    per_second = Counter((int(t), r) for t, r in early)
    assert all(t == int(t) for t, _ in early)  # only at the rounds, every whole second
    assert max(per_second.values()) <= release_count(0.0)  # 2: the rule's most
    for region in ("r1", "r2"):
        seconds = sorted(s for s, r in per_second if r == region)
        assert seconds[:3] == [1, 2, 3]  # a round every second, not every pace tick
        # 10,000-token prompts on 100,000 tokens of KV: the endpoint stops taking work
        # once its EMU reaches 60 %, after a few rounds, not 2 a second for ever
        assert 4 <= sum(n for (_s, r), n in per_second.items() if r == region) <= 8


def test_at_most_16_requests_whose_slack_ran_out_are_promoted_a_round() -> None:
    due = Tier("NIW-due", TierKind.BATCH, deadline_s=20.0, priority=1)
    perf = flat_perf(decode_s=0.01, kv=100_000)
    # promoted at once: a 20 s deadline, 2,000 tokens at 100 tokens/s, no margin
    # (no trough release at all, so every request leaves by promotion)
    cfg = config(
        perf,
        initial=1,
        lo=1,
        hi=1,
        end_s=30.0,
        drain_s=0.0,
        promotion_margin_s=0.0,
        release_rules=(),
    )
    sim = Recording(cfg, make_strategy("reactive"), batch(50, due, prompt=100, output=2000))
    result = sim.run()
    promoted = sorted(Counter(t for t, _r, _tier, trough in sim.sent if not trough).items())
    assert [n for _t, n in promoted] == [PROMOTED_PER_SIGNAL] * 3 + [2]
    first = promoted[0][0]
    assert [t for t, _n in promoted] == [first, first + 1, first + 2, first + 3]
    assert result.batch_released["m"]["promoted"] == 50


def test_requests_held_longer_than_120_s_for_a_model_scaling_from_zero_are_refused() -> None:
    # nothing serving; the first request makes the endpoint scale from zero, and the
    # instance takes 300 s to come up: what waited more than 120 s by then was refused
    perf = flat_perf()
    delays = Delays(
        redeploy_s=300.0,
        remote_redeploy_s=300.0,
        reclaim_same_model_median_s=300.0,
        reclaim_same_model_max_s=300.0,
    )
    cfg = config(perf, initial=0, lo=0, hi=1, end_s=600.0, drain_s=600.0, delays=delays)
    reqs = [Request(i, 10.0 * i, "m", IW_F, "r1", 200, 20) for i in range(60)]
    sim = Simulation(cfg, make_strategy("reactive"), reqs)
    result = sim.run()
    st = result.stats[(IW_F.name, "m")]
    ready = min(
        (
            i.ready_at
            for d in sim.cluster.endpoints.values()
            for x in d.deployments
            for i in x.instances
        ),
        default=None,
    )
    assert ready is not None and ready >= 300.0
    refused = [r for r in reqs if ready - r.arrival > 120.0]
    assert st.refused_no_instance == len(refused) > 0
    assert st.finished == len(reqs) - len(refused)
    doc = policy_summary(result, 1.0)
    assert doc["requests"]["refused_no_instance"] == len(refused)
    assert doc["tiers"][IW_F.name]["m"]["refused_no_instance"] == len(refused)
    assert doc["requests"]["unfinished"] == len(refused)  # they count against the SLO
    assert_simulate_shows(result, len(refused))


def assert_simulate_shows(result: RunResult, refused: int) -> None:
    """`sageserve simulate`'s table has the column, with the run's count."""
    from rich.console import Console

    from sageserve.commands.sim import comparison_table
    from sageserve.sim.run import Comparison

    runs = {"reactive": (result, 1.0)}
    doc = summary({"name": "t", "window": {"start_s": 0.0, "end_s": 600.0}, "seed": 0}, runs)
    cmp = Comparison(doc, comparison_rows(doc, runs, [IW_F.name]), runs)
    console = Console(width=300, record=True)
    console.print(comparison_table(cmp, "t"))
    text = console.export_text()
    assert "refused (no instance within 120 s)" in text
    row = next(line for line in text.splitlines() if "reactive" in line)
    assert f" {refused} " in row


def test_past_the_held_bound_a_request_is_refused_at_once() -> None:
    # at most 5 held (the bound lowered from the router's 1,000): the 5 first wait and are
    # served by the instance that comes up in 60 s, the 15 others are refused at once
    perf = flat_perf()
    quick = Delays(redeploy_s=60.0, remote_redeploy_s=60.0)
    cfg = config(perf, initial=0, lo=0, hi=1, end_s=100.0, drain_s=600.0, max_held=5, delays=quick)
    reqs = [Request(i, 0.01 * i, "m", IW_F, "r1", 200, 20) for i in range(20)]
    result = Simulation(cfg, make_strategy("reactive"), reqs).run()
    st = result.stats[(IW_F.name, "m")]
    assert (st.refused_no_instance, st.finished) == (15, 5)


def test_a_run_with_serving_instances_holds_and_refuses_nothing() -> None:
    perf = flat_perf()
    cfg = config(perf, initial=1, lo=1, hi=2, end_s=60.0)
    reqs = [Request(i, 0.5 * i, "m", IW_F, "r1", 200, 20) for i in range(100)]
    result = Simulation(cfg, make_strategy("reactive"), reqs).run()
    assert result.refused_no_instance == 0 and result.finished == 100
    from sageserve.commands.sim import comparison_table
    from sageserve.sim.run import Comparison

    runs = {"reactive": (result, 1.0)}
    doc = summary({"name": "t", "window": {"start_s": 0.0, "end_s": 60.0}, "seed": 0}, runs)
    cmp = Comparison(doc, comparison_rows(doc, runs, [IW_F.name]), runs)
    headers = [c.header for c in comparison_table(cmp, "t").columns]
    assert not any("refused" in str(h) for h in headers)  # the column only when needed
