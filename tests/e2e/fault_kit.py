"""What the fault tests share (docs/reliability.md): a policy's conditions, Events, a pod
set's replicas held over time, and the figures each test prints for the table.

Figures go to the real stderr (not pytest's capture) as `reliability: <fault>: <what>`
lines, so a run of `pytest -m slow tests/e2e -s` or the CI log shows what was measured.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e_helpers import eventually, kubectl
from operator_kit import policy_status


def condition(kubeconfig: Path, namespace: str, type_: str) -> dict[str, Any] | None:
    """The ScalingPolicy `fleet`'s condition of `type_` (None before it is set)."""
    found = [c for c in policy_status(kubeconfig, namespace).get("conditions", [])]
    return next((c for c in found if c["type"] == type_), None)


def wait_condition(
    kubeconfig: Path, namespace: str, type_: str, status: str, timeout: float, reason: str = ""
) -> dict[str, Any]:
    """Until `type_` has `status` (and `reason`, when given); the condition."""

    def probe() -> dict[str, Any] | None:
        c = condition(kubeconfig, namespace, type_)
        if c and c["status"] == status and (not reason or c["reason"] == reason):
            return c
        return None

    return eventually(probe, timeout, f"{type_}={status} {reason}".strip(), interval=0.5)


def events(kubeconfig: Path, namespace: str, reason: str | None = None) -> list[dict[str, Any]]:
    """The namespace's Events (of one reason), oldest first."""
    out = kubectl(kubeconfig, ["get", "events", "-n", namespace, "-o", "json"]).stdout
    items = [e for e in json.loads(out)["items"] if reason is None or e.get("reason") == reason]
    return sorted(items, key=lambda e: e.get("firstTimestamp") or e["metadata"]["name"])


def deployment(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    out = kubectl(kubeconfig, ["get", "deployment", name, "-n", namespace, "-o", "json"])
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def pods(kubeconfig: Path, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = kubectl(kubeconfig, ["get", "pods", "-n", namespace, "-l", selector, "-o", "json"])
    return list(json.loads(out.stdout)["items"])


def steady(probe: Callable[[], Any], seconds: float, what: str, interval: float = 1.0) -> Any:
    """`probe()` keeps one value for `seconds` (no flapping); that value."""
    first = probe()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(interval)
        now = probe()
        assert now == first, f"{what} moved from {first!r} to {now!r}"
    return first


def figure(fault: str, what: str) -> None:
    """One measured figure for docs/reliability.md, on the real stderr."""
    sys.__stderr__.write(f"reliability: {fault}: {what}\n")
    sys.__stderr__.flush()
