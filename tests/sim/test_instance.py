"""The analytic continuous-batching instance against hand-computed timelines."""

from __future__ import annotations

import heapq

import pytest

from sageserve.core.snapshot import emu
from sageserve.core.types import IW_F, NIW, Request
from sageserve.sim.instance import Instance, InstanceHooks, Job
from tests.sim.helpers import flat_perf


class Driver(InstanceHooks):
    """Runs one instance's events in time order, as the engine does."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Instance]] = []
        self.done: list[Job] = []
        self.n = 0

    def on_finish(self, job: Job, now: float) -> None:
        self.done.append(job)

    def schedule(self, inst: Instance, when: float) -> None:
        self.n += 1
        heapq.heappush(self.heap, (when, self.n, inst))

    def on_idle(self, inst: Instance, now: float) -> None:
        pass

    def run(self, until: float = 1e9) -> None:
        while self.heap and self.heap[0][0] <= until:
            when, _, inst = heapq.heappop(self.heap)
            if inst.event_time != when:
                continue
            inst.event_time = float("inf")
            inst.update(when)


def req(i: int, t: float, prompt: int, out: int, tier=IW_F) -> Request:
    return Request(i, t, "m", tier, "r1", prompt, out)


def test_single_request_ttft_is_prefill_and_e2e_adds_decode_iterations() -> None:
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.2, decode_s=0.05), "r1", d)
    job = Job(req(0, 1.0, 1000, 11), 0)
    inst.enqueue(job, 1.0)
    d.run()
    assert job.first_token == pytest.approx(1.2)
    # first token at prefill end, then 10 decode iterations of 50 ms
    assert job.finish_time == pytest.approx(1.2 + 10 * 0.05)


def test_two_requests_share_decode_iterations() -> None:
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.1, decode_s=0.02), "r1", d)
    a, b = Job(req(0, 0.0, 100, 6), 0), Job(req(1, 0.0, 100, 3), 0)
    inst.enqueue(a, 0.0)
    inst.enqueue(b, 0.0)
    d.run()
    # a is prefilled at once; b, queued during that step, in the next one (decode pauses
    # meanwhile, as in vLLM without chunked prefill); then both decode together
    assert a.first_token == pytest.approx(0.1)
    assert b.first_token == pytest.approx(0.2)
    assert b.finish_time == pytest.approx(0.2 + 2 * 0.02)
    assert a.finish_time == pytest.approx(0.2 + 5 * 0.02)


def test_emu_is_kv_in_use_over_capacity_and_grows_one_token_per_iteration() -> None:
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.1, decode_s=0.01, kv=10_000), "r1", d)
    inst.enqueue(Job(req(0, 0.0, 1000, 500), 0), 0.0)
    d.run(until=0.1)
    # after the prefill: prompt + first token
    assert inst.kv_at(0.1) == pytest.approx(1001)
    assert inst.kv_at(0.1 + 100 * 0.01) == pytest.approx(1101)
    assert emu(inst.kv_at(0.1), inst.kv_cap) == pytest.approx(0.1001)


def test_admission_stops_when_kv_is_full_and_resumes_after_a_finish() -> None:
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.1, decode_s=0.01, kv=1000), "r1", d)
    a, b = Job(req(0, 0.0, 600, 5), 0), Job(req(1, 0.0, 600, 5), 0)
    inst.enqueue(a, 0.0)
    inst.enqueue(b, 0.0)
    d.run()
    assert a.first_token == pytest.approx(0.1)
    assert b.first_token >= a.finish_time  # b waited for a's KV


def test_preemption_when_kv_runs_out_and_every_request_still_finishes() -> None:
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.05, decode_s=0.01, kv=1000), "r1", d)
    jobs = [Job(req(i, 0.0, 300, 400), 0) for i in range(3)]
    for j in jobs:
        inst.enqueue(j, 0.0)
    d.run()
    assert sum(j.preemptions for j in jobs) >= 1
    assert all(j.done and j.finish_time > 0 for j in jobs)
    assert inst.idle and inst.kv_at(1e6) == pytest.approx(0.0, abs=1e-6)


def test_priority_0_is_admitted_before_priority_1() -> None:
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.1, decode_s=0.01, kv=700), "r1", d)
    blocker = Job(req(0, 0.0, 600, 3), 0)
    inst.enqueue(blocker, 0.0)  # fills the KV
    batch = Job(req(1, 0.01, 600, 3, NIW), 1)
    inter = Job(req(2, 0.02, 600, 3), 0)
    inst.enqueue(batch, 0.01)
    inst.enqueue(inter, 0.02)
    d.run()
    assert inter.first_token < batch.first_token


def test_a_prompt_larger_than_the_kv_cache_is_dropped_not_looped() -> None:
    d = Driver()
    inst = Instance("i", flat_perf(kv=100), "r1", d)
    job = Job(req(0, 0.0, 500, 3), 0)
    inst.enqueue(job, 0.0)
    d.run()
    assert d.done == [job] and job.finish_time < 0
