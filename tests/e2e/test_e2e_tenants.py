"""Two teams behind one router on the real control plane: each key sees only its own
namespace's models, files and batches, a header cannot raise a key's tier, a key taken
out of its Secret stops working after the next key resync, and a key Secret that cannot
be read fails closed.

Tenant A runs the full fleet (operator, twin, a bloom pod); tenant B has a ModelDeployment
of its own with no pod (its requests are held, then 503), which is enough to show whose
model a key reaches: another tenant's model is 404 for it, as if it did not exist.
Requests travel over real HTTP through `sageserve router --auth required`.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from e2e_helpers import eventually, kubectl
from fault_kit import figure
from kopf.testing import KopfRunner
from operator_kit import (
    RouterProcess,
    TwinProcess,
    apply,
    operator_args,
    operator_env,
    prepare_namespace,
    scaling_policy,
    tier_keys,
)
from test_e2e_router import SERVED, TRACE, bloom, request

#: tenant B's model (a ModelDeployment of its own, never started)
SERVED_B = "org/tenant-b-model"
KEY_A, KEY_A_NEW, KEY_B = "sk-team-a-1", "sk-team-a-2", "sk-team-b-1"
#: how often the router reads the key Secrets again (the bound on revocation)
RESYNC_S = 5


def key_secret(kubeconfig: Path, namespace: str, key: str) -> None:
    """The namespace's Secret `keys` holding one key, listed by its iw-f and niw tiers."""
    tier_keys(kubeconfig, namespace, "keys", {"client": key}, "iw-f", "niw")


@pytest.fixture
def tenant_b(kubeconfig: Path) -> Iterator[str]:
    name = f"tenant-b-{uuid.uuid4().hex[:6]}"
    prepare_namespace(kubeconfig, name)
    model = bloom(["us-east"], 0, 1)
    model["metadata"]["name"] = "tenant-b-model"
    model["spec"]["model"] = {"name": SERVED_B}
    apply(kubeconfig, name, scaling_policy("reactive"), model)
    key_secret(kubeconfig, name, KEY_B)
    try:
        yield name
    finally:
        kubectl(kubeconfig, ["delete", "namespace", name, "--wait=false"], check=False)


def call(
    router: RouterProcess, method: str, path: str, key: str | None, **kw: Any
) -> requests.Response:
    headers = {"x-sageserve-region": "us-east", **kw.pop("headers", {})}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return requests.request(method, router.url + path, headers=headers, timeout=60, **kw)


def models(router: RouterProcess, key: str | None) -> list[str] | int:
    r = call(router, "GET", "/v1/models", key)
    return [m["id"] for m in r.json()["data"]] if r.status_code == 200 else r.status_code


def upload(router: RouterProcess, key: str, model: str) -> str:
    line = {
        "custom_id": "q-1",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": model, "prompt": "Say hello.", "max_tokens": 8},
    }
    files = {"file": ("input.jsonl", json.dumps(line).encode() + b"\n", "application/jsonl")}
    r = call(router, "POST", "/v1/files", key, data={"purpose": "batch"}, files=files)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


