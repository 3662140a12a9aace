"""Whole-run properties: conservation, Little's law, determinism, GPU-hour accounting."""

from __future__ import annotations

import pytest

from sageserve.core.snapshot import Plan
from sageserve.core.types import IW_F, IW_N, NIW, EndpointKey, InstanceState, Request
from sageserve.pace import make_strategy
from sageserve.sim.cluster import Cluster, Delays
from sageserve.sim.engine import Simulation
from sageserve.sim.instance import InstanceHooks
from sageserve.sim.results import policy_summary
from tests.sim.helpers import config, flat_perf, nodes, poisson


def plan_of(now: float, targets: dict[str, int], forecast: float = 0.0) -> Plan:
    """A plan of model "m", variant "v", with `targets` per region."""
    keys = {r: EndpointKey("m", r) for r in targets}
    return Plan(
        now,
        {(keys[r], "v"): n for r, n in targets.items()},
        {k: forecast for k in keys.values()},
    )


def run(policy: str, rate: float = 20.0, end_s: float = 1800.0, seed: int = 1, **kw):
    perf = flat_perf(prefill_s=0.05, decode_s=0.02, kv=60_000)
    cfg = config(perf, regions=("r1", "r2"), end_s=end_s, **kw)
    reqs = poisson(rate, end_s, [IW_F, IW_N, NIW], ("r1", "r2"), seed=seed)
    return Simulation(cfg, make_strategy(policy), reqs).run()


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["reactive", "siloed"])
def test_every_request_finishes_or_is_reported_unfinished(policy: str) -> None:
    r = run(policy, rate=40.0, drain_s=60.0)  # short drain: some work is left over
    unfinished = sum(r.unfinished_by_key.values())
    assert r.arrived > 0
    assert r.finished + unfinished == r.arrived
    assert sum(s.finished for s in r.stats.values()) == r.finished


@pytest.mark.slow
def test_a_seed_gives_the_same_run_and_another_seed_a_different_one() -> None:
    a = policy_summary(run("reactive", seed=3), 1.0)
    b = policy_summary(run("reactive", seed=3), 1.0)
    c = policy_summary(run("reactive", seed=4), 1.0)
    for d in (a, b, c):
        d.pop("sim")
    assert a == b
    assert a != c


class Counting(Simulation):
    """Samples the number of requests in the system every minute (for Little's law)."""

    samples: list[int]

    def _minute_tick(self, now: float) -> None:
        super()._minute_tick(now)
        n = self.qm.pending() + sum(len(ep.backlog) for ep in self.cluster.endpoints.values())
        for inst in self.cluster.all_instances:
            n += inst.running + inst.waiting
        if 600 <= now <= self.cfg.end_s - 600:  # steady part of the run
            self.samples.append(n)


@pytest.mark.slow
def test_littles_law_holds_on_a_steady_run() -> None:
    end = 4 * 3600.0
    rate = 15.0
    perf = flat_perf(prefill_s=0.05, decode_s=0.03, kv=200_000)
    cfg = config(perf, initial=3, lo=3, hi=3, end_s=end)  # fixed fleet: a stationary system
    reqs = list(poisson(rate, end, [IW_F], seed=9, prompt=400, output=80))
    sim = Counting(cfg, make_strategy("reactive"), reqs)
    sim.samples = []
    r = sim.run()
    st = r.stats[("IW-F", "m")]
    mean_w = sum(st.e2e) / len(st.e2e)
    lam = len(reqs) / end
    mean_l = sum(sim.samples) / len(sim.samples)
    assert mean_l == pytest.approx(lam * mean_w, rel=0.1)


def test_batch_requests_past_the_deadline_count_as_misses() -> None:
    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, end_s=100.0)
    late_tier = NIW.__class__(
        **{**{f: getattr(NIW, f) for f in NIW.__dataclass_fields__}, "deadline_s": 0.5}
    )
    reqs = [Request(0, 1.0, "m", late_tier, "r1", 100, 200)]  # needs ~4 s > 0.5 s deadline
    r = Simulation(cfg, make_strategy("siloed"), reqs).run()
    st = r.stats[("NIW", "m")]
    assert st.finished == 1 and st.deadline_miss == 1 and st.slo_met == 0


