"""The twin answering at each pod's own address (`pod_listeners`), as its vLLM would."""

from __future__ import annotations

import json
import random
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace

import pytest

from sageserve.core.pooled_engines import PooledEngine
from sageserve.twin.clock import AcceleratedClock
from sageserve.twin.pods import PodInfo, pod_info
from sageserve.twin.runner import Twin, pod_addresses, pod_listener_path
from tests.twin.helpers import api_pod, pod, sim
from tests.twin.test_runner import Pods, eventually


def loopback() -> str:
    """A loopback address few others use (all of 127/8 is local on Linux)."""
    return f"127.{random.randint(64, 250)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


def at(p: PodInfo, ip: str, port: int) -> PodInfo:
    return replace(p, pod_ip=ip, ports=(port,))


@pytest.fixture
def listening() -> Iterator[tuple[Twin, Pods, str, int]]:
    ip = loopback()
    port = free_port(ip)
    pods = Pods([at(pod("a"), ip, port)])
    twin = Twin(sim(load=1.0), AcceleratedClock(speed=20), pods, refresh_s=0.1, pod_listeners=True)
    with twin:
        yield twin, pods, ip, port
    assert twin.listeners == {}


def call(url: str, body: dict[str, object] | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_serving_pod_answers_metrics_health_and_completions_at_its_ip_and_port(
    listening: tuple[Twin, Pods, str, int],
) -> None:
    twin, _, ip, port = listening
    base = f"http://{ip}:{port}"
    code, text = call(f"{base}/metrics")
    assert code == 200
    assert 'vllm:num_requests_waiting{model_name="bigscience/bloom"}' in text
    assert "vllm:kv_cache_usage_perc" in text
    assert call(f"{base}/health") == (200, "ok\n")
    code, text = call(
        f"{base}/v1/completions", {"model": "bigscience/bloom", "prompt": "hi", "max_tokens": 4}
    )
    assert code == 200, text
    assert json.loads(text)["usage"]["completion_tokens"] == 4
    # the twin's controls are not the pod's
    assert call(f"{base}/load", {"multiplier": 0})[0] == 404
    assert call(f"{base}/status")[0] == 404
    assert call(f"{base}/metrics/pods")[0] == 404
    status = json.loads(call(f"http://{twin.address}/status")[1])
    assert status["listeners"] == {"llm/a": [f"{ip}:{port}"]}
    assert status["listenerErrors"] == {}


def test_the_listener_goes_when_the_pod_stops_serving_and_moves_with_its_ip(
    listening: tuple[Twin, Pods, str, int],
) -> None:
    twin, pods, ip, port = listening
    pods.pods = [replace(pods.pods[0], serving=False, phase="Succeeded")]
    eventually(lambda: twin.listeners == {})
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=5)
    other = loopback()
    pods.pods = [at(pod("a"), other, port)]
    eventually(lambda: list(twin.listeners) == [(other, port)])
    assert call(f"http://{other}:{port}/metrics")[0] == 200


def test_an_address_this_host_cannot_bind_is_reported_and_the_rest_still_listen() -> None:
    ip = loopback()
    port = free_port(ip)
    # 198.51.100.0/24 is TEST-NET-2: never an address of this host
    pods = Pods([at(pod("a"), ip, port), at(pod("b"), "198.51.100.7", 8000)])
    with Twin(sim(), AcceleratedClock(speed=20), pods, refresh_s=0.1, pod_listeners=True) as twin:
        status = json.loads(call(f"http://{twin.address}/status")[1])
        assert status["listeners"] == {"llm/a": [f"{ip}:{port}"]}
        assert list(status["listenerErrors"]) == ["198.51.100.7:8000"]
        assert "assign" in status["listenerErrors"]["198.51.100.7:8000"]


def test_without_the_option_nothing_listens_at_pod_addresses() -> None:
    ip = loopback()
    port = free_port(ip)
    with Twin(sim(), AcceleratedClock(speed=20), Pods([at(pod("a"), ip, port)])) as twin:
        assert twin.listeners == {}
        assert json.loads(call(f"http://{twin.address}/status")[1])["listeners"] == {}
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=5)


def test_pod_ip_and_container_ports_come_from_the_pod() -> None:
    raw = api_pod()
    raw["status"]["podIP"] = "127.1.0.7"
    raw["spec"]["containers"][0]["ports"] = [
        {"name": "http", "containerPort": 8000, "protocol": "TCP"},
        {"name": "udp", "containerPort": 9000, "protocol": "UDP"},
    ]
    info = pod_info(raw)
    assert info is not None
    assert (info.pod_ip, info.ports) == ("127.1.0.7", (8000,))
    pending = pod_info(api_pod(phase="Pending", node=None))
    assert pending is not None and (pending.pod_ip, pending.ports) == ("", ())


def test_a_pooled_pod_listens_at_each_engine_port_with_its_own_api() -> None:
    engines = (PooledEngine("m1", "org/m1", 8001), PooledEngine("m2", "org/m2", 8002))
    pooled = replace(pod("p"), pod_ip="127.9.0.1", ports=(8000,), engines=engines)
    assert pod_addresses([pooled, replace(pod("q"), pod_ip="", ports=(8000,))]) == {
        ("127.9.0.1", 8001): ("llm", "p", 8001),
        ("127.9.0.1", 8002): ("llm", "p", 8002),
    }
    assert pod_listener_path(("llm", "p", 8002), "/wake_up?tags=x") == (
        "/pods/llm/p/port/8002/wake_up?tags=x"
    )
    assert pod_listener_path(("llm", "p", None), "/v1/chat/completions") == (
        "/pods/llm/p/v1/chat/completions"
    )
    assert pod_listener_path(("llm", "p", None), "/metrics/") == "/metrics/llm/p"
    assert pod_listener_path(("llm", "p", None), "/speed") is None
