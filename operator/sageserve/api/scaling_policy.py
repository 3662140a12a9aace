"""ScalingPolicy: how a fleet is sized — strategy, cadence, thresholds, forecast, ILP, spot.

Every default is the SageServe paper's value (SageServe §2.3, §4, §5, §6, §7.1);
where the paper leaves a value open (ε, τ_n, τ_p, the new-node delay) the field says what
sageserve chose and why. The status carries the current plan, so `kubectl get spol -o yaml`
shows forecast, targets, objective, solver time and unmet demand.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field

from sageserve.api.common import (
    LABEL_VALUE,
    ApiModel,
    Condition,
    ObjectMeta,
    cel,
    conditions_field,
    list_map,
    sub_object,
)
from sageserve.metrics.picker import PickerKind


class Strategy(StrEnum):
    """Scaling strategies (SageServe §6.4, baselines §7.1).

    reactive: unified pool, scale on EMU thresholds only (the paper's main baseline),
    counting instances still starting as capacity (as the HPA counts unready pods).
    reactive-paper: the paper's rule exactly (SageServe §7.1): EMU of serving instances
    only, none of reactive's queue signals or scale-in holds.
    siloed: separate interactive and batch pools, same thresholds (status quo at O365).
    lt-immediate (LT-I): apply the hourly ILP target at once.
    lt-utilization (LT-U): step toward the target only while EMU crosses the thresholds.
    lt-utilization-arima (LT-UA): LT-U, plus in the last minutes of the hour keep scaling
    when observed load is far from the forecast.
    preserve (PreServe §4.1, §4.3.2): size each window from separate prompt and decode
    forecasts, add an instance per instance whose projected KV cache overflows, scale down
    at most once per window.
    static: a fixed fleet sized for the window's peak (PreServe §5's static baseline; a
    simulation baseline).
    chiron (Chiron, Patke et al., SageServe v3 §7.1's baseline): interactive backpressure
    (share of instances running an interactive request above spec.chiron's threshold: out
    one, else in one) and the batch queue's pending time against its deadlines.
    """

    REACTIVE = "reactive"
    REACTIVE_PAPER = "reactive-paper"
    CHIRON = "chiron"
    SILOED = "siloed"
    LT_IMMEDIATE = "lt-immediate"
    LT_UTILIZATION = "lt-utilization"
    LT_UTILIZATION_ARIMA = "lt-utilization-arima"
    PRESERVE = "preserve"
    STATIC = "static"


class ForecastMethod(StrEnum):
    """Forecasters (docs/forecast.md). `arima` is the paper's load predictor (a seasonal AR
    fit of the log rate); `arima-classic` is statsmodels' ARIMA; `peak-regression` predicts
    the next hour's peak directly; `ensemble` blends the two best on the ServeGen backtest;
    the rest are baselines, also usable as fallbacks. `realised` is the load that actually
    came, which only a simulation knows (the achievable reference, `sageserve simulate
    --reference`); the operator refuses it."""

    ARIMA = "arima"
    ARIMA_CLASSIC = "arima-classic"
    PEAK_REGRESSION = "peak-regression"
    ENSEMBLE = "ensemble"
    PERSISTENCE = "persistence"
    SEASONAL_NAIVE = "seasonal-naive"
    MOVING_AVERAGE = "moving-average"
    REALISED = "realised"


class FallbackMethod(StrEnum):
    """Baselines that need no fitting, so they always produce a forecast."""

    PERSISTENCE = "persistence"
    SEASONAL_NAIVE = "seasonal-naive"
    MOVING_AVERAGE = "moving-average"


class Solver(StrEnum):
    """MILP solvers reached through PuLP; the other one is the fallback."""

    HIGHS = "highs"
    CBC = "cbc"


INTERVAL_RULES = cel(
    (
        "self.paceSeconds < self.planSeconds",
        "spec.intervals.paceSeconds must be below spec.intervals.planSeconds: pacing moves "
        "the fleet toward each plan, so it must run more often than planning",
    ),
)


class Intervals(ApiModel):
    """Cadence of the two loops and the pause between scaling events."""

    model_config = ConfigDict(json_schema_extra=INTERVAL_RULES)

    plan_seconds: int = Field(
        default=3600, ge=60, le=86400, description="Forecast + ILP cadence (SageServe: 1 h)."
    )
    pace_seconds: int = Field(
        default=15,
        ge=1,
        le=3600,
        description="How often utilisation is checked. The paper checks on every request "
        "arrival; a controller samples instead, at the cooldown's period.",
    )
    cooldown_seconds: int = Field(
        default=15,
        ge=0,
        le=3600,
        description="Minimum time between two scaling events of one pod set (SageServe: 15 s).",
    )
    scale_in_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="How long a scale-in waits after the queue-side signal (requests "
        "waiting, TTFT, batch deadline pressure) was last at its level: prefill-bound "
        "capacity shows no KV use, so a backlog just drained is no reason to shrink. The "
        "HPA's scale-down stabilization window (default 300 s).",
    )


class Signals(ApiModel):
    """Load signals read besides the engines' own (docs/metrics.md)."""

    endpoint_picker: PickerKind = Field(
        default=PickerKind.NONE,
        description="The endpoint picker in front of each region's pods whose Prometheus "
        "series the pace loop reads as pressure next to the engines' queues: gaie (the "
        "Gateway API Inference Extension's EPP, v1.0-v1.5), llm-d (the llm-d router's "
        "EPP) or none. Each region's picker is found by its InferencePool's name "
        "(ModelDeployment spec.regions[].inferencePool, default <name>-<region>); the "
        "decision reads the larger of the engines' and the picker's pressure.",
    )