def test_unified_reactive_holds_batch_in_the_queue_manager_until_released() -> None:
    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, end_s=120.0)
    reqs = [Request(i, 1.0 + i, "m", NIW, "r1", 100, 10) for i in range(5)]
    r = Simulation(cfg, make_strategy("reactive"), reqs).run()
    # released on pace ticks / completions because the idle endpoint signals EMU < 50%
    assert r.stats[("NIW", "m")].finished == 5
    ttft = list(r.stats[("NIW", "m")].ttft)
    assert max(ttft) <= 15.0 + 1.0  # at most one pace interval (15 s) of waiting


class NoHooks(InstanceHooks):
    def schedule(self, inst, when):
        pass

    def on_finish(self, job, now):
        pass

    def on_idle(self, inst, now):
        pass


def test_gpu_hours_per_state_match_a_hand_computed_case() -> None:
    perf = flat_perf(gpus=8)
    delays = Delays(reclaim_same_model_median_s=60, reclaim_same_model_max_s=60, redeploy_s=600)
    cl = Cluster(nodes(("r1",), serving=2, spot=1), NoHooks(), delays, seed=0)
    key = EndpointKey("m", "r1")
    ep = cl.add_endpoint(key, 1, 3, 1.0)
    dep = cl.add_deployment(ep, "m-r1-v", perf)
    assert cl.start_instances(dep, 2, 0.0) == 2
    cl.scale_in(key, 1800.0)  # idle: gone at once, its node wholly idle
    reclaimed, donated = cl.spot_pass(1800.0)  # the pace tick donates the node
    assert reclaimed == [] and len(donated) == 1
    assert cl.scale_out(key, 3600.0) is None  # no serving GPUs free: pending
    assert ep.replicas() == {"m-r1-v": 2}
    reclaimed, _ = cl.spot_pass(3600.0)  # the node that last served m, weights cached
    assert reclaimed == donated
    (got,) = ep.provisioning
    assert got.ready_at == 3660.0
    cl.ready(got, got.ready_at)
    assert cl.scale_out(key, 5400.0) is None
    assert cl.spot_pass(5400.0) == (["r1-p0"], [])  # the spot pool's own node: redeploy
    (extra,) = ep.provisioning
    assert extra.ready_at == 6000.0
    cl.ready(extra, 6000.0)
    cl.close_accounting(7200.0)
    g = {
        st: sum(v for (m, r, s), v in cl.acct.gpu_seconds.items() if s is st) / 3600
        for st in InstanceState
    }
    # instance A: serving 2 h; B: serving 0.5 h, then its node donated 0.5 h; C (fresh, on
    # the reclaimed node): provisioning 60 s, serving 7200-3660 s; D: provisioning
    # 5400-6000 s (redeploy), serving 1200 s
    assert g[InstanceState.SERVING] * 3600 == pytest.approx(8 * (7200 + 1800 + 3540 + 1200))
    assert g[InstanceState.SPOT] * 3600 == pytest.approx(8 * 1800)
    assert g[InstanceState.PROVISIONING] * 3600 == pytest.approx(8 * (60 + 600))
    assert cl.acct.events["reclaim_same_model"] == 1
    assert cl.acct.events["redeploy_other_model"] == 1
    assert cl.acct.events["donate_to_spot"] == 1
    assert cl.acct.events["scale_out_pending"] == 2


def test_a_scale_out_with_no_free_gpus_stays_pending_and_takes_gpus_a_drain_frees() -> None:
    from dataclasses import replace as dc_replace

    perf_a = flat_perf(gpus=8)
    perf_b = dc_replace(flat_perf(gpus=8), model="b")
    cl = Cluster(nodes(("r1",), serving=2, spot=0), NoHooks(), Delays(redeploy_s=600), seed=0)
    placed: list = []
    cl.placed = placed.append
    ka, kb = EndpointKey("m", "r1"), EndpointKey("b", "r1")
    dep_a = cl.add_deployment(cl.add_endpoint(ka, 0, 2, 1.0), "a", perf_a)
    dep_b = cl.add_deployment(cl.add_endpoint(kb, 0, 2, 1.0), "b", perf_b)
    cl.start_instances(dep_a, 1, 0.0)
    cl.start_instances(dep_b, 1, 0.0)
    assert cl.scale_out(ka, 10.0) is None  # both nodes busy: a Pending pod
    assert dep_a.endpoint.replicas() == {"a": 2}  # counted in replicas: not asked again
    assert cl.spot_pass(15.0) == ([], [])  # no spot node to reclaim, nothing donated
    cl.scale_in(kb, 100.0)  # b's instance drains, idle: its GPUs free
    (got,) = placed  # the scheduler places the pending instance at once
    assert got.model == "m" and got.ready_at == 700.0
    assert dep_a.endpoint.provisioning == [got] and not cl.pending
    assert cl.acct.events["scale_out_pending"] == 1
    assert cl.acct.events["donate_to_spot"] == 0


