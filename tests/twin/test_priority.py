"""The twin's pods honour vLLM's request `priority` as vLLM does: a pod run with
`--scheduling-policy priority` serves the lowest priority first (ties by arrival), one
without refuses a request carrying a priority (HTTP 400). So the router's tier priorities
(SageServe v3 §6.5) can be seen overtaking on the twin."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from sageserve.twin.clock import AcceleratedClock
from sageserve.twin.load import PriorityRefused
from sageserve.twin.pods import PodInfo, pod_info
from sageserve.twin.runner import Twin
from tests.twin.helpers import api_pod, pod, sim


def _with_args(*extra: str) -> PodInfo:
    raw = api_pod()
    raw["spec"]["containers"][0]["args"] += list(extra)
    info = pod_info(raw)
    assert info is not None
    return info


def test_the_pod_reads_its_scheduling_policy_from_vllms_arguments() -> None:
    assert _with_args("--scheduling-policy", "priority").priority_scheduling
    assert _with_args("--scheduling-policy=priority").priority_scheduling
    assert not _with_args().priority_scheduling
    # argparse: the last occurrence wins (the user's engine.args come after sageserve's)
    last = _with_args("--scheduling-policy", "priority", "--scheduling-policy", "fcfs")
    assert not last.priority_scheduling


def _first_tokens(priority_pod: bool, priorities: list[int]) -> list[float]:
    """One request occupies the pod (one sequence at a time), then one request per
    priority; their first-token times."""
    s = sim(load=0.0)
    s.sync([replace(pod("a"), priority_scheduling=priority_pod)])
    s.pods[("llm", "a")].instance.max_seqs = 1
    s.submit("llm", "a", 100, 200)
    jobs = []
    for p in priorities:
        s.advance(s.now + 0.01)
        job = s.submit("llm", "a", 100, 5, p)
        assert job is not None
        jobs.append(job)
    s.advance(s.now + 600)
    return [j.first_token for j in jobs]


def test_a_lower_priority_value_overtakes_on_a_priority_pod() -> None:
    normal, fast, batch = _first_tokens(True, [1, 0, 1001])
    assert fast < normal < batch


def test_a_pod_scheduling_fcfs_refuses_a_priority_and_serves_in_arrival_order() -> None:
    s = sim(load=0.0)
    s.sync([pod("a")])
    with pytest.raises(PriorityRefused):
        s.submit("llm", "a", 100, 5, 3)
    first, second = _first_tokens(False, [0, 0])
    assert first < second


@pytest.fixture
def twin() -> Iterator[Twin]:
    info = replace(pod("a"), priority_scheduling=True)
    with Twin(sim(load=0.0), AcceleratedClock(speed=20), lambda: [info, pod("f")],
              refresh_s=0.1, tick_s=0.02) as t:  # fmt: skip
        yield t


def _post(t: Twin, pod_name: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        f"http://{t.address}/pods/llm/{pod_name}/v1/completions",
        data=json.dumps({"model": "bloom", "prompt": "x" * 400, **body}).encode(),
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_over_http_a_priority_request_overtakes_and_fcfs_pods_refuse_one(twin: Twin) -> None:
    code, answer = _post(twin, "f", {"max_tokens": 5, "priority": 2})
    assert code == 400 and answer["error"]["param"] == "priority"  # type: ignore[index]
    code, answer = _post(twin, "a", {"max_tokens": 5, "priority": "high"})
    assert code == 400
    with twin.lock:
        twin.sim.pods[("llm", "a")].instance.max_seqs = 1  # the order alone decides
    # the order the pod served them in, on its simulated clock (the order the HTTP answers
    # reach their threads also depends on how loaded this machine is)
    jobs: dict[int, Any] = {}
    submit = twin.sim.submit

    def recording(namespace: str, pod_name: str, prompt: int, output: int, priority: int) -> Any:
        job = submit(namespace, pod_name, prompt, output, priority)
        jobs[output] = job
        return job

    twin.sim.submit = recording  # type: ignore[method-assign]

    def send(name: str, body: dict[str, object]) -> None:
        assert _post(twin, "a", body)[0] == 200

    threads = [threading.Thread(target=send, args=("busy", {"max_tokens": 1500}))]
    threads[0].start()
    _until(twin, 1)
    for name, priority, tokens in (("normal", 1, 5), ("fast", 0, 6)):
        body = {"max_tokens": tokens, "priority": priority}
        thread = threading.Thread(target=send, args=(name, body))
        threads.append(thread)
        thread.start()
        # the next one is sent once this one waits in the pod's simulated queue
        _until(twin, len(threads))
    for thread in threads:
        thread.join(timeout=60)
    busy, normal, fast = (jobs[n] for n in (1500, 5, 6))
    assert busy.first_token < fast.first_token < normal.first_token


def _until(t: Twin, requests: int, timeout: float = 10.0) -> None:
    """Until pod a's simulated instance holds `requests` requests (running or waiting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with t.lock:
            inst = t.sim.pods[("llm", "a")].instance
            if inst.waiting + inst.running == requests:
                return
        time.sleep(0.01)
    raise AssertionError("timed out")
