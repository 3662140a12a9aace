"""OServe layouts on Kubernetes: from ModelDeployment variants and the router's request-shape
counter to the layout search's inputs, and from a layout back to pod-set targets and
dispatch weights (OServe §4.2, §4.3, §5.1, §5.2). Pure: the operator's layout loop
(`controller.layout_loop`) fetches and writes, this module decides.

- **Layouts are declared** as variants: a ModelDeployment that lists two or more variants of
  one GPU type (different tensorParallel × pipelineParallel) under a policy with a
  `spec.layouts` section runs them side by side, one pod set per (region, variant) as
  always. Each variant is one strategy (TP, PP) of the search (`layout_search.Strategy`), and
  the search is restricted to the declared ones: its `LayoutSpace` holds only their rows.
- **Request types** (§5.1) come from the router's counter of answered requests per log-2
  (prompt, output) bucket: each bucket is one point at its representative lengths
  (`forecast.request_types.bucket_tokens`) weighted by its count, clustered by weighted
  k-means, or classified into the centroids of a measured capacity table when the
  ModelDeployment names one (its n are per *those* types).
- **Per-type capacity n** (§4.2) is analytical (`perf/capacity.py`) on the perf profile of
  each variant's (TP, PP), or measured (`sageserve calibrate --by-type`'s file, kept in a
  ConfigMap).
- **Budget** (§4.3 searches inside a GPU budget): the plan in force's instances of that
  (model, region, GPU type) × their GPUs when a plan covers it, else the GPUs the pod sets
  of those variants hold now.
- **Targets**: the layout in force overrides the plan's targets of those variants
  (`with_layouts`), so the decision step moves each variant's pod set to its own count.
- **Weights** (§4.2): the assignment LP's x_{k,j}/λ_j summed over each variant's replicas.
- **Per-type forecasts** (§5.1: "types and their share forecast per window"): the buckets'
  per-step rates are classified into the types (`type_series`, the same nearest centroid
  in log space), summed into one series per type, and each is forecast over the re-plan
  horizon with the policy's forecaster (`forecast.api.forecast_peak`, gaps as missing
  data), the horizon cut into `replanSeconds` windows (`forecast_windows`). The windows
  carry the point path's mean per window; a type the forecaster cannot fit keeps its
  measured mean rate.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import yaml

from sageserve.api.model_deployment import ModelDeployment, Variant
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.core.snapshot import Plan
from sageserve.core.types import EndpointKey
from sageserve.forecast.api import forecast_peak
from sageserve.forecast.methods import get_forecaster
from sageserve.forecast.request_types import RequestTypes, bucket_tokens, fit_request_types
from sageserve.forecast.types import ForecastSpec
from sageserve.perf.capacity import type_capacity
from sageserve.perf.layout_check import profile_names, variant_parallelism
from sageserve.perf.model import PerfCatalog
from sageserve.plan.cycle import expected_in_window, forecast_spec
from sageserve.plan.layout_search import Layout, Strategy, canonical
from sageserve.plan.layout_switch import Window
from sageserve.plan.oserve_assign import layout_weights

#: ModelDeployment annotation naming a ConfigMap with measured n (`calibrate --by-type`).
TYPE_CAPACITY_ANNOTATION = "sageserve.io/type-capacity"
#: The ConfigMap key holding the file `sageserve calibrate --by-type --out` writes.
TYPE_CAPACITY_KEY = "type-capacity.yaml"

#: (prompt_le, output_le) → requests counted in that bucket over the history.
ShapeCounts = Mapping[tuple[str, str], float]
#: (prompt_le, output_le) → requests/s per step of the history, oldest first (NaN: missing).
ShapeSeries = Mapping[tuple[str, str], Sequence[float]]


@dataclass(frozen=True)
class LayoutGroup:
    """The variants of one GPU type of one ModelDeployment: the layouts OServe chooses from."""

    model: str
    gpu_type: str
    variants: tuple[Variant, ...]

    def strategy(self, variant: Variant) -> Strategy:
        return Strategy(*variant_parallelism(variant))

    @property
    def by_strategy(self) -> dict[Strategy, Variant]:
        return {self.strategy(v): v for v in self.variants}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variants)

    def layout(self, replicas: Mapping[str, int]) -> Layout:
        """The layout of `replicas` per variant name (absent: 0)."""
        return canonical(
            self.strategy(v) for v in self.variants for _ in range(max(0, replicas.get(v.name, 0)))
        )

    def replicas(self, layout: Sequence[Strategy]) -> dict[str, int]:
        """Instances per variant name of `layout` (every variant listed, 0 when absent)."""
        counts = Counter(layout)
        by = self.by_strategy
        unknown = [str(s) for s in counts if s not in by]
        if unknown:
            raise ValueError(f"layout: {unknown} are no variant of {self.model} on {self.gpu_type}")
        return {by[s].name: counts.get(s, 0) for s in sorted(by)}

    def startup_seconds(self) -> dict[Strategy, float]:
        return {self.strategy(v): float(v.startup_seconds) for v in self.variants}


def layout_groups(md: ModelDeployment) -> list[LayoutGroup]:
    """The GPU types of `md` with two or more variants, in spec order. Raises ValueError
    naming the field when two variants of one GPU type have the same (TP, PP): the search
    could not tell them apart (one strategy = one variant)."""
    by_type: dict[str, list[Variant]] = {}
    for v in md.spec.variants:
        by_type.setdefault(v.gpu_type, []).append(v)
    out = []
    for gpu, variants in by_type.items():
        if len(variants) < 2:
            continue
        seen: dict[tuple[int, int], str] = {}
        for v in variants:
            key = variant_parallelism(v)
            if key in seen:
                raise ValueError(
                    f"spec.variants[{v.name}]: same tensorParallel × pipelineParallel "
                    f"{key[0]} × {key[1]} as variant {seen[key]} on {gpu}; OServe layouts need "
                    "one variant per parallelism: change one, or remove it"
                )
            seen[key] = v.name
        out.append(LayoutGroup(md.metadata.name, gpu, tuple(variants)))
    return out


@dataclass(frozen=True)
class Mix:
    """Request types (centroid tokens) and their requests/s over the history read."""

    centroids: tuple[tuple[float, float], ...]
    rates: tuple[float, ...]


def _points(counts: ShapeCounts) -> tuple[list[float], list[float], list[float]]:
    prompts, outputs, weights = [], [], []
    for (p_le, o_le), c in sorted(counts.items()):
        if not math.isfinite(c) or c <= 0:
            continue
        prompts.append(bucket_tokens(p_le))
        outputs.append(bucket_tokens(o_le))
        weights.append(float(c))
    return prompts, outputs, weights


def mix_from_buckets(
    counts: ShapeCounts,
    seconds: float,
    k: int = 4,
    centroids: Sequence[tuple[float, float]] | None = None,
    seed: int = 0,
) -> Mix | None:
    """Types and rates from the router's shape buckets over `seconds` of history (OServe §5.1).

    With `centroids` (a measured capacity table's types), each bucket goes to the nearest
    centroid in log(1 + tokens) space, where the types were fitted; else weighted k-means
    (`fit_request_types`). None when no request was counted. A bucket label that is not a
    bound raises ValueError (the router and operator disagree on the buckets)."""
    if not seconds > 0:
        raise ValueError(f"seconds: the history must be > 0 s, got {seconds}")
    prompts, outputs, weights = _points(counts)
    if not weights:
        return None
    if centroids is not None:
        cents = tuple((float(p), float(o)) for p, o in centroids)
        types = _types_at(cents)
    else:
        types = fit_request_types(prompts, outputs, k=k, seed=seed, weights=weights)
        cents = tuple(types.centroid_tokens(j) for j in range(types.k))
    nearest = types.classify(prompts, outputs)
    per_type = np.bincount(nearest, weights=np.asarray(weights), minlength=len(cents))
    return Mix(cents, tuple(float(v) / seconds for v in per_type))


def _types_at(centroids: Sequence[tuple[float, float]]) -> RequestTypes:
    """Request types given by their centroids in tokens (a measured table's), to classify
    with (`RequestTypes.classify`: nearest in log(1 + tokens) space)."""
    logs = np.log1p(np.asarray(centroids, dtype=np.float64).reshape(-1, 2))
    return RequestTypes(
        log_centroids=tuple((float(p), float(o)) for p, o in logs), counts=(0,) * len(logs)
    )


def type_series(series: ShapeSeries, centroids: Sequence[tuple[float, float]]) -> list[list[float]]:
    """Requests/s per step of each type: the buckets' series summed by nearest centroid (in
    log(1 + tokens) space at the bucket's representative lengths, as `mix_from_buckets`
    classifies; pure). Series are aligned on their last point (now).

    Gaps, settled: a step where no bucket has a finite value is missing for every type
    (Prometheus recorded nothing then: the routers were not scraped); a bucket without a
    value at a step where others have one counts 0 (its counter did not exist yet: no
    request of that shape). A bucket label that is not a bound raises ValueError."""
    types = len(centroids)
    length = max((len(v) for v in series.values()), default=0)
    out = np.zeros((types, length))
    seen = np.zeros(length, dtype=bool)
    keys = sorted(series)
    if keys and types:
        prompts = [bucket_tokens(p) for p, _ in keys]
        outputs = [bucket_tokens(o) for _, o in keys]
        nearest = _types_at(centroids).classify(prompts, outputs)
        for key, j in zip(keys, nearest, strict=True):
            values = np.full(length, np.nan)
            raw = np.asarray(series[key], dtype=np.float64)
            if raw.size:
                values[length - raw.size :] = raw
            ok = np.isfinite(values) & (values >= 0)
            seen |= ok
            out[int(j)] += np.where(ok, values, 0.0)
    out[:, ~seen] = np.nan
    return [[float(v) for v in row] for row in out]


def layout_forecast_spec(policy: ScalingPolicySpec, history_seconds: float) -> ForecastSpec:
    """The policy's forecaster settings (`plan.cycle.forecast_spec`: step, quantile,
    training window, ARIMA order) reaching over the layouts' re-plan horizon: from now
    (no lead) to min(`historySeconds`, `forecast.horizonSeconds`), so that with the
    defaults (an hour each) the gain is weighed over the hour persistence weighed it over,
    and never beyond what the policy's forecaster is set to reach."""
    horizon = min(float(history_seconds), float(policy.forecast.horizon_seconds))
    return replace(forecast_spec(policy), lead_seconds=0.0, horizon_seconds=horizon)