def test_a_scale_in_removes_a_pending_instance_first() -> None:
    cl = Cluster(nodes(("r1",), serving=1, spot=0), NoHooks(), Delays(), seed=0)
    key = EndpointKey("m", "r1")
    ep = cl.add_endpoint(key, 0, 3, 1.0)
    dep = cl.add_deployment(ep, "a", flat_perf(gpus=8))
    cl.start_instances(dep, 1, 0.0)
    assert cl.scale_out(key, 10.0) is None
    assert cl.scale_in(key, 20.0) is None  # the Pending pod goes, the serving one stays
    assert ep.serving == 1 and ep.replicas() == {"a": 1} and not cl.pending


def test_a_silent_clusters_idle_node_is_neither_donated_nor_its_spot_node_reclaimed() -> None:
    """The operator can neither relabel nor evict in a cluster whose API server is silent:
    the spot pass leaves a held region's nodes as they are, then acts once it answers."""
    cl = Cluster(nodes(("r1",), serving=2, spot=1), NoHooks(), Delays(), seed=0)
    key = EndpointKey("m", "r1")
    ep = cl.add_endpoint(key, 0, 4, 1.0)
    dep = cl.add_deployment(ep, "a", flat_perf(gpus=8))
    cl.start_instances(dep, 2, 0.0)
    idle = next(i for i in dep.instances if i.node is not None and i.node.name == "r1-s1")
    cl.scale_in(key, 100.0, chosen_ones=[idle.id])
    held = frozenset({"r1"})
    assert cl.spot_pass(100.0, held) == ([], [])  # idle, but its cluster is silent
    assert cl.scale_out(key, 150.0) is not None  # takes r1-s1's free GPUs again
    assert cl.scale_out(key, 160.0) is None  # no free GPUs: a pending instance
    assert cl.spot_pass(170.0, held) == ([], [])  # the spot node is not reclaimed for it
    reclaimed, _ = cl.spot_pass(180.0)  # the cluster answers: reclaimed
    assert reclaimed == ["r1-p0"]


def test_free_serving_gpus_are_taken_before_a_donated_node_is_reclaimed() -> None:
    cl = Cluster(nodes(("r1",), serving=2, spot=0), NoHooks(), Delays(), seed=0)
    key = EndpointKey("m", "r1")
    ep = cl.add_endpoint(key, 0, 4, 1.0)
    dep = cl.add_deployment(ep, "a", flat_perf(gpus=4))
    cl.start_instances(dep, 3, 0.0)  # two on r1-s0, one on r1-s1
    third = next(i for i in dep.instances if i.node is not None and i.node.name == "r1-s1")
    cl.scale_in(key, 100.0, chosen_ones=[third.id])
    assert cl.spot_pass(100.0) == ([], ["r1-s1"])  # wholly idle: donated, model m's
    second = next(i for i in dep.instances if i.node is not None and i.node.name == "r1-s0")
    cl.scale_in(key, 200.0, chosen_ones=[second.id])
    assert cl.spot_pass(200.0) == ([], [])  # r1-s0 half used: not donated
    got = cl.scale_out(key, 300.0)
    assert got is not None and got[1] == "deploy_free_gpus" and got[0].node.name == "r1-s0"
    # a fresh instance, its weights from the node's cache (it served m): the reclaim delay
    assert got[0].ready_at <= 300.0 + Delays().reclaim_same_model_max_s
    assert cl.acct.events["reclaim_same_model"] == 0
    assert cl.donated_nodes() == {("r1", "m"): 1}