THRESHOLD_RULES = cel(
    (
        "self.scaleInEmu < self.scaleOutEmu",
        "spec.thresholds.scaleInEmu must be below spec.thresholds.scaleOutEmu: otherwise "
        "the fleet oscillates; lower scaleInEmu or raise scaleOutEmu (SageServe: 0.3 / 0.7)",
    ),
)


class Thresholds(ApiModel):
    """Effective memory utilisation (KV-cache use) that triggers scaling (SageServe §4, §6.4)."""

    model_config = ConfigDict(json_schema_extra=THRESHOLD_RULES)

    scale_out_emu: float = Field(
        default=0.7, gt=0, le=1, description="Scale out above this EMU (SageServe: 70%)."
    )
    scale_in_emu: float = Field(
        default=0.3, ge=0, lt=1, description="Scale in below this EMU (SageServe: 30%)."
    )


BATCH_RELEASE_RULES = cel(
    (
        "self.twoBelowEmu < self.oneBelowEmu",
        "spec.routing.batchRelease.twoBelowEmu must be below oneBelowEmu: a less loaded "
        "region gets more batch work (SageServe: 0.5 and 0.6)",
    ),
)


class BatchRelease(ApiModel):
    """When the Queue Manager releases queued batch requests to a region (SageServe §6.2)."""

    model_config = ConfigDict(json_schema_extra=BATCH_RELEASE_RULES)

    one_below_emu: float = Field(
        default=0.6, gt=0, le=1, description="Release 1 request when EMU is below this."
    )
    two_below_emu: float = Field(
        default=0.5, gt=0, le=1, description="Release 2 requests when EMU is below this."
    )


class Routing(ApiModel):
    """Region routing and batch release (SageServe's global router and Queue Manager)."""

    region_emu_threshold: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Interactive requests go to the first preferred region below this EMU, "
        "else to the least loaded region (SageServe: 70%).",
    )
    batch_release: BatchRelease = sub_object(BatchRelease)


class InstanceOrder(StrEnum):
    """The order an instance admits waiting interactive requests in (SageServe v3 §6.5)."""

    FCFS = "fcfs"
    EDF = "edf"
    PF = "pf"
    DPA = "dpa"


class InstanceScheduling(ApiModel):
    """How each instance orders its waiting interactive requests when tiers of different
    TTFT SLOs share it (SageServe v3 §6.5, Fig. 15). Batch work waits behind interactive
    work under every policy (SageServe §6.1)."""

    policy: InstanceOrder = Field(
        default=InstanceOrder.FCFS,
        description="fcfs: by arrival (the engine's default); edf: earliest TTFT deadline "
        "(arrival + the tier's slo.ttftP95Seconds) first, expired ones first; pf: every "
        "request of the tier with the lower spec.priority first (IW-F before IW-N), by "
        "arrival within a tier; dpa: severely expired, urgent by tier, non-urgent by tier, "
        "recently expired. On Kubernetes any policy but fcfs runs vLLM with "
        "--scheduling-policy priority and the router sends each request's priority (dpa "
        "as pf: a fixed number cannot follow the time left).",
    )
    expired_after_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="dpa's τ_n: a request later than this past its TTFT deadline is severely "
        "expired and served first; one less late waits behind every request still on time. "
        "The paper gives no value; 10 s is ten IW-F SLOs.",
    )
    urgent_within_seconds: float = Field(
        default=2.0,
        ge=0,
        le=3600,
        description="dpa's τ_p: a request due within this is urgent (served before every "
        "non-urgent one, faster tier first). The paper gives no value; 2 s makes every "
        "live IW-F request (1 s SLO) urgent.",
    )


