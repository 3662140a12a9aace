"""A pooled pod in the twin: vLLM's sleep-mode API per engine, with simulated switch times,
the awake quota, and requests that a sleeping engine does not answer."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from sageserve.api.model_pool import ModelPool
from sageserve.controller.pool_podsets import render_pool_pod_set
from sageserve.twin.clock import AcceleratedClock
from sageserve.twin.load import LoadControl, PerfResolver, TwinSim
from sageserve.twin.pods import PodInfo, pod_info
from sageserve.twin.runner import Twin
from sageserve.twin.sleep_mode import PodEngines, transfer_seconds
from tests.twin.helpers import CATALOG, steady

H100 = "NVIDIA-H100-80GB-HBM3"


def pool_doc(models: int = 3, awake: int = 2) -> ModelPool:
    return ModelPool.model_validate(
        {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "ModelPool",
            "metadata": {"name": "tail"},
            "spec": {
                "models": [{"name": f"m{i}", "model": f"acme/ft-{i}"} for i in range(models)],
                "variant": {"name": "h100", "gpuType": H100, "gpusPerInstance": 4},
                "regions": [{"name": "us-east", "maxInstances": 2}],
                "awakePerInstance": awake,
                "tiers": ["iw-f"],
                "policyRef": {"name": "fleet"},
            },
        }
    )


def pooled_pod(name: str = "tail-us-east-h100-0") -> PodInfo:
    """A Running pod of the pod set the operator renders for the pool."""
    d = render_pool_pod_set(pool_doc(), pool_doc().spec.regions[0], 1, "llm")
    template = d["spec"]["template"]
    pod = {
        "metadata": {"name": name, "namespace": "llm", **template["metadata"]},
        "spec": {**template["spec"], "nodeName": "gpu-0"},
        "status": {"phase": "Running"},
    }
    info = pod_info(pod)
    assert info is not None
    return info


def test_the_pod_info_of_a_pooled_pod_names_its_engines_and_quota() -> None:
    info = pooled_pod()
    assert [(e.served_name, e.port) for e in info.engines] == [
        ("acme/ft-0", 8000),
        ("acme/ft-1", 8001),
        ("acme/ft-2", 8002),
    ]
    assert info.awake_quota == 2 and info.gpu_type == H100 and info.gpus == 4


def test_switch_time_is_the_weights_over_the_host_links() -> None:
    # Llama-2-70B: 138 GB of bf16 weights, a quarter per H100, 64 GB/s each
    assert transfer_seconds("llama-2-70b", H100, 4) == pytest.approx(0.539, abs=0.001)


def test_engines_wake_and_sleep_in_simulated_time_within_the_quota() -> None:
    info = pooled_pod()
    e = PodEngines.of(list(info.engines), info.awake_quota, 0.5)
    assert e.is_sleeping("acme/ft-0", 0.0)
    assert e.wake("acme/ft-0", 0.0) == 0.5
    assert e.is_sleeping("acme/ft-0", 0.4) and not e.is_sleeping("acme/ft-0", 0.5)
    assert e.wake("acme/ft-1", 1.0) == 1.5
    with pytest.raises(RuntimeError, match="out of memory"):
        e.wake("acme/ft-2", 2.0)
    assert e.sleep("acme/ft-0", 2.0) == 2.5
    with pytest.raises(RuntimeError, match="out of memory"):  # still leaving the GPUs
        e.wake("acme/ft-2", 2.2)
    assert e.wake("acme/ft-2", 2.5) == 3.0
    assert e.state(3.0) == {"acme/ft-0": "asleep", "acme/ft-1": "awake", "acme/ft-2": "awake"}


@pytest.fixture
def twin() -> Iterator[Twin]:
    info = pooled_pod()
    clock = AcceleratedClock(speed=1)
    resolve = PerfResolver(CATALOG, {"tail": "llama-2-70b"}).resolve
    fleet = TwinSim(steady(), resolve, LoadControl(scale=0.0))
    t = Twin(fleet, clock, lambda: [info], refresh_s=0.1, tick_s=0.05)
    with t:
        yield t


def call(t: Twin, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://{t.address}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


POD = "/pods/llm/tail-us-east-h100-0"
ASK = {"model": "acme/ft-1", "prompt": "hi", "max_tokens": 4}


@pytest.mark.slow
def test_over_http_a_sleeping_engine_answers_only_after_it_is_woken(twin: Twin) -> None:
    assert call(twin, "GET", f"{POD}/port/8001/is_sleeping") == (200, {"is_sleeping": True})
    code, body = call(twin, "POST", f"{POD}/port/8001/v1/completions", ASK)
    assert code == 503 and "sleeping" in body["error"]["message"]
    # a request sent while the engine wakes waits for it and is served
    answer: dict[str, Any] = {}
    waking = threading.Thread(
        target=lambda: answer.update(wake=call(twin, "POST", f"{POD}/port/8001/wake_up"))
    )
    waking.start()
    deadline = time.monotonic() + 10
    while call(twin, "GET", "/status")[1]["engines"][POD[6:]]["acme/ft-1"] != "waking":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    code, body = call(twin, "POST", f"{POD}/port/8001/v1/completions", ASK)
    assert code == 200 and body["usage"]["completion_tokens"] == 4
    waking.join(10)
    assert answer["wake"] == (200, None)
    assert call(twin, "GET", f"{POD}/port/8001/is_sleeping") == (200, {"is_sleeping": False})
    # without a port the body's model picks the engine
    assert call(twin, "POST", f"{POD}/v1/completions", ASK)[0] == 200
    # the quota: a third engine cannot wake before one sleeps
    assert call(twin, "POST", f"{POD}/port/8000/wake_up")[0] == 200
    code, body = call(twin, "POST", f"{POD}/port/8002/wake_up")
    assert code == 500 and "out of memory" in body["error"]["message"]
    assert call(twin, "POST", f"{POD}/port/8000/sleep?level=1")[0] == 200
    assert call(twin, "POST", f"{POD}/port/8002/wake_up")[0] == 200
    assert call(twin, "GET", "/status")[1]["engines"][POD[6:]] == {
        "acme/ft-0": "asleep",
        "acme/ft-1": "awake",
        "acme/ft-2": "awake",
    }
    assert call(twin, "POST", f"{POD}/port/9999/wake_up")[0] == 404
