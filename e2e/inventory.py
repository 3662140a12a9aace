"""Node inventories: plain v1.Node YAML files in ``e2e/inventory/``.

Why plain Nodes: the simulator reads the same files, and ``kubectl create`` accepts
them as-is (status included, as a kubelet registering itself would send it). KWOK's
controller then keeps them Ready as fake nodes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from e2e import kubectl, procs
from sageserve.core.labels import DEFAULT_NODE_LABELS
from sageserve.core.labels import GPU_RESOURCE as GPU_RESOURCE  # re-exported for the tests

INVENTORY_DIR = Path(__file__).resolve().parent / "inventory"
DEFAULT_INVENTORY = INVENTORY_DIR / "small.yaml"

REGION_LABEL = DEFAULT_NODE_LABELS.region
GPU_PRODUCT_LABEL = DEFAULT_NODE_LABELS.gpu_type
POOL_LABEL = DEFAULT_NODE_LABELS.pool


def resolve(name_or_path: str | Path) -> Path:
    """Accept a path, or a bare name like ``paper-3regions`` looked up in e2e/inventory/."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = INVENTORY_DIR / (path.name if path.suffix else f"{path.name}.yaml")
    if candidate.is_file():
        return candidate
    raise FileNotFoundError(f"no inventory {name_or_path!r} (looked in {INVENTORY_DIR})")


def load_nodes(path: Path) -> list[dict[str, Any]]:
    """The Node objects of an inventory file, in file order."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if doc.get("kind") != "Node":
            kind = doc.get("kind")
            raise ValueError(f"{path}: an inventory holds only v1 Node objects, got {kind}")
    return docs


def create_nodes(kubeconfig: Path, path: Path) -> list[str]:
    """Create the inventory's nodes (skipping ones that exist) and return their names."""
    nodes = load_nodes(path)
    existing = set(kubectl.kubectl(kubeconfig, ["get", "nodes", "-o", "name"]).split())
    fresh = [n for n in nodes if f"node/{n['metadata']['name']}" not in existing]
    if fresh:
        doc = {"apiVersion": "v1", "kind": "List", "items": fresh}
        kubectl.kubectl(kubeconfig, ["create", "-f", "-"], stdin=json.dumps(doc))
    return [n["metadata"]["name"] for n in nodes]


def ready_nodes(kubeconfig: Path) -> set[str]:
    """Names of nodes whose Ready condition is True."""
    out = json.loads(kubectl.kubectl(kubeconfig, ["get", "nodes", "-o", "json"]))
    ready = set()
    for item in out["items"]:
        for cond in item.get("status", {}).get("conditions", []):
            if cond["type"] == "Ready" and cond["status"] == "True":
                ready.add(item["metadata"]["name"])
    return ready


def wait_ready(kubeconfig: Path, names: list[str], timeout: float = 60.0) -> None:
    """Wait until KWOK has marked every named node Ready."""
    procs.wait_until(
        lambda: set(names) <= ready_nodes(kubeconfig),
        timeout,
        f"{len(names)} KWOK nodes to become Ready",
        interval=0.5,
    )
