"""Many sporadic models on few GPUs: Aegaeon's pooled serving and its baselines, simulated.

Aegaeon (Xiang et al., SOSP '25) serves a long tail of models on one pool by switching
models at token granularity. This module replays per-model requests through five ways of
serving them, in one simulator, and measures what users notice: per-token deadline
attainment (Aegaeon §2.1, Fig. 3) and the GPUs and GPU-hours spent.

- ``pooled`` (Aegaeon §4): separate prefill and decode instances. Prefill: grouped
  first-come-first-served (Algorithm 1), groups of at most 8 same-model requests whose size
  is cumulative, batch size 1, a new group on the least-loaded instance. Decode: per-model
  batches on each instance's work list, served in rounds by weighted round-robin; batch i
  decodes for its quota qᵢ of Eqs. 2–3 (:func:`sageserve.plan.pool_sizing.decode_quotas`)
  per turn (Algorithm 2). A switch costs Aegaeon's Eq. 4 (weights over the host link × β, after the
  reuse of engine components of §5.1), hidden by prefetching when the previous turn was at
  least that long and the GPU holds a second model's weights next to the KV in use (§5.2);
  a batch's KV is swapped in before its turn and a request's prompt KV moves from prefill to
  decode over the same link (§5.3).
- ``request`` (ServerlessLLM-like, Aegaeon §7.1): an instance serves one model at a time
  with vLLM's continuous batching; a model is loaded for a request (weights at the link's
  full rate, no β) and kept while it has work; requests of a model no instance serves wait
  first-come-first-served for an instance to go idle (head-of-line blocking, §2.2).
- ``mux2`` (MuxServe-like): each instance holds at most two models for good, each with half
  the KV cache and, optimistically, the whole instance's compute (no interference).
- ``dedicated``: one instance per model, started when a request comes (weights from host
  memory) and stopped after ``keep_alive_s`` idle: scale-to-zero.
- ``router``: what ``sageserve router`` does with a ModelPool (``router/pool_switcher.py``), its
  rules called, not rewritten (``dispatch.pool_switch``, applied by ``sim.pool_router``, the
  implementation the fleet simulator's pooled pods use too): each pod keeps at most
  ``awake_per_instance`` models awake; a request goes to the pod ``choose_pod`` picks (its
  model awake there, else waking, else a free slot, else an idle model to put to sleep,
  else the least-loaded pod, where it waits) and waits there, in arrival order, until
  ``plan_wake`` finds it a slot; a wake puts the least recently used idle models to sleep
  first (vLLM sleep level 1: weights over the host link, then the model's weights back);
  every second the models idle for ``idle_sleep_s`` go to sleep (``idle_models``). ``pooled``
  is the research variant (token-level switching inside one engine, which stock vLLM cannot
  do); ``router`` is the request-level rule that runs on Kubernetes.

Models the planner serves dedicated (``hot``) get that many always-on instances in every
strategy, so the strategies differ only in how the long tail is served.

Deadlines (Aegaeon §2.1 gives none): token k of a request that arrived at a is due at
a + TTFT + (k − 1)·TBT, so a late first token makes the following tokens late until the
stream catches up (buffering, Fig. 3), and a request that waits long misses most of its
tokens, which is what Aegaeon reports of ServerlessLLM's queues (§7.2). Tokens of requests
unfinished at the end count as missed.

Approximations (documented in docs/aegaeon.md): the decode step time is evaluated at the
start of each turn; a request dispatched to a batch joins it at the batch's next turn; the
Instance-based strategies' tokens after the first are taken as evenly spaced between the
first and the last (their decode pace is piecewise constant anyway); ``router``'s engines
awake on one pod split its KV cache evenly and each gets the whole pod's compute (as
``mux2``'s, optimistic where two decode at once), and a held request waits without the
router's hold-time bound (so it is late, not refused).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sageserve.core.percentile import percentile
from sageserve.core.types import Request, Tier, TierKind
from sageserve.dispatch.pool_switch import IDLE_SWEEP_SECONDS
from sageserve.perf.model import VariantPerf
from sageserve.perf.switch import (
    AEGAEON_BETA,
    kv_transfer_seconds,
    link_gb_per_s,
    model_size,
    switch_seconds,
)
from sageserve.plan.pool_sizing import Q_MAX_S, decode_quotas
from sageserve.sim.events import INSTANCE, Event, EventQueue, fire
from sageserve.sim.instance import Instance, InstanceHooks, Job
from sageserve.sim.pool_router import RouterEngine, RouterPod, RouterRule, SwitchDone

STRATEGIES = ("pooled", "request", "mux2", "dedicated", "router")
#: Aegaeon §4.2: the largest prefill group (MAX_GPSIZE, chosen by grid search).
MAX_GROUP = 8
_TIER = Tier("pool", TierKind.INTERACTIVE, priority=0)


def tokens_on_time(
    arrival: float,
    ttft_s: float,
    tbt_s: float,
    first_index: int,
    start: float,
    step: float,
    count: int,
) -> int:
    """How many of ``count`` tokens meet their deadlines.

    Token ``first_index + j − 1`` (tokens numbered from 1) is emitted at ``start + j·step``
    for j = 1 … count and is due at ``arrival + ttft_s + (index − 1)·tbt_s``. Met iff
    j·(step − tbt) ≤ B with B = arrival + ttft + (first_index − 2)·tbt − start: a linear
    inequality in j, so the count is one division, whatever ``count`` is.
    """
    if count <= 0:
        return 0
    b = arrival + ttft_s + (first_index - 2) * tbt_s - start + 1e-9
    slope = step - tbt_s
    if slope < 0.0:
        j_min = math.ceil(-b / -slope) if b < 0 else 1  # j ≥ −B/(tbt − step)
        j_min = max(j_min, 1)
        return max(0, count - j_min + 1)
    if slope == 0.0:
        return count if b >= 0 else 0
    return max(0, min(count, math.floor(b / slope)))


@dataclass(frozen=True, slots=True)
class PoolRequest:
    """One request of the replayed stream: arrival time, model, prompt and output tokens."""

    t: float
    model: str
    prompt: int
    output: int


@dataclass(frozen=True)
class PoolSetup:
    """The instance every model runs on (one base model size), its switch costs and the SLO.

    Every model of a pool is a fine-tuned variant of one base model, so one performance
    profile, one switch cost and one KV size serve all of them.
    """

    perf: VariantPerf
    switch_s: float
    load_s: float
    kv_s_per_token: float
    prefetch_kv_tokens: float
    ttft_s: float = 10.0
    tbt_s: float = 0.1
    q_max_s: float = Q_MAX_S
    max_group: int = MAX_GROUP
    keep_alive_s: float = 60.0
    #: Engine start-up of a cold start (process, CUDA context, graph capture; Aegaeon §5
    #: measures up to 26.9 s), paid on top of `load_s` by the baselines that start an
    #: engine: dedicated scale-from-zero and request-level switching. 0 leaves it out.
    startup_s: float = 0.0
    #: Instances each model keeps in the dedicated baseline however idle (a
    #: ModelDeployment's `minInstances`): 0 scales to zero after `keep_alive_s`; 1 keeps
    #: every model's instance up over the whole window, started before it.
    dedicated_floor: int = 0

    def __post_init__(self) -> None:
        if self.startup_s < 0:
            raise ValueError(f"base.startupSeconds: must be >= 0, got {self.startup_s}")
        if self.dedicated_floor not in (0, 1):
            raise ValueError(
                "pool.dedicatedMinInstances: must be 0 (scale to zero) or 1 (one instance "
                f"per model always up), got {self.dedicated_floor}"
            )

    @property
    def cold_start_s(self) -> float:
        """Seconds from a cold start's decision to serving: weights over the link, then the
        engine's start-up."""
        return self.load_s + self.startup_s

    @classmethod
    def from_profile(cls, perf: VariantPerf, **kw: Any) -> PoolSetup:
        """Switch costs from the profile's model size and its GPU type's host link.

        Prefetch (Aegaeon §5.2) needs a second model's weights to fit beside the KV in use:
        the instance's memory is its weights plus its KV capacity (vLLM's sizing), so the
        KV in use must stay below capacity − weights / (KV bytes per token).
        """
        size = model_size(perf.model)
        bw = link_gb_per_s(perf.gpu_type)
        return cls(
            perf=perf,
            switch_s=switch_seconds(size.weight_bytes, perf.gpus, bw, AEGAEON_BETA),
            load_s=switch_seconds(size.weight_bytes, perf.gpus, bw, 1.0),
            kv_s_per_token=kv_transfer_seconds(1.0, size.kv_bytes_per_token, perf.gpus, bw),
            prefetch_kv_tokens=max(
                0.0, perf.kv_capacity_tokens - size.weight_bytes / size.kv_bytes_per_token
            ),
            **kw,
        )