FORECAST_GAP_RULES = cel(
    (
        "self.scaleDownRatio < 1.0 && self.scaleUpRatio > 1.0",
        "spec.forecastGap needs scaleDownRatio < 1 < scaleUpRatio: they say how far observed "
        "load must fall below or rise above the forecast (SageServe: 0.5 and 5)",
    ),
)


class ForecastGap(ApiModel):
    """LT-UA's correction when observed load is far from the forecast (SageServe §6.4)."""

    model_config = ConfigDict(json_schema_extra=FORECAST_GAP_RULES)

    window_seconds: int = Field(
        default=1200,
        ge=0,
        le=86400,
        description="Active during the last this-many seconds of each plan interval, once "
        "the target is reached (SageServe: last 20 min).",
    )
    scale_up_ratio: float = Field(
        default=5.0,
        gt=0,
        le=1000,
        description="Keep scaling out while observed tokens/s ≥ this × forecast (SageServe: 5).",
    )
    scale_down_ratio: float = Field(
        default=0.5,
        gt=0,
        le=1000,
        description="Keep scaling in while observed tokens/s ≤ this × forecast (SageServe: 0.5).",
    )
    overload_emu: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="LT-UA scales out past the plan's target while EMU is above this, at any "
        "time (the reference code's valve; 1 turns it off).",
    )


class ArimaOrder(ApiModel):
    """A fixed ARIMA(p, d, q) order; without it the order is chosen by AIC as in the paper."""

    p: int = Field(ge=0, le=10)
    d: int = Field(ge=0, le=2)
    q: int = Field(ge=0, le=10)


FORECAST_RULES = cel(
    (
        "self.leadSeconds < self.horizonSeconds",
        "spec.forecast.leadSeconds must be below spec.forecast.horizonSeconds: the peak is "
        "taken over [now + lead, now + horizon]",
    ),
    (
        "self.granularitySeconds <= self.horizonSeconds",
        "spec.forecast.granularitySeconds must not exceed spec.forecast.horizonSeconds: "
        "the horizon must hold at least one step",
    ),
    (
        "self.trainingWindowSeconds >= 3 * self.granularitySeconds",
        "spec.forecast.trainingWindowSeconds must hold at least 3 steps of "
        "granularitySeconds: lengthen the window or use a finer granularity",
    ),
)


class Forecast(ApiModel):
    """The load predictor: tokens/s per (model, region) (SageServe §6.3)."""

    model_config = ConfigDict(json_schema_extra=FORECAST_RULES)

    method: ForecastMethod = Field(default=ForecastMethod.ARIMA)
    fallback: FallbackMethod = Field(
        default=FallbackMethod.MOVING_AVERAGE,
        description="Used, and named in status, when the method fails or history is short.",
    )
    order: ArimaOrder | None = Field(
        default=None, description="Fixed ARIMA order; absent means chosen by AIC (paper)."
    )
    granularity_seconds: int = Field(
        default=60, ge=10, le=86400, description="Step of the series (SageServe: 1 min)."
    )
    training_window_seconds: int = Field(
        default=3600,
        ge=30,
        le=2592000,
        description="History the model is fitted on (SageServe: 60 steps of 1 min).",
    )
    horizon_seconds: int = Field(
        default=3600, ge=60, le=86400, description="Forecast reach (SageServe: next hour)."
    )
    lead_seconds: int = Field(
        default=0,
        ge=0,
        le=86400,
        description="The peak is taken from now + lead; the paper takes the whole hour "
        "(0), its code [t+20 min, t+60 min] (1200).",
    )
    quantile: float = Field(
        default=0.5,
        ge=0.5,
        lt=1,
        description="Forecast quantile provisioned for; 0.5 is the point forecast (paper).",
    )
    batch_buffer_fraction: float = Field(
        default=0.1,
        ge=0,
        le=10,
        description="β: this share of the last hour's batch tokens/s is added to the "
        "interactive forecast (SageServe: 10%).",
    )
    batch_tokens_query: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="PromQL giving batch (NIW) tokens/s by namespace, model_deployment and "
        "region. Unset: the tokens `sageserve router` answered for the namespace's batch "
        "tiers (sageserve_router_tokens_total); with neither, vLLM's metrics do not tell "
        "batch from interactive tokens, all traffic is forecast as interactive and β is 0.",
    )


