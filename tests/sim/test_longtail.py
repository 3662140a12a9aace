"""The long-tail scenario: every ServeGen client becomes a model of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from sageserve.sim.longtail import load_long_tail

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "long-tail"


def test_each_client_is_its_own_model_and_rates_are_skewed() -> None:
    lt = load_long_tail(SCENARIO, hours=0.5)
    assert lt.end_s - lt.start_s == pytest.approx(1800.0)
    assert len(lt.models) > 20  # many models, one per client that sent something
    assert all(m.startswith("m-large-client-") for m in lt.models)
    assert all(r.prompt + r.output <= lt.perf.context_length for r in lt.requests)
    rates = sorted(f.rate_rps for f in lt.forecasts())
    # a long tail: the median model is far below the busiest
    assert rates[len(rates) // 2] * 10 < rates[-1]
    for f in lt.forecasts():
        assert f.peak_tokens_per_s is not None and f.peak_tokens_per_s >= f.tokens_per_s


def test_a_missing_field_is_named(tmp_path: Path) -> None:
    (tmp_path / "long-tail.yaml").write_text("name: x\nwindow: {start: 0s}\n")
    with pytest.raises(ValueError, match=r"window\.duration"):
        load_long_tail(tmp_path)


@pytest.mark.slow
def test_a_seed_draws_another_day_of_the_same_clients() -> None:
    # the per-client rates are the trace's; the seed draws arrival times and sizes
    default = load_long_tail(SCENARIO, hours=0.25)
    assert default.seed == 20250417  # the file's
    again = load_long_tail(SCENARIO, hours=0.25, seed=default.seed)
    assert [(r.t, r.model, r.prompt) for r in again.requests] == [
        (r.t, r.model, r.prompt) for r in default.requests
    ]
    other = load_long_tail(SCENARIO, hours=0.25, seed=1)
    assert other.seed == 1
    assert [r.t for r in other.requests] != [r.t for r in default.requests]
    # the busiest clients stay the busiest: the rates come from the trace, not the seed
    busiest = max(default.forecasts(), key=lambda f: f.rate_rps).name
    assert busiest == max(other.forecasts(), key=lambda f: f.rate_rps).name


def test_a_negative_seed_is_refused() -> None:
    with pytest.raises(ValueError, match="seed"):
        load_long_tail(SCENARIO, hours=0.1, seed=-1)
