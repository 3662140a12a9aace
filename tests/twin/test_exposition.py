"""vLLM-format metrics: the names current vLLM serves, matched by the operator's queries."""

from __future__ import annotations

import re

from sageserve.metrics import queries, vllm
from sageserve.twin.exposition import encode, families
from tests.twin.helpers import pod, sim

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def exposed(accept: str | None, **kw: bool) -> tuple[str, str]:
    s = sim(load=2)
    s.sync([pod("a")])
    s.advance(120)
    body, content_type = encode(families(s.samples(), **kw), accept)
    return body.decode(), content_type


def sample_names(text: str) -> set[str]:
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_prometheus_gets_openmetrics_whose_names_match_the_operators_queries() -> None:
    text, content_type = exposed(PROMETHEUS_ACCEPT)
    assert content_type.startswith("application/openmetrics-text")
    names = sample_names(text)
    for name, wanted in (
        ("kv", (vllm.KV_CACHE_USAGE,)),
        ("prompt", (vllm.PROMPT_TOKENS,)),
        ("generation", (vllm.GENERATION_TOKENS,)),
        ("waiting", (vllm.REQUESTS_WAITING,)),
        ("ttft", (f"{vllm.TTFT}_bucket",)),
    ):
        pattern = queries.name_pattern(*wanted)
        assert [n for n in names if re.fullmatch(pattern, n)], (name, pattern, names)
    assert 'model_name="bigscience/bloom"' in text
    assert "pod=" not in text  # a pod's own endpoint: the scrape adds the pod labels


def test_a_text_format_scraper_gets_vllm_colon_names() -> None:
    text, content_type = exposed("text/plain")
    assert content_type.startswith("text/plain")
    names = sample_names(text)
    assert {
        vllm.KV_CACHE_USAGE,
        vllm.REQUESTS_RUNNING,
        vllm.REQUESTS_WAITING,
        vllm.PROMPT_TOKENS,
        vllm.GENERATION_TOKENS,
        f"{vllm.TTFT}_bucket",
        f"{vllm.E2E}_count",
        "vllm:request_success_total",
        "vllm:num_preemptions_total",
        vllm.CACHE_CONFIG,
    } <= names


def test_one_endpoint_for_every_pod_puts_the_pod_labels_on_the_series() -> None:
    text, _ = exposed("text/plain", with_pod_labels=True)
    line = next(ln for ln in text.splitlines() if ln.startswith(vllm.KV_CACHE_USAGE))
    for label in ('namespace="llm"', 'model_deployment="bloom-176b"', 'region="us-east"'):
        assert label in line
    assert 'pod="a"' in line and 'variant="a100"' in line


def test_cache_config_reports_the_kv_capacity_in_blocks() -> None:
    text, _ = exposed("text/plain")
    line = next(ln for ln in text.splitlines() if ln.startswith(vllm.CACHE_CONFIG + "{"))
    blocks = int(re.search(r'num_gpu_blocks="(\d+)"', line).group(1))  # type: ignore[union-attr]
    assert blocks == 55679 // 16  # bloom-176b on 8 A100s