class GpuCost(ApiModel):
    """α for one GPU type: what one GPU-hour of it costs."""

    gpu_type: str = Field(min_length=1, max_length=63, pattern=LABEL_VALUE)
    cost_per_gpu_hour: float = Field(ge=0, le=1e6)


class Optimizer(ApiModel):
    """The hourly ILP that sets instance targets per (model, region, variant) (SageServe §5)."""

    local_serve_fraction: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="ε: each region serves at least this share of its own peak; the rest "
        "may spill to other regions. The paper leaves ε open; its code uses 1.",
    )
    gpu_hour_costs: list[GpuCost] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra=list_map("gpuType"),
        description="α per GPU type; types not listed cost defaultGpuHourCost.",
    )
    default_gpu_hour_cost: float = Field(
        default=12.29,
        ge=0,
        le=1e6,
        description="α for unlisted GPU types: $98.32 per 8×H100 hour / 8 (SageServe §7.2).",
    )
    solver: Solver = Field(default=Solver.HIGHS)
    node_limit: int = Field(
        default=100,
        ge=1,
        le=1_000_000,
        description="Branch-and-bound nodes per solve: the solver's budget, so that the same "
        "forecast gives the same plan on any machine.",
    )
    time_limit_seconds: float = Field(
        default=30,
        gt=0,
        le=3600,
        description="Safety stop per solve against a runaway solver; a plan it cuts short "
        "says so in status (that plan depends on the machine's speed).",
    )
    relative_gap: float = Field(
        default=0.0001, ge=0, le=1, description="Relative MIP gap at which the solver stops."
    )


SPOT_RULES = cel(
    (
        "self.reclaimSameModelSeconds <= self.reclaimSameModelMaxSeconds",
        "spec.spot.reclaimSameModelSeconds (median) must not exceed "
        "reclaimSameModelMaxSeconds (SageServe: 60 and 300)",
    ),
)


class Spot(ApiModel):
    """Donating idle GPUs to the spot pool and reclaiming them (SageServe §2.3, §6.4)."""

    model_config = ConfigDict(json_schema_extra=SPOT_RULES)

    enabled: bool = Field(
        default=True,
        description="Donate nodes freed by scale-in to the spot pool and reclaim from it.",
    )
    reclaim_same_model_seconds: int = Field(
        default=60,
        ge=0,
        le=86400,
        description="Median delay to reclaim a node that last served the same model "
        "(weights cached; SageServe: 1 min).",
    )
    reclaim_same_model_max_seconds: int = Field(
        default=300, ge=0, le=86400, description="Its maximum (SageServe: 5 min)."
    )
    redeploy_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="Delay to reclaim a node of another model and load this one "
        "(SageServe: 10 min with weights in the region).",
    )
    remote_redeploy_seconds: int = Field(
        default=7200,
        ge=0,
        le=86400,
        description="Same, when weights come from another region (SageServe: ~2 h).",
    )
    new_node_seconds: int = Field(
        default=3600,
        ge=0,
        le=604800,
        description="Delay to obtain a node outside the serving and spot pools (the paper: "
        "minutes to hours). Read by neither the operator nor the simulator today: both take "
        "GPUs only from the serving and spot pools.",
    )


class Siloed(ApiModel):
    """Pool split of the siloed baseline (SageServe §7.1)."""

    batch_instance_fraction: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Share of each (model, region)'s instances kept for batch "
        "(SageServe: 4 of 20).",
    )


class Chiron(ApiModel):
    """The Chiron baseline's interactive autoscaler (Patke et al.; SageServe v3 §7.1)."""

    interactive_busy_above: float = Field(
        default=0.6,
        gt=0,
        lt=1,
        description="Strategy chiron: scale out one instance when more than this share of "
        "an endpoint's serving instances run at least one interactive request, else scale "
        "in one (Chiron's interactive backpressure threshold; SageServe: 0.6).",
    )


POLICY_RULES = cel(
    (
        "self.forecast.horizonSeconds >= self.intervals.planSeconds",
        "spec.forecast.horizonSeconds must cover spec.intervals.planSeconds: each plan has "
        "to see the load until the next one",
    ),
    (
        "self.forecastGap.windowSeconds <= self.intervals.planSeconds",
        "spec.forecastGap.windowSeconds must not exceed spec.intervals.planSeconds: it is "
        "the tail of each plan interval",
    ),
)


PRESERVE_RULES = cel(
    (
        "self.scaleDownKvUsage < self.overloadKvUsage",
        "spec.preserve.scaleDownKvUsage must be below overloadKvUsage: otherwise an instance "
        "could be both overloaded and idle (PreServe: 0.3 and 0.95)",
    ),
)


