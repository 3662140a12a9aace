"""Trace load on the pods that run: the simulator's instances, one per serving pod.

Every endpoint (namespace, model deployment, region) draws requests from its own seeded
copy of the trace, scaled by the load control. A request goes to the serving pod of its
endpoint with the fewest remaining tokens (the simulator's in-region picker); with no
serving pod it is rejected, as a Service without ready endpoints would refuse it. Each
serving pod is a `sim.instance.Instance` (continuous batching, KV cache, priority queues,
preemption), advanced by the same event queue as `sim.engine` (`sim.events`): nothing about
batching is re-implemented here. A pod that stops serving drops its instance and the
requests in it (counted as lost), as a killed vLLM process would.

Time is the trace's own (seconds from the trace's t=0); the caller advances it from a
`Clock`, so the same code runs live (accelerated or not), in backfill and in unit tests.
"""

from __future__ import annotations

import fnmatch
import math
import random
import threading
import zlib
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from sageserve.core.types import IW_F, Request, Tier, TierKind
from sageserve.dispatch.instance_order import InstanceScheduling, OrderPolicy
from sageserve.dispatch.instance_picker import pick_instance
from sageserve.metrics.vllm import TTFT_BUCKETS
from sageserve.perf.model import DEFAULT_NODE_GPUS, LayoutError, PerfCatalog, VariantPerf
from sageserve.sim import traces
from sageserve.sim.events import INSTANCE, EventQueue, fire
from sageserve.sim.instance import Instance, InstanceHooks, Job
from sageserve.sim.workload import parse_duration
from sageserve.twin.pods import EndpointId, PodInfo

_INF = math.inf
#: a trace row's request, due at its arrival (next to events.INSTANCE, a pod's own event)
_EV_ARRIVAL = 1

#: Buckets (seconds) of vLLM's end-to-end latency histogram.
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

#: (start seconds, seed) -> trace rows from `start` on, in time order, without end.
RowSource = Callable[[float, int], Iterator[traces.TraceRow]]


# ---- the trace ---------------------------------------------------------------------------


