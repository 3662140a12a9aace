"""θ learned from the fleet: tokens/s one instance serves at its SLO, from what it served.

Why: θ (`capacityTokensPerSecond`) is calibrated once, on one pinned instance and one
request mix (`sim/calibrate.py`); the traffic a fleet sees drifts away from that mix, and the
same procedure on another day gives a θ 1.25–1.6× apart. The planner divides forecast load
by θ (SageServe §6.3) and LT-U/UA's caps turn observed load into instances with it, so a
stale θ over- or under-provisions every hour. PreServe profiles its per-instance capacities
from the serving history instead (PreServe §4.1, Alg. 1: μ_t is the most tokens/s per
instance over historical windows with no SLO violation). This step generalises that rule:

- a window (one minute of one (model, variant, region)) *qualifies* when every interactive
  tier with first tokens in it kept its TTFT P95 within the tier's SLO (the tier's goal:
  95 % of its requests within the TTFT SLO) and its instances were loaded enough to say
  something about their capacity (EMU ≥ `min_emu`); an idle window says only that the
  instance was idle;
- its sample is the tokens/s per serving instance (PreServe's Σ tokens / |T_i| per
  instance). With `scale_to_emu`, it is scaled to the EMU θ is defined at (the scale-out
  threshold, `sim/calibrate.py`'s KV target): `tps × at_emu / emu`, so that a fleet that
  runs cool still estimates θ at the threshold; this is linear in KV use, which holds when
  θ is bound by KV memory and overestimates θ when it is bound by TTFT (prefill) at a
  lower KV use, so it is off by default;
- learned θ is the `quantile` of the qualifying samples (a high one by default: the most a
  loaded instance served within its SLO, robust to one lucky minute), each weighted by
  0.5^(age / `half_life_s`), over the last `history_s` (older windows are forgotten);
- trust: the declared θ is the starting point and the bound. Learned θ replaces it only
  once `min_windows` windows qualified, and never leaves [declared × `min_factor`,
  declared × `max_factor`].

What the plan sizes with is also what batch deadlines are judged with
(`model_theta_in_force`): the operator records θ in force in each ModelDeployment's
`status.capacity` and its pace loop and routers read it back (`deadline_theta`); the
simulator hands its table to the same rule at each plan.

Pure and stateless: both worlds hand it the windows they observed (the simulator from its
minutes, the operator from Prometheus' range over `history_s`) and get the same θ.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sageserve.api.model_deployment import ModelDeployment, Variant
    from sageserve.api.scaling_policy import ScalingPolicySpec

#: (model deployment, variant, region)
CapacityKey = tuple[str, str, str]


@dataclass(frozen=True)
class CapacityWindow:
    """One observed window of one (model, variant, region)'s serving instances."""

    #: end of the window, seconds (the clock both worlds plan on)
    at: float
    model: str
    variant: str
    region: str
    #: tokens/s (prompt + generated) the variant's instances served in the window, together
    tokens_per_s: float
    #: serving instances over the window (their mean)
    instances: float
    #: KV used ÷ KV capacity of those instances (EMU, `core.snapshot.emu`)
    emu: float
    #: every interactive tier with first tokens in the window kept its TTFT P95 within its
    #: SLO; None: no interactive first token (nothing to judge the SLO by)
    slo_met: bool | None

    @property
    def key(self) -> CapacityKey:
        return (self.model, self.variant, self.region)


@dataclass(frozen=True)
class LearnSettings:
    """How windows become θ (ScalingPolicy `spec.capacity`)."""

    learn: bool = False
    min_windows: int = 30
    quantile: float = 0.9
    min_emu: float = 0.3
    #: scale each window's tokens/s to `at_emu` (the scale-out threshold)
    scale_to_emu: bool = False
    at_emu: float = 0.7
    min_factor: float = 0.5
    max_factor: float = 2.0
    history_s: float = 86400.0
    half_life_s: float = 21600.0

    def __post_init__(self) -> None:
        checks = (
            ("minWindows", self.min_windows >= 1, "at least 1"),
            ("quantile", 0.0 < self.quantile <= 1.0, "in (0, 1]"),
            ("minEmu", 0.0 < self.min_emu <= 1.0, "in (0, 1]"),
            ("atEmu", 0.0 < self.at_emu <= 1.0, "in (0, 1]"),
            ("minFactor", 0.0 < self.min_factor <= 1.0, "in (0, 1]"),
            ("maxFactor", self.max_factor >= 1.0, "at least 1"),
            ("historySeconds", self.history_s > 0, "positive"),
            ("halfLifeSeconds", self.half_life_s > 0, "positive"),
        )
        for name, ok, what in checks:
            if not ok:
                raise ValueError(f"spec.capacity.{name}: must be {what}")