def test_an_idle_node_is_not_donated_while_its_pair_has_an_instance_coming_up() -> None:
    cl = Cluster(nodes(("r1",), serving=3, spot=0), NoHooks(), Delays(redeploy_s=600), seed=0)
    key = EndpointKey("m", "r1")
    ep = cl.add_endpoint(key, 0, 4, 1.0)
    dep = cl.add_deployment(ep, "a", flat_perf(gpus=8))
    cl.start_instances(dep, 2, 0.0)
    got = cl.scale_out(key, 10.0)  # on r1-s2, loading for 600 s
    assert got is not None
    cl.scale_in(key, 20.0, chosen_ones=[dep.instances[0].id])  # r1-s0 wholly idle
    assert cl.spot_pass(30.0) == ([], [])  # (r1, H100) busy: an instance is coming up
    cl.ready(got[0], got[0].ready_at)
    assert cl.spot_pass(615.0) == ([], ["r1-s0"])


def test_runs_sharing_one_config_start_from_the_same_empty_cluster() -> None:
    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, initial=4, end_s=600.0)
    reqs = list(poisson(5.0, 600.0, [IW_F]))
    first = Simulation(cfg, make_strategy("reactive"), reqs)
    first.run()
    second = Simulation(cfg, make_strategy("siloed"), reqs)
    assert sum(ep.serving for ep in second.cluster.endpoints.values()) == 4
    assert all(n.free_gpus == n.gpus for n in cfg.nodes)


@pytest.mark.slow
def test_the_planner_is_called_hourly_with_history_and_current_counts() -> None:
    calls: list[tuple[float, dict, dict]] = []

    def planner(now, history, batch, current, received, need):
        calls.append((now, {k: list(v) for k, v in history.items()}, dict(current)))
        return plan_of(now, {"r1": 3}, 1000.0)

    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, initial=2, end_s=2 * 3600.0 + 10)
    reqs = poisson(2.0, cfg.end_s, [IW_F])
    sim = Simulation(cfg, make_strategy("lt-immediate"), reqs, planner=planner)
    r = sim.run()
    assert [c[0] for c in calls] == [3600.0, 7200.0]
    _now, history, current = calls[0]
    assert len(history[("m", "r1")]) == 60 and sum(history[("m", "r1")]) > 0
    assert current == {("m", "r1", "v"): 2}
    assert sim.step_state.plan is not None  # the plan in force is the planner's last
    assert sim.step_state.plan.targets == {EndpointKey("m", "r1"): 3}
    # the third instance: the idle serving nodes went to the spot pool at the first pace
    # tick, so it is a spot node reclaimed (it never served m: a redeploy)
    assert r.events["scale_out_pending"] == 1 and r.events["redeploy_other_model"] == 1


def test_baselines_never_run_the_planner() -> None:
    def planner(*a):
        raise AssertionError("baselines must not plan")

    perf = flat_perf()
    cfg = config(perf, end_s=2 * 3600.0)
    Simulation(
        cfg, make_strategy("reactive"), poisson(1.0, cfg.end_s, [IW_F]), planner=planner
    ).run()


def test_history_before_the_window_gives_a_plan_at_the_start() -> None:
    """With Prometheus-like history the first plan is at t = start, not an hour in."""
    calls: list[tuple[float, list[float]]] = []

    def planner(now, history, batch, current, received, need):
        calls.append((now, list(history[("m", "r1")])))
        return plan_of(now, {"r1": 1}, 10.0)

    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, initial=3, end_s=3600.0 - 1)
    before = ({("m", "r1"): [5.0] * 90}, {("m", "r1"): [1.0] * 90})
    r = Simulation(
        cfg, make_strategy("lt-immediate"), poisson(1.0, cfg.end_s, [IW_F]), None, planner, before
    ).run()
    # the last training window of it (the policy's trainingWindowSeconds, 1 h by default)
    assert calls[0][0] == 0.0 and calls[0][1] == [5.0] * cfg.history_minutes
    assert cfg.history_minutes == 60
    assert [c[0] for c in calls[1:]] == [3600.0]  # then hourly (the drain included)
    # the plan's target of 1 applied at once: the fleet shrank from its initial 3
    assert r.events["scale_in"] == 2
    assert all(row.serving == 1 for row in r.minutes)


