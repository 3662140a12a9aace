"""The router's deployment step (SageServe §6.1): among an endpoint's variants, the one
with the least EMU, before the in-region picker; the simulator's rule too."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sageserve.dispatch.instance_picker import Arrival
from sageserve.router.fleet import Backend, Fleet, ModelRoute, fleet_picker
from sageserve.sim.engine import SimConfig

MODEL = ModelRoute("llm", "llama", "llama-70b", ("us-east",), ("iw-f",), variants=("h100", "a100"))
H1 = Backend("llm", "h-1", "llama", "us-east", "h100", "http://h1")
H2 = Backend("llm", "h-2", "llama", "us-east", "h100", "http://h2")
A1 = Backend("llm", "a-1", "llama", "us-east", "a100", "http://a1")


def fleet(readings: dict[str, tuple[float, float | None]]) -> Fleet:
    f = Fleet(picker=fleet_picker("token-jsq"))
    f.set_backends([H1, H2, A1])
    f.set_pod_loads(readings)
    return f


@pytest.mark.parametrize(
    ("readings", "variant"),
    [
        # h100: (0.8·100 + 0.6·100) / 200 = 0.7; a100: 0.2
        ({"h-1": (0.8, 100.0), "h-2": (0.6, 100.0), "a-1": (0.2, 100.0)}, "a100"),
        ({"h-1": (0.1, 100.0), "h-2": (0.1, 100.0), "a-1": (0.5, 100.0)}, "h100"),
        # capacity-weighted: h100 holds 900 of 1,000 → 0.9 although one pod reads 0
        ({"h-1": (1.0, 900.0), "h-2": (0.0, 100.0), "a-1": (0.5, 100.0)}, "a100"),
        # a tie goes to the first variant of spec.variants (h100), not the pods' order
        ({"h-1": (0.3, 100.0), "h-2": (0.3, 100.0), "a-1": (0.3, 100.0)}, "h100"),
        # nothing read yet: every variant reads 0, the first is taken
        ({}, "h100"),
    ],
)
def test_the_request_goes_to_the_variant_with_the_least_emu(
    readings: dict[str, tuple[float, float | None]], variant: str
) -> None:
    chosen = fleet(readings).choose_backend(MODEL, "us-east", arrival=Arrival(100, 50))
    assert chosen is not None and chosen.variant == variant


def test_tokens_sent_since_the_reading_raise_the_variants_emu() -> None:
    """Between two Prometheus readings the variant that took the last requests fills up in
    the router's estimate, so traffic does not all go to one variant for 2 s."""
    f = fleet({"h-1": (0.2, 1000.0), "h-2": (0.2, 1000.0), "a-1": (0.25, 1000.0)})
    picks = []
    for _ in range(4):
        chosen = f.choose_backend(MODEL, "us-east", arrival=Arrival(100, 50))
        assert chosen is not None
        picks.append(chosen.variant)
        f.start(chosen, 150.0)
    # h100 at 0.2 takes the first; 150 tokens over its 2,000 lift it to 0.275 > 0.25
    assert picks[:2] == ["h100", "a100"]
    assert set(picks) == {"h100", "a100"}
    f.set_pod_loads({"h-1": (0.2, 1000.0), "h-2": (0.2, 1000.0), "a-1": (0.25, 1000.0)})
    chosen = f.choose_backend(MODEL, "us-east", arrival=Arrival(100, 50))
    assert chosen is not None and chosen.variant == "h100"  # a fresh reading resets it


def test_without_capacities_the_sent_correction_is_not_guessed() -> None:
    f = fleet({"h-1": (0.2, None), "h-2": (0.2, None), "a-1": (0.3, None)})
    for _ in range(3):
        chosen = f.choose_backend(MODEL, "us-east", arrival=Arrival(100, 50))
        assert chosen is not None and chosen.variant == "h100"
        f.start(chosen, 10_000.0)


def test_an_excluded_variant_leaves_the_other() -> None:
    f = fleet({"h-1": (0.1, 100.0), "h-2": (0.1, 100.0), "a-1": (0.9, 100.0)})
    chosen = f.choose_backend(MODEL, "us-east", frozenset({"h-1", "h-2"}), Arrival(100, 50))
    assert chosen == A1


def test_the_deployed_router_picks_as_the_simulator_does_by_default() -> None:
    from sageserve.cli import app

    out = CliRunner().invoke(app, ["router", "--help"], env={"COLUMNS": "300"})
    assert out.exit_code == 0
    default = SimConfig({}, [], 0.0, 1.0).picker
    assert default == "token-jsq"
    assert f"[default: {default}]" in out.output.replace("\n", " ")
