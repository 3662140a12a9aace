"""A scenario says which in-region picker its routers run (`sageserve router --picker`),
and `simulate --picker` overrides it, so PreServe's router can be simulated with its
scaler; an unknown name is refused naming where it came from and the choices."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.dispatch.instance_picker import DEFAULT_PICKER
from sageserve.sim.engine import Simulation
from sageserve.sim.scenario import load_scenario

TINY = Path(__file__).parent / "fixtures" / "tiny"


def tiny_with(tmp_path: Path, extra: str) -> Path:
    """The tiny scenario's files, indexed from `tmp_path` with `extra` lines added."""
    index = tmp_path / "scenario.yaml"
    files = ", ".join(str(TINY / f) for f in ("models.yaml", "tiers.yaml", "policy.yaml"))
    index.write_text(
        f"name: tiny\nmanifests: [{files}]\ninventory: {TINY / 'nodes.yaml'}\n"
        f"workload: {TINY / 'workload.yaml'}\ndrain: 30m\n{extra}"
    )
    return tmp_path


def test_the_routers_picker_is_the_scenarios_then_the_command_lines() -> None:
    sc = load_scenario(TINY)
    assert sc.picker == DEFAULT_PICKER == sc.sim_config().picker
    chosen = sc.with_picker("preserve")
    assert chosen.sim_config().picker == "preserve"
    assert chosen.with_picker(None) is chosen
    strategy = chosen.strategy("reactive")
    sim = Simulation(chosen.sim_config(), strategy, chosen.requests(), None)
    assert type(sim.picker).__name__ == "PreServe"


def test_a_scenario_names_its_picker(tmp_path: Path) -> None:
    sc = load_scenario(tiny_with(tmp_path, "picker: least-request\n"))
    assert sc.sim_config().picker == "least-request"


def test_an_unknown_picker_is_refused_naming_where_and_the_choices(tmp_path: Path) -> None:
    root = tiny_with(tmp_path, "picker: fastest\n")
    with pytest.raises(ValueError, match=r"scenario\.yaml: picker: unknown picker 'fastest'"):
        load_scenario(root)
    with pytest.raises(ValueError, match=r"--picker: unknown picker 'x'; choose one of .*jsq"):
        load_scenario(TINY).with_picker("x")
    out = CliRunner().invoke(
        app, ["simulate", "-s", str(TINY), "--picker", "x", "-o", str(tmp_path / "o")]
    )
    assert out.exit_code == 2 and "unknown picker 'x'" in out.output