@pytest.mark.usefixtures("restore_node_pools")
def test_two_teams_behind_one_router_see_only_their_own_work(
    kubeconfig: Path,
    namespace: str,
    tenant_b: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    key_secret(kubeconfig, namespace, KEY_A)
    twin = TwinProcess(
        kubeconfig, namespace, prometheus_targets_dir, "--trace", str(TRACE), "--scale", "0.05"
    )
    router: RouterProcess | None = None
    try:
        with KopfRunner(operator_args(namespace), timeout=600):
            apply(kubeconfig, namespace, scaling_policy("reactive"), bloom(["us-east"], 1, 1))
            router = RouterProcess(
                kubeconfig,
                namespace,
                twin.url,
                prometheus_url,
                prometheus_targets_dir,
                "-n",
                tenant_b,
                "--auth",
                "required",
                "--hold-seconds",
                "3",
                "--key-resync-seconds",
                str(RESYNC_S),
            )
            a_request = request()
            eventually(
                lambda: (
                    call(router, "POST", "/v1/completions", KEY_A, json=a_request).status_code
                    == 200
                ),
                120,
                "tenant A served through the router with its key",
            )

            # models: each key sees its own namespace's; no key sees nothing
            assert models(router, KEY_A) == [SERVED]
            assert models(router, KEY_B) == [SERVED_B]
            assert models(router, None) == 401
            assert models(router, "sk-guess") == 401

            # requests: another tenant's model does not exist for a key; no key is 401
            b_request = {**a_request, "model": SERVED_B}
            for key, body, code in [
                (KEY_B, a_request, 404),
                (KEY_A, b_request, 404),
                (None, a_request, 401),
                ("sk-guess", a_request, 401),
                (KEY_B, b_request, 503),  # B's own model: reached, held, no pod yet
            ]:
                r = call(router, "POST", "/v1/completions", key, json=body)
                assert r.status_code == code, (key, body["model"], r.text)
                assert namespace not in r.text and tenant_b not in r.text
            # the header narrows among the key's tiers (iw-f, niw) and cannot add iw-n
            r = call(
                router,
                "POST",
                "/v1/completions",
                KEY_A,
                json=a_request,
                headers={"x-sageserve-tier": "iw-n"},
            )
            assert r.status_code == 403 and "iw-f, niw" in r.json()["error"]["message"], r.text

            # files and batches: each tenant's own, another's ids are 404
            file_a = upload(router, KEY_A, SERVED)
            for method, path in [
                ("GET", f"/v1/files/{file_a}"),
                ("GET", f"/v1/files/{file_a}/content"),
                ("DELETE", f"/v1/files/{file_a}"),
            ]:
                assert call(router, method, path, KEY_B).status_code == 404, path
            assert call(router, "GET", "/v1/files", KEY_B).json()["data"] == []
            create = {
                "input_file_id": file_a,
                "endpoint": "/v1/completions",
                "completion_window": "24h",
            }
            stolen = call(router, "POST", "/v1/batches", KEY_B, json=create)
            assert stolen.status_code in (400, 404), stolen.text
            r = call(router, "POST", "/v1/batches", KEY_A, json=create)
            assert r.status_code == 200, r.text
            batch_a = r.json()["id"]
            assert call(router, "GET", f"/v1/batches/{batch_a}", KEY_B).status_code == 404
            assert call(router, "POST", f"/v1/batches/{batch_a}/cancel", KEY_B).status_code == 404
            assert call(router, "GET", "/v1/batches", KEY_B).json()["data"] == []
            assert [b["id"] for b in call(router, "GET", "/v1/batches", KEY_A).json()["data"]] == [
                batch_a
            ]
            # B cannot put its lines on A's model either: the line fails, A's pods never see it
            file_b = upload(router, KEY_B, SERVED)
            r = call(router, "POST", "/v1/batches", KEY_B, json={**create, "input_file_id": file_b})
            if r.status_code == 200:  # accepted with the line failed (errors file), or refused
                batch_b = r.json()["id"]

                def b_closed() -> dict[str, Any] | None:
                    got = call(router, "GET", f"/v1/batches/{batch_b}", KEY_B).json()
                    return got if got["status"] in ("completed", "failed") else None

                closed = eventually(b_closed, 60, "tenant B's batch closed")
                assert closed["request_counts"]["completed"] == 0, closed
            else:
                assert r.status_code == 400, r.text

            # revocation: A's key replaced in its Secret stops working within the resync
            secret = json.loads(
                kubectl(kubeconfig, ["get", "secret", "keys", "-n", namespace, "-o", "json"]).stdout
            )
            secret["data"] = {"client": base64.b64encode(KEY_A_NEW.encode()).decode()}
            revoked_at = time.monotonic()
            kubectl(kubeconfig, ["replace", "-f", "-"], stdin=json.dumps(secret))
            eventually(
                lambda: call(router, "GET", "/v1/models", KEY_A).status_code == 401,
                RESYNC_S + 30,
                "the removed key refused",
            )
            took = time.monotonic() - revoked_at
            assert models(router, KEY_A_NEW) == [SERVED]
            figure(
                "key revoked",
                f"refused {took:.1f} s after the Secret changed (--key-resync-seconds {RESYNC_S})",
            )

            # key material that cannot be read fails closed: B's niw tier names a Secret
            # that does not exist; a key found nowhere is 503 (it may be in that Secret),
            # never let through, and B's own key keeps working
            patch = json.dumps({"spec": {"match": {"apiKeysSecretRef": {"name": "missing"}}}})
            kubectl(
                kubeconfig,
                ["patch", "workloadtier", "niw", "-n", tenant_b, "--type=merge", "-p", patch],
            )
            eventually(
                lambda: call(router, "GET", "/v1/models", "sk-guess").status_code == 503,
                RESYNC_S + 30,
                "an unknown key refused with 503 while a key Secret is unreadable",
            )
            assert models(router, None) == 401
            assert models(router, KEY_B) == [SERVED_B]
    finally:
        if router is not None:
            router.close()
        twin.close()
