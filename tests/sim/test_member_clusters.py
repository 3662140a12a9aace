"""A scenario's fleet of clusters: loading, the held regions while a cluster is silent, and
a run in which the silent cluster's endpoints neither move nor take planned demand."""

from __future__ import annotations

import re
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from sageserve.core.snapshot import PlanSolve
from sageserve.sim.member_clusters import SimCluster, SimFleet, parse_clusters
from sageserve.sim.results import plans_summary
from sageserve.sim.run import run_policies
from sageserve.sim.scenario import load_scenario
from sageserve.sim.workload import parse_duration

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "regions-as-clusters"


def test_the_bundled_scenario_reads_three_clusters_from_their_nodes() -> None:
    sc = load_scenario(SCENARIO)
    assert {c.name: c.regions for c in sc.fleet.clusters} == {
        "east": {"us-east"},
        "central": {"us-central"},
        "west": {"us-west"},
    }
    # nodePools and a Node YAML give the same shape: 32 nodes per region
    per_region: dict[str, int] = defaultdict(int)
    for n in sc.nodes:
        per_region[n.region] += 1
    assert per_region == {"us-east": 32, "us-central": 32, "us-west": 32}
    west = next(c for c in sc.fleet.clusters if c.name == "west")
    assert west.silent == ((2400.0, 4200.0),)


def test_a_silent_cluster_holds_its_regions_only_while_silent() -> None:
    fleet = SimFleet(
        (
            SimCluster("east", frozenset({"us-east"})),
            SimCluster("west", frozenset({"us-west", "eu-west"}), ((100.0, 200.0),)),
        )
    )
    assert fleet.held_at(99.0) == frozenset()
    assert fleet.held_at(100.0) == {"us-west", "eu-west"}
    assert fleet.held_at(200.0) == frozenset()
    assert fleet.shifted(1000.0).held_at(1150.0) == {"us-west", "eu-west"}
    assert SimFleet().held_at(0.0) == frozenset()


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ("east", "clusters: expected a list"),
        ([{"inventory": "x"}], "clusters[0]: expected a mapping with a name"),
        ([{"name": "a"}, {"name": "a"}], "clusters[1].name: 'a' is declared twice"),
        ([{"name": "b"}], "clusters[0].inventory: cluster 'b' has no GPU node"),
        ([{"name": "a"}, {"name": "c"}], "region 'r1' is in clusters 'a' and 'c'"),
        ([{"name": "a", "silent": [{"from": "2h"}]}], "clusters[0].silent[0]: expected"),
        ([{"name": "a", "silent": [{"from": "2h", "to": "1h"}]}], "must come before to"),
    ],
)
def test_a_bad_clusters_entry_names_the_field(entries: object, says: str) -> None:
    regions = {"a": frozenset({"r1"}), "c": frozenset({"r1"})}
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_clusters(entries, regions, parse_duration)


def test_a_cluster_needs_nodes_from_a_file_or_from_node_pools(tmp_path: Path) -> None:
    root = tmp_path / "s"
    shutil.copytree(SCENARIO, root)
    meta = yaml.safe_load((root / "scenario.yaml").read_text())
    meta["manifests"] = [str(SCENARIO / m) for m in meta["manifests"]]
    meta["workload"] = str(SCENARIO / meta["workload"])
    meta["clusters"][0] = {"name": "east"}
    (root / "scenario.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(ValueError, match=r"clusters\[0\]: name the cluster's Node YAML"):
        load_scenario(root)
    meta["clusters"][0] = {"name": "east", "nodePools": [{"region": "us-east", "gpus": 8}]}
    (root / "scenario.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(ValueError, match=r"clusters\[0\].nodePools\[0\]: expected \{region"):
        load_scenario(root)


def _held_region_sizes(sc_root: Path, silent: bool) -> tuple[dict[str, set[int]], dict[str, Any]]:
    """Instances (serving + starting) per model in us-west over minutes 41–69 of a run, and
    how its plans were solved."""
    sc = load_scenario(sc_root)
    if not silent:
        sc.fleet = SimFleet(tuple(SimCluster(c.name, c.regions) for c in sc.fleet.clusters))
    cmp = run_policies(sc, ["lt-ua"])
    result, _ = cmp.runs["lt-ua"]
    first = min(r.minute for r in result.minutes)
    sizes: dict[str, set[int]] = defaultdict(set)
    for r in result.minutes:
        if r.region == "us-west" and 41 <= r.minute - first < 70:
            sizes[r.model].add(r.serving + r.provisioning)
    return sizes, cmp.summary["policies"]["lt-ua"]["plans"]


@pytest.mark.slow
def test_the_silent_clusters_endpoints_do_not_move_while_the_others_keep_pacing() -> None:
    """us-west's API server is silent from 40 to 70 minutes: every model there keeps its
    size through the hourly plan at 60 minutes, which leaves us-west out and says so;
    without the silence some model there moves in the same minutes (so the check can
    fail)."""
    held, plans = _held_region_sizes(SCENARIO, silent=True)
    assert held and all(len(s) == 1 for s in held.values()), held
    assert plans["held_regions"] == ["us-west"] and plans["cycles_holding_regions"] == 1
    assert plans["cycles"] >= 2 and set(plans["statuses"]) == {"optimal"}
    free, plans = _held_region_sizes(SCENARIO, silent=False)
    assert any(len(s) > 1 for s in free.values()), free
    assert "held_regions" not in plans and plans["cycles_holding_regions"] == 0


def test_plans_summary_gives_the_slowest_solve_the_widest_gap_and_held_regions() -> None:
    solves = [
        PlanSolve("optimal", 0.5, 0.0),
        PlanSolve("feasible", 2.0, 0.004, frozenset({"eu-west"})),
        PlanSolve("greedy", 0.1, None),
    ]
    assert plans_summary(solves) == {
        "cycles": 3,
        "max_solve_s": 2.0,
        "mean_solve_s": 0.8667,
        "max_gap": 0.004,
        "statuses": {"feasible": 1, "greedy": 1, "optimal": 1},
        "cycles_holding_regions": 1,
        "held_regions": ["eu-west"],
    }
