"""Regions as clusters: where each region lives, which regions a plan holds, and what the
plan does with them (the real forecaster and solver)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.plan.cycle import run_plan_cycle
from sageserve.plan.member_clusters import ClusterReading, FleetView, fleet_view

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-2-70b"
REGIONS = ("us-east", "us-central", "us-west")


def _reading(name: str, *regions: str) -> ClusterReading:
    return ClusterReading(name, frozenset(regions))


def _silent(name: str, why: str = "connection refused") -> ClusterReading:
    return ClusterReading(name, reachable=False, error=why)


@pytest.mark.parametrize(
    ("readings", "last_home", "home", "held", "reason"),
    [
        (  # one region per cluster, all answering
            [_reading("east", "us-east"), _reading("west", "us-west")],
            {},
            {"us-east": "east", "us-west": "west"},
            set(),
            "ClustersReachable",
        ),
        (  # a cluster may hold several regions as node labels
            [_reading("hub", "us-east", "us-central"), _reading("west", "us-west")],
            {},
            {"us-east": "hub", "us-central": "hub", "us-west": "west"},
            set(),
            "ClustersReachable",
        ),
        (  # a silent cluster keeps the regions it served when last read, held
            [_reading("east", "us-east"), _silent("west")],
            {"us-east": "east", "us-west": "west", "us-central": "west"},
            {"us-east": "east", "us-west": "west", "us-central": "west"},
            {"us-west", "us-central"},
            "ClusterUnreachable",
        ),
        (  # silent before it was ever read: nothing known to hold, still named
            [_reading("east", "us-east"), _silent("west")],
            {},
            {"us-east": "east"},
            set(),
            "ClusterUnreachable",
        ),
        (  # a region whose nodes sit in two clusters is held, never guessed
            [_reading("a", "us-east", "us-west"), _reading("b", "us-west")],
            {},
            {"us-east": "a"},
            {"us-west"},
            "RegionInSeveralClusters",
        ),
        (  # a region that moved while its old cluster is silent is in two clusters
            [_reading("new", "us-west"), _silent("old")],
            {"us-west": "old"},
            {},
            {"us-west"},
            "ClusterUnreachable",
        ),
    ],
)
def test_fleet_view(
    readings: list[ClusterReading],
    last_home: dict[str, str],
    home: dict[str, str],
    held: set[str],
    reason: str,
) -> None:
    view = fleet_view(readings, last_home)
    assert view.home == home
    assert view.held_regions == held
    assert view.condition()[1] == reason
    assert view.condition()[0] == (reason == "ClustersReachable")


def test_the_condition_names_the_silent_cluster_its_regions_and_why() -> None:
    view = fleet_view(
        [_reading("east", "us-east"), _silent("west", "i/o timeout")], {"us-west": "west"}
    )
    healthy, _, message = view.condition()
    assert not healthy
    assert "west (regions us-west: i/o timeout)" in message
    assert "nothing scaled in" in message
    assert FleetView().held_regions == frozenset()


def _llama() -> ModelDeployment:
    docs = yaml.safe_load_all((ROOT / "policies" / "base" / "models.yaml").read_text())
    return ModelDeployment.model_validate(next(iter(docs)))


def _policy(epsilon: float = 1.0) -> ScalingPolicySpec:
    spec = ScalingPolicySpec.model_validate(
        {
            "forecast": {
                "granularitySeconds": 600,
                "trainingWindowSeconds": 6 * 3600,
                "method": "persistence",
            }
        }
    )
    return spec.model_copy(
        update={"optimizer": spec.optimizer.model_copy(update={"local_serve_fraction": epsilon})}
    )


def test_a_held_region_keeps_its_instances_and_no_demand_is_planned_onto_it() -> None:
    """us-west's cluster is silent with 9 instances: it keeps them whatever its history
    says, and with ε = 0.5 the other regions may not send their excess there (its capacity
    is not in the plan), so they are sized for their own demand."""
    md = _llama()
    gpus = [v.gpu_type for v in md.spec.variants]
    history = {(MODEL, r): [3000.0] * 288 for r in REGIONS}
    history[(MODEL, "us-east")] = [9000.0] * 288
    current = {(MODEL, "us-west", v.name): 0 for v in md.spec.variants}
    current[(MODEL, "us-west", md.spec.variants[0].name)] = 9
    capacity = {(r, g): 400 for r in REGIONS for g in gpus}
    capacity.update({("us-east", g): 160 for g in gpus})  # us-east cannot serve itself alone

    shared = run_plan_cycle([md], _policy(0.5), history, {}, current, capacity)
    held = run_plan_cycle(
        [md], _policy(0.5), history, {}, current, capacity, held_regions=frozenset({"us-west"})
    )
    assert held.result.status in ("optimal", "feasible")
    # the plan in force in the silent region is what it had: 9 of its first variant
    assert {v: n for (m, r, v), n in held.targets.items() if r == "us-west"} == {
        v.name: (9 if i == 0 else 0) for i, v in enumerate(md.spec.variants)
    }
    assert (MODEL, "us-west") not in held.forecasts
    assert "us-west" not in held.result.target.get(MODEL, {})
    # nobody spills into it, and it spills nowhere
    for home, shares in held.spill.get(MODEL, {}).items():
        assert home != "us-west" and "us-west" not in shares
    # without the hold, the plan did use us-west for us-east's excess
    assert any("us-west" in s for s in shared.spill.get(MODEL, {}).values())


def test_every_region_held_says_why_nothing_is_planned() -> None:
    md = _llama()
    with pytest.raises(ValueError, match="every region of every ModelDeployment is held"):
        run_plan_cycle([md], _policy(), {}, {}, {}, held_regions=frozenset(REGIONS))