@dataclass
class ModelTokens:
    """Per-model counts: tokens due, tokens on time, requests arrived and finished."""

    tokens: int = 0
    on_time: int = 0
    arrived: int = 0
    finished: int = 0


@dataclass
class PoolOutcome:
    """What one strategy did with one request stream."""

    strategy: str
    requests: int
    finished: int
    tokens: int
    tokens_on_time: int
    gpus: int
    gpu_hours: float
    window_s: float
    switches: int
    wall_s: float
    cpu_s: float
    per_model: dict[str, ModelTokens] = field(default_factory=dict)
    ttft_p50_s: float = 0.0
    ttft_p95_s: float = 0.0
    #: pooled only: the longest decoding turn (its quota bounds it, Aegaeon §4.3)
    longest_turn_s: float = 0.0

    @property
    def attainment(self) -> float:
        """Share of all tokens emitted by their deadline (Aegaeon §2.1)."""
        return self.tokens_on_time / self.tokens if self.tokens else 1.0

    @property
    def requests_per_wall_s(self) -> float:
        return self.requests / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict[str, float | int | str]:
        return {
            "strategy": self.strategy,
            "requests": self.requests,
            "finished": self.finished,
            "attainment": self.attainment,
            "gpus": self.gpus,
            "gpu_hours": self.gpu_hours,
            "switches": self.switches,
            "ttft_p50_s": self.ttft_p50_s,
            "ttft_p95_s": self.ttft_p95_s,
            "requests_per_wall_s": self.requests_per_wall_s,
            "requests_per_cpu_s": self.requests / self.cpu_s if self.cpu_s > 0 else 0.0,
        }


