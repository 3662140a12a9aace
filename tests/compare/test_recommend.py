"""The sentence a comparison ends with, on tables of hand-made figures: the pick is the
cheapest run that holds the target and every NIW deadline, and the sentence gives its
reasons (the saving against the next policy, the cheaper runs that fall short, the
policies that never qualify), or says that nothing qualifies."""

from __future__ import annotations

from typing import Any

import pytest

from sageserve.compare.output import group, retarget, summary_doc
from sageserve.compare.recommend import Run, best_run, recommendation

from .test_output import outcome

# (policy, label, GPU-h, attainment, NIW missed, scalings)
Row = tuple[str, str, float, float, int, int]


def summary(rows: list[Row], target: float = 0.99) -> dict[str, Any]:
    """The parts of a `sageserve.compare/v1` summary the sentence reads."""
    policies: dict[str, Any] = {}
    for policy, label, gpu, att, missed, scalings in rows:
        policies.setdefault(policy, {"points": []})["points"].append(
            {
                "label": label,
                "gpu_hours": gpu,
                "attainment": att,
                "niw_missed": missed,
                "scale_events": scalings,
                "error": None,
            }
        )
    return {"tier": "iw-f", "target": target, "policies": policies}


FOUR: list[Row] = [
    ("static", "as configured", 200.0, 1.0, 0, 24),
    ("siloed", "scaleOutEmu=0.5", 240.0, 0.978, 0, 640),
    ("reactive", "scaleOutEmu=0.5", 185.0, 0.9912, 0, 365),
    ("reactive", "scaleOutEmu=0.7", 150.0, 0.9881, 0, 198),
    ("lt-ua", "quantile=0.5", 160.0, 0.9999, 0, 60),
]


@pytest.mark.parametrize(
    ("rows", "target", "picked"),
    [
        (FOUR, 0.99, ("lt-ua", "quantile=0.5")),
        (FOUR, 0.95, ("reactive", "scaleOutEmu=0.7")),  # a looser target: the cheapest
        (FOUR, 1.0, ("static", "as configured")),
        # a cheaper run that misses NIW deadlines does not qualify
        (
            [("a", "x=1", 100.0, 0.999, 3, 5), ("b", "x=1", 120.0, 0.995, 0, 5)],
            0.99,
            ("b", "x=1"),
        ),
        # equal GPU-hours: the higher attainment, then the policy given first
        ([("a", "x=1", 100.0, 0.991, 0, 5), ("b", "x=1", 100.0, 0.995, 0, 5)], 0.99, ("b", "x=1")),
        ([("a", "x=1", 100.0, 0.995, 0, 5), ("b", "x=1", 100.0, 0.995, 0, 5)], 0.99, ("a", "x=1")),
        # exactly at the target holds it
        ([("a", "x=1", 100.0, 0.99, 0, 5)], 0.99, ("a", "x=1")),
        (FOUR, 1.0 + 1e-9, None),
        ([("a", "x=1", 100.0, 0.999, 3, 5)], 0.99, None),
    ],
)
def test_the_pick_is_the_cheapest_run_that_holds_both(
    rows: list[Row], target: float, picked: tuple[str, str] | None
) -> None:
    every = [Run(*r) for r in rows]
    order = list(dict.fromkeys(r.policy for r in every))
    got = best_run(every, target, order)
    assert (None if got is None else (got.policy, got.label)) == picked


def test_the_sentence_names_the_pick_and_its_reasons() -> None:
    text = recommendation(summary(FOUR))
    assert text.startswith("Pick lt-ua (quantile=0.5) on this traffic: it holds iw-f at 99.99%")
    assert "(target 99.00%)" in text and "for 160.0 GPU-h and 60 scalings" in text
    # the next cheapest that qualifies is reactive at 0.5, not static
    assert "13.5% fewer GPU-hours than reactive (scaleOutEmu=0.5: 185.0 GPU-h, 365" in text
    assert "1 cheaper run falls short (reactive scaleOutEmu=0.7 at 98.81%)" in text
    assert text.endswith("and siloed never reaches the target (best 97.80%).")
    assert "static" not in text and ". " not in text  # one sentence


def test_several_cheaper_runs_name_the_closest_and_a_miss_says_why() -> None:
    rows: list[Row] = [
        ("a", "x=1", 90.0, 0.95, 0, 1),
        ("a", "x=2", 95.0, 0.999, 2, 1),
        ("b", "x=1", 100.0, 0.995, 0, 1),
    ]
    text = recommendation(summary(rows))
    assert "2 cheaper runs fall short (the closest: a x=2 at 99.90% but 2 NIW deadlines" in text
    assert text.endswith("and a misses NIW deadlines wherever it reaches the target.")
    assert "fewer GPU-hours" not in text  # only one policy qualifies


@pytest.mark.parametrize(
    ("rows", "target", "closest"),
    [
        (FOUR, 1.0 + 1e-9, "the closest is static (as configured) at 100.00% for 200.0 GPU-h"),
        # a run that misses NIW deadlines is the closest only when every run does
        (
            [("a", "x=1", 90.0, 0.999, 4, 1), ("b", "x=1", 80.0, 0.97, 0, 1)],
            0.99,
            "the closest is b (x=1) at 97.00% for 80.0 GPU-h",
        ),
        (
            [("a", "x=1", 90.0, 0.999, 4, 1)],
            0.99,
            "the closest is a (x=1) at 99.90% but 4 NIW deadlines missed for 90.0 GPU-h",
        ),
    ],
)
def test_when_nothing_qualifies_the_sentence_says_so_and_what_to_do(
    rows: list[Row], target: float, closest: str
) -> None:
    text = recommendation(summary(rows, target))
    assert text.startswith("No policy holds iw-f at")
    assert closest in text and text.endswith("(--from) or sweep further (--grid).")


def test_no_finished_run_picks_nothing() -> None:
    doc = summary(FOUR)
    for p in doc["policies"].values():
        for q in p["points"]:
            q["error"] = "boom"
    assert recommendation(doc) == "No run finished, so there is nothing to pick."


def test_the_summary_carries_it_and_a_new_target_rereads_it() -> None:
    outcomes = [outcome(0, 0.5, 120.0, 0.999, 0), outcome(1, 0.7, 100.0, 0.97, 0)]
    scenario = {"name": "t", "window": {"start_s": 0.0, "end_s": 60.0}, "seed": 1}
    doc = summary_doc(group(outcomes, "iw-f", 0.99), scenario, "iw-f", 0.99, [], None, {})
    assert doc["recommendation"].startswith("Pick reactive (scaleOutEmu=0.5)")
    assert retarget(doc, 0.95)["recommendation"].startswith("Pick reactive (scaleOutEmu=0.7)")