def settings_for(policy: ScalingPolicySpec) -> LearnSettings:
    """The step's settings from a ScalingPolicy (`spec.capacity`); θ is tokens/s at the
    scale-out EMU (`spec.thresholds.scaleOutEmu`, the KV target `sim/calibrate.py` holds)."""
    c = policy.capacity
    return LearnSettings(
        learn=c.learn,
        min_windows=c.min_windows,
        quantile=c.quantile,
        min_emu=c.min_emu,
        scale_to_emu=c.scale_to_emu,
        at_emu=policy.thresholds.scale_out_emu,
        min_factor=c.min_factor,
        max_factor=c.max_factor,
        history_s=float(c.history_seconds),
        half_life_s=float(c.half_life_seconds),
    )


@dataclass(frozen=True)
class LearnedCapacity:
    """θ of one (model, variant, region): declared, learned, the one in force, and why."""

    declared_tps: float
    #: the weighted quantile of the qualifying samples (None: no qualifying window)
    learned_tps: float | None
    #: windows seen within `history_s`, and those that qualified
    windows: int
    qualifying: int
    trusted: bool
    #: θ the planner and the caps use: declared until trusted, then learned within bounds
    in_force_tps: float


def window_sample(w: CapacityWindow, settings: LearnSettings) -> float | None:
    """A qualifying window's estimate of θ (tokens/s per instance, at `at_emu` with
    `scale_to_emu`), else None."""
    if w.slo_met is not True or w.instances <= 0 or not math.isfinite(w.tokens_per_s):
        return None
    if not (math.isfinite(w.emu) and w.emu >= settings.min_emu) or w.tokens_per_s <= 0:
        return None
    per_instance = w.tokens_per_s / w.instances
    return per_instance * settings.at_emu / w.emu if settings.scale_to_emu else per_instance


def weighted_quantile(values: Sequence[tuple[float, float]], q: float) -> float:
    """The q-quantile of (value, weight) pairs: the smallest value whose cumulative weight
    reaches q of the total (q = 1: the largest, PreServe's max)."""
    ordered = sorted(values)
    total = sum(w for _, w in ordered)
    seen = 0.0
    for v, w in ordered:
        seen += w
        if seen >= q * total - 1e-12:
            return v
    return ordered[-1][0]


def learn_one(
    windows: Iterable[CapacityWindow], declared_tps: float, now: float, settings: LearnSettings
) -> LearnedCapacity:
    """θ of one key from its windows (see the module doc)."""
    samples: list[tuple[float, float]] = []
    seen = 0
    for w in windows:
        age = now - w.at
        if age < 0 or age > settings.history_s:
            continue
        seen += 1
        s = window_sample(w, settings)
        if s is not None:
            samples.append((s, 0.5 ** (age / settings.half_life_s)))
    learned = weighted_quantile(samples, settings.quantile) if samples else None
    trusted = learned is not None and len(samples) >= settings.min_windows
    in_force = declared_tps
    if trusted and learned is not None:
        lo, hi = declared_tps * settings.min_factor, declared_tps * settings.max_factor
        in_force = min(hi, max(lo, learned))
    return LearnedCapacity(declared_tps, learned, seen, len(samples), trusted, in_force)


def learn(
    windows: Iterable[CapacityWindow],
    declared: Mapping[CapacityKey, float],
    now: float,
    settings: LearnSettings,
) -> dict[CapacityKey, LearnedCapacity]:
    """θ per declared (model, variant, region) from the windows observed there."""
    by_key: dict[CapacityKey, list[CapacityWindow]] = {k: [] for k in declared}
    for w in windows:
        if w.key in by_key:
            by_key[w.key].append(w)
    return {k: learn_one(by_key[k], declared[k], now, settings) for k in sorted(declared)}