class _R:
    """Simulator state of one request."""

    __slots__ = ("done", "emitted", "first", "kv", "model", "on_time", "out", "prompt", "t")

    def __init__(self, t: float, model: str, prompt: int, out: int) -> None:
        self.t = t
        self.model = model
        self.prompt = prompt
        self.out = out
        self.emitted = 0
        self.on_time = 0
        self.first = -1.0
        self.kv = prompt
        self.done = False


class _Base(InstanceHooks):
    """Event heap, accounting and the Instance-based dedicated serving every strategy shares."""

    def __init__(
        self, setup: PoolSetup, hot: Mapping[str, int], start_s: float, end_s: float
    ) -> None:
        self.s = setup
        self.events = EventQueue()
        self.start_s, self.end_s = start_s, end_s
        self.per_model: dict[str, ModelTokens] = {}
        self.finished = 0
        self.switches = 0
        self.ttfts: list[float] = []
        self.hot: dict[str, list[Instance]] = {}
        for m, n in hot.items():
            self.hot[m] = [self._instance(f"hot-{m}-{i}") for i in range(n)]
        self.hot_gpus = sum(len(v) for v in self.hot.values()) * setup.perf.gpus

    # ---- plumbing ---------------------------------------------------------------------------

    def push(self, when: float, kind: int, obj: object) -> None:
        self.events.push(when, kind, obj)

    def _instance(self, iid: str, perf: VariantPerf | None = None) -> Instance:
        return Instance(iid, perf or self.s.perf, "pool", self)

    def schedule(self, inst: Instance, when: float) -> None:
        self.events.schedule(inst, when)

    def on_idle(self, inst: Instance, now: float) -> None:
        return None

    def on_finish(self, job: Job, now: float) -> None:
        r = job.ep
        assert isinstance(r, _R)
        st = self.per_model[r.model]
        if now < 0:  # could never fit in the KV cache: every token missed
            r.done = True
            return
        s = self.s
        first = job.first_token
        ok = 1 if first <= r.t + s.ttft_s + 1e-9 else 0
        if r.out > 1:
            step = (now - first) / (r.out - 1)
            ok += tokens_on_time(r.t, s.ttft_s, s.tbt_s, 2, first, step, r.out - 1)
        self._done(r, st, ok, first)

    def _done(self, r: _R, st: ModelTokens, on_time: int, first: float) -> None:
        r.done = True
        r.on_time += on_time
        st.on_time += r.on_time
        st.finished += 1
        self.finished += 1
        self.ttfts.append(first - r.t)

    def _job(self, r: _R) -> Job:
        req = Request(0, r.t, r.model, _TIER, "pool", r.prompt, r.out)
        job = Job(req, 0)
        job.ep = r
        return job

    def _to_hot(self, r: _R, now: float) -> bool:
        insts = self.hot.get(r.model)
        if not insts:
            return False
        best = min(insts, key=lambda i: i.remaining_tokens_at(now))
        best.enqueue(self._job(r), now)
        return True

    # ---- the loop ---------------------------------------------------------------------------

    def arrive(self, r: _R, now: float) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def event(self, kind: int, obj: object, when: float) -> None:  # pragma: no cover
        raise NotImplementedError

    def gpus(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def gpu_hours(self) -> float:
        return self.gpus() * (self.end_s - self.start_s) / 3600.0

    def run(self, requests: Iterable[PoolRequest], drain_s: float) -> tuple[int, int, int]:
        """Replay; returns (requests, tokens due, tokens on time)."""
        events = self.events
        arrived: list[_R] = []
        end = self.end_s
        for q in requests:
            if q.t < self.start_s or q.t >= end:
                continue
            for item in events.pop_due(q.t):
                self._pop(item)
            r = _R(q.t, q.model, max(1, q.prompt), max(1, q.output))
            st = self.per_model.get(r.model)
            if st is None:
                st = self.per_model[r.model] = ModelTokens()
            st.arrived += 1
            st.tokens += r.out
            arrived.append(r)
            if not self._to_hot(r, q.t):
                self.arrive(r, q.t)
        for item in events.pop_due(end + drain_s):
            self._pop(item)
        # tokens emitted on time by requests still running at the end count as met
        for r in arrived:
            if not r.done and r.on_time:
                self.per_model[r.model].on_time += r.on_time
        tokens = sum(st.tokens for st in self.per_model.values())
        on_time = sum(st.on_time for st in self.per_model.values())
        return len(arrived), tokens, on_time

    def _pop(self, item: Event) -> None:
        when, _, kind, obj = item
        if kind == INSTANCE:
            assert isinstance(obj, Instance)
            if fire(obj, when):
                self.after_update(obj, when)
        else:
            self.event(kind, obj, when)

    def after_update(self, inst: Instance, now: float) -> None:
        return None


# ---- pooled (Aegaeon) ----------------------------------------------------------------------


class _Group:
    __slots__ = ("model", "reqs", "size")

    def __init__(self, model: str, r: _R) -> None:
        self.model = model
        self.reqs: deque[_R] = deque([r])
        self.size = 1


class _Prefill:
    __slots__ = ("busy", "groups", "load", "loaded")

    def __init__(self) -> None:
        self.groups: deque[_Group] = deque()
        self.loaded: str | None = None
        self.busy = False
        self.load = 0.0


class _Batch:
    __slots__ = ("kv", "model", "owner", "pending", "reqs", "reserved")

    def __init__(self, model: str, owner: _Decode) -> None:
        self.model = model
        self.owner = owner
        self.reqs: list[_R] = []
        self.pending: list[_R] = []
        self.kv = 0  # context tokens of its requests (the decode step's input)
        self.reserved = 0  # prompt + output of every member (the KV it may grow to)


class _Decode:
    __slots__ = (
        "batches",
        "busy",
        "cur",
        "last_kv",
        "last_turn",
        "loaded",
        "quotas",
        "round",
        "t_end",
        "t_start",
        "t_step",
        "turn",
    )

    def __init__(self) -> None:
        self.batches: list[_Batch] = []
        self.round: list[_Batch] = []
        self.quotas: list[float] = []
        self.turn = 0
        self.loaded: str | None = None
        self.busy = False
        self.last_turn = 0.0
        self.last_kv = 0
        #: the batch decoding now, and its turn's start, step time and end
        self.cur: _Batch | None = None
        self.t_start = self.t_step = self.t_end = 0.0


_PREFILL_DONE, _TO_DECODE, _TURN_DONE = 1, 2, 3


class _Pooled(_Base):
    def __init__(
        self,
        setup: PoolSetup,
        hot: Mapping[str, int],
        start_s: float,
        end_s: float,
        prefill: int,
        decode: int,
    ) -> None:
        super().__init__(setup, hot, start_s, end_s)
        if prefill < 1 or decode < 1:
            raise ValueError(f"prefill/decode: the pool needs >= 1 of each, got {prefill}/{decode}")
        self.prefill = [_Prefill() for _ in range(prefill)]
        self.decode = [_Decode() for _ in range(decode)]
        self.kv_cap = int(setup.perf.kv_capacity_tokens * 0.99)
        self.max_seqs = setup.perf.max_num_seqs
        self._dlut = setup.perf.decode_lut
        self._step = setup.perf.LUT_STEP
        self.longest_turn = 0.0

    def gpus(self) -> int:
        return (len(self.prefill) + len(self.decode)) * self.s.perf.gpus + self.hot_gpus

    def _decode_step(self, kv: int) -> float:
        i = kv // self._step
        lut = self._dlut
        return lut[i] if i < len(lut) else self.s.perf.decode(kv)

    # Algorithm 1: grouped FCFS over the prefill instances
    def arrive(self, r: _R, now: float) -> None:
        s = self.s
        est = s.perf.prefill(r.prompt)
        for p in self.prefill:
            for g in p.groups:
                if g.model == r.model and g.size < s.max_group:
                    g.reqs.append(r)
                    g.size += 1
                    p.load += est
                    return
        best = min(self.prefill, key=lambda p: p.load)
        last = best.groups[-1].model if best.groups else best.loaded
        best.groups.append(_Group(r.model, r))
        best.load += est + (s.switch_s if last != r.model else 0.0)
        if not best.busy:
            self._prefill_next(best, now)

    def _prefill_next(self, p: _Prefill, now: float) -> None:
        while p.groups and not p.groups[0].reqs:
            p.groups.popleft()
        if not p.groups:
            p.busy = False
            p.load = 0.0
            return
        g = p.groups[0]
        r = g.reqs.popleft()
        s = self.s
        dur = s.perf.prefill(r.prompt)
        cost = 0.0
        if p.loaded != g.model:
            cost = s.switch_s
            p.loaded = g.model
            self.switches += 1
        p.load = max(0.0, p.load - dur - cost)
        p.busy = True
        self.push(now + cost + dur, _PREFILL_DONE, (p, r))

    def event(self, kind: int, obj: object, when: float) -> None:
        if kind == _TURN_DONE:
            assert isinstance(obj, _Decode)
            self._next_turn(obj, when)
        elif kind == _PREFILL_DONE:
            assert isinstance(obj, tuple)
            p: _Prefill = obj[0]
            r: _R = obj[1]
            self._first_token(r, when)
            self._prefill_next(p, when)
        else:
            assert isinstance(obj, _R)
            self._dispatch(obj, when)

    def _first_token(self, r: _R, now: float) -> None:
        s = self.s
        r.first = now
        r.emitted = 1
        r.kv = r.prompt + 1
        r.on_time = 1 if now <= r.t + s.ttft_s + 1e-9 else 0
        if r.out <= 1:
            self._done(r, self.per_model[r.model], 0, now)
            return
        self.push(now + s.kv_s_per_token * r.prompt, _TO_DECODE, r)

    # Algorithm 2's dispatch: a same-model batch with room, else a new batch on the
    # instance with the shortest work list
    def _dispatch(self, r: _R, now: float) -> None:
        need = r.prompt + r.out
        for d in self.decode:
            for b in d.batches:
                if (
                    b.model == r.model
                    and b.reserved + need <= self.kv_cap
                    and len(b.reqs) + len(b.pending) < self.max_seqs
                ):
                    b.reserved += need
                    if b.owner.cur is b and now < b.owner.t_end:
                        self._join_turn(b, r, now)
                    else:
                        b.pending.append(r)
                    return
        best = min(self.decode, key=lambda d: sum(1 for b in d.batches if b.reqs or b.pending))
        b = _Batch(r.model, best)
        b.pending.append(r)
        b.reserved = need
        best.batches.append(b)
        if not best.busy:
            self._start_round(best, now)

    def _join_turn(self, b: _Batch, r: _R, now: float) -> None:
        """A request joins its model's batch while the batch decodes (continuous batching):
        it decodes from the next step to the end of the turn."""
        d = b.owner
        step = d.t_step
        done = math.ceil((now - d.t_start) / step - 1e-9) if now > d.t_start else 0
        start = d.t_start + done * step
        k = min(r.out - r.emitted, int((d.t_end - start) / step + 1e-9))
        s = self.s
        r.on_time += tokens_on_time(r.t, s.ttft_s, s.tbt_s, r.emitted + 1, start, step, k)
        r.emitted += k
        r.kv += k
        if r.emitted >= r.out:
            b.reserved -= r.prompt + r.out
            self._done(r, self.per_model[r.model], 0, r.first)
        else:
            b.reqs.append(r)
            b.kv += r.kv

    def _start_round(self, d: _Decode, now: float) -> None:
        d.batches = [b for b in d.batches if b.reqs or b.pending]
        if not d.batches:
            d.busy = False
            return
        # same-model batches adjacent, in order of first appearance (Algorithm 2, line 5)
        order: dict[str, int] = {}
        for b in d.batches:
            order.setdefault(b.model, len(order))
        d.batches.sort(key=lambda b: order[b.model])
        d.round = list(d.batches)
        steps = [self._decode_step(b.kv + sum(r.kv for r in b.pending)) for b in d.round]
        s = self.s
        changes = sum(1 for i, b in enumerate(d.round) if b.model != d.round[i - 1].model)
        if len(order) == 1:
            changes = 0
        d.quotas = decode_quotas(steps, s.tbt_s, changes * s.switch_s, s.q_max_s)
        d.turn = 0
        d.busy = True
        self._turn(d, now)

    def _next_turn(self, d: _Decode, now: float) -> None:
        d.cur = None
        d.turn += 1
        if d.turn >= len(d.round):
            self._start_round(d, now)
        else:
            self._turn(d, now)

    def _turn(self, d: _Decode, now: float) -> None:
        b = d.round[d.turn]
        if b.pending:
            for r in b.pending:
                b.reqs.append(r)
                b.kv += r.kv
            b.pending = []
        if not b.reqs:
            self._next_turn(d, now)
            return
        s = self.s
        cost = 0.0
        if d.loaded != b.model:
            hidden = d.last_turn >= s.switch_s and d.last_kv <= s.prefetch_kv_tokens
            cost = (0.0 if hidden else s.switch_s) + s.kv_s_per_token * b.kv
            d.loaded = b.model
            self.switches += 1
        step = self._decode_step(b.kv)
        steps = max(1, int(d.quotas[d.turn] / step))
        most = max(r.out - r.emitted for r in b.reqs)
        n = steps if steps < most else most
        start = now + cost
        ttft, tbt = s.ttft_s, s.tbt_s
        keep: list[_R] = []
        for r in b.reqs:
            k = r.out - r.emitted
            if k > n:
                k = n
            r.on_time += tokens_on_time(r.t, ttft, tbt, r.emitted + 1, start, step, k)
            r.emitted += k
            r.kv += k
            b.kv += k
            if r.emitted >= r.out:
                b.kv -= r.kv
                b.reserved -= r.prompt + r.out
                self._done(r, self.per_model[r.model], 0, r.first)
            else:
                keep.append(r)
        b.reqs = keep
        d.last_turn = n * step
        if d.last_turn > self.longest_turn:
            self.longest_turn = d.last_turn
        d.last_kv = b.kv
        d.cur, d.t_start, d.t_step, d.t_end = b, start, step, start + n * step
        self.push(start + n * step, _TURN_DONE, d)


# ---- request-level switching (ServerlessLLM-like) -------------------------------------------


class _Slot:
    __slots__ = ("inst", "last_used", "loaded", "model", "pending", "ready")

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.model: str | None = None  # the model it serves now (None: idle)
        self.loaded: str | None = None  # the model whose weights it holds
        self.pending: list[Job] = []
        self.ready = True
        self.last_used = 0.0


_SLOT_READY = 1


class _RequestLevel(_Base):
    def __init__(
        self, setup: PoolSetup, hot: Mapping[str, int], start_s: float, end_s: float, n: int
    ) -> None:
        super().__init__(setup, hot, start_s, end_s)
        if n < 1:
            raise ValueError(f"request: needs >= 1 instance, got {n}")
        self.slots = [_Slot(self._instance(f"slot-{i}")) for i in range(n)]
        self.by_inst = {id(sl.inst): sl for sl in self.slots}
        self.active: dict[str, _Slot] = {}
        self.queue: deque[_R] = deque()

    def gpus(self) -> int:
        return len(self.slots) * self.s.perf.gpus + self.hot_gpus

    def arrive(self, r: _R, now: float) -> None:
        sl = self.active.get(r.model)
        if sl is not None:
            if sl.ready:
                sl.inst.enqueue(self._job(r), now)
            else:
                sl.pending.append(self._job(r))
            return
        idle = [sl for sl in self.slots if sl.model is None]
        if not idle:
            self.queue.append(r)
            return
        same = [sl for sl in idle if sl.loaded == r.model]
        sl = same[0] if same else min(idle, key=lambda x: x.last_used)
        self._switch(sl, r.model, [self._job(r)], now)

    def _switch(self, sl: _Slot, model: str, jobs: list[Job], now: float) -> None:
        sl.model = model
        self.active[model] = sl
        if sl.loaded == model:
            sl.ready = True
            for j in jobs:
                sl.inst.enqueue(j, now)
            return
        sl.loaded = model
        sl.ready = False
        sl.pending = jobs
        self.switches += 1
        self.push(now + self.s.cold_start_s, _SLOT_READY, sl)

    def event(self, kind: int, obj: object, when: float) -> None:
        assert isinstance(obj, _Slot)
        obj.ready = True
        jobs, obj.pending = obj.pending, []
        for j in jobs:
            obj.inst.enqueue(j, when)

    def after_update(self, inst: Instance, now: float) -> None:
        sl = self.by_inst.get(id(inst))
        if sl is None or not sl.ready or not inst.idle or sl.model is None:
            return
        # idle: free for the oldest waiting request's model, all of whose requests come along
        del self.active[sl.model]
        sl.model = None
        sl.last_used = now
        if self.queue:
            model = self.queue[0].model
            jobs = [self._job(r) for r in self.queue if r.model == model]
            self.queue = deque(r for r in self.queue if r.model != model)
            self._switch(sl, model, jobs, now)


# ---- the router's request-level rule (dispatch.pool_switch, via sim.pool_router) -------------


_SWITCHED, _SWEEP = 2, 4


class _RouterRule(_Base):
    """`sim.pool_router.RouterRule` on a fixed set of pods, each engine its own instance
    (its share of the pod's KV cache, the whole pod's compute)."""

    def __init__(
        self,
        setup: PoolSetup,
        hot: Mapping[str, int],
        start_s: float,
        end_s: float,
        n: int,
        quota: int,
        idle_sleep_s: float,
    ) -> None:
        super().__init__(setup, hot, start_s, end_s)
        if n < 1:
            raise ValueError(f"router: needs >= 1 pod, got {n}")
        if quota < 1:
            raise ValueError(f"router: awake_per_instance must be >= 1, got {quota}")
        self.rule: RouterRule[_R] = RouterRule(self, quota, idle_sleep_s, setup.load_s)
        for name in (f"pod-{i:04d}" for i in range(n)):
            self.rule.add_pod(name)
        self.engine_perf = dataclasses.replace(
            setup.perf, kv_capacity_tokens=setup.perf.kv_capacity_tokens // quota
        )
        #: each engine's instance (by id) to its pod and engine
        self.of_inst: dict[int, tuple[RouterPod[_R], str]] = {}
        self.push(start_s + IDLE_SWEEP_SECONDS, _SWEEP, None)

    def gpus(self) -> int:
        return len(self.rule.pods) * self.s.perf.gpus + self.hot_gpus

    # ---- PoolServing ---------------------------------------------------------------------

    def model_of(self, item: _R) -> str:
        return item.model

    def busy(self, engine: RouterEngine) -> int:
        inst = engine.handle
        assert isinstance(inst, Instance)
        return 0 if inst.idle else inst.running + inst.waiting

    def load(self, pod: RouterPod[_R], now: float) -> float:
        return sum(
            e.handle.remaining_tokens_at(now)  # type: ignore[attr-defined]
            for e in pod.live.values()
            if e.awake
        )

    def new_engine(self, pod: RouterPod[_R], model: str) -> object:
        inst = self._instance(f"{pod.name}-{model}", self.engine_perf)
        self.of_inst[id(inst)] = (pod, model)
        return inst

    def forward(self, pod: RouterPod[_R], engine: RouterEngine, item: _R, now: float) -> None:
        inst = engine.handle
        assert isinstance(inst, Instance)
        inst.enqueue(self._job(item), now)

    def schedule_switch(self, when: float, done: SwitchDone[_R]) -> None:
        self.push(when, _SWITCHED, done)

    # ---- the loop ------------------------------------------------------------------------

    def arrive(self, r: _R, now: float) -> None:
        self.rule.arrive(r, now)

    def event(self, kind: int, obj: object, when: float) -> None:
        if kind == _SWEEP:
            self.rule.sweep(when)
            if when + IDLE_SWEEP_SECONDS <= self.end_s:
                self.push(when + IDLE_SWEEP_SECONDS, _SWEEP, None)
            return
        assert isinstance(obj, SwitchDone)
        self.rule.switch_done(obj, when)

    def after_update(self, inst: Instance, now: float) -> None:
        found = self.of_inst.get(id(inst))
        if found is None or not inst.idle:
            return
        pod, model = found
        self.rule.released(pod, pod.engines[model], now)


# ---- static multiplexing, <= 2 models per instance (MuxServe-like) --------------------------


class _Mux2(_Base):
    def __init__(
        self,
        setup: PoolSetup,
        hot: Mapping[str, int],
        start_s: float,
        end_s: float,
        models: Sequence[str],
    ) -> None:
        super().__init__(setup, hot, start_s, end_s)
        half = dataclasses.replace(
            setup.perf, kv_capacity_tokens=setup.perf.kv_capacity_tokens // 2
        )
        self.inst = {m: self._instance(f"mux-{m}", half) for m in models if m not in self.hot}
        self.pairs = math.ceil(len(self.inst) / 2)

    def gpus(self) -> int:
        return self.pairs * self.s.perf.gpus + self.hot_gpus

    def arrive(self, r: _R, now: float) -> None:
        inst = self.inst.get(r.model)
        if inst is None:
            raise ValueError(f"mux2: model {r.model} has no instance; list it in models")
        inst.enqueue(self._job(r), now)


# ---- dedicated, one instance per model, scale-to-zero ---------------------------------------


class _Dedicated(_Base):
    def __init__(
        self,
        setup: PoolSetup,
        hot: Mapping[str, int],
        start_s: float,
        end_s: float,
        models: Sequence[str] = (),
    ) -> None:
        super().__init__(setup, hot, start_s, end_s)
        self.slots: dict[str, _Slot] = {}
        self.by_inst: dict[int, _Slot] = {}
        self.up_since: dict[str, float] = {}
        self.idle_since: dict[str, float] = {}
        self.alive_s = 0.0
        self.alive = 0
        self.peak = 0
        if setup.dedicated_floor:
            for m in models:
                if m in hot or m in self.slots:
                    continue
                inst = self._instance(f"ded-{m}")
                sl = self.slots[m] = _Slot(inst)
                self.by_inst[id(inst)] = sl
                sl.model, sl.ready = m, True
                self.up_since[m] = start_s
                self.alive += 1
            self.peak = self.alive

    def gpus(self) -> int:
        return self.peak * self.s.perf.gpus + self.hot_gpus

    def gpu_hours(self) -> float:
        return (self.alive_s * self.s.perf.gpus) / 3600.0 + self.hot_gpus * (
            self.end_s - self.start_s
        ) / 3600.0

    def arrive(self, r: _R, now: float) -> None:
        sl = self.slots.get(r.model)
        if sl is None:
            inst = self._instance(f"ded-{r.model}")
            sl = self.slots[r.model] = _Slot(inst)
            self.by_inst[id(inst)] = sl
        self.idle_since.pop(r.model, None)
        if sl.model is None:  # scaled to zero: start it
            sl.model = r.model
            sl.ready = False
            sl.pending = [self._job(r)]
            self.up_since[r.model] = now
            self.alive += 1
            self.peak = max(self.peak, self.alive)
            self.switches += 1
            self.push(now + self.s.cold_start_s, _SLOT_READY, sl)
        elif sl.ready:
            sl.inst.enqueue(self._job(r), now)
        else:
            sl.pending.append(self._job(r))

    def event(self, kind: int, obj: object, when: float) -> None:
        if kind == _SLOT_READY:
            assert isinstance(obj, _Slot)
            obj.ready = True
            jobs, obj.pending = obj.pending, []
            for j in jobs:
                obj.inst.enqueue(j, when)
            if obj.inst.idle:
                self.after_update(obj.inst, when)
            return
        assert isinstance(obj, tuple)
        model: str = obj[0]
        since: float = obj[1]
        if self.idle_since.get(model) != since:
            return  # work came in the meantime
        sl = self.slots[model]
        if sl.inst.idle and sl.model is not None:
            del self.idle_since[model]
            sl.model = None
            self.alive -= 1
            self.alive_s += self._clip(self.up_since.pop(model), when)

    def _clip(self, a: float, b: float) -> float:
        return max(0.0, min(b, self.end_s) - max(a, self.start_s))

    def after_update(self, inst: Instance, now: float) -> None:
        sl = self.by_inst.get(id(inst))
        if sl is None or sl.model is None or not sl.ready or not inst.idle:
            return
        if self.s.dedicated_floor:
            return  # the floor keeps it up
        self.idle_since[sl.model] = now
        self.push(now + self.s.keep_alive_s, 2, (sl.model, now))

    def close(self, now: float) -> None:
        for since in self.up_since.values():
            self.alive_s += self._clip(since, now)
        self.up_since.clear()


# ---- entry point -----------------------------------------------------------------------------


def simulate_pool(
    strategy: str,
    requests: Iterable[PoolRequest],
    setup: PoolSetup,
    *,
    start_s: float,
    end_s: float,
    instances: int = 0,
    prefill: int = 0,
    decode: int = 0,
    models: Sequence[str] = (),
    hot: Mapping[str, int] | None = None,
    drain_s: float = 600.0,
    awake_per_instance: int = 1,
    idle_sleep_s: float = 60.0,
) -> PoolOutcome:
    """Replay ``requests`` (sorted by time) under one strategy; see the module doc.

    ``pooled`` takes ``prefill`` and ``decode`` instances, ``request`` ``instances``,
    ``mux2`` the ``models`` it must place (two per instance), ``dedicated`` nothing: it
    starts what the requests ask for (with ``setup.dedicated_floor``, ``models`` are up from
    the start); ``router`` ``instances`` pods, each keeping
    ``awake_per_instance`` models awake and putting one to sleep after ``idle_sleep_s``
    (a ModelPool's `awakePerInstance` and `idleSleepSeconds`). ``hot`` models are served
    by that many always-on instances of their own in every strategy.
    """
    if end_s <= start_s:
        raise ValueError(f"end_s: must be after start_s ({start_s}), got {end_s}")
    hot = dict(hot or {})
    sim: _Base
    if strategy == "pooled":
        sim = _Pooled(setup, hot, start_s, end_s, prefill, decode)
    elif strategy == "request":
        sim = _RequestLevel(setup, hot, start_s, end_s, instances)
    elif strategy == "mux2":
        sim = _Mux2(setup, hot, start_s, end_s, models)
    elif strategy == "dedicated":
        sim = _Dedicated(setup, hot, start_s, end_s, models)
    elif strategy == "router":
        sim = _RouterRule(setup, hot, start_s, end_s, instances, awake_per_instance, idle_sleep_s)
    else:
        raise ValueError(f"strategy: unknown {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    t0, c0 = time.perf_counter(), time.process_time()
    n, tokens, on_time = sim.run(requests, drain_s)
    if isinstance(sim, _RouterRule):
        sim.switches = sim.rule.wakes
    if isinstance(sim, _Dedicated):
        sim.close(end_s + drain_s)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return PoolOutcome(
        strategy=strategy,
        requests=n,
        finished=sim.finished,
        tokens=tokens,
        tokens_on_time=on_time,
        gpus=sim.gpus(),
        gpu_hours=sim.gpu_hours(),
        window_s=end_s - start_s,
        switches=sim.switches,
        wall_s=wall,
        cpu_s=cpu,
        per_model=sim.per_model,
        ttft_p50_s=percentile(sim.ttfts, 50) if sim.ttfts else 0.0,
        ttft_p95_s=percentile(sim.ttfts, 95) if sim.ttfts else 0.0,
        longest_turn_s=sim.longest_turn if isinstance(sim, _Pooled) else 0.0,
    )
