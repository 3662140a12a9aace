"""Donation and reclaim move a node between pools by relabelling it; a watch (what
the operator's informers use) must see both moves."""

from __future__ import annotations

from typing import Any

from kubernetes import client, watch

from e2e import inventory

NODE = "gpu-us-central-a100-serving-0"
POOL = inventory.POOL_LABEL


def set_pool(core: client.CoreV1Api, pool: str) -> None:
    core.patch_node(NODE, {"metadata": {"labels": {POOL: pool}}})


def watched_pools(core: client.CoreV1Api, since: str, until_pool: str) -> list[str]:
    """Pool labels of NODE seen by a watch from resourceVersion ``since``."""
    seen: list[str] = []
    w = watch.Watch()
    for event in w.stream(
        core.list_node,
        field_selector=f"metadata.name={NODE}",
        resource_version=since,
        timeout_seconds=30,
    ):
        seen.append(event["object"].metadata.labels.get(POOL, ""))
        if seen[-1] == until_pool:
            w.stop()
    return seen


def test_relabel_serving_to_spot_and_back_is_seen_by_a_watch(api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    assert core.read_node(NODE).metadata.labels[POOL] == "serving"
    start = core.list_node(field_selector=f"metadata.name={NODE}").metadata.resource_version

    set_pool(core, "spot")
    spot_nodes = {n.metadata.name for n in core.list_node(label_selector=f"{POOL}=spot").items}
    assert NODE in spot_nodes
    set_pool(core, "serving")

    seen = watched_pools(core, start, "serving")
    assert "spot" in seen and seen[-1] == "serving", seen
    assert seen.index("spot") < len(seen) - 1
    serving = {n.metadata.name for n in core.list_node(label_selector=f"{POOL}=serving").items}
    assert NODE in serving
