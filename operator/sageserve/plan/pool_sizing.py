"""Sizing a pool of GPUs that serves many sporadic models by token-level switching.

Aegaeon (Xiang et al., SOSP '25) serves a long tail of rarely used models on a shared pool
that switches models between decoding turns. How many GPUs such a pool needs follows from
three pieces of the paper, each a pure function here:

- **Active models** (Aegaeon §3, Theorem 3.1, App. A.1): with Poisson arrivals at rate λᵢ and
  mean service time Tᵢ, model i has a request in service at a random instant with probability
  pᵢ = 1 − e^(−λᵢTᵢ), so the expected number of active models is E[m] = Σ pᵢ. Its worked value
  is 46.55 of 100 models (λ = 0.037, T = 16.79 s). The count itself is a sum of independent
  Bernoulli variables (Poisson-binomial), so a quantile of it is exact too
  (:func:`active_models_quantile`), for a pool sized for busier moments than the mean.
- **Decode quotas** (Aegaeon §4.3, Eqs. 2–3): a decode instance serves its batches in rounds,
  batch i for a quota qᵢ, with the switching cost c of the round spread over the turns. The
  round's estimated attainment is 1/α (:func:`round_alpha`), so an instance can hold as many
  models as keep 1/α at the target (:func:`models_per_decode_instance`).
- **Prefill** (Aegaeon §4.2): prefill runs on its own instances, one request at a time; an
  instance is busy for the prefill plus, at worst, one model switch per request.

Which models are pooled: those whose forecast load would use less than a threshold of one
dedicated instance (:func:`split_hot_cold`). The paper pools the whole long tail and serves
hot models dedicated (§2.2, Fig. 1b) without naming a threshold; the threshold is ours.

The pool's GPUs enter the planner as GPU demand per (region, GPU type)
(:meth:`PoolPlan.gpu_demand`); :func:`with_pool` adds it to a :class:`PlanProblem` as one
more "model" whose capacity is one instance per instance, so the ILP covers dedicated and
pooled capacity in one plan, under one GPU capacity per (region, GPU type).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sageserve.plan.problem import InstanceBounds, PlanProblem

#: Aegaeon §4.3: the longest decoding turn (Q_MAX, "empirically set to 4 seconds").
Q_MAX_S = 4.0
#: Aegaeon §4.3, Eq. 3: α ≥ 0.5, so a round never plans for more than 200 % attainment.
ALPHA_FLOOR = 0.5
#: Prefill instances are sized to run at most this busy: with a 10 s TTFT target a queue
#: at 80 % load waits a few prefill times (ours; the paper fixes its 6 prefill GPUs).
PREFILL_MAX_UTILISATION = 0.8
#: Prefix of the pseudo-model a pool becomes in a :class:`PlanProblem`.
POOL_MODEL_PREFIX = "pool:"


def _check_finite(name: str, value: float, minimum: float = 0.0, strict: bool = False) -> None:
    ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise ValueError(f"{name}: must be a finite number {bound}, got {value}")


def active_probability(rate_rps: float, service_s: float) -> float:
    """P(a model has a request in service at a random instant) = 1 − e^(−λT) (Aegaeon App. A.1)."""
    _check_finite("rate_rps", rate_rps)
    _check_finite("service_s", service_s)
    return -math.expm1(-rate_rps * service_s)


def expected_active_models(rates_rps: Sequence[float], service_s: Sequence[float] | float) -> float:
    """E[m] = Σᵢ (1 − e^(−λᵢTᵢ)) (Aegaeon Theorem 3.1, heterogeneous rates).

    ``service_s`` is one mean service time for every model or one per model.
    """
    times = _per_model("service_s", service_s, len(rates_rps))
    return math.fsum(active_probability(lam, t) for lam, t in zip(rates_rps, times, strict=True))


def active_models_quantile(
    rates_rps: Sequence[float], service_s: Sequence[float] | float, quantile: float
) -> int:
    """The smallest k with P(active models ≤ k) ≥ ``quantile``.

    The active count is a sum of independent Bernoulli(pᵢ) (Aegaeon App. A.1's indicator
    variables), so its distribution is Poisson-binomial; one pass of the convolution gives it
    exactly (O(M²), M models).
    """
    if not (0.0 < quantile <= 1.0):
        raise ValueError(f"quantile: must be in (0, 1], got {quantile}")
    times = _per_model("service_s", service_s, len(rates_rps))
    dist = [1.0]
    for lam, t in zip(rates_rps, times, strict=True):
        p = active_probability(lam, t)
        nxt = [0.0] * (len(dist) + 1)
        for k, w in enumerate(dist):
            nxt[k] += w * (1.0 - p)
            nxt[k + 1] += w * p
        dist = nxt
    acc = 0.0
    for k, w in enumerate(dist):
        acc += w
        if acc >= quantile - 1e-12:
            return k
    return len(dist) - 1


def _per_model(name: str, value: Sequence[float] | float, n: int) -> list[float]:
    if isinstance(value, int | float):
        return [float(value)] * n
    if len(value) != n:
        raise ValueError(f"{name}: {len(value)} values for {n} models")
    return [float(v) for v in value]


# ---- decode quotas (Aegaeon §4.3) ------------------------------------------------------------


def round_alpha(step_s: Sequence[float], tbt_s: float, switch_s: float, q_max_s: float) -> float:
    """α of one decoding round, Eq. 3: max(c / (minₖ nₖ · Q_MAX) + Σₖ 1/nₖ, 0.5).

    nₖ = d / tₖ is how many deadline intervals one decoding step of batch k fits; c =
    ``switch_s`` is the round's total switching cost. 1/α is the round's estimated SLO
    attainment.
    """
    _check_finite("tbt_s", tbt_s, strict=True)
    _check_finite("switch_s", switch_s)
    _check_finite("q_max_s", q_max_s, strict=True)
    if not step_s:
        raise ValueError("step_s: needs at least one batch")
    for i, t in enumerate(step_s):
        _check_finite(f"step_s[{i}]", t, strict=True)
    ns = [tbt_s / t for t in step_s]
    return max(switch_s / (min(ns) * q_max_s) + math.fsum(1.0 / n for n in ns), ALPHA_FLOOR)


def decode_quotas(
    step_s: Sequence[float], tbt_s: float, switch_s: float, q_max_s: float = Q_MAX_S
) -> list[float]:
    """Each batch's turn length qᵢ = c / (nᵢ · (α − Σₖ 1/nₖ)), Eq. 2, with α from Eq. 3.

    Why this works (Aegaeon §4.3): a round lasts R = Σ qᵢ + c; batch i decodes qᵢ/tᵢ tokens,
    which cover qᵢ·nᵢ seconds of its deadlines, and Eq. 2 makes that R/α for every batch, so
    each batch attains min(1, 1/α). With no switching in the round (c = 0, one model) the
    paper's formula is 0/0; the batch then decodes for Q_MAX before the round is re-planned.
    """
    alpha = round_alpha(step_s, tbt_s, switch_s, q_max_s)
    if switch_s == 0.0:
        return [q_max_s] * len(step_s)
    inv_sum = math.fsum(t / tbt_s for t in step_s)
    return [switch_s / ((tbt_s / t) * (alpha - inv_sum)) for t in step_s]


def models_per_decode_instance(
    step_s: float,
    tbt_s: float,
    switch_s: float,
    target_attainment: float = 0.9,
    q_max_s: float = Q_MAX_S,
    kv_limit: int | None = None,
) -> int:
    """The most models one decode instance can round-robin while 1/α ≥ the target.

    Each model is one batch with step time ``step_s``; a round of k models switches k times
    (``switch_s`` each, including the switch back to the first model). ``kv_limit`` caps k by
    how many models' batches the KV cache holds at once. Raises when not even one model keeps
    the target: the decoding step itself is too slow for the TBT SLO.
    """
    if not (0.0 < target_attainment <= 1.0):
        raise ValueError(f"target_attainment: must be in (0, 1], got {target_attainment}")
    if round_alpha([step_s], tbt_s, 0.0, q_max_s) > 1.0 / target_attainment + 1e-12:
        raise ValueError(
            f"step_s: a decoding step of {step_s:.3f} s cannot meet a {tbt_s:.3f} s TBT at "
            f"{target_attainment:.0%} even with one model per instance"
        )
    k = 1
    cap = kv_limit if kv_limit is not None else 10_000
    while k < cap:
        nxt = k + 1
        if round_alpha([step_s] * nxt, tbt_s, switch_s * nxt, q_max_s) > (
            1.0 / target_attainment + 1e-12
        ):
            break
        k = nxt
    return k


def theta_at_tbt(
    decode_s: Callable[[float], float],
    kv_capacity_tokens: int,
    tbt_s: float,
    prompt_tokens: float,
    output_tokens: float,
    headroom: float = 0.8,
) -> float:
    """Tokens/s one dedicated instance serves while its decoding step stays within
    ``headroom`` × TBT: the per-token SLO's θ (Aegaeon §2.1 judges every token).

    A decoding step slows as the batch's context grows (``decode_s`` of context tokens), so
    the TBT caps the context K an instance may run; K / (prompt + output/2) requests then
    share it, each done after ``output_tokens`` steps of decode_s(K).
    """
    _check_finite("tbt_s", tbt_s, strict=True)
    _check_finite("output_tokens", output_tokens, strict=True)
    _check_finite("prompt_tokens", prompt_tokens)
    limit = headroom * tbt_s
    if decode_s(1.0) > limit:
        raise ValueError(f"tbt_s: one decoding step exceeds {limit:.3f} s even for one token")
    lo, hi = 1.0, float(kv_capacity_tokens)
    if decode_s(hi) <= limit:
        lo = hi
    else:
        for _ in range(60):
            mid = (lo + hi) / 2
            if decode_s(mid) <= limit:
                lo = mid
            else:
                hi = mid
    concurrent = max(1.0, lo / (prompt_tokens + output_tokens / 2))
    requests_per_s = concurrent / (output_tokens * decode_s(lo))
    return requests_per_s * (prompt_tokens + output_tokens)


# ---- hot / cold split and the pool's size ------------------------------------------------------


@dataclass(frozen=True)
class ModelForecast:
    """One model's forecast: request rate and mean request size."""

    name: str
    rate_rps: float
    prompt_tokens: float
    output_tokens: float
    #: tokens/s of the busiest forecast window; dedicated instances are sized on it (the
    #: mean when not given)
    peak_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        _check_finite(f"{self.name}.rate_rps", self.rate_rps)
        _check_finite(f"{self.name}.prompt_tokens", self.prompt_tokens)
        _check_finite(f"{self.name}.output_tokens", self.output_tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.rate_rps * (self.prompt_tokens + self.output_tokens)


@dataclass(frozen=True)
class PoolShape:
    """What one pooled instance is and how fast it works (one base model size, one GPU type).

    ``theta_tps``: tokens/s one *dedicated* instance of the model serves at its SLO (the
    planner's θ), to tell hot models from cold ones. ``decode_step_s``: one decoding step of
    a single model's batch; ``prefill_s``: one request's prefill (batch size 1, Aegaeon §4.2);
    ``switch_s``: one model switch (Aegaeon Eq. 4).
    """

    region: str
    gpu_type: str
    gpus_per_instance: int
    theta_tps: float
    decode_step_s: float
    prefill_s: float
    switch_s: float
    ttft_s: float = 10.0
    tbt_s: float = 0.1
    target_attainment: float = 0.9
    q_max_s: float = Q_MAX_S
    kv_models_per_instance: int | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_instance < 1:
            raise ValueError(f"gpus_per_instance: must be >= 1, got {self.gpus_per_instance}")
        _check_finite("theta_tps", self.theta_tps, strict=True)
        _check_finite("decode_step_s", self.decode_step_s, strict=True)
        _check_finite("prefill_s", self.prefill_s)
        _check_finite("switch_s", self.switch_s)
        _check_finite("ttft_s", self.ttft_s, strict=True)
        _check_finite("tbt_s", self.tbt_s, strict=True)


def split_hot_cold(
    models: Sequence[ModelForecast], theta_tps: float, threshold: float
) -> tuple[dict[str, int], list[ModelForecast]]:
    """Models whose load is at least ``threshold`` of one dedicated instance stay dedicated
    (with ⌈peak load / θ⌉ instances); the rest are pooled.

    Why a utilisation threshold: a model that keeps an instance busy gains nothing from
    sharing it and would pay switches for nothing (Aegaeon §2.2 pools the long tail, serves
    the hot models on their own GPUs).
    """
    _check_finite("theta_tps", theta_tps, strict=True)
    if not threshold > 0.0:
        raise ValueError(f"threshold: must be > 0, got {threshold}")
    hot: dict[str, int] = {}
    cold: list[ModelForecast] = []
    for m in models:
        load = m.tokens_per_s / theta_tps
        if load >= threshold:
            peak = max(m.tokens_per_s, m.peak_tokens_per_s or 0.0) / theta_tps
            hot[m.name] = max(1, math.ceil(peak - 1e-9))
        else:
            cold.append(m)
    return hot, cold


@dataclass(frozen=True)
class PoolPlan:
    """How a fleet of sporadic models is served: dedicated instances and one pool."""

    shape: PoolShape
    dedicated: dict[str, int]
    pooled: tuple[str, ...]
    expected_active: float
    sized_active: int
    models_per_decode_instance: int
    prefill_instances: int
    decode_instances: int
    notes: tuple[str, ...] = field(default=())

    @property
    def pool_instances(self) -> int:
        return self.prefill_instances + self.decode_instances

    @property
    def pool_gpus(self) -> int:
        return self.pool_instances * self.shape.gpus_per_instance

    @property
    def dedicated_gpus(self) -> int:
        return sum(self.dedicated.values()) * self.shape.gpus_per_instance

    def gpu_demand(self) -> dict[tuple[str, str], int]:
        """The pool's GPUs per (region, GPU type): what the planner must reserve for it."""
        return {(self.shape.region, self.shape.gpu_type): self.pool_gpus} if self.pooled else {}


def size_pool(
    models: Sequence[ModelForecast],
    shape: PoolShape,
    dedicated_threshold: float = 0.5,
    active_quantile: float | None = None,
) -> PoolPlan:
    """The fewest pooled instances whose quotas keep the per-token SLO (Aegaeon §3, §4).

    Decode: the cold models' active count (E[m], or its ``active_quantile`` when given) over
    the models one decode instance can round-robin at the target attainment. A model counts
    as active while a request of it decodes, which under the quotas takes about one TBT per
    output token (the pace Eq. 2 aims every batch at), so Tᵢ = output tokens × TBT.
    Prefill: the cold models' prefill work, one switch per request at worst, at most
    :data:`PREFILL_MAX_UTILISATION` busy.
    """
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError("models: duplicate names")
    hot, cold = split_hot_cold(models, shape.theta_tps, dedicated_threshold)
    rates = [m.rate_rps for m in cold]
    times = [m.output_tokens * shape.tbt_s for m in cold]
    expected = expected_active_models(rates, times)
    if active_quantile is None:
        sized = math.ceil(expected - 1e-9)
    else:
        sized = active_models_quantile(rates, times, active_quantile)
    per_instance = models_per_decode_instance(
        shape.decode_step_s,
        shape.tbt_s,
        shape.switch_s,
        shape.target_attainment,
        shape.q_max_s,
        shape.kv_models_per_instance,
    )
    notes: list[str] = []
    if not cold:
        return PoolPlan(shape, hot, (), 0.0, 0, per_instance, 0, 0, ("no model is cold",))
    decode = max(1, math.ceil(sized / per_instance))
    work = math.fsum(m.rate_rps for m in cold) * (shape.prefill_s + shape.switch_s)
    prefill = max(1, math.ceil(work / PREFILL_MAX_UTILISATION - 1e-9))
    if shape.prefill_s + shape.switch_s > shape.ttft_s:
        notes.append(
            f"one prefill with its switch takes {shape.prefill_s + shape.switch_s:.2f} s, "
            f"more than the {shape.ttft_s:.2f} s TTFT target"
        )
    return PoolPlan(
        shape=shape,
        dedicated=hot,
        pooled=tuple(m.name for m in cold),
        expected_active=expected,
        sized_active=sized,
        models_per_decode_instance=per_instance,
        prefill_instances=prefill,
        decode_instances=decode,
        notes=tuple(notes),
    )


# ---- into the planner's ILP ---------------------------------------------------------------------


def with_pool(
    problem: PlanProblem,
    name: str,
    instances: Mapping[tuple[str, str], int],
    gpus_per_instance: int,
    current: Mapping[tuple[str, str], int] | None = None,
    startup_seconds: float = 0.0,
) -> PlanProblem:
    """``problem`` with a pool as one more model ``pool:<name>`` of fixed demand.

    ``instances[(region, gpu type)]`` pooled instances must exist in that region. The pool
    becomes a model of capacity 1 per instance whose demand is its instance count in every
    window, allowed only in its regions, so the ILP's C1/C2 rows ask for exactly those
    instances and its GPU-capacity rows (Σ GPUs per (region, GPU type)) share the GPUs with
    the dedicated models: one plan for both. A pool that does not fit is reported as the
    planner reports any model's shortfall.
    """
    model = POOL_MODEL_PREFIX + name
    if model in problem.models:
        raise ValueError(f"models: {model} is already in the problem")
    if gpus_per_instance < 1:
        raise ValueError(f"gpus_per_instance: must be >= 1, got {gpus_per_instance}")
    gpus = {g for _, g in instances}
    if len(gpus) > 1:
        raise ValueError(f"instances: one GPU type per pool, got {sorted(gpus)}")
    for (r, g), n in instances.items():
        if r not in problem.regions:
            raise ValueError(f"instances: region {r} is not in the problem's regions")
        if g not in problem.gpu_types:
            raise ValueError(f"instances: GPU type {g} is not in the problem's gpu_types")
        if n < 0:
            raise ValueError(f"instances.{r}.{g}: must be >= 0, got {n}")
    data = problem.model_dump()
    windows = max(1, problem.windows())
    data["models"] = [*problem.models, model]
    if gpus:
        (g,) = gpus
        data["capacity_tps"][model] = {g: 1.0}
        data["gpus_per_instance"][model] = {g: gpus_per_instance}
        data["startup_seconds"][model] = {g: startup_seconds}
    per_region = {r: n for (r, _), n in instances.items()}
    data["demand_tps"][model] = {r: [float(n)] * windows for r, n in per_region.items() if n}
    if problem.demand_tps_by_tier is not None and problem.tiers:
        top = problem.tiers[0]
        data["demand_tps_by_tier"][model] = {
            r: {top: list(v)} for r, v in data["demand_tps"][model].items()
        }
    bounds = data.get("bounds") or {}
    bounds[model] = {
        r: InstanceBounds(max=per_region.get(r, 0)).model_dump() for r in problem.regions
    }
    data["bounds"] = bounds
    if current:
        data["current"][model] = {}
        for (r, g), n in current.items():
            data["current"][model].setdefault(r, {})[g] = n
    return PlanProblem.model_validate(data)


# ---- request-level switching (vLLM sleep mode on Kubernetes) ------------------------------------


@dataclass(frozen=True)
class SwitchingPoolSize:
    """Pods a pool of sleep-mode engines needs: `instances` = ⌈active models / awake quota⌉."""

    expected_active: float
    sized_active: int
    instances: int


def size_switching_pool(
    rates_rps: Sequence[float],
    service_s: Sequence[float] | float,
    awake_per_instance: int,
    active_quantile: float | None = None,
) -> SwitchingPoolSize:
    """Pods for request-level switching: every model with a request in service must be awake
    somewhere, and a pod keeps at most ``awake_per_instance`` models awake, so the pool
    needs ⌈k / quota⌉ pods for k active models: E[m] (Aegaeon Theorem 3.1), or its
    ``active_quantile`` (Poisson-binomial), for a pool that rarely makes a request wait for
    a slot. Why not :func:`size_pool`: stock vLLM cannot switch models between decoding
    turns, so the decode quotas of Eqs. 2–3 do not apply; a model holds its slot for its
    whole request (Aegaeon §5, request-level switching).
    """
    if awake_per_instance < 1:
        raise ValueError(f"awake_per_instance: must be >= 1, got {awake_per_instance}")
    expected = expected_active_models(rates_rps, service_s)
    if active_quantile is None:
        sized = math.ceil(expected - 1e-9)
    else:
        sized = active_models_quantile(rates_rps, service_s, active_quantile)
    return SwitchingPoolSize(expected, sized, math.ceil(sized / awake_per_instance))