class TraceSource:
    """Endless request rows of one trace file (Azure LLM 2023 CSV or ServeGen windows).

    The trace repeats back to back when it ends, so a twin can run for days on a 1-hour
    trace. Rates are the trace's own; the load control scales them.
    """

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise FileNotFoundError(f"trace {path} does not exist")
        self.path = path
        self.kind = "servegen" if "_client_windows_" in path.name else "azure2023"
        self._table: traces.ServeGenTable | None = None
        self._knots: traces.TokenKnots | None = None
        if self.kind == "servegen":
            windows, tokens = traces.servegen_paths(path)
            self._table = traces.ServeGenTable.load(windows)
            volume = self._table.client_volume()
            self._knots = (
                traces.load_token_knots(tokens, volume)
                if tokens is not None
                else traces.TokenKnots(traces._QS, {}, {})
            )

    def __call__(self, start: float, seed: int) -> Iterator[traces.TraceRow]:
        if self._table is None:
            return traces.azure2023_rows(self.path, start, _INF, True, 1.0, seed)
        return self._servegen(start, seed)

    def _servegen(self, start: float, seed: int) -> Iterator[traces.TraceRow]:
        assert self._table is not None and self._knots is not None
        span = self._table.span_s
        lap = int(start // span)
        while True:
            offset = lap * span
            rows = traces.servegen_rows(
                self._table, self._knots, max(0.0, start - offset), span, 1.0, seed + lap
            )
            for r in rows:
                yield traces.TraceRow(r.t + offset, r.client, r.prompt, r.output)
            lap += 1


# ---- how much of it ------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadShape:
    """A multiplier over trace time, linear between points, held after the last one.

    `LoadShape.parse("0:1,30m:3,1h:0.5")`: 1× at the start, rising to 3× at 30 min, down
    to 0.5× at 1 h and after. Times use the workload files' units (s, m, h, d).
    """

    points: tuple[tuple[float, float], ...] = ((0.0, 1.0),)

    @classmethod
    def parse(cls, text: str) -> LoadShape:
        pts = []
        for part in text.split(","):
            if not part.strip():
                continue
            t, sep, m = part.partition(":")
            if not sep:
                raise ValueError(f"load profile point {part!r}: use TIME:MULTIPLIER, e.g. 30m:2")
            mult = float(m)
            if mult < 0:
                raise ValueError(f"load profile point {part!r}: the multiplier must be >= 0")
            pts.append((parse_duration(t.strip()), mult))
        if not pts:
            raise ValueError("an empty load profile; e.g. 0:1,30m:3,1h:0.5")
        pts.sort()
        return cls(tuple(pts))

    def __call__(self, t: float) -> float:
        pts = self.points
        if t <= pts[0][0]:
            return pts[0][1]
        for (t0, m0), (t1, m1) in pairwise(pts):
            if t <= t1:
                return m0 + (m1 - m0) * (t - t0) / (t1 - t0) if t1 > t0 else m1
        return pts[-1][1]


def endpoint_name(ep: EndpointId) -> str:
    """`namespace/model-deployment/region`, the form endpoint patterns match."""
    return "/".join(ep)


class LoadControl:
    """Request-rate multiplier per endpoint: scale × shape(t) × endpoint factors × override.

    Patterns are shell-style over `namespace/model-deployment/region` (e.g. `*/bloom/*`).
    `set` changes the runtime override (the twin's HTTP control and tests use it); it is
    thread-safe and takes effect from the next request on.
    """

    def __init__(
        self,
        scale: float = 1.0,
        shape: LoadShape | None = None,
        factors: Mapping[str, float] | None = None,
    ) -> None:
        self.scale = scale
        self.shape = shape or LoadShape()
        self.factors = dict(factors or {})
        self._overrides: dict[str, float] = {}
        self._lock = threading.Lock()

    def set(self, multiplier: float, pattern: str = "*") -> None:
        if multiplier < 0:
            raise ValueError("the load multiplier must be >= 0")
        with self._lock:
            if pattern == "*":
                self._overrides.clear()
            self._overrides[pattern] = multiplier

    def overrides(self) -> dict[str, float]:
        with self._lock:
            return dict(self._overrides)

    def multiplier(self, ep: EndpointId, t: float) -> float:
        name = endpoint_name(ep)
        m = self.scale * self.shape(t)
        for pattern, f in self.factors.items():
            if fnmatch.fnmatchcase(name, pattern):
                m *= f
        with self._lock:
            found = [v for p, v in self._overrides.items() if fnmatch.fnmatchcase(name, p)]
        if found:
            m *= found[-1]  # the latest matching override (insertion order)
        return m


# ---- which performance profile -------------------------------------------------------------


class PerfResolver:
    """The perf profile of a pod: explicit mapping, ModelDeployment annotation, its name.

    Then the layout the pod runs: with the pod's tensor/pipeline-parallel sizes known (its
    vLLM arguments, rendered from the ModelDeployment variant), the (TP, PP) profile of
    `PerfCatalog.layout` (measured, or a pipeline derived from the TP profile, OServe
    App. D), so a TP4×PP2 pod no longer gets the TP8 profile of the same 8 GPUs; a layout
    vLLM would refuse (TP not dividing the heads) is reported as the pod's problem, as the
    pod would not start. Without them, with no TP profile to derive from, or with TP × PP
    not the pod's GPU count (a pooled pod's engines share its GPUs): the variant of (GPU
    type, GPUs) the pod asks for, else the largest variant on that GPU type, else the
    largest of the profile. `default` covers model deployments named after no profile.
    """

    def __init__(
        self,
        catalog: PerfCatalog,
        profiles: Mapping[str, str] | None = None,
        default: str | None = None,
    ) -> None:
        self.catalog = catalog
        self.profiles = dict(profiles or {})
        self.default = default
        self.annotations: dict[tuple[str, str], str] = {}

    def resolve(self, pod: PodInfo) -> VariantPerf:
        names = [
            self.profiles.get(pod.model_deployment),
            self.annotations.get((pod.namespace, pod.model_deployment)),
            pod.model_deployment,
            self.default,
        ]
        models = set(self.catalog.models())
        for name in names:
            if name is None or name not in models:
                continue
            found = self._layout(name, pod)
            if found is not None:
                return found
            try:
                return self.catalog.get(name, pod.gpu_type, pod.gpus or None)
            except KeyError:
                pass
            try:
                return self.catalog.get(name, pod.gpu_type)
            except KeyError:
                return max(
                    (v for (m, _, _), v in self.catalog.variants.items() if m == name),
                    key=lambda v: v.gpus,
                )
        raise KeyError(
            f"pod {pod.namespace}/{pod.name}: no perf profile for model deployment "
            f"{pod.model_deployment!r}; name one with --profile {pod.model_deployment}=PROFILE, "
            f"the sageserve.io/perf-profile annotation or --default-profile (have "
            f"{', '.join(sorted(models))})"
        )

    def _layout(self, name: str, pod: PodInfo) -> VariantPerf | None:
        """The (TP, PP) profile of `pod` when its arguments name its parallelism; None to
        fall back to the GPU count. Raises KeyError (the twin's "no profile" problem) with
        `check_layout`'s message for a layout vLLM would refuse."""
        if pod.tensor_parallel is None and pod.pipeline_parallel is None:
            return None
        pp = pod.pipeline_parallel or 1
        tp = pod.tensor_parallel or max(1, pod.gpus // pp)
        if pod.gpus and tp * pp != pod.gpus:
            # not one replica over all of the pod's GPUs (a pooled pod's engines share
            # them): keep the GPU-count lookup
            return None
        # a pod runs on one node: every stage hop is inside it
        node_gpus = max(DEFAULT_NODE_GPUS, tp * pp, pod.gpus)
        try:
            return self.catalog.layout(name, pod.gpu_type, tp, pp, node_gpus)
        except LayoutError as exc:
            raise KeyError(f"pod {pod.namespace}/{pod.name}: {exc}") from None
        except KeyError:
            return None


# ---- what each pod reports -----------------------------------------------------------------


@dataclass
class Histogram:
    """Counts per bucket (not cumulative) plus sum, like a prometheus-client histogram."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.total += v

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, cumulative count), ...] ending with +Inf."""
        out, acc = [], 0
        for b, c in zip((*self.bounds, _INF), self.counts, strict=True):
            acc += c
            out.append(("+Inf" if b == _INF else repr(float(b)), acc))
        return out

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total)


@dataclass
class PodCounters:
    """Monotonic counters of one pod, as vLLM's would be."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    preemptions: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))

    def copy(self) -> PodCounters:
        return PodCounters(
            self.prompt_tokens,
            self.generation_tokens,
            self.requests_finished,
            self.preemptions,
            self.ttft.copy(),
            self.e2e.copy(),
        )


@dataclass(frozen=True)
class PodSample:
    """One pod's metrics at one moment."""

    pod: PodInfo
    kv_usage: float
    running: int
    waiting: int
    kv_capacity_tokens: int
    counters: PodCounters


class ContextLengthExceeded(ValueError):
    """A request whose prompt + output exceeds the pod's context length: vLLM's OpenAI
    server refuses it before it reaches the engine (HTTP 400)."""

    def __init__(self, limit: int, prompt: int, output: int) -> None:
        self.limit, self.prompt, self.output = limit, prompt, output
        super().__init__(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt + output} tokens ({prompt} in the messages, {output} in the completion). "
            "Please reduce the length of the messages or completion."
        )