def layout_history_seconds(policy: ScalingPolicySpec, history_seconds: float) -> float:
    """Seconds of per-step shape history the forecast reads: `historySeconds`, or more when
    the policy's forecaster needs more points to fit (its `min_points`, the training window:
    `plan.preserve.window_history_minutes`' rule), at most 10,000 steps (under Prometheus'
    11,000 points per series)."""
    spec = layout_forecast_spec(policy, history_seconds)
    try:
        points = get_forecaster(policy.forecast.method.value).min_points(spec)
    except KeyError:
        points = 0
    seconds = max(float(history_seconds), points * spec.step_seconds, spec.min_history_seconds)
    return min(seconds, 10_000 * spec.step_seconds)


#: Most windows a re-plan's horizon is cut into (`layout_switch`: "6-12 windows of 5-10 min").
MAX_WINDOWS = 12


@dataclass(frozen=True)
class TypeForecast:
    """The re-plan horizon as forecast windows, and per type what made its rates."""

    windows: tuple[Window, ...]
    #: per type: the forecaster that ran, or "persisted" (its measured mean rate)
    methods: tuple[str, ...]
    #: why a type persisted, and the forecaster's notes
    notes: tuple[str, ...] = ()

    def summary(self, measured: Sequence[float]) -> str:
        """One line for the status message: each type's measured → horizon-mean rate."""
        total = sum(w.duration_s for w in self.windows)
        parts = []
        for j, how in enumerate(self.methods):
            mean = (
                sum(w.duration_s * w.rates[j] for w in self.windows) / total if total > 0 else 0.0
            )
            was = measured[j] if j < len(measured) else 0.0
            parts.append(f"type {j} {was:.3g} → {mean:.3g} req/s ({how})")
        head = f"per-type forecast over {total:.0f} s in {len(self.windows)} windows: "
        tail = f"; {'; '.join(self.notes)}" if self.notes else ""
        return head + ", ".join(parts) + tail