class Preserve(ApiModel):
    """The `preserve` strategy's window and thresholds (PreServe §4.1, §4.3.2; paper values)."""

    model_config = ConfigDict(json_schema_extra=PRESERVE_RULES)

    window_seconds: int = Field(
        default=600,
        ge=60,
        le=86400,
        description="Window of the service-level forecast: prompt and decode tokens are "
        "forecast, and the fleet resized, once per window (PreServe: 10 min).",
    )
    lookahead_iterations: int = Field(
        default=100,
        ge=1,
        le=10000,
        description="Decode iterations each instance's KV usage is projected over "
        "(PreServe: l = 100).",
    )
    overload_kv_usage: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="Projected KV usage above which an iteration counts as overloaded "
        "(PreServe: 95 %).",
    )
    overload_iteration_share: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="An instance projected overloaded in more than this share of the "
        "look-ahead gets one more instance within the window (PreServe: 10 %).",
    )
    scale_down_kv_usage: float = Field(
        default=0.3,
        ge=0,
        lt=1,
        description="Within a window the fleet shrinks (at most once) only while every "
        "instance's projected peak KV usage is below this (PreServe: T_f = 30 %).",
    )
    queue_pressure: bool = Field(
        default=False,
        description="Also add an instance within the window when the decision step's queue "
        "pressure is at its level (backlog per instance, TTFT P95 over the tier's SLO): "
        "PreServe's projections see KV memory only, and an instance bound by prefill or "
        "decode time queues before its KV cache fills. false: the paper's rule.",
    )


class LayoutForecast(StrEnum):
    """How a layout re-plan sees the horizon: the measured rates persisting, or each
    request type's rate forecast per window with the policy's forecaster."""

    PERSIST = "persist"
    POLICY = "policy"


LAYOUT_RULES = cel(
    (
        "self.historySeconds >= self.replanSeconds",
        "spec.layouts.historySeconds must cover replanSeconds: each re-plan reads the mix of at "
        "least the interval since the last one (raise historySeconds or lower replanSeconds)",
    ),
)


class Layouts(ApiModel):
    """OServe layouts: a ModelDeployment listing two or more variants of one GPU
    type under this policy runs them side by side as parallelism layouts, chosen for the
    measured request mix (OServe §4.2 assignment, §4.3 search, §5.2 switching with our
    gain-against-cost gate). Absent: one planned variant per GPU type, as before."""

    model_config = ConfigDict(json_schema_extra=LAYOUT_RULES)

    replan_seconds: int = Field(
        default=600,
        ge=10,
        le=86400,
        description="Seconds between re-plans of each (model, region, GPU type) layout "
        "(OServe re-plans every span; 5-10 minutes here, as pods take minutes to start).",
    )
    history_seconds: int = Field(
        default=3600,
        ge=60,
        le=604800,
        description="History of the router's request-shape counter the types and their "
        "rates are read over (sageserve_router_request_shapes_total).",
    )
    types: int = Field(
        default=4,
        ge=1,
        le=16,
        description="Request types k (k-means on log prompt and output length, OServe §5.1: "
        "4). Ignored when the ModelDeployment names a measured type-capacity ConfigMap, "
        "whose types are used.",
    )
    confirmations: int = Field(
        default=2,
        ge=1,
        le=100,
        description="Consecutive worthwhile re-plans before a switch (1: the paper's "
        "behaviour, switch on the first).",
    )
    min_gain_fraction: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="A switch must gain at least this share of the requests the layout in "
        "force serves over the horizon (inside the capacity model's error otherwise).",
    )
    forecast: LayoutForecast = Field(
        default=LayoutForecast.POLICY,
        description="policy: each request type's per-minute rate is forecast with "
        "spec.forecast's method over min(historySeconds, forecast.horizonSeconds), in "
        "replanSeconds windows, and the switch's gain is weighed on those windows (a type "
        "with too little history keeps its measured rate); persist: the rates measured over "
        "historySeconds persist for historySeconds.",
    )


