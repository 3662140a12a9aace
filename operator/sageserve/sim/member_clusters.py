"""A scenario's fleet of clusters: each cluster's nodes and the times its API server is silent.

`scenario.yaml` may declare the fleet as clusters instead of one inventory:

    clusters:
      - name: us-east-1
        inventory: nodes-us-east.yaml
      - name: eu-west-1
        inventory: nodes-eu-west.yaml
        silent: [{from: 2h, to: 2h30m}]

Each cluster's regions are those of its GPU nodes, as the operator reads them from each
member's API server (`plan.member_clusters`). While a cluster is silent its regions are
held: the plan leaves them out and keeps their instances, and the pace step does not act on
them (the operator can neither read nor write there). Its pods keep serving: silence is the
control plane's, not the data plane's, so requests still reach them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sageserve.plan.member_clusters import ClusterReading, fleet_view


@dataclass(frozen=True)
class SimCluster:
    """One member cluster of a simulated fleet."""

    name: str
    regions: frozenset[str]
    #: [from, to) in seconds of the run's clock during which its API server does not answer
    silent: tuple[tuple[float, float], ...] = ()

    def silent_at(self, now: float) -> bool:
        """Whether its API server is silent at `now`."""
        return any(start <= now < end for start, end in self.silent)


@dataclass(frozen=True)
class SimFleet:
    """The clusters of a scenario; a scenario without `clusters` has none (one cluster,
    never silent)."""

    clusters: tuple[SimCluster, ...] = ()

    def held_at(self, now: float) -> frozenset[str]:
        """Regions held at `now`: those of a silent cluster. The engine asks at every
        decision, so the view is built once per set of silent clusters."""
        silent = frozenset(c.name for c in self.clusters if c.silent_at(now))
        return _held_regions(self, silent) if silent else frozenset()

    def shifted(self, start_s: float) -> SimFleet:
        """The silent windows on the run's clock (they are written from the workload's
        start)."""
        return SimFleet(
            tuple(
                SimCluster(
                    c.name, c.regions, tuple((a + start_s, b + start_s) for a, b in c.silent)
                )
                for c in self.clusters
            )
        )


def parse_clusters(
    entries: object,
    regions_of: Mapping[str, frozenset[str]],
    duration: Callable[[Any], float],
) -> SimFleet:
    """`scenario.yaml`'s `clusters` list, with each cluster's regions (`regions_of`, read
    from its inventory). `duration` parses "30m"-style times. A bad entry is an error naming
    the field and the fix; a region in two clusters is refused (a scenario states its fleet,
    so there is nothing to hold)."""
    if not isinstance(entries, list) or not entries:
        raise ValueError("clusters: expected a list of {name, inventory, silent} entries")
    seen: dict[str, str] = {}
    out: list[SimCluster] = []
    for i, entry in enumerate(entries):
        where = f"clusters[{i}]"
        if not isinstance(entry, dict) or not entry.get("name"):
            raise ValueError(f"{where}: expected a mapping with a name and an inventory")
        name = str(entry["name"])
        if any(c.name == name for c in out):
            raise ValueError(f"{where}.name: {name!r} is declared twice; names are unique")
        regions = regions_of.get(name, frozenset())
        if not regions:
            raise ValueError(
                f"{where}.inventory: cluster {name!r} has no GPU node with a region label"
            )
        for region in sorted(regions):
            if region in seen:
                raise ValueError(
                    f"{where}.inventory: region {region!r} is in clusters {seen[region]!r} and "
                    f"{name!r}; a region lives in one cluster (rename one of them)"
                )
            seen[region] = name
        windows: list[tuple[float, float]] = []
        for j, window in enumerate(entry.get("silent") or []):
            at = f"{where}.silent[{j}]"
            if not isinstance(window, dict) or "from" not in window or "to" not in window:
                raise ValueError(f"{at}: expected {{from: 2h, to: 2h30m}}")
            start, end = duration(window["from"]), duration(window["to"])
            if not 0 <= start < end:
                raise ValueError(
                    f"{at}: from ({window['from']}) must come before to ({window['to']})"
                )
            windows.append((start, end))
        out.append(SimCluster(name, regions, tuple(windows)))
    return SimFleet(tuple(out))


@functools.cache
def _held_regions(fleet: SimFleet, silent: frozenset[str]) -> frozenset[str]:
    """The regions `plan.member_clusters.fleet_view` holds when `silent` do not answer."""
    home = {r: c.name for c in fleet.clusters for r in c.regions}
    readings = [
        ClusterReading(c.name, reachable=False, error="API server silent")
        if c.name in silent
        else ClusterReading(c.name, c.regions)
        for c in fleet.clusters
    ]
    return fleet_view(readings, home).held_regions