@pytest.mark.parametrize("policy", ["reactive", "lt-u"])
def test_an_endpoint_no_request_reaches_still_scales_in_to_its_floor(policy: str) -> None:
    # r2 gets no traffic: the operator's pace loop checks it every pace period, so the
    # simulator must too (the paper's rule fires on arrivals, and none come).
    def planner(now, history, batch, current, received, need):
        return plan_of(now, {"r1": 1, "r2": 1})

    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, regions=("r1", "r2"), initial=4, lo=1, hi=6, end_s=1800.0)
    reqs = list(poisson(5.0, 1800.0, [IW_F], ("r1",)))
    before = ({("m", r): [1.0] * 90 for r in ("r1", "r2")}, {})
    sim = Simulation(cfg, make_strategy(policy), reqs, None, planner, before)
    sim.run()
    assert sim.cluster.endpoints[EndpointKey("m", "r2")].serving == 1


def test_an_endpoint_scaled_to_zero_without_traffic_stays_at_zero() -> None:
    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, regions=("r1", "r2"), initial=1, lo=0, hi=4, end_s=1800.0)
    reqs = list(poisson(5.0, 1800.0, [IW_F], ("r1",)))
    sim = Simulation(cfg, make_strategy("reactive"), reqs)
    r = sim.run()
    quiet = [m for m in r.minutes if m.region == "r2"]
    assert quiet[-1].serving == 0  # scaled in once, never back out for no request
    assert all(m.provisioning == 0 for m in quiet)


def test_capacity_outside_both_pools_is_never_used_and_remote_weights_take_their_delay() -> None:
    from dataclasses import replace

    from sageserve.core.nodes import OUTSIDE_POOLS
    from sageserve.sim.cluster import Node

    perf = flat_perf(gpus=8)
    inventory = (
        Node("s0", "r1", perf.gpu_type, "serving", 8),
        Node("s1", "r1", perf.gpu_type, "serving", 8),
        *(Node(f"x{i}", "r1", perf.gpu_type, OUTSIDE_POOLS, 8) for i in range(2)),
    )
    delays = Delays(redeploy_s=600, remote_redeploy_s=7200)
    cl = Cluster(inventory, NoHooks(), delays, seed=0)
    key = EndpointKey("m", "r1")
    dep = cl.add_deployment(cl.add_endpoint(key, 0, 4, 1.0), "a", perf)
    cl.start_instances(dep, 1, 0.0)  # the serving node: weights now in r1
    other = EndpointKey("n", "r1")
    perf_n = replace(perf, model="n")
    dep_n = cl.add_deployment(cl.add_endpoint(other, 0, 4, 1.0), "n", perf_n)
    got = cl.scale_out(other, 20.0)
    assert got is not None and got[0].ready_at == 20.0 + 7200  # n never loaded in r1
    assert dep_n.endpoint.provisioning == [got[0]]
    assert cl.scale_out(key, 30.0) is None  # the operator never uses x0, x1: pending
    assert cl.spot_pass(45.0) == ([], [])
    assert all(n.free_gpus == 8 for n in cl.nodes if n.pool == OUTSIDE_POOLS)


def test_scale_out_goes_to_the_variant_the_plan_chose() -> None:
    small = flat_perf(gpus=4)
    cl = Cluster(nodes(("r1",), serving=2, spot=0), NoHooks(), Delays(redeploy_s=60), seed=0)
    key = EndpointKey("m", "r1")
    ep = cl.add_endpoint(key, 0, 4, 1.0)
    big_dep = cl.add_deployment(ep, "m-big", flat_perf(gpus=8))
    small_dep = cl.add_deployment(ep, "m-small", small)
    big_dep.variant, small_dep.variant = "big", "small"
    got = cl.scale_out(key, 0.0, "small")
    assert (
        got is not None
        and got[0].endpoint is small_dep
        and ep.replicas()
        == {
            "big": 0,
            "small": 1,
        }
    )


