"""Out-of-sample protocol: choose on some days, report on others and on
another trace; the choice never sees a reported hour."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.forecast import ForecastSpec
from sageserve.forecast.backtest import HourScore, Scores
from sageserve.forecast.protocol import (
    choose,
    day_origins,
    parse_days,
    run_protocol,
)

from .test_forecast import diurnal


@pytest.mark.parametrize(
    ("text", "expected"), [("1-7", (1, 7)), ("8–14", (8, 14)), (" 3 ", (3, 3)), ("2-2", (2, 2))]
)
def test_parse_days(text: str, expected: tuple[int, int]) -> None:
    assert parse_days(text) == expected


@pytest.mark.parametrize("text", ["0-3", "5-2", "a-b", "1-", ""])
def test_parse_days_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="day"):
        parse_days(text)


@pytest.mark.parametrize(
    ("spec", "days", "expected"),
    [
        # 10-minute steps, next hour's peak: day 8 = origins 1008..1146 (window ends by 1152).
        (ForecastSpec(), (8, 14), range(1008, 2011)),
        (ForecastSpec(), (1, 7), range(0, 1003)),
        # [now+20 min, now+60 min]: a window may start in the range before the decision.
        (ForecastSpec(lead_seconds=1200), (2, 2), range(142, 283)),
    ],
)
def test_day_origins_keep_every_actual_window_inside_its_days(
    spec: ForecastSpec, days: tuple[int, int], expected: range
) -> None:
    origins = day_origins(days, spec)
    assert origins == expected
    first, last = spec.steps()
    lo, hi = (days[0] - 1) * 144, days[1] * 144
    assert all(lo <= t + first - 1 and t + last <= hi for t in (origins[0], origins[-1]))


def fake(method: str, errors: list[float], spreads: list[float]) -> Scores:
    """Decisions at origins 0..n-1 with actual 100, point 100 × (1 + error), and uppers at
    q = 0.8 / 0.9 of 100 × (1 + spread) per hour."""
    hours = tuple(
        HourScore(t, 100.0, 100.0 * (1 + e), (100.0 * (1 + s), 100.0 * (1 + s + 0.2)), False, 0.0)
        for t, (e, s) in enumerate(zip(errors, spreads, strict=True))
    )
    return Scores(method, (0.8, 0.9), hours, ())


def test_the_rule_takes_the_lowest_mape_then_the_smallest_quantile_reaching_the_target() -> None:
    # Hours 0-3 are the choose hours; hours 4-7 would favour the other method: never seen.
    scores = {
        "a": fake("a", [0.1] * 4 + [0.5] * 4, [-0.1, 0.1, 0.1, 0.1] + [0.0] * 4),
        "b": fake("b", [0.2] * 4 + [0.0] * 4, [0.1] * 8),
    }
    picked = choose(scores, range(0, 4), "days 1-1", target=0.75)
    assert (picked.method, picked.quantile) == ("a", 0.8)
    assert picked.row.coverage == pytest.approx(0.75)
    picked = choose(scores, range(0, 4), "days 1-1", target=0.9)
    assert (picked.method, picked.quantile) == ("a", 0.9)  # 0.8 covers 75 % only
    assert choose(scores, range(4, 8), "days 2-2").method == "b"


def test_protocol_chooses_on_some_days_and_reports_on_others_and_across_series() -> None:
    series = {"one": diurnal(4, seed=1), "two": 3.0 * diurnal(4, seed=2, noise=0.1)}
    result = run_protocol(
        series,
        choose_days=(1, 2),
        report_days=(3, 4),
        candidates=("persistence", "moving-average"),
        quantiles=(0.8, 0.9),
    )
    assert set(result.within) == {"one", "two"}
    assert [r.protocol for r in result.within["one"]] == ["in-sample", "out-of-sample"]
    out = result.within["one"][1]
    assert out.choice.on == "one days 1–2" and out.on == "one days 3–4"
    assert out.row.hours == 48  # every hour of days 3 and 4
    assert out.choice.row.hours == 24  # decisions from h24: day 2 only
    assert out.baseline.method == "persistence"
    assert [(r.choice.on, r.on) for r in result.cross] == [
        ("one days 1–2", "two days 3–4"),
        ("two days 1–2", "one days 3–4"),
    ]
    assert [q.quantile for q in result.quantiles["one"]] == [0.8, 0.85, 0.9]


def test_protocol_refuses_overlapping_days_and_says_when_a_series_is_short() -> None:
    series = {"one": diurnal(3)}
    with pytest.raises(ValueError, match="must end before"):
        run_protocol(series, choose_days=(1, 2), report_days=(2, 3))
    result = run_protocol(
        series, choose_days=(1, 2), report_days=(3, 5), candidates=("persistence",)
    )
    assert result.report_days == (3, 3)
    assert any("spans 3 days" in n for n in result.notes)
    with pytest.raises(ValueError, match="nothing to report"):
        run_protocol(series, choose_days=(1, 3), report_days=(4, 5))


def write_servegen(path: Path, series: np.typing.NDArray[np.float64]) -> Path:
    rows = ["window_start_s,total_rate_rps,input_tokens_mean_weighted,output_tokens_mean_weighted"]
    rows += [f"{600 * i},{v:.4f},100,20" for i, v in enumerate(series)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_backtest_cli_runs_the_protocol_and_prints_its_tables(tmp_path: Path) -> None:
    a = write_servegen(tmp_path / "language_m-a_aggregate_10min.csv", diurnal(4, seed=3) / 100)
    b = write_servegen(tmp_path / "language_m-b_aggregate_10min.csv", diurnal(4, seed=4) / 50)
    result = CliRunner().invoke(
        app,
        [
            "forecast",
            "backtest",
            "--trace",
            str(a),
            "--trace",
            str(b),
            "--method",
            "persistence,moving-average",
            "--choose-days",
            "1-2",
            "--report-days",
            "3-4",
        ],
        env={"COLUMNS": "250"},
    )
    assert result.exit_code == 0, result.output
    for text in ("out-of-sample", "in-sample", "cross-trace", "m-a days 1–2", "m-b days 3–4"):
        assert text in result.output
    bad = CliRunner().invoke(
        app,
        ["forecast", "backtest", "--trace", str(a), "--choose-days", "3-4", "--report-days", "1-2"],
    )
    assert bad.exit_code == 2 and "must end before" in bad.output