def horizon_bounds(horizon_s: float, window_s: float) -> list[tuple[float, float]]:
    """[start, end) of each window of `window_s` seconds from now to `horizon_s` (the last
    one shorter when the horizon is not a whole number of windows)."""
    if not horizon_s > 0 or not window_s > 0:
        raise ValueError(f"horizon {horizon_s} s and windows of {window_s} s must be > 0")
    out, t = [], 0.0
    while t < horizon_s - 1e-9:
        out.append((t, min(horizon_s, t + window_s)))
        t += window_s
    return out


def forecast_windows(
    series: Sequence[Sequence[float]],
    persisted: Sequence[float],
    spec: ForecastSpec,
    method: str,
    window_s: float,
    max_windows: int = MAX_WINDOWS,
) -> TypeForecast:
    """Each type's requests/s per window of the horizon [now, now + spec.horizon_seconds]
    (OServe §5.1, pure): the policy's forecaster (`forecast_peak`, the one the plan and
    window loops call: gaps and partial gaps are missing data, `forecast/gaps.py`) on the
    type's series, and the window's rate the mean of the point path over it
    (`plan.cycle.expected_in_window`).

    Why the point path, not the provisioning quantile: the windows weigh a switch's
    expected gain in served requests against its cost, an expectation; the upper quantile
    sizes capacity against a peak (and `forecast_peak` gives it for the horizon's peak
    only, not per step). A type the method cannot forecast (too little history or too many
    gaps for it, a failed fit, no observation) keeps its measured mean rate `persisted[j]`
    in every window, and a note says why. Windows are `window_s` (the re-plan interval)
    long, longer when the horizon would hold more than `max_windows` of them (each window
    costs the switch evaluation two assignment LPs per candidate)."""
    width = max(float(window_s), spec.horizon_seconds / max(1, max_windows))
    bounds = horizon_bounds(spec.horizon_seconds, width)
    per_type: list[list[float]] = []
    methods: list[str] = []
    notes: list[str] = []
    for j, rate in enumerate(persisted):
        values = series[j] if j < len(series) else []
        fc = forecast_peak(values, spec, method, "persistence")
        if fc.fallback_reason or not fc.reliable or not fc.path_tps:
            why = fc.fallback_reason or "no observation in the history"
            notes.append(f"type {j}: {why}; its measured rate persists")
            per_type.append([float(rate)] * len(bounds))
            methods.append("persisted")
            continue
        per_type.append([max(0.0, expected_in_window(fc, spec, a, b)) for a, b in bounds])
        methods.append(fc.method)
        notes.extend(f"type {j}: {n}" for n in fc.notes if n.startswith("gap floor"))
    windows = tuple(
        Window(b - a, tuple(rates[i] for rates in per_type)) for i, (a, b) in enumerate(bounds)
    )
    return TypeForecast(windows, tuple(methods), tuple(notes))


