"""In-region instance pickers, chosen by name: what each one minimises, and PreServe's
picker avoiding an instance that its anticipator sees filling up (PreServe §3.2.2, §4.3.3)."""

from __future__ import annotations

import pytest

from sageserve.core.types import IW_F, Request
from sageserve.dispatch.anticipator import LoadAnticipator
from sageserve.dispatch.instance_picker import (
    DEFAULT_PICKER,
    Arrival,
    InstanceLoad,
    make_picker,
    picker_names,
    preserve_score,
)
from sageserve.pace import make_strategy
from sageserve.sim.engine import Simulation
from tests.sim.helpers import config, flat_perf

CAP = 10_000


def _load(
    running: list[tuple[int, int]] = (),  # type: ignore[assignment]
    waiting: list[tuple[int, int]] = (),  # type: ignore[assignment]
    kv: float = 0.0,
) -> InstanceLoad:
    """An instance with running (context, predicted left) and waiting (prompt, predicted)
    requests, at iteration 0."""
    ant = LoadAnticipator(CAP)
    for i, (ctx, d) in enumerate(running):
        ant.start(i, 0, ctx, d)
    for i, (p, d) in enumerate(waiting, start=len(running)):
        ant.enqueue(i, p, d)
    return InstanceLoad(ant, 0, kv)


def test_pickers_are_chosen_by_name() -> None:
    assert {"round-robin", "least-request", "min-usage", "token-jsq", "preserve"} <= set(
        picker_names()
    )
    assert DEFAULT_PICKER == "token-jsq"
    with pytest.raises(ValueError, match=r"unknown instance picker 'random'.*preserve"):
        make_picker("random")


def test_round_robin_takes_turns_whatever_the_load() -> None:
    rr = make_picker("round-robin")
    cands = [("a", _load(kv=0.9)), ("b", _load()), ("c", _load())]
    assert [rr.pick(Arrival(10, 10), cands) for _ in range(4)] == ["a", "b", "c", "a"]


# The pilot of PreServe §3.2.2: "a" runs two requests that will each grow by 2,000 tokens
# and fill its KV cache, though it holds a little less now (3,800 tokens against 4,000);
# "b" runs four requests about to finish.
FILLING = _load(running=[(1900, 2000), (1900, 2000)], kv=0.38)
FINISHING = _load(running=[(1000, 5)] * 4, kv=0.40)


@pytest.mark.parametrize(
    ("picker", "want"),
    [
        ("least-request", "a"),  # two requests against four
        ("min-usage", "a"),  # less in use now, blind to the growth to come
        ("token-jsq", "b"),  # 4,000 predicted tokens left against 20
        ("preserve", "b"),
    ],
)
def test_each_picker_minimises_its_own_load(picker: str, want: str) -> None:
    cands = [("b", FINISHING), ("a", FILLING)]
    assert make_picker(picker).pick(Arrival(500, 100), cands) == want


def test_preserve_avoids_an_instance_projected_to_fill_when_token_counts_tie() -> None:
    """Equal prompt and decode tokens to come, but "full" holds 7,500 tokens already and
    keeps growing: its projected peak with the new request passes 80 % within the look-ahead,
    so it pays the memory penalty; token-JSQ, blind to memory, takes it (listed first)."""
    full = _load(running=[(7500, 1500)], kv=0.75)
    light = _load(running=[(100, 1500)], kv=0.01)
    req = Arrival(400, 200)
    assert preserve_score(req, full) > preserve_score(req, light)
    assert make_picker("preserve").pick(req, [("full", full), ("light", light)]) == "light"
    assert make_picker("token-jsq").pick(req, [("full", full), ("light", light)]) == "full"
    # prefill 0 + 400, decode 1,500 + 200; the peak over the 100 iterations looked at is at
    # the last: (7,500 + 99 + 400 + 99) / 10,000 = 0.8098, a penalty of 0.0098 × 10,000
    base = (0 + 400) + (1500 + 200)
    assert preserve_score(req, full) == pytest.approx(base + 98)
    assert preserve_score(req, light) == pytest.approx(base)


def _first_instance_of(sim: Simulation, rid: int) -> str:
    for inst in sim.cluster.all_instances:
        jobs = [*inst.prefilling, *inst.waiting0, *inst.waiting1, *inst._running]
        if any(j.req.id == rid for j in jobs):
            return inst.id
    raise AssertionError(f"request {rid} is on no instance")


@pytest.mark.parametrize(
    ("predictor", "same_instance"), [("client-quantile", True), ("oracle", False)]
)
def test_the_simulators_token_jsq_reads_predicted_lengths_unless_told_the_truth(
    predictor: str, same_instance: bool
) -> None:
    """Request 0 will write 5,000 tokens, request 1 only 10; both look alike at arrival.
    On predicted lengths, request 2 cannot know which instance holds the long one (a tie:
    the first instance, request 0's); only the oracle sends it away from request 0."""
    sim = Simulation(
        config(flat_perf(), initial=2, lo=2, predictor=predictor),
        make_strategy("reactive"),
        iter(()),
    )
    for i, out in enumerate((5000, 10, 10)):
        sim._arrive(Request(i, 0.0, "m", IW_F, "r1", 100, out))
    assert _first_instance_of(sim, 0) != _first_instance_of(sim, 1)
    assert (_first_instance_of(sim, 2) == _first_instance_of(sim, 0)) is same_instance