def test_the_simulator_takes_spot_capacity_in_the_operators_order() -> None:
    """pace.spot.reclaim_order for pending instances: same model newest-donated first,
    else other models' longest-donated first (the rule the operator's spot pass follows)."""
    from dataclasses import replace as dc_replace

    perf_a, perf_b = flat_perf(gpus=8), dc_replace(flat_perf(gpus=8), model="b")
    cl = Cluster(nodes(("r1",), serving=4, spot=0), NoHooks(), Delays(), seed=0)
    ka, kb = EndpointKey("m", "r1"), EndpointKey("b", "r1")
    dep_a = cl.add_deployment(cl.add_endpoint(ka, 0, 4, 1.0), "a", perf_a)
    dep_b = cl.add_deployment(cl.add_endpoint(kb, 0, 4, 1.0), "b", perf_b)
    cl.start_instances(dep_a, 2, 0.0)  # r1-s0, r1-s1
    cl.start_instances(dep_b, 2, 0.0)  # r1-s2, r1-s3
    node_of = {i.id: i.node.name for d in (dep_a, dep_b) for i in d.instances if i.node}
    a_old, b_old = cl.scale_in(ka, 100.0), cl.scale_in(kb, 100.0)
    assert a_old is not None and b_old is not None
    cl.spot_pass(100.0)
    a_new, b_new = cl.scale_in(ka, 200.0), cl.scale_in(kb, 200.0)
    assert a_new is not None and b_new is not None
    cl.spot_pass(200.0)
    for _ in range(3):
        assert cl.scale_out(ka, 300.0) is None
    reclaimed, _ = cl.spot_pass(315.0)
    assert reclaimed == [node_of[a_new.id], node_of[a_old.id], node_of[b_old.id]]
    assert cl.acct.events["reclaim_same_model"] == 2
    assert cl.acct.events["redeploy_other_model"] == 1
    assert cl.donated_nodes() == {("r1", "b"): 1}  # the longest-donated b went first


def test_the_planner_sees_batch_received_apart_from_batch_served() -> None:
    """β is 10 % of the batch load *received* (SageServe §6.3): with the Queue Manager
    holding every batch request (no release rule), nothing is served, and the planner still
    sees every batch token that arrived, in the request's home region."""
    seen: dict[str, dict] = {}

    def planner(now, history, batch, current, received, need):
        if not seen:  # the plan at the end of the first hour
            seen.update(batch={k: list(v) for k, v in batch.items()}, received=dict(received))
        return plan_of(now, {"r1": 1, "r2": 1})

    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, regions=("r1", "r2"), end_s=3600.0 + 10, release_rules=())
    reqs = [Request(i, 10.0 * i, "m", NIW, "r2", 100, 10) for i in range(300)]
    Simulation(cfg, make_strategy("lt-immediate"), reqs, planner=planner).run()
    assert sum(sum(v) for v in seen["batch"].values()) == 0  # served: nothing
    assert sum(seen["received"][("m", "r2")]) * 60.0 == pytest.approx(300 * 110)
    assert sum(seen["received"][("m", "r1")]) == 0  # a region that received none: zeros


@pytest.mark.parametrize("pressure", [True, False])
def test_the_planner_sees_each_models_batch_deadline_need_when_deadlines_drive_scaling(
    pressure: bool,
) -> None:
    """The queue held all hour (no release rule): the plan at its end is told the tokens/s
    the queue needs for every request to meet its 24 h deadline, earliest deadline first;
    nothing when the run leaves batch to the troughs alone."""
    seen: list[tuple[dict[str, float], float]] = []

    def planner(now, history, batch, current, received, need):
        seen.append((dict(need), sim.qm.required_tps("m", now)))
        return plan_of(now, {"r1": 1})

    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, end_s=3600.0 + 10, release_rules=(), deadline_pressure=pressure)
    reqs = [Request(i, 10.0 * i, "m", NIW, "r1", 100, 10) for i in range(300)]
    sim = Simulation(cfg, make_strategy("lt-immediate"), reqs, planner=planner)
    sim.run()
    need, queue_says = seen[0]
    assert queue_says > 0  # 300 requests held, each due 24 h after its arrival
    assert need == ({"m": queue_says} if pressure else {})


def test_attainment_is_split_by_day_of_arrival_and_adds_up_to_the_whole_run() -> None:
    """A two-day run: day 1's requests are all served in time; of day 2's, the three that
    arrive in the last second are still unfinished at the end (no drain), so they count
    against day 2 only, as a one-day run of day 2 would count them."""
    day = 86_400.0
    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, initial=1, lo=1, hi=1, end_s=2 * day, drain_s=0.0)
    early = [Request(i, 3600.0 * (i + 1), "m", IW_F, "r1", 100, 20) for i in range(10)]
    late = [Request(10 + i, day + 3600.0 * (i + 1), "m", IW_F, "r1", 100, 20) for i in range(7)]
    last = [Request(17 + i, 2 * day - 0.5, "m", IW_F, "r1", 100, 200) for i in range(3)]
    r = Simulation(cfg, make_strategy("static"), early + late + last).run()
    p = policy_summary(r, 1.0)
    by_day = p["tiers"]["IW-F"]["m"]["slo_attainment_by_day"]
    assert [(d["day"], d["start_s"], d["requests"]) for d in by_day] == [
        (0, 0.0, 10),
        (1, day, 10),
    ]
    assert [d["slo_attainment"] for d in by_day] == [1.0, 0.7]
    assert p["tiers"]["IW-F"]["m"]["slo_attainment"] == pytest.approx(17 / 20)
    assert p["slo_attainment_by_day"]["IW-F"] == by_day  # one model: the tier is the model


