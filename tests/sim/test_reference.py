"""The paper's reference policies end to end: `sageserve compare` sweeps `reactive-paper` and
`chiron` on the tiny scenario through the CLI, and `--reference` runs LT-UA with the
realised future next to the lower bound, kept in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.cli import app
from sageserve.sim.reference import realised_future
from sageserve.sim.workload import TokenSeries

TINY = Path(__file__).parent / "fixtures" / "tiny"
KEY = ("llama", "us-east")


def _series(prompt: list[float], decode: list[float]) -> TokenSeries:
    return TokenSeries(0.0, {KEY: np.array(prompt)}, {KEY: np.array(decode)}, {}, {})


@pytest.mark.parametrize(
    ("granularity", "horizon", "now", "want"),
    [
        # per minute, from the minute that starts now, up to the horizon
        (60, 180, 60.0, [3.0, 5.0, 7.0]),
        # 2-minute steps: the mean of each two minutes after now
        (120, 240, 0.0, [2.0, 6.0]),
        # the window ends before the horizon: what there is
        (60, 3600, 180.0, [7.0, 9.0]),
    ],
)
def test_the_realised_future_is_the_interactive_load_of_each_step_after_now(
    granularity: int, horizon: int, now: float, want: list[float]
) -> None:
    series = _series([0.0, 1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0, 5.0])  # sums 1,3,5,7,9
    spec = ScalingPolicySpec.model_validate(
        {
            "intervals": {"planSeconds": min(horizon, 3600)},
            "forecast": {"granularitySeconds": granularity, "horizonSeconds": horizon,
                         "trainingWindowSeconds": 3600},
            "forecastGap": {"windowSeconds": 60},
        }
    )  # fmt: skip
    assert realised_future(series, now, spec) == {KEY: want}


@pytest.mark.slow
def test_compare_runs_the_reference_policies_and_the_achievable_reference(
    tmp_path: Path,
) -> None:
    args = [
        "compare", "-s", str(TINY), "-o", str(tmp_path), "--workers", "1", "--no-report",
        "-p", "reactive,reactive-paper,chiron,lt-ua", "--reference",
        "--grid", "reactive:thresholds.scaleOutEmu=0.7",
        "--grid", "reactive-paper:thresholds.scaleOutEmu=0.7",
        "--grid", "chiron:chiron.interactiveBusyAbove=0.4,0.8",
        "--grid", "lt-ua:forecast.quantile=0.5",
    ]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["runs"]["failed"] == 0
    assert list(doc["policies"]) == ["reactive", "reactive-paper", "chiron", "lt-ua"]
    chiron = doc["policies"]["chiron"]["points"]
    assert [p["label"] for p in chiron] == ["interactiveBusyAbove=0.4", "interactiveBusyAbove=0.8"]
    # Θ reaches the simulated strategy: a lower one scales out sooner, more GPU-hours
    assert chiron[0]["gpu_hours"] > chiron[1]["gpu_hours"]
    ref = doc["reference"]
    assert (ref["policy"], ref["setting"]) == ("lt-ua", "forecast.method=realised")
    assert ref["gpu_hours"] >= doc["bounds"]["lower_bound_gpu_hours"] - 1e-6
    assert "achievable reference" in res.output and "lower bound" in res.output


def test_simulate_refuses_an_unknown_policy_naming_the_available_ones(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["simulate", "-s", str(TINY), "-o", str(tmp_path), "-p", "chiro"])
    assert res.exit_code == 2
    assert "chiron" in res.output and "reactive-paper" in res.output
