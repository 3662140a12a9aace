"""Trace readers stream real data; the workload mapping is explicit and deterministic."""

from __future__ import annotations

import itertools
import random
import types
from pathlib import Path

import pytest

from sageserve.sim import traces
from sageserve.sim.workload import assign_by_volume, parse_duration

ROOT = Path(__file__).resolve().parents[2]
AZ = ROOT / "data/traces/azure-llm-2023"
SG = ROOT / "data/traces/servegen-bailian"


def test_azure_reader_yields_every_row_in_time_order() -> None:
    rows = traces.azure2023_rows(AZ / "AzureLLMInferenceTrace_conv.csv.gz")
    assert isinstance(rows, types.GeneratorType)
    rows = list(rows)
    assert len(rows) == 19366  # the README's count
    assert all(a.t <= b.t for a, b in itertools.pairwise(rows))
    assert rows[0].t == 0.0 and 3400 < rows[-1].t < 3600


def test_azure_repeat_and_rate_scale() -> None:
    p = AZ / "AzureLLMInferenceTrace_code.csv.gz"
    rows = list(traces.azure2023_rows(p, 0, 3600))
    one = len(rows)
    period = rows[-1].t * one / (one - 1)  # the hour is replayed back to back
    two_hours = sum(1 for _ in traces.azure2023_rows(p, 0, 7200, repeat=True))
    half = sum(1 for _ in traces.azure2023_rows(p, 0, 3600, rate_scale=0.5, seed=1))
    assert two_hours == pytest.approx(one * 7200 / period, rel=0.02)
    assert half == pytest.approx(one / 2, rel=0.05)


@pytest.fixture(scope="module")
def small_table() -> traces.ServeGenTable:
    return traces.ServeGenTable.load(SG / "language_m-small_client_windows_10min.csv.xz")


def test_servegen_volume_matches_the_published_rates(small_table: traces.ServeGenTable) -> None:
    knots = traces.load_token_knots(SG / "language_m-small_client_token_stats_6h.csv")
    scale, start, end = 0.002, 20 * 3600.0, 22 * 3600.0
    n = sum(1 for _ in traces.servegen_rows(small_table, knots, start, end, scale, seed=5))
    sel = (small_table.window >= start) & (small_table.window < end)
    expected = float((small_table.rate[sel] * 600).sum()) * scale
    assert n == pytest.approx(expected, rel=0.05)


def test_servegen_tokens_stay_within_the_published_support(
    small_table: traces.ServeGenTable,
) -> None:
    knots = traces.load_token_knots(SG / "language_m-small_client_token_stats_6h.csv")
    rows = list(traces.servegen_rows(small_table, knots, 0, 1800, 0.001, seed=2))
    assert rows and all(r.prompt >= 1 and r.output >= 1 for r in rows)
    for r in rows:
        k = knots.knots(r.client, 0)
        assert k is not None
        assert r.prompt <= k[0][-1] + 1 and r.output <= k[1][-1] + 1


def test_servegen_is_deterministic_per_seed(small_table: traces.ServeGenTable) -> None:
    knots = traces.load_token_knots(SG / "language_m-small_client_token_stats_6h.csv")
    a = list(traces.servegen_rows(small_table, knots, 0, 1200, 0.001, seed=7))
    b = list(traces.servegen_rows(small_table, knots, 0, 1200, 0.001, seed=7))
    c = list(traces.servegen_rows(small_table, knots, 0, 1200, 0.001, seed=8))
    assert a == b and a != c


def test_clients_are_assigned_to_categories_by_request_volume() -> None:
    rng = random.Random(0)
    volume = {c: rng.expovariate(1.0) for c in range(400)}
    got = assign_by_volume(volume, {"a": 0.7, "b": 0.3}, random.Random(1))
    share_a = sum(v for c, v in volume.items() if got[c] == "a") / sum(volume.values())
    assert share_a == pytest.approx(0.7, abs=0.02)
    assert got == assign_by_volume(volume, {"a": 0.7, "b": 0.3}, random.Random(1))


