"""The live twin over HTTP: per-pod metrics, file_sd targets, load control, status."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sageserve.twin.clock import AcceleratedClock
from sageserve.twin.pods import PodInfo
from sageserve.twin.runner import Twin
from tests.twin.helpers import pending, pod, sim


class Pods:
    def __init__(self, pods: list[PodInfo]) -> None:
        self.pods = pods

    def __call__(self) -> list[PodInfo]:
        return list(self.pods)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Twin, Pods, Path]]:
    pods = Pods([pod("a"), pod("b", serving=False)])
    targets = tmp_path / "twin.json"
    twin = Twin(
        sim(load=1.0),
        AcceleratedClock(speed=20),
        pods,
        targets_file=targets,
        refresh_s=0.1,
        tick_s=0.05,
    )
    with twin:
        yield twin, pods, targets
    assert json.loads(targets.read_text()) == []  # stopping withdraws the targets


def get(twin: Twin, path: str, accept: str = "text/plain") -> tuple[int, str]:
    req = urllib.request.Request(f"http://{twin.address}{path}", headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def post(twin: Twin, path: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        f"http://{twin.address}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        out: dict[str, object] = json.loads(resp.read())
        return out


def eventually(probe, timeout: float = 10):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := probe():
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_each_serving_pod_has_its_own_metrics_path_and_pending_pods_none(
    running: tuple[Twin, Pods, Path],
) -> None:
    twin, _, _ = running
    code, text = get(twin, "/metrics/llm/a")
    assert code == 200 and "vllm:kv_cache_usage_perc" in text
    assert get(twin, "/metrics/llm/b")[0] == 404
    code, text = get(twin, "/metrics/pods")
    assert code == 200 and 'pod="a"' in text and 'pod="b"' not in text
    code, text = get(twin, "/metrics")
    assert "sageserve_twin_sim_time_seconds" in text


def test_the_targets_file_lists_serving_pods_with_the_scrape_labels(
    running: tuple[Twin, Pods, Path],
) -> None:
    twin, pods, targets = running
    [entry] = json.loads(targets.read_text())
    assert entry["targets"] == [twin.address]
    assert entry["labels"] == {
        "namespace": "llm",
        "model_deployment": "bloom-176b",
        "region": "us-east",
        "variant": "a100",
        "pod": "a",
        "__metrics_path__": "/metrics/llm/a",
    }
    pods.pods = [pod("a"), pod("b")]  # b is scheduled and runs
    eventually(lambda: len(json.loads(targets.read_text())) == 2)
    assert eventually(lambda: get(twin, "/metrics/llm/b")[0] == 200)
    pods.pods = [pending(pod("a"))]
    eventually(lambda: json.loads(targets.read_text()) == [])


def test_time_runs_at_the_clock_speed_and_the_load_follows_the_control(
    running: tuple[Twin, Pods, Path],
) -> None:
    twin, _, _ = running
    ep = "llm/bloom-176b/us-east"

    def arrived() -> int:
        return int(json.loads(get(twin, "/status")[1])["endpoints"][ep]["arrived"])

    before = arrived()
    eventually(lambda: arrived() > before + 20)  # 20× speed: a request per 50 ms
    status = post(twin, "/load", {"multiplier": 0})
    assert status["overrides"] == {"*": 0.0}
    stopped = arrived()
    time.sleep(0.5)
    assert arrived() <= stopped + 2  # at most the copies already drawn
    status = post(twin, "/speed", {"speed": 1})
    assert status["speed"] == 1


def test_a_bad_control_request_is_refused(running: tuple[Twin, Pods, Path]) -> None:
    twin, _, _ = running
    with pytest.raises(urllib.error.HTTPError) as err:
        post(twin, "/load", {"multiplier": -1})
    assert err.value.code == 400


def test_listing_failures_keep_the_last_fleet(tmp_path: Path) -> None:
    calls = {"n": 0}

    def flaky() -> list[PodInfo]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise ConnectionError("API server away")
        return [pod("a")]

    with Twin(sim(), AcceleratedClock(speed=10), flaky, refresh_s=0.05, tick_s=0.02) as twin:
        eventually(lambda: twin.list_errors >= 2)
        assert get(twin, "/metrics/llm/a")[0] == 200


def test_a_pod_answers_the_openai_api_at_its_simulated_pace(
    running: tuple[Twin, Pods, Path],
) -> None:
    twin, _, _ = running
    before = twin.sim.endpoints[("llm", "bloom-176b", "us-east")].arrived
    answer = post(
        twin, "/pods/llm/a/v1/completions", {"model": "bloom", "prompt": "x" * 400, "max_tokens": 5}
    )
    assert answer["object"] == "text_completion"
    assert answer["usage"] == {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
    # the request joined the pod's simulated instance: counted with the trace's arrivals
    assert twin.sim.endpoints[("llm", "bloom-176b", "us-east")].arrived > before


def test_a_streamed_answer_arrives_token_by_token_then_done(
    running: tuple[Twin, Pods, Path],
) -> None:
    twin, _, _ = running
    req = urllib.request.Request(
        f"http://{twin.address}/pods/llm/a/v1/chat/completions",
        data=json.dumps(
            {
                "model": "bloom",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "stream": True,
            }
        ).encode(),
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        events = [line for line in resp.read().decode().splitlines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert text.count("tok") == 4 and all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_a_pod_that_does_not_serve_answers_404(running: tuple[Twin, Pods, Path]) -> None:
    twin, _, _ = running
    for path in ("/pods/llm/b/v1/completions", "/pods/llm/a/v1/embeddings"):
        with pytest.raises(urllib.error.HTTPError) as err:
            post(twin, path, {"model": "bloom", "prompt": "x"})
        assert err.value.code == 404


def test_a_request_beyond_the_context_length_is_refused_with_400(
    running: tuple[Twin, Pods, Path],
) -> None:
    """Bloom-176B's context is 2,048 tokens (its profile): 2,000 prompt tokens + 100 to
    generate are refused before reaching the engine, as vLLM's OpenAI server does."""
    twin, _, _ = running
    ep = twin.sim.endpoints[("llm", "bloom-176b", "us-east")]
    before = ep.refused
    with pytest.raises(urllib.error.HTTPError) as err:
        post(
            twin,
            "/pods/llm/a/v1/completions",
            {"model": "bloom", "prompt": "x" * 8000, "max_tokens": 100},
        )
    assert err.value.code == 400
    body = json.loads(err.value.read())
    assert body["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 2048 tokens" in body["error"]["message"]
    assert "2100 tokens (2000 in the messages, 100 in the completion)" in body["error"]["message"]
    assert ep.refused == before + 1
    assert twin.status()["endpoints"]["llm/bloom-176b/us-east"]["refused"] == before + 1
    # within the context: answered
    ok = post(
        twin,
        "/pods/llm/a/v1/completions",
        {"model": "bloom", "prompt": "x" * 7600, "max_tokens": 100},
    )
    assert ok["usage"]["total_tokens"] == 2000
