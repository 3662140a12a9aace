"""The comparison's summary and tables on hand-built outcomes: a point that misses NIW
deadlines shows its misses, carries the marker, and stays off the frontier, also when the
summary is read again at another target."""

from __future__ import annotations

from typing import Any

from sageserve.compare.grid import Job
from sageserve.compare.output import (
    NIW_MARK,
    POINT_HEAD,
    group,
    point_rows,
    retarget,
    summary_doc,
)
from sageserve.compare.runner import Outcome, Task, niw_metrics


def outcome(i: int, q: float, gpu: float, att: float, missed: int) -> Outcome:
    job = Job("reactive", (("thresholds.scaleOutEmu", q),), ())
    result: dict[str, Any] = {
        "gpu_hours": gpu,
        "provisioning_gpu_hours": 1.0,
        "instance_hours": gpu / 4,
        "slo": {"iw-f": att},
        "iw_ttft_p95_s": 0.5,
        "unfinished": missed,
        "refused": 0,
        "scale_events": 3,
        **niw_metrics(
            {
                "deadline_attainment": 1.0 - missed / 100,
                "misses": missed,
                "queued_beyond_horizon": 7,
                "feasible_at_max": True,
            }
        ),
        "summary": {},
        "wall_s": 1.0,
    }
    return Outcome(Task(i, "/x", job, None), result, None)


def doc(outcomes: list[Outcome]) -> dict[str, Any]:
    scenario = {"name": "t", "window": {"start_s": 0.0, "end_s": 60.0}, "seed": 1}
    return summary_doc(group(outcomes, "iw-f", 0.95), scenario, "iw-f", 0.95, [], None, {})


def test_a_point_with_niw_misses_is_marked_and_kept_off_the_frontier() -> None:
    d = doc([outcome(0, 0.5, 120.0, 0.96, 0), outcome(1, 0.9, 80.0, 0.97, 4)])
    p = d["policies"]["reactive"]
    ok, bad = p["points"]
    assert (ok["niw_missed"], ok["on_frontier"]) == (0, True)
    assert (bad["niw_missed"], bad["on_frontier"]) == (4, False)
    assert bad["niw_deadline_attainment"] == 0.96
    assert [f["label"] for f in p["frontier"]] == ["scaleOutEmu=0.5"]
    assert p["niw_excluded"] == 1
    assert p["at_target"]["gpu_hours"] == 120.0  # not the cheaper point that missed
    assert "1 point off: NIW misses" in p["at_target"]["note"]
    rows = {r[1]: dict(zip(POINT_HEAD, r, strict=True)) for r in point_rows(d)}
    assert rows["scaleOutEmu=0.9"]["front"] == NIW_MARK
    assert rows["scaleOutEmu=0.9"]["niw_missed"] == "4"
    assert rows["scaleOutEmu=0.9"]["NIW by deadline"] == "96.00%"
    assert rows["scaleOutEmu=0.5"]["front"] == "●"


def test_reading_again_at_another_target_keeps_points_with_misses_off() -> None:
    d = doc([outcome(0, 0.5, 120.0, 0.96, 0), outcome(1, 0.9, 80.0, 0.99, 2)])
    again = retarget(d, 0.9)["policies"]["reactive"]["at_target"]
    assert again["gpu_hours"] == 120.0 and again["status"] == "at-most"


def test_when_every_point_misses_the_note_says_so() -> None:
    d = doc([outcome(0, 0.5, 120.0, 0.96, 3)])
    at = d["policies"]["reactive"]["at_target"]
    assert at["gpu_hours"] is None
    assert at["note"] == "every point misses NIW deadlines inside the horizon (1)"
    assert retarget(d, 0.9)["policies"]["reactive"]["at_target"]["note"] == at["note"]