@pytest.mark.parametrize(("text", "seconds"), [(90, 90.0), ("15m", 900.0), ("1d12h", 129600.0)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bad_duration_is_refused_with_a_hint() -> None:
    with pytest.raises(ValueError, match="use seconds"):
        parse_duration("two days")


@pytest.mark.slow
def test_tokens_per_minute_before_the_window_counts_every_earlier_request() -> None:
    from dataclasses import replace

    from sageserve.sim.scenario import default_scenario_dir, load_scenario
    from sageserve.sim.workload import requests, tokens_per_minute

    sc = load_scenario(default_scenario_dir())
    wl = replace(sc.workload, duration_s=600.0)
    iw, niw = tokens_per_minute(wl, sc.tiers, 10)
    earlier = replace(wl, start_s=wl.start_s - 600.0, duration_s=600.0)
    want_iw = want_niw = 0
    for req in requests(earlier, sc.tiers):
        if req.tier.interactive:
            want_iw += req.prompt_tokens + req.output_tokens
        else:
            want_niw += req.prompt_tokens + req.output_tokens
    assert all(len(v) == 10 for v in [*iw.values(), *niw.values()])
    assert abs(sum(map(sum, iw.values())) * 60 - want_iw) < 1e-6 * want_iw
    assert abs(sum(map(sum, niw.values())) * 60 - want_niw) < 1e-6 * want_niw
    assert {m for m, _ in iw} == {md.metadata.name for md in sc.models}
    # no time before the trace's start
    early, _ = tokens_per_minute(replace(wl, start_s=120.0), sc.tiers, 10)
    assert early and all(len(v) == 2 for v in early.values())


@pytest.mark.parametrize(
    ("model", "tokens", "overflow", "want"),
    [
        ("bloom", 2000, ("llama2", "llama3"), "bloom"),  # fits: stays
        ("bloom", 3000, ("llama2", "llama3"), "llama2"),  # the first that holds it
        ("bloom", 9000, ("llama2", "llama3"), "llama3"),
        ("bloom", 200_000, ("llama2", "llama3"), "bloom"),  # none holds it: refused there
        ("bloom", 3000, (), "bloom"),  # no overflow: refused at arrival
        ("unknown", 10**6, ("llama2",), "unknown"),  # no context on record: no limit
    ],
)
def test_overflow_sends_a_request_to_the_first_model_whose_context_holds_it(
    model: str, tokens: int, overflow: tuple[str, ...], want: str
) -> None:
    from sageserve.sim.workload import overflow_model

    contexts = {"bloom": 2048, "llama2": 4096, "llama3": 131072}
    assert overflow_model(model, tokens, overflow, contexts) == want


@pytest.mark.slow
def test_overflow_moves_only_the_long_requests_and_keeps_the_rest_of_the_stream() -> None:
    from dataclasses import replace

    from sageserve.sim.scenario import default_scenario_dir, load_scenario
    from sageserve.sim.workload import requests

    sc = load_scenario(default_scenario_dir())
    wl = replace(sc.workload, duration_s=600.0)
    ctx = sc.contexts()
    plain = list(requests(wl, sc.tiers))
    moved = list(requests(wl, sc.tiers, ctx))
    assert len(plain) == len(moved)
    changed = [(a, b) for a, b in zip(plain, moved, strict=True) if a.model != b.model]
    assert changed, "the default scenario's m-large has requests beyond Bloom's 2,048 tokens"
    for a, b in changed:
        assert a.prompt_tokens + a.output_tokens > ctx[a.model]
        assert a.prompt_tokens + a.output_tokens <= ctx[b.model]
        assert (a.arrival, a.region, a.tier, a.prompt_tokens) == (
            b.arrival,
            b.region,
            b.tier,
            b.prompt_tokens,
        )


def test_a_workload_naming_a_model_the_scenario_does_not_serve_is_refused(
    tmp_path: Path,
) -> None:
    import shutil

    from sageserve.sim.scenario import default_scenario_dir, load_scenario

    for f in default_scenario_dir().iterdir():
        shutil.copy(f, tmp_path / f.name)
    wl = tmp_path / "workload.yaml"
    wl.write_text(
        wl.read_text()
        .replace("../../data", str(Path(__file__).resolve().parents[2] / "data"))
        .replace("overflow: [llama-2-70b, llama-3-1-8b]", "overflow: [llama-3-1-70b]")
    )
    with pytest.raises(ValueError, match="names model 'llama-3-1-70b'"):
        load_scenario(tmp_path)
