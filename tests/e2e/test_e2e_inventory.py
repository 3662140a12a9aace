"""The node inventories are the contract between the test cluster and the simulator:
plain v1.Node objects, labels from DESIGN.md, 8 allocatable GPUs per node."""

from __future__ import annotations

from itertools import product
from pathlib import Path

import pytest

from e2e import inventory

REGIONS = {"us-east", "us-central", "us-west"}
GPU_TYPES = {"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"}
POOLS = {"serving", "spot"}
FILES = sorted(inventory.INVENTORY_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_inventory_covers_every_region_gpu_type_and_pool(path: Path) -> None:
    nodes = inventory.load_nodes(path)
    names = [n["metadata"]["name"] for n in nodes]
    assert len(names) == len(set(names)), "node names must be unique"
    combos = set()
    for node in nodes:
        labels = node["metadata"]["labels"]
        assert labels[inventory.REGION_LABEL] in REGIONS
        assert labels[inventory.GPU_PRODUCT_LABEL] in GPU_TYPES
        assert labels[inventory.POOL_LABEL] in POOLS
        assert labels["kubernetes.io/hostname"] == node["metadata"]["name"]
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert node["status"]["allocatable"][inventory.GPU_RESOURCE] == "8"
        combos.add(
            (
                labels[inventory.REGION_LABEL],
                labels[inventory.GPU_PRODUCT_LABEL],
                labels[inventory.POOL_LABEL],
            )
        )
    assert combos == set(product(REGIONS, GPU_TYPES, POOLS))


def test_inventory_by_name_resolves_to_the_file() -> None:
    assert inventory.resolve("paper-3regions") == inventory.INVENTORY_DIR / "paper-3regions.yaml"
    with pytest.raises(FileNotFoundError):
        inventory.resolve("no-such-inventory")