def planned_theta(learned: Mapping[CapacityKey, LearnedCapacity]) -> dict[CapacityKey, float]:
    """θ in force per (model, variant, region) for the plan, where that region trusts its
    learned θ; an entry absent means the declared θ stays there. The ILP takes a θ per
    (model, region, GPU type) (`PlanProblem.capacity_tps_by_region`), so a region whose
    traffic lets its instances serve more is sized with its own θ (SageServe §5's θ made
    regional, as PreServe Alg. 1 profiles each instance group from its own history)."""
    return {k: lc.in_force_tps for k, lc in sorted(learned.items()) if lc.trusted}


#: θ in force per (model deployment, variant, region), where learned and trusted.
ThetaTable = Mapping[CapacityKey, float]


def theta_of(model: str, variant: Variant, region: str, table: ThetaTable | None) -> float:
    """θ the plan sizes `variant` of `model` with in `region`: the learned θ in force there,
    else the declared `capacityTokensPerSecond`."""
    declared = float(variant.capacity_tokens_per_second)
    return table.get((model, variant.name, region), declared) if table else declared


def tier_slo_met(
    p95_s: Mapping[str, float], samples: Mapping[str, int], slo_s: Mapping[str, float]
) -> bool | None:
    """Whether every interactive tier with first tokens in the window kept its TTFT P95
    within its SLO (None: no tier had any). Both worlds judge a window by this."""
    judged = [t for t, n in samples.items() if n > 0 and t in slo_s and t in p95_s]
    if not judged:
        return None
    return all(p95_s[t] <= slo_s[t] for t in judged)


def declared_theta(mds: Iterable[ModelDeployment]) -> dict[CapacityKey, float]:
    """The declared θ (`capacityTokensPerSecond`) of every (model, variant, region)."""
    return {
        (md.metadata.name, v.name, r.name): float(v.capacity_tokens_per_second)
        for md in mds
        for v in md.spec.variants
        for r in md.spec.regions
    }


def model_theta_in_force(model: str, declared: ThetaTable, in_force: ThetaTable | None) -> float:
    """θ of `model` for its batch deadlines: the largest θ in force over its (variant,
    region)s, the learned one where trusted, else the declared one (0: none declared).

    The deadline signal, the at-risk check and the router's admission ask whether the
    model's instances *can* serve its batch queue in time; the largest θ errs toward "they
    can" (`api.model_deployment.model_theta_tps`, the declared-only rule it extends). With
    learning, the θ the plan sizes with is the θ deadlines are judged with, so a declared θ
    the fleet has shown to be stale does not raise a scale-out for deadlines, or refuse a
    batch, that the learned one says it meets."""
    return max(
        ((in_force or {}).get(key, theta) for key, theta in declared.items() if key[0] == model),
        default=0.0,
    )


def recorded_theta(name: str, obj: Mapping[str, Any]) -> dict[CapacityKey, float]:
    """θ in force per (model, variant, region) as the plan loop recorded it in the
    ModelDeployment object's `status.capacity`, where trusted: the operator's record of what
    the plan sizes with (empty unless the policy learns: the plan loop clears it when
    learning is off). An entry that does not validate is left out: its declared θ stays."""
    from sageserve.api.model_deployment import CapacityStatus

    status = obj.get("status")
    entries = status.get("capacity") if isinstance(status, Mapping) else None
    out: dict[CapacityKey, float] = {}
    for raw in entries if isinstance(entries, list) else []:
        try:
            entry = CapacityStatus.model_validate(raw)
        except ValueError:
            continue
        theta = entry.in_force_tokens_per_second
        if entry.trusted and math.isfinite(theta) and theta > 0:
            out[(name, entry.variant, entry.region)] = theta
    return out


def deadline_theta(md: ModelDeployment, obj: Mapping[str, Any]) -> float:
    """θ of a ModelDeployment for its batch deadlines, on Kubernetes: `model_theta_in_force`
    over its declared θ and the θ in force its object's status records (`obj`: the object
    as listed, status included)."""
    name = md.metadata.name
    return model_theta_in_force(name, declared_theta([md]), recorded_theta(name, obj))