def analytical_capacity(
    catalog: PerfCatalog,
    md: ModelDeployment,
    group: LayoutGroup,
    centroids: Sequence[tuple[float, float]],
    node_gpus: int = 8,
) -> dict[Strategy, tuple[float, ...]]:
    """n per declared variant and type from the perf profile (`perf/capacity.py`), the
    profile found as the layout rules find it (annotation `sageserve.io/perf-profile`, the
    ModelDeployment's name, the model name). Raises ValueError naming the fix when no
    profile has every variant's (TP, PP) on the GPU type."""
    problems = []
    for name in profile_names(md):
        try:
            perf = {
                group.strategy(v): catalog.layout(
                    name, group.gpu_type, *variant_parallelism(v), node_gpus=node_gpus
                )
                for v in group.variants
            }
        except (KeyError, ValueError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        return {s: tuple(type_capacity(p, i, o) for i, o in centroids) for s, p in perf.items()}
    raise ValueError(
        f"no perf profile gives n for every variant of {group.model} on {group.gpu_type} "
        f"({'; '.join(problems)}); name a profile with the annotation sageserve.io/perf-profile, "
        f"or give measured n in a ConfigMap named by the annotation {TYPE_CAPACITY_ANNOTATION} "
        f"(key {TYPE_CAPACITY_KEY}, the file of `sageserve calibrate --by-type --out`)"
    )


@dataclass(frozen=True)
class MeasuredCapacity:
    """A measured capacity table (`calibrate --by-type`) as the layout loop uses it."""

    gpu_type: str
    centroids: tuple[tuple[float, float], ...]
    capacity: dict[str, tuple[float, ...]]

    def rows(self, group: LayoutGroup) -> dict[Strategy, tuple[float, ...]]:
        """n per declared variant; ValueError naming the missing layout and the fix."""
        out = {}
        for v in group.variants:
            s = group.strategy(v)
            row = self.capacity.get(str(s))
            if row is None:
                declared = ",".join(str(group.strategy(x)) for x in group.variants)
                raise ValueError(
                    f"{TYPE_CAPACITY_KEY}: capacity has no row {str(s)!r} for variant {v.name} "
                    f"(have {sorted(self.capacity)}); measure it with `sageserve calibrate "
                    f"--by-type --strategies {declared}`"
                )
            out[s] = row
        return out


def _centroids(types: Any) -> tuple[tuple[float, float], ...]:
    if not isinstance(types, list) or not types:
        raise ValueError(f"{TYPE_CAPACITY_KEY}: types must list the request types' centroids")
    out = []
    for j, t in enumerate(types):
        try:
            p, o = float(t["promptTokens"]), float(t["outputTokens"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{TYPE_CAPACITY_KEY}: types[{j}] needs numeric promptTokens and outputTokens"
            ) from None
        if not (math.isfinite(p) and math.isfinite(o) and p >= 0 and o >= 0):
            raise ValueError(f"{TYPE_CAPACITY_KEY}: types[{j}]: tokens must be finite and >= 0")
        out.append((p, o))
    return tuple(out)


def _capacity_rows(cap: Any, types: int) -> dict[str, tuple[float, ...]]:
    if not isinstance(cap, Mapping) or not cap:
        raise ValueError(f"{TYPE_CAPACITY_KEY}: capacity must map each layout (TP4, TP4xPP2) to n")
    rows: dict[str, tuple[float, ...]] = {}
    for name, row in cap.items():
        try:
            values = tuple(float(x) for x in row)
        except (TypeError, ValueError):
            raise ValueError(
                f"{TYPE_CAPACITY_KEY}: capacity.{name} must be a list of requests/s, one per type"
            ) from None
        if len(values) != types:
            raise ValueError(
                f"{TYPE_CAPACITY_KEY}: capacity.{name} has {len(values)} values for "
                f"{types} types; one n per type"
            )
        if any(not math.isfinite(x) or x < 0 for x in values):
            raise ValueError(f"{TYPE_CAPACITY_KEY}: capacity.{name}: n must be finite and >= 0")
        rows[str(name)] = values
    return rows


def parse_measured(raw: Any) -> MeasuredCapacity:
    """The `calibrate --by-type` file (YAML/JSON already loaded), checked; ValueError naming
    the field and the fix. Only what the loop needs is read: kind, gpuType, types, capacity."""
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"{TYPE_CAPACITY_KEY}: not a mapping; store the file of `sageserve calibrate "
            "--by-type --out n.yaml` under that key"
        )
    if raw.get("kind") != "sageserve.io/type-capacity":
        raise ValueError(
            f"{TYPE_CAPACITY_KEY}: kind is {raw.get('kind')!r}, not sageserve.io/type-capacity; "
            "store the file of `sageserve calibrate --by-type --out n.yaml`"
        )
    gpu = raw.get("gpuType")
    if not isinstance(gpu, str) or not gpu:
        raise ValueError(f"{TYPE_CAPACITY_KEY}: gpuType missing; the GPU type n was measured on")
    centroids = _centroids(raw.get("types"))
    return MeasuredCapacity(gpu, centroids, _capacity_rows(raw.get("capacity"), len(centroids)))


def measured_capacity(
    md: ModelDeployment,
    groups: Sequence[LayoutGroup],
    namespace: str,
    data: Mapping[str, str] | None,
) -> MeasuredCapacity | None:
    """The measured table `md`'s annotation `sageserve.io/type-capacity` names, from the
    ConfigMap's `data` (None: it does not exist); None when `md` names none. ValueError
    naming the ConfigMap, the key, the field and the fix when it is missing or broken: no
    key, not YAML, a table `parse_measured` refuses, a GPU type without layouts, a declared
    variant without a row. The operator reports it as `LayoutsReady=False`; the simulator
    refuses the scenario."""
    name = md.metadata.annotations.get(TYPE_CAPACITY_ANNOTATION)
    if not name:
        return None
    where = f"ConfigMap {namespace}/{name} (annotation {TYPE_CAPACITY_ANNOTATION})"
    if data is None:
        raise ValueError(
            f"{where} does not exist; create it with the file of `sageserve calibrate "
            f"--by-type --out n.yaml` under the key {TYPE_CAPACITY_KEY}, or remove the "
            "annotation for analytical n"
        )
    text = data.get(TYPE_CAPACITY_KEY)
    if text is None:
        raise ValueError(f"{where} has no key {TYPE_CAPACITY_KEY} (keys: {sorted(data)})")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{where}, key {TYPE_CAPACITY_KEY}: not YAML or JSON: {exc}") from None
    try:
        table = parse_measured(raw)
        matching = [g for g in groups if g.gpu_type == table.gpu_type]
        if not matching:
            raise ValueError(
                f"{TYPE_CAPACITY_KEY}: gpuType {table.gpu_type} is none of the GPU types "
                f"with several variants {[g.gpu_type for g in groups]}; measure n on that "
                "GPU type (calibrate --by-type --gpu-type)"
            )
        for g in matching:
            table.rows(g)  # every declared variant has a row
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return table


def budget_gpus(
    group: LayoutGroup, region: str, plan: Plan | None, replicas: Mapping[str, int]
) -> tuple[int, str]:
    """(GPUs, source) the layout is searched on (OServe §4.3's budget D).

    The plan's instances of the group's variants × their GPUs when the plan in force covers
    the (model, region) (the ILP plans one variant per GPU type; its GPUs are the model's
    share of that type); else the GPUs `replicas` hold (the layout in force, first read from
    the pod sets' spec.replicas), so that a strategy without a plan keeps its size and only
    the layout changes."""
    key = EndpointKey(group.model, region)
    if plan is not None and key in plan.targets:
        gpus = sum(plan.variant_target(key, v.name) * v.gpus_per_instance for v in group.variants)
        return gpus, "plan"
    held = sum(max(0, replicas.get(v.name, 0)) * v.gpus_per_instance for v in group.variants)
    return held, "held"


def variant_weights(
    group: LayoutGroup,
    capacity: Mapping[Strategy, Sequence[float]],
    layout: Sequence[Strategy],
    rates: Sequence[float],
) -> list[dict[str, float]]:
    """Per type, the share of its requests each variant gets (`layout_weights` by variant
    name). Every variant of the group is named, 0 for those the layout does not run or the
    type should not go to: the router applies weights only where every candidate pod's
    variant is named, so a variant still running while a switch retires it must be named
    (with 0) for the weights to hold during the switch."""
    by = group.by_strategy
    out: list[dict[str, float]] = []
    for shares in layout_weights(capacity, canonical(layout), rates):
        named = dict.fromkeys((v.name for v in group.variants), 0.0) if shares else {}
        for s, w in shares.items():
            named[by[s].name] += w
        out.append({v: round(w, 4) for v, w in named.items()})
    return out


@dataclass(frozen=True)
class LayoutTargets:
    """The layouts in force: instances per (endpoint, variant) of the variants they manage,
    and when they last changed."""

    targets: Mapping[tuple[EndpointKey, str], int] = field(default_factory=dict)
    changed_at: float = 0.0


def with_layouts(plan: Plan | None, layouts: LayoutTargets) -> Plan | None:
    """The plan in force with its targets of the layouts' variants replaced by the layouts'
    (pure). The plan's other targets, forecasts and time are kept (LT-UA times its gap
    window from `computed_at`); with no plan, a plan of the layouts alone, timed at their
    last change. `layout_variants` tells the decision step which targets are a layout's
    (moved per variant, `pace.step.decide`)."""
    if not layouts.targets:
        return plan
    if plan is None:
        return Plan(
            layouts.changed_at, dict(layouts.targets), layout_variants=frozenset(layouts.targets)
        )
    merged = dict(plan.variant_targets)
    merged.update(layouts.targets)
    return Plan(
        plan.computed_at,
        merged,
        plan.forecasts,
        plan.instance_tps,
        plan.spill,
        layout_variants=frozenset(layouts.targets) | plan.layout_variants,
    )