def test_simulate_prints_attainment_by_day_only_for_a_window_of_several_days() -> None:
    from rich.console import Console

    from sageserve.commands.sim import attainment_by_day_table
    from sageserve.sim.run import Comparison

    def cmp(days: list[float | None]) -> Comparison:
        row = {"policy": "reactive", "slo_by_day": {"IW-F": days, "NIW": days}}
        return Comparison(summary={}, table=[row], runs={})

    assert attainment_by_day_table(cmp([0.99])) is None
    table = attainment_by_day_table(cmp([0.9775, None]))
    assert table is not None
    console = Console(width=120, record=True)
    console.print(table)
    text = console.export_text()
    assert "day 1" in text and "day 2" in text and "97.75%" in text
    assert text.count("reactive") == 2  # one row per tier


def test_gpu_time_after_the_window_is_counted_apart_until_the_last_request_finishes() -> None:
    """One instance of 8 GPUs for a 10-minute window: its GPU-hours are the window's; a
    request arriving 10 s before the end needs ~40 s more, which the fleet holds in the
    drain and the summary reports apart; without it, nothing is held after the window."""
    perf = flat_perf(prefill_s=0.05, decode_s=0.02)
    cfg = config(perf, initial=1, lo=1, hi=1, end_s=600.0, drain_s=3600.0)
    early = Request(0, 100.0, "m", IW_F, "r1", 100, 10)
    late = Request(1, 590.0, "m", IW_F, "r1", 100, 2000)  # 0.05 + 1999 × 0.02 ≈ 40 s
    with_late = policy_summary(Simulation(cfg, make_strategy("static"), [early, late]).run(), 1)
    without = policy_summary(Simulation(cfg, make_strategy("static"), [early]).run(), 1)
    for p in (with_late, without):
        assert p["fleet"]["gpu_hours"]["internal"] == pytest.approx(8 * 600 / 3600, abs=1e-3)
    # held from 600 s until the run's next pace tick after the request finished (~630 s)
    assert 8 * 30 / 3600 <= with_late["fleet"]["after_window_gpu_hours"] <= 8 * 60 / 3600
    assert with_late["requests"]["unfinished"] == 0
    assert without["fleet"]["after_window_gpu_hours"] == 0.0


def test_a_decision_the_inventory_cannot_place_is_not_asked_again_and_lands_when_gpus_free() -> (
    None
):
    """The operator writes absolute replicas: a Pending pod stays in them, so the same
    decision after the cooldown asks nothing new; the pod starts once a drain frees GPUs."""
    from dataclasses import replace as dc_replace

    from sageserve.core.snapshot import Decision
    from sageserve.core.types import ActionKind

    perf = flat_perf(gpus=8)
    cfg = dc_replace(config(perf, initial=1, lo=0, hi=4), nodes=nodes(("r1",), serving=1, spot=0))
    sim = Simulation(cfg, make_strategy("reactive"), [])
    key = EndpointKey("m", "r1")
    ep = sim.cluster.endpoints[key]
    more = Decision(key, ActionKind.SCALE_OUT, 1, {"v": 2}, "test")
    sim._apply([more], 10.0)
    sim._apply([more], 400.0)  # the same wish after the cooldown
    assert ep.replicas() == {"v": 2} and len(sim.cluster.pending) == 1
    assert sim.cluster.acct.events["scale_out_pending"] == 1
    dep = ep.deployments[0]
    (serving,) = dep.instances
    sim.cluster.drain(dep, serving, 500.0)  # idle: gone at once, its GPUs free
    assert not sim.cluster.pending and len(ep.provisioning) == 1
    assert any(item[3] is ep.provisioning[0] for item in sim.events.heap)  # its readiness scheduled
