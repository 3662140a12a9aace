"""The analytic continuous-batching instance against hand-computed timelines."""

from __future__ import annotations

import pytest

from sageserve.core.snapshot import emu
from sageserve.core.types import IW_F, NIW, Request
from sageserve.sim.events import EventQueue, fire
from sageserve.sim.instance import Instance, InstanceHooks, Job
from tests.sim.helpers import flat_perf


class Driver(InstanceHooks):
    """Runs one instance's events in time order, as the engine does."""

    def __init__(self) -> None:
        self.events = EventQueue()
        self.done: list[Job] = []

    def on_finish(self, job: Job, now: float) -> None:
        self.done.append(job)

    def schedule(self, inst: Instance, when: float) -> None:
        self.events.schedule(inst, when)

    def on_idle(self, inst: Instance, now: float) -> None:
        pass

    def run(self, until: float = 1e9) -> None:
        for when, _, _, inst in self.events.pop_due(until):
            assert isinstance(inst, Instance)
            fire(inst, when)


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


# ---- chunked prefill (vLLM's max_num_batched_tokens) -------------------------------------


def test_a_long_prompt_is_prefilled_in_chunks_with_a_decode_step_between() -> None:
    """A 10,000-token prompt with a 4,096-token budget takes three chunks (4096, 4096,
    1808); the running sequence decodes one token after each of the first two."""
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.5, decode_s=0.05), "r1", d, max_batched_tokens=4096)
    short = Job(req(0, 0.0, 100, 50), 0)
    inst.enqueue(short, 0.0)
    d.run(until=0.5)
    assert short.first_token == pytest.approx(0.5)
    long = Job(req(1, 0.5, 10_000, 5), 0)
    inst.enqueue(long, 0.5)
    d.run(until=0.999)
    # chunk 1 from 0.5 to 1.0; the whole prompt's KV is reserved at admission
    assert inst.kv_at(0.75) == pytest.approx(101 + 10_000)
    assert long.first_token < 0
    d.run()
    # chunk 1 (0.5 s), decode (0.05), chunk 2 (0.5), decode (0.05), last chunk (0.5)
    assert long.first_token == pytest.approx(0.5 + 3 * 0.5 + 2 * 0.05)
    # the short request decoded during the long prefill: 49 decode iterations in all,
    # two of them between chunks, the rest after the last chunk
    assert short.finish_time == pytest.approx(long.first_token + 47 * 0.05)
    assert long.finish_time == pytest.approx(long.first_token + 4 * 0.05)
    assert inst.idle and inst.kv_at(10.0) == pytest.approx(0.0)


def test_without_running_sequences_the_chunks_follow_each_other() -> None:
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.5, decode_s=0.05), "r1", d, max_batched_tokens=4096)
    long = Job(req(0, 0.0, 9000, 2), 0)
    inst.enqueue(long, 0.0)
    assert inst.running == 1 and inst.waiting == 0
    d.run()
    assert long.first_token == pytest.approx(3 * 0.5)
    assert long.finish_time == pytest.approx(3 * 0.5 + 0.05)


def test_the_last_chunk_shares_its_step_with_short_prompts() -> None:
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.5, decode_s=0.05), "r1", d, max_batched_tokens=4096)
    long = Job(req(0, 0.0, 5000, 2), 0)
    inst.enqueue(long, 0.0)
    short = Job(req(1, 0.1, 1000, 2), 0)
    inst.enqueue(short, 0.1)
    d.run()
    # chunk 1: 4096 tokens; chunk 2: 904 + the short prompt's 1000 in one step
    assert long.first_token == pytest.approx(1.0)
    assert short.first_token == pytest.approx(1.0)


def test_prompts_within_the_budget_are_scheduled_as_before() -> None:
    """Below the budget nothing changes: several prompts in one prefill step."""
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.2, decode_s=0.05), "r1", d, max_batched_tokens=4096)
    first = Job(req(0, 0.0, 100, 3), 0)
    inst.enqueue(first, 0.0)
    a, b = Job(req(1, 0.1, 2000, 3), 0), Job(req(2, 0.1, 2000, 3), 0)
    inst.enqueue(a, 0.1)
    inst.enqueue(b, 0.1)
    d.run()
    assert first.first_token == pytest.approx(0.2)
    assert a.first_token == pytest.approx(0.4) and b.first_token == pytest.approx(0.4)


def test_abandon_all_returns_a_prompt_between_its_chunks() -> None:
    d = Driver()
    inst = Instance("i", flat_perf(prefill_s=0.5, decode_s=0.05), "r1", d, max_batched_tokens=4096)
    short = Job(req(0, 0.0, 100, 500), 0)
    inst.enqueue(short, 0.0)
    d.run(until=0.5)
    long = Job(req(1, 0.5, 10_000, 5), 0)
    inst.enqueue(long, 0.5)
    d.run(until=1.02)  # chunk 1 done, decoding before chunk 2
    assert not inst.prefilling and inst.chunk_job is long
    assert inst.remaining_tokens_at(1.02) > 10_000 - 4096
    jobs = inst.abandon_all()
    assert set(jobs) == {short, long}
    assert inst.idle and inst.chunk_job is None