class Capacity(ApiModel):
    """θ learned from the fleet (PreServe §4.1, Alg. 1, generalised; `plan.learned_capacity`):
    per (model, variant, region), a high quantile of the tokens/s one instance served in the
    loaded minutes that kept every interactive tier's TTFT SLO. The declared
    capacityTokensPerSecond is the starting point and the bound."""

    learn: bool = Field(
        default=False,
        description="Learn θ from the fleet and plan with it once it is trusted (the plan's "
        "θ is also what LT-U/UA's caps turn observed load into instances with, and what batch "
        "deadlines are judged with: the deadline scale-out, BatchDeadlinesAtRisk and the "
        "Batch API's admission); false: the declared capacityTokensPerSecond only, nothing "
        "is learned, and status.capacity is cleared.",
    )
    min_windows: int = Field(
        default=30,
        ge=1,
        le=100000,
        description="Qualifying one-minute windows before the learned θ is trusted.",
    )
    quantile: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Quantile of the windows' per-instance tokens/s taken as θ (1: the "
        "largest, PreServe's rule).",
    )
    min_emu: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="A window counts only if its instances' EMU reached this: an idle "
        "instance says nothing about its capacity.",
    )
    scale_to_emu: bool = Field(
        default=False,
        description="Scale each window's tokens/s per instance to thresholds.scaleOutEmu "
        "(× scaleOutEmu ÷ its EMU), so a fleet that runs cool still estimates θ at the "
        "threshold; overestimates θ where the TTFT SLO, not KV memory, bounds an instance.",
    )
    min_factor: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="The learned θ in force is at least the declared θ × this.",
    )
    max_factor: float = Field(
        default=2.0,
        ge=1,
        le=100,
        description="The learned θ in force is at most the declared θ × this.",
    )
    history_seconds: int = Field(
        default=86400,
        ge=60,
        le=30 * 86400,
        description="Windows older than this are forgotten.",
    )
    half_life_seconds: int = Field(
        default=21600,
        ge=60,
        le=30 * 86400,
        description="A window's weight halves with each this-many seconds of age.",
    )


class Actuation(StrEnum):
    """Who writes the replicas the pace decision step decides (docs/keda.md).

    direct: the operator patches each pod set's `spec.replicas` itself (the default).
    keda: the operator plans and decides as in direct mode but writes no replicas: it owns
    one KEDA ScaledObject per pod set whose `external` trigger asks the operator's gRPC
    scaler for the decided replicas, and KEDA's HorizontalPodAutoscaler writes them.
    """

    DIRECT = "direct"
    KEDA = "keda"


class Keda(ApiModel):
    """What the ScaledObjects of `actuation: keda` carry (ignored in direct mode)."""

    failure_threshold: int = Field(
        default=3,
        ge=1,
        le=100,
        description="KEDA's fallback.failureThreshold: after this many failed metric reads "
        "in a row KEDA feeds each pod set's HPA its fallback replicas, which sageserve keeps "
        "at the plan in force for it. KEDA v2.20 counts no failure while the scaler is "
        "unreachable (kedacore/keda#8056): then the HPA keeps each pod set at its size and "
        "KEDA does not scale it to zero (docs/keda.md, When the operator dies).",
    )
    scaler_address: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?:[0-9]{1,5}$",
        description="host:port KEDA dials for this policy's scaler; absent: the operator's "
        "--scaler-address (the chart sets its scaler Service, "
        "<release>-scaler.<namespace>.svc:9100).",
    )


class ScalingPolicySpec(ApiModel):
    """How the fleets of the ModelDeployments referring to this policy are sized."""

    model_config = ConfigDict(json_schema_extra=POLICY_RULES)

    strategy: Strategy = Field(default=Strategy.LT_UTILIZATION_ARIMA)
    dry_run: bool = Field(
        default=False,
        description="Compute and report plans and decisions without changing the cluster.",
    )
    actuation: Actuation = Field(
        default=Actuation.DIRECT,
        description="direct (default): the operator writes each pod set's replicas. keda: "
        "the operator plans and decides the same replicas but KEDA writes them: one "
        "ScaledObject per pod set (owned by its ModelDeployment) whose external trigger "
        "reads the decision from the operator's gRPC scaler; needs KEDA installed "
        "(scaledobjects.keda.sh), else the policy's Actuation condition is False and "
        "replicas are left alone. docs/keda.md says which to pick and how to switch.",
    )
    keda: Keda = sub_object(Keda)
    intervals: Intervals = sub_object(Intervals)
    thresholds: Thresholds = sub_object(Thresholds)
    routing: Routing = sub_object(Routing)
    instance_scheduling: InstanceScheduling = sub_object(InstanceScheduling)
    forecast_gap: ForecastGap = sub_object(ForecastGap)
    forecast: Forecast = sub_object(Forecast)
    optimizer: Optimizer = sub_object(Optimizer)
    spot: Spot = sub_object(Spot)
    siloed: Siloed = sub_object(Siloed)
    chiron: Chiron = sub_object(Chiron)
    preserve: Preserve = sub_object(Preserve)
    capacity: Capacity = sub_object(Capacity)
    signals: Signals = sub_object(Signals)
    layouts: Layouts | None = Field(
        default=None,
        description="OServe layouts for ModelDeployments with two or more variants of one "
        "GPU type (docs/oserve.md, On Kubernetes); absent: the first variant of each GPU "
        "type is planned, the others keep what pacing gives them.",
    )