class PriorityRefused(ValueError):
    """A request with a `priority` sent to an engine scheduling FCFS: vLLM's OpenAI server
    refuses it (HTTP 400)."""

    def __init__(self, priority: int) -> None:
        self.priority = priority
        super().__init__(f"Got priority {priority} but Priority scheduling is not enabled.")


#: vLLM's `--scheduling-policy priority`: the lowest `priority` first, ties by arrival,
#: which is PF's order over ranks (`dispatch.instance_order`)
ENGINE_PRIORITY = InstanceScheduling(OrderPolicy.PF)


def _priority_tier(priority: int, cache: dict[int, Tier]) -> Tier:
    """An interactive tier ranked `priority` and without a TTFT SLO: what the instance order
    reads of a request sent with vLLM's `priority`."""
    tier = cache.get(priority)
    if tier is None:
        tier = cache[priority] = Tier(
            f"priority-{priority}", TierKind.INTERACTIVE, priority=priority
        )
    return tier


class TwinPod:
    """A serving pod: its instance, counters and context length (0: none known)."""

    __slots__ = ("alive", "context", "counters", "endpoint", "info", "instance")

    def __init__(
        self, info: PodInfo, instance: Instance, endpoint: EndpointLoad, context: int = 0
    ) -> None:
        self.info = info
        self.instance = instance
        self.endpoint = endpoint
        self.counters = PodCounters()
        self.alive = True
        self.context = context

    def refuses(self, prompt: int, output: int) -> bool:
        """Whether vLLM would refuse this request (prompt + output beyond the context)."""
        return 0 < self.context < prompt + output


