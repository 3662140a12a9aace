"""Which knob(s) each policy sweeps, and the runs a comparison makes.

Each policy is swept along the knobs that trade GPU-hours for SLO attainment (SageServe
§6.4, §7.1), the ones the earlier equal-SLO comparison swept by hand
(docs/policy-comparison.md):

- reactive (and reactive-paper, siloed): the scale-out EMU threshold
  `thresholds.scaleOutEmu`; a lower one scales out sooner, holding the SLO with more GPUs.
  The scale-in threshold follows it (`matching_scale_in`).
- LT-I, LT-U: the forecast quantile provisioned for, `forecast.quantile` (0.5 is the
  paper's point forecast).
- LT-UA: the quantile and its valve, `forecastGap.overloadEmu` (scale past the plan while
  EMU is above it; 1 turns it off).
- chiron: its interactive backpressure threshold `chiron.interactiveBusyAbove` (Θ; a
  lower one scales out sooner).

A knob is a PATH of the ScalingPolicy spec, as `sageserve simulate --set PATH=VALUE` takes
it, so a point of the frontier is reproduced by one `simulate` command.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sageserve.pace.base import ALIASES

SCALE_OUT = "thresholds.scaleOutEmu"
SCALE_IN = "thresholds.scaleInEmu"
QUANTILE = "forecast.quantile"
VALVE = "forecastGap.overloadEmu"
CHIRON_THETA = "chiron.interactiveBusyAbove"

#: SageServe's thresholds, 30 % / 70 %: the scale-in a swept scale-out keeps its ratio to.
PAPER_IN_OUT_RATIO = 0.3 / 0.7


@dataclass(frozen=True)
class Axis:
    """One knob and the values it takes."""

    path: str
    values: tuple[float, ...]

    @property
    def name(self) -> str:
        """The knob's short name in labels: the last part of its path."""
        return self.path.rsplit(".", 1)[-1]


_REACTIVE = (Axis(SCALE_OUT, (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)),)
_LT = (Axis(QUANTILE, (0.5, 0.7, 0.9)),)
_LT_UA = (Axis(QUANTILE, (0.5, 0.7, 0.9)), Axis(VALVE, (0.8, 0.9, 1.0)))
_CHIRON = (Axis(CHIRON_THETA, (0.4, 0.5, 0.6, 0.7, 0.8)),)

#: Default sweeps per strategy (its registered name). Chosen before any comparison was run,
#: to span each knob's useful range; `--grid` replaces them.
DEFAULT_AXES: Mapping[str, tuple[Axis, ...]] = {
    "reactive": _REACTIVE,
    "reactive-paper": _REACTIVE,
    "siloed": _REACTIVE,
    "lt-immediate": _LT,
    "lt-utilization": _LT,
    "lt-utilization-arima": _LT_UA,
    "chiron": _CHIRON,
}


@dataclass(frozen=True)
class Job:
    """One simulation: a policy at one point of its grid."""

    policy: str
    knobs: tuple[tuple[str, float], ...]  # (path, value) of each swept knob
    settings: tuple[str, ...]  # every `--set PATH=VALUE` of the run, common ones first

    @property
    def label(self) -> str:
        """The point's knob values, e.g. `quantile=0.9 overloadEmu=0.8`."""
        if not self.knobs:
            return "as configured"
        return " ".join(f"{p.rsplit('.', 1)[-1]}={v:g}" for p, v in self.knobs)

    @property
    def run_id(self) -> str:
        return f"{self.policy} {self.label}"


def canonical(policy: str) -> str:
    """The registered strategy name of `policy` (the paper's short names are aliases)."""
    return ALIASES.get(policy, policy)


def parse_grid(items: Sequence[str]) -> dict[str, list[Axis]]:
    """`--grid POLICY:PATH=V1,V2,...` (repeatable): the axes that replace a policy's default
    sweep; several for one policy make a product. Raises ValueError naming the fix."""
    out: dict[str, list[Axis]] = {}
    for item in items:
        policy, colon, rest = item.partition(":")
        path, eq, raw = rest.partition("=")
        if not colon or not eq or not policy.strip() or not path.strip():
            raise ValueError(
                f"--grid {item!r}: expected POLICY:PATH=V1,V2,..., "
                "e.g. reactive:thresholds.scaleOutEmu=0.5,0.6,0.7"
            )
        try:
            values = tuple(dict.fromkeys(float(v) for v in raw.split(",") if v.strip()))
        except ValueError:
            raise ValueError(f"--grid {item!r}: values must be numbers") from None
        if not values:
            raise ValueError(f"--grid {item!r}: no values")
        out.setdefault(policy.strip(), []).append(Axis(path.strip(), values))
    return out


def matching_scale_in(scale_out: float, scale_in: float) -> float | None:
    """The scale-in threshold to set with a swept scale-out, or None to keep the policy's.

    The policy's scale-in is kept while it is below the scale-out (what the earlier sweep
    did: 0.3 under every threshold from 0.4 to 0.7), so points differ in one knob only;
    where it is not, the CRD would refuse the pair (the fleet oscillates), and the scale-in
    takes the paper's ratio to the scale-out (30 / 70, SageServe §7.1).
    """
    if scale_in < scale_out:
        return None
    return round(scale_out * PAPER_IN_OUT_RATIO, 4)


def _set_paths(settings: Sequence[str]) -> set[str]:
    return {s.partition("=")[0].strip() for s in settings}


def expand(
    policies: Sequence[str],
    grids: Mapping[str, Sequence[Axis]],
    common: Sequence[str] = (),
    scale_in: float = 0.3,
) -> list[Job]:
    """Every run of a comparison: per policy, the product of its axes (from `grids`, else
    `DEFAULT_AXES`), each with the `common` settings first. `scale_in` is the scenario's
    scale-in threshold (after `common`), used by `matching_scale_in`."""
    unknown = set(grids) - set(policies)
    if unknown:
        raise ValueError(
            f"--grid names {', '.join(sorted(unknown))}, not among --policy "
            f"{','.join(policies)}; add it to --policy"
        )
    jobs: list[Job] = []
    fixed = _set_paths(common)
    for policy in policies:
        axes = tuple(grids.get(policy, DEFAULT_AXES.get(canonical(policy), ())))
        swept = {a.path for a in axes}
        for values in itertools.product(*(a.values for a in axes)):
            knobs = tuple((a.path, v) for a, v in zip(axes, values, strict=True))
            extra = [f"{p}={v:g}" for p, v in knobs]
            out = dict(knobs).get(SCALE_OUT)
            if out is not None and SCALE_IN not in swept | fixed:
                matched = matching_scale_in(out, scale_in)
                if matched is not None:
                    extra.append(f"{SCALE_IN}={matched:g}")
            jobs.append(Job(policy, knobs, (*common, *extra)))
    return jobs