class ForecastEntry(ApiModel):
    """Forecast peak load of one (model, region) for the current plan."""

    model: str = Field(max_length=253)
    region: str = Field(max_length=63)
    tokens_per_second: float = Field(
        ge=0,
        description="Peak forecast incl. the batch part: the larger of the batch buffer β "
        "and the batch deadline need.",
    )
    batch_buffer_tokens_per_second: float = Field(default=0, ge=0)
    batch_deadline_need_tokens_per_second: float = Field(
        default=0,
        ge=0,
        description="This region's share of the tokens/s its model's batch queue needs to "
        "finish every queued request by its deadline (split over the model's regions by "
        "their interactive forecast). The plan provisions it instead of β when it is the "
        "larger.",
    )
    expected_tokens_per_second: float | None = Field(
        default=None,
        ge=0,
        description="Point forecast for the last forecastGap.windowSeconds of the interval "
        "plus the batch rate: what LT-UA compares observed tokens/s with.",
    )
    instance_tokens_per_second: float | None = Field(
        default=None,
        ge=0,
        description="Tokens/s one planned instance serves (capacityTokensPerSecond of the "
        "planned variants, weighted by their targets): how LT-UA turns observed tokens/s "
        "into instances.",
    )
    prompt_tokens_per_second: float | None = Field(
        default=None,
        ge=0,
        description="strategy preserve: forecast prompt tokens/s P̂ of the window (β "
        "included), sized against prefillTokensPerSecond (PreServe §4.1, Alg. 2).",
    )
    decode_tokens_per_second: float | None = Field(
        default=None,
        ge=0,
        description="strategy preserve: forecast generated tokens/s D̂ of the window (β "
        "included), sized against decodeTokensPerSecond (PreServe §4.1, Alg. 2).",
    )
    method: str = Field(max_length=64, description="Forecaster actually used.")
    fallback_reason: str | None = Field(default=None, max_length=1024)
    ignored_points: int | None = Field(
        default=None,
        ge=0,
        description="History points not read as demand: missing, not finite, negative, "
        "collection gaps or absurd spikes (two orders of magnitude above a steady level).",
    )


class TargetEntry(ApiModel):
    """Planned instances of one (model, region, variant)."""

    model: str = Field(max_length=253)
    region: str = Field(max_length=63)
    variant: str = Field(max_length=63)
    gpu_type: str = Field(max_length=63)
    current: int = Field(ge=0)
    target: int = Field(ge=0)
    delta: int


class ShortfallEntry(ApiModel):
    """Demand the plan cannot serve with the GPUs available."""

    model: str = Field(max_length=253)
    region: str = Field(max_length=63)
    tier: str | None = Field(default=None, max_length=253)
    tokens_per_second: float = Field(ge=0)


class SpillEntry(ApiModel):
    """Share of one region's planned demand that another region is planned to serve: the
    bound `sageserve router` keeps when it sends a region's requests elsewhere."""

    model: str = Field(max_length=253)
    from_region: str = Field(max_length=63, alias="from")
    to_region: str = Field(max_length=63, alias="to")
    share: float = Field(ge=0, le=1)


class PlanStatus(ApiModel):
    """The plan in force: forecast, targets, objective, solver outcome, unmet demand."""

    computed_at: datetime
    strategy: Strategy
    solver_status: Literal["optimal", "shortfall", "time_limit", "infeasible", "window"] = Field(
        description="The ILP's outcome; `window` for strategy preserve, whose plan is "
        "PreServe's per-window rule (no ILP)."
    )
    solver_seconds: float = Field(ge=0)
    objective: float | None = None
    forecasts: list[ForecastEntry] = Field(default_factory=list, max_length=4096)
    targets: list[TargetEntry] = Field(default_factory=list, max_length=8192)
    shortfalls: list[ShortfallEntry] = Field(default_factory=list, max_length=4096)
    spillover: list[SpillEntry] = Field(
        default_factory=list,
        max_length=4096,
        description="Planned cross-region spill-over (empty when every region serves itself).",
    )


class LayoutWeight(ApiModel):
    """The share of one request type's requests a variant (parallelism layout) gets."""

    variant: str = Field(max_length=63)
    weight: float = Field(ge=0, le=1)


