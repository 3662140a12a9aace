"""The oserve-mixed scenario: it loads, its mix follows the phases, and the bundled
traces are what the documented transformation of the Azure 2023 traces gives.

Why: the benchmark's claims rest on this day; a file edited by hand or a transformation that
drifted from its README would silently change every figure in docs/results/oserve.md.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from sageserve.sim.mixed_day import CONTEXT_TOKENS, PHASES, derive
from sageserve.sim.scenario import default_scenario_dir, load_scenario
from sageserve.sim.traces import read_jsonl

SCENARIO = default_scenario_dir().parent / "oserve-mixed"
TRACES = default_scenario_dir().parent.parent / "data" / "traces" / "azure-llm-2023"


def test_the_scenario_loads_one_model_on_16_h100() -> None:
    sc = load_scenario(SCENARIO)
    assert [m.metadata.name for m in sc.models] == ["llama-2-70b"]
    assert sum(n.gpus for n in sc.nodes) == 16
    assert {n.gpu_type for n in sc.nodes} == {"NVIDIA-H100-80GB-HBM3"}
    assert sc.workload.duration_s == 8 * 3600.0
    assert [s.name for s in sc.workload.sources] == ["code", "conversation"]


@pytest.mark.slow
def test_each_hour_holds_its_phase_mix_and_every_request_fits_the_context() -> None:
    code = read_jsonl(SCENARIO / "code.jsonl.gz")
    conv = read_jsonl(SCENARIO / "conversation.jsonl.gz")
    per_hour = {"code": Counter(int(t // 3600) for t, _, _ in code)}
    per_hour["conversation"] = Counter(int(t // 3600) for t, _, _ in conv)
    for h, ph in enumerate(PHASES):
        n_code, n_conv = per_hour["code"][h], per_hour["conversation"][h]
        assert abs((n_code + n_conv) / 3600.0 - ph.rate) < 0.05 * ph.rate
        assert abs(n_code / (n_code + n_conv) - ph.code_share) < 0.03
    assert all(p + o <= CONTEXT_TOKENS for _, p, o in code + conv)
    # the two services keep their shapes: code long prompts and short outputs
    mean = lambda rows, i: sum(r[i] for r in rows) / len(rows)  # noqa: E731
    assert mean(code, 1) > mean(conv, 1) and mean(code, 2) < mean(conv, 2) / 3


@pytest.mark.slow
def test_the_bundled_hour_0_is_the_documented_transformation() -> None:
    day = derive(
        TRACES / "AzureLLMInferenceTrace_code.csv.gz",
        TRACES / "AzureLLMInferenceTrace_conv.csv.gz",
        phases=PHASES[:1],
    )
    for service, name in (("code", "code"), ("conversation", "conversation")):
        bundled = [r for r in read_jsonl(SCENARIO / f"{name}.jsonl.gz") if r[0] < 3600.0]
        got = [(round(t * 1000.0) / 1000.0, p, o) for t, p, o in day[service]]
        assert got == bundled


def test_the_scenario_files_are_small_enough_to_bundle() -> None:
    assert sum(p.stat().st_size for p in Path(SCENARIO).glob("*.gz")) < 4_000_000
