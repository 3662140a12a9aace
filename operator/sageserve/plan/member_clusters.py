"""Regions as clusters: which cluster each region lives in, and which regions a plan holds.

SageServe plans one fleet across regions (§5: C1 per region, C2 across them, spill-over
between them). A real multi-region fleet is several Kubernetes clusters, one per cloud
region or GPU provider, and a cluster may also hold several regions as node labels. The
worlds read each member cluster's GPU nodes; this module turns those readings into the one
view every loop plans on:

- each region's *home* cluster: the one whose GPU nodes carry the region label. A region
  whose nodes sit in two clusters is a configuration error; it is held (never planned by
  guesswork) and named.
- the *silent* clusters: members whose API server could not be read this pass. Their regions
  keep the last plan in force (the pods there keep serving; nothing is scaled in because
  data stopped) and their capacity is left out of the plan, so no other region's demand is
  planned onto GPUs that cannot be reached. A silent cluster's regions are the ones it held
  when last read.

Pure: readings and the last view in, the new view out. The operator reads members through
their kubeconfig Secrets, the simulator through a scenario's `clusters.yaml`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClusterReading:
    """One member cluster as one pass read it."""

    name: str
    #: regions of its GPU nodes (empty when it could not be read)
    regions: frozenset[str] = frozenset()
    reachable: bool = True
    #: why it could not be read (the API error, a timeout)
    error: str = ""


@dataclass(frozen=True)
class FleetView:
    """Where each region lives, and what the plan may not touch."""

    #: region → the cluster that serves it
    home: dict[str, str] = field(default_factory=dict)
    #: region → the clusters whose nodes all carry it (a configuration error)
    conflicts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: silent cluster → (its regions when last read, why it is silent)
    silent: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)

    @property
    def held_regions(self) -> frozenset[str]:
        """Regions the plan keeps at the plan in force: a silent cluster's, and those in
        more than one cluster."""
        held = {r for regions, _ in self.silent.values() for r in regions}
        return frozenset(held | set(self.conflicts))

    def condition(self) -> tuple[bool, str, str]:
        """(healthy, reason, message) for a `Clusters` condition: which clusters are silent
        and which regions are held, so a person at 3 a.m. reads the cluster's name."""
        if self.silent:
            names = ", ".join(
                f"{c} (regions {', '.join(regions) or 'none known'}: {why})"
                for c, (regions, why) in sorted(self.silent.items())
            )
            return (
                False,
                "ClusterUnreachable",
                f"held at the plan in force, nothing scaled in, no demand planned onto them: "
                f"{names}",
            )
        if self.conflicts:
            names = "; ".join(f"{r} in {', '.join(cs)}" for r, cs in sorted(self.conflicts.items()))
            return (
                False,
                "RegionInSeveralClusters",
                f"a region must live in one cluster; held until its nodes are in one: {names}",
            )
        members = sorted(set(self.home.values()))
        return True, "ClustersReachable", f"{len(members)} cluster(s) read: {', '.join(members)}"


def fleet_view(
    readings: Iterable[ClusterReading], last_home: Mapping[str, str] | None = None
) -> FleetView:
    """The fleet as this pass read it.

    `last_home` is the region → cluster map of the last pass: a silent cluster's regions
    are the ones it served then (its nodes cannot be listed now), and they stay its home,
    so its endpoints are still named and held rather than forgotten.
    """
    last_home = dict(last_home or {})
    found: dict[str, list[str]] = {}
    silent: dict[str, tuple[tuple[str, ...], str]] = {}
    for reading in sorted(readings, key=lambda r: r.name):
        if not reading.reachable:
            regions = tuple(sorted(r for r, c in last_home.items() if c == reading.name))
            silent[reading.name] = (regions, reading.error or "not reachable")
            for region in regions:
                found.setdefault(region, []).append(reading.name)
            continue
        for region in sorted(reading.regions):
            found.setdefault(region, []).append(reading.name)
    home = {r: cs[0] for r, cs in found.items() if len(cs) == 1}
    conflicts = {r: tuple(cs) for r, cs in found.items() if len(cs) > 1}
    return FleetView(home=home, conflicts=conflicts, silent=silent)