class LayoutType(ApiModel):
    """One request type of an endpoint's mix (OServe §5.1) and where its requests go (§4.2:
    the assignment's x_{k,j}/λ_j summed over the replicas of each variant)."""

    prompt_tokens: float = Field(ge=0, description="The type's centroid: prompt tokens.")
    output_tokens: float = Field(ge=0, description="The type's centroid: output tokens.")
    rate: float = Field(
        ge=0,
        description="Requests/s of this type measured over the history read (not the "
        "forecast: spec.layouts.forecast shapes only the re-plan's windows).",
    )
    weights: list[LayoutWeight] = Field(
        default_factory=list, max_length=16, json_schema_extra=list_map("variant")
    )


class LayoutReplicas(ApiModel):
    """Instances of one variant in a layout."""

    variant: str = Field(max_length=63)
    replicas: int = Field(ge=0)


class LayoutEntry(ApiModel):
    """OServe's layout of one (model, region, GPU type): the variants (parallelism layouts)
    of that GPU type side by side, the mix they are chosen for and the dispatch weights
    `sageserve router` follows."""

    model: str = Field(max_length=253)
    region: str = Field(max_length=63)
    gpu_type: str = Field(max_length=63)
    computed_at: datetime
    replicas: list[LayoutReplicas] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra=list_map("variant"),
        description="The layout in force: instances per variant (the targets pacing follows).",
    )
    types: list[LayoutType] = Field(default_factory=list, max_length=16)
    message: str | None = Field(default=None, max_length=2048)


class MemberClusterEntry(ApiModel):
    """One cluster of the fleet as the last plan pass read it."""

    name: str = Field(max_length=253)
    regions: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Regions of its GPU nodes; for a silent cluster, those it had when it "
        "last answered (held at the plan in force).",
    )
    reachable: bool
    message: str | None = Field(default=None, max_length=512)


class ScalingPolicyStatus(ApiModel):
    """What the operator decided under this policy."""

    observed_generation: int | None = Field(default=None, ge=0)
    conditions: list[Condition] = conditions_field()
    plan: PlanStatus | None = None
    donated_nodes: int = Field(
        default=0, ge=0, description="Nodes of this policy's regions and GPU types in spot."
    )
    layouts: list[LayoutEntry] = Field(
        default_factory=list,
        max_length=1024,
        description="OServe layouts: per (model, region, GPU type) with several variants of "
        "that type, the instances per variant and the per-type dispatch weights.",
    )
    clusters: list[MemberClusterEntry] = Field(
        default_factory=list,
        max_length=256,
        description="The fleet's clusters (the operator's own and each member named by a "
        "kubeconfig Secret labelled sageserve.io/member-cluster) and whether each answered "
        "the last plan pass; empty when the fleet is one cluster.",
    )


class ScalingPolicy(ApiModel):
    """ScalingPolicy: strategy, cadence, thresholds, forecast, ILP and spot settings."""

    api_version: Literal["sageserve.io/v1alpha1"]
    kind: Literal["ScalingPolicy"]
    metadata: ObjectMeta
    spec: ScalingPolicySpec = sub_object(ScalingPolicySpec)
    status: ScalingPolicyStatus | None = None


def spill_from_status(plan: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """`status.plan.spillover` as `Plan.spill` (model → home → region → share); the operator and the
    router read it alike."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for e in plan.get("spillover") or []:
        try:
            out.setdefault(str(e["model"]), {}).setdefault(str(e["from"]), {})[str(e["to"])] = (
                float(e["share"])
            )
        except (KeyError, TypeError, ValueError):
            continue
    return out


#: (model, region) → per type: (prompt tokens, output tokens, variant → weight)
LayoutWeights = dict[tuple[str, str], list[tuple[float, float, dict[str, float]]]]


def layouts_from_status(status: Mapping[str, Any]) -> LayoutWeights:
    """`status.layouts` as per-type dispatch weights per (model, region); the operator
    writes them and the router reads them. An entry that does not parse is skipped (the
    router then dispatches that endpoint as if it had one layout)."""
    out: LayoutWeights = {}
    for e in status.get("layouts") or []:
        try:
            types = [
                (
                    float(t["promptTokens"]),
                    float(t["outputTokens"]),
                    {str(w["variant"]): float(w["weight"]) for w in t.get("weights") or []},
                )
                for t in e.get("types") or []
            ]
            out.setdefault((str(e["model"]), str(e["region"])), []).extend(types)
        except (KeyError, TypeError, ValueError):
            continue
    return out