class EndpointLoad:
    """One endpoint's request stream and serving pods."""

    def __init__(self, ep: EndpointId, rows: Iterator[traces.TraceRow], seed: int) -> None:
        self.id = ep
        self.rows = rows
        self.next_row: traces.TraceRow | None = next(rows, None)
        self.rng = random.Random(seed)
        self.pods: dict[str, TwinPod] = {}
        self.arrived = 0
        self.rejected = 0
        #: refused at arrival: longer than the model's context (vLLM's HTTP 400)
        self.refused = 0
        self.lost = 0
        self.prompt_tokens = 0


def _endpoint_seed(seed: int, ep: EndpointId) -> int:
    return (seed * 1_000_003 + zlib.crc32(endpoint_name(ep).encode())) & 0x7FFFFFFF


class TwinSim(InstanceHooks):
    """The simulated fleet behind the pods; call `sync` with the pods, `advance` with time."""

    #: Extra copies of a trace row (multiplier > 1) are spread over this many seconds.
    COPY_SPREAD_S = 1.0

    def __init__(
        self,
        rows: RowSource,
        perf: Callable[[PodInfo], VariantPerf],
        load: LoadControl | None = None,
        start: float = 0.0,
        seed: int = 0,
        max_batched_tokens: int = 16384,
    ) -> None:
        self.rows = rows
        self.perf = perf
        self.load = load or LoadControl()
        self.now = start
        self.seed = seed
        self.max_batched_tokens = max_batched_tokens
        self.endpoints: dict[EndpointId, EndpointLoad] = {}
        self.pods: dict[tuple[str, str], TwinPod] = {}
        self.events = EventQueue()
        self._req_id = 0
        self._priority_tiers: dict[int, Tier] = {}
        #: Serving pods left without an instance, and why (e.g. no perf profile).
        self.problems: dict[str, str] = {}

    # ---- the pods ---------------------------------------------------------------------

    def sync(self, pods: Iterable[PodInfo]) -> tuple[list[str], list[str]]:
        """Match the fleet to `pods` at the current time; returns (added, removed) pod names.

        Serving pods get an instance; pods that stopped serving (deleted, or no longer
        Running) lose theirs with the requests in it. Endpoints with no pod at all go.
        """
        listed = list(pods)
        serving = {p.key: p for p in listed if p.serving}
        for name in [n for n in self.problems if n not in {k[1] for k in serving}]:
            del self.problems[name]
        wanted_eps = {p.endpoint for p in listed}
        removed: list[str] = []
        for key in [k for k in self.pods if k not in serving]:
            tp = self.pods.pop(key)
            tp.alive = False
            tp.endpoint.pods.pop(tp.info.name, None)
            tp.endpoint.lost += len(tp.instance.abandon_all())
            removed.append(tp.info.name)
        for ep in wanted_eps - set(self.endpoints):
            seed = _endpoint_seed(self.seed, ep)
            self.endpoints[ep] = EndpointLoad(ep, self.rows(self.now, seed), seed)
        for ep in set(self.endpoints) - wanted_eps:
            del self.endpoints[ep]
        added: list[str] = []
        for key, info in serving.items():
            if key in self.pods:
                continue
            endpoint = self.endpoints[info.endpoint]
            try:
                perf = self.perf(info)
            except KeyError as exc:  # no profile: the pod gets no load, and the user is told
                self.problems[info.name] = str(exc.args[0] if exc.args else exc)
                continue
            self.problems.pop(info.name, None)
            inst = Instance(
                f"{info.namespace}/{info.name}",
                perf,
                info.region,
                self,
                self.max_batched_tokens,
                ENGINE_PRIORITY if info.priority_scheduling else None,
            )
            inst.t0 = self.now
            tp = TwinPod(info, inst, endpoint, info.max_model_len or perf.context_length)
            inst.endpoint = tp
            self.pods[key] = tp
            endpoint.pods[info.name] = tp
            added.append(info.name)
        return added, removed

    # ---- time ---------------------------------------------------------------------------

    def advance(self, to: float) -> None:
        """Run every arrival and instance event up to `to` (trace seconds)."""
        if to <= self.now:
            return
        for ep in self.endpoints.values():
            self._pull(ep, to)
        for when, _, kind, obj in self.events.pop_due(to):
            if kind == INSTANCE:
                assert isinstance(obj, TwinPod)
                if obj.alive:  # a pod that stopped serving dropped its instance
                    fire(obj.instance, when)
            else:
                assert isinstance(obj, tuple)
                self._arrive(obj[0], when, obj[1], obj[2])
        self.now = to

    def _pull(self, ep: EndpointLoad, to: float) -> None:
        rng = ep.rng
        while ep.next_row is not None and ep.next_row.t <= to:
            row = ep.next_row
            m = self.load.multiplier(ep.id, row.t)
            whole = int(m)
            copies = whole + (1 if rng.random() < m - whole else 0)
            for c in range(copies):
                t = row.t + (rng.random() * self.COPY_SPREAD_S if c else 0.0)
                self.events.push(max(t, self.now), _EV_ARRIVAL, (ep, row.prompt, row.output))
            ep.next_row = next(ep.rows, None)

    def _arrive(self, ep: EndpointLoad, t: float, prompt: int, output: int) -> None:
        if self.endpoints.get(ep.id) is not ep:
            return  # the endpoint went away with its pods
        ep.arrived += 1
        ep.prompt_tokens += prompt
        if not ep.pods:
            ep.rejected += 1
            return
        self._req_id += 1
        req = Request(self._req_id, t, ep.id[1], IW_F, ep.id[2], prompt, output)
        job = Job(req, 0)
        pods = list(ep.pods.values())
        if pods[0].refuses(prompt, output):  # one pod set's pods share their arguments
            ep.refused += 1
            return
        if len(pods) == 1:
            tp = pods[0]
        else:
            rem = Instance.remaining_tokens_at
            tp = pick_instance([(p, rem(p.instance, t)) for p in pods])
        job.ep = tp
        tp.instance.enqueue(job, t)

    def submit(
        self, namespace: str, pod: str, prompt: int, output: int, priority: int = 0
    ) -> Job | None:
        """A request that reached this pod over HTTP, run by its simulated instance from
        now on (None if the pod does not serve). The caller polls the job under the lock.
        Raises `ContextLengthExceeded` for a request longer than the pod's context, and
        `PriorityRefused` for a `priority` sent to a pod not scheduling by priority (as
        vLLM). On a pod that does, the request waits by its priority, lowest first."""
        tp = self.pods.get((namespace, pod))
        if tp is None or not tp.alive:
            return None
        ep = tp.endpoint
        ep.arrived += 1
        if tp.refuses(prompt, max(1, output)):
            ep.refused += 1
            raise ContextLengthExceeded(tp.context, prompt, max(1, output))
        if priority and not tp.info.priority_scheduling:
            ep.refused += 1
            raise PriorityRefused(priority)
        ep.prompt_tokens += prompt
        self._req_id += 1
        tier = _priority_tier(priority, self._priority_tiers) if priority else IW_F
        req = Request(self._req_id, self.now, ep.id[1], tier, ep.id[2], prompt, max(1, output))
        job = Job(req, 0)
        job.ep = tp
        tp.instance.enqueue(job, self.now)
        return job

    # ---- InstanceHooks --------------------------------------------------------------------

    def schedule(self, inst: Instance, when: float) -> None:
        tp = inst.endpoint
        assert isinstance(tp, TwinPod)
        self.events.push(when, INSTANCE, tp)

    def on_finish(self, job: Job, now: float) -> None:
        tp = job.ep
        assert isinstance(tp, TwinPod)
        if now < 0:  # could never fit in the KV cache: vLLM rejects it
            tp.endpoint.lost += 1
            return
        c = tp.counters
        req = job.req
        c.prompt_tokens += req.prompt_tokens
        c.generation_tokens += req.output_tokens
        c.requests_finished += 1
        c.preemptions += job.preemptions
        c.ttft.observe(max(0.0, job.first_token - req.arrival))
        c.e2e.observe(max(0.0, now - req.arrival))

    def on_idle(self, inst: Instance, now: float) -> None:
        pass  # twin instances are always serving; pods leave through `sync`

    # ---- what Prometheus sees -------------------------------------------------------------

    def samples(self) -> list[PodSample]:
        """Every serving pod's metrics at the current time, in (namespace, name) order."""
        out = []
        for key in sorted(self.pods):
            tp = self.pods[key]
            inst = tp.instance
            kv = inst.kv_at(self.now) / inst.kv_cap if inst.kv_cap else 0.0
            out.append(
                PodSample(
                    tp.info,
                    min(1.0, max(0.0, kv)),
                    inst.running,
                    inst.waiting,
                    inst.kv_cap,
                    tp.counters.copy(),
                )
            )
        return out
