"""One simulated vLLM instance with continuous batching, advanced analytically.

Why analytic: stepping every decode iteration of every instance costs ~100 Python operations
per generated token, far from the 50,000 requests per wall-second goal. Between two events
(an arrival, a prefill finishing, a request finishing, the KV cache filling up) the running
batch is fixed, so every running sequence gains one token per iteration and the iteration
time is constant. We therefore keep a *virtual iteration counter* `v`: a request admitted at
`v_a` with `k` output tokens left finishes at `v_a + k`, the KV in use is
`Σ(context_i - v_a_i) + n·v`, and the next finish or KV-full moment is one division away.

What is modelled, following vLLM's scheduler:
- admission while the waiting request's prompt fits in free KV and the running set is under
  `max_num_seqs`; admissible prompts are prefilled together in one step of at most
  `max_batched_tokens` (vLLM's `max_num_batched_tokens`), during which decoding pauses;
- chunked prefill: a prompt longer than that budget is prefilled in chunks of the budget,
  each followed by one decode iteration of the running batch (vLLM's chunked prefill, on by
  default since V1, interleaves them in one step; here they alternate), so one long prompt
  slows the running sequences but cannot hold the instance for its whole prefill. Its KV is
  reserved whole at admission (so a chunked prompt never preempts), and its last chunk
  shares its step with shorter prompts that fit the rest of the budget. Prompts within the
  budget are scheduled exactly as before;
- priority queues: priority-0 requests (interactive, promoted batch) are admitted before any
  priority-1 request (SageServe §6.1); FCFS within a priority, unless the instance has an
  order (`order`, the ScalingPolicy's `spec.instanceScheduling`): then its priority-0 queue
  is sorted by `dispatch.instance_order` before each admission (EDF, PF or DPA, SageServe
  v3 §6.5), and admission takes it in that order while memory permits;
- the prefill step emits the first token (TTFT); each decode iteration emits one token per
  running sequence;
- preemption by recomputation when the KV cache is full: the most recently admitted sequence
  is evicted and re-queued at the head with its generated tokens folded into its prompt.

Approximation (documented): the decode iteration time is re-evaluated at every event of the
instance, not at every iteration, so it lags KV growth by at most one inter-event interval.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import TYPE_CHECKING

from sageserve.core.types import InstanceState, Request
from sageserve.dispatch.instance_order import InstanceScheduling, sort_key, waiting_of

if TYPE_CHECKING:
    from sageserve.dispatch.anticipator import LoadAnticipator
    from sageserve.perf.model import VariantPerf

_EPS = 1e-9
_INF = float("inf")
_SERVING = InstanceState.SERVING


class Job:
    """Simulator-side state of one request (kept apart from the pure `Request`)."""

    __slots__ = (
        "admit_v",
        "context",
        "deadline",
        "done",
        "ep",
        "finish_time",
        "finish_v",
        "first_token",
        "instance",
        "load",
        "net_delay",
        "out_left",
        "pred_out",
        "preemptions",
        "prio",
        "prompt_left",
        "req",
    )

    def __init__(self, req: Request, prio: int, net_delay: float = 0.0) -> None:
        self.req = req
        self.prio = prio
        self.prompt_left = req.prompt_tokens  # tokens to (re)compute at the next prefill
        self.out_left = req.output_tokens  # output tokens still to produce
        self.context = 0  # KV tokens held when admitted to the decode set
        self.admit_v = 0.0
        self.finish_v = 0.0
        self.first_token = -1.0
        self.finish_time = -1.0
        self.done = False
        self.instance: Instance | None = None
        self.net_delay = net_delay
        self.preemptions = 0
        self.deadline = _INF
        self.ep: object | None = None  # the endpoint that routed it (set by the simulator)
        #: predicted output tokens (what a router knows; `req.output_tokens` is the truth)
        self.pred_out = req.output_tokens
        #: the load anticipator that tracks it on its instance (set by the simulator)
        self.load: LoadAnticipator | None = None


class InstanceHooks:
    """Callbacks the cluster gives an instance (kept tiny: one call per finished request)."""

    def on_finish(self, job: Job, now: float) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def schedule(self, inst: Instance, when: float) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def on_idle(self, inst: Instance, now: float) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def on_first_token(self, job: Job, now: float) -> None:
        """A request's first token (its TTFT ends here); nothing by default."""

    def on_decode(self, job: Job, now: float) -> None:
        """A request's prefill is done and it joins the decode batch at iteration
        `job.admit_v` holding `job.context` tokens (again after a preemption); nothing by
        default."""

    def on_preempt(self, job: Job, now: float) -> None:
        """A running request was preempted and re-queued with its generated tokens folded
        into its prompt (`job.prompt_left`); nothing by default."""


class Instance:
    """A model instance: KV accounting, queues, prefill/decode state machine."""

    __slots__ = (
        "_a",
        "_dlut",
        "_n",
        "_run_heap",
        "_running",
        "_seq",
        "_sum_finish_v",
        "busy_until",
        "chunk_done",
        "chunk_job",
        "chunk_resume_v",
        "chunk_tokens",
        "endpoint",
        "event_time",
        "gpu_hours",
        "gpus",
        "hooks",
        "id",
        "iter_time",
        "kv_cap",
        "kv_prefill",
        "last_model",
        "max_batched_tokens",
        "max_seqs",
        "model",
        "node",
        "order",
        "perf",
        "prefill_work",
        "prefilling",
        "ready_at",
        "region",
        "reporting",
        "state",
        "state_since",
        "t0",
        "tokens_in",
        "v",
        "waiting0",
        "waiting1",
        "waiting_tokens",
    )

    def __init__(
        self,
        iid: str,
        perf: VariantPerf,
        region: str,
        hooks: InstanceHooks,
        max_batched_tokens: int = 16384,
        order: InstanceScheduling | None = None,
    ) -> None:
        self.id = iid
        #: the order of the priority-0 queue (None: FCFS, the queue's own order, no cost)
        self.order = order if order is not None and order.ordered else None
        #: whether its metrics reach the observer (False models a scrape gap)
        self.reporting = True
        self.perf = perf
        self._dlut = perf.decode_lut
        self.model = perf.model
        self.last_model: str | None = perf.model
        self.region = region
        self.gpus = perf.gpus
        self.kv_cap = perf.kv_capacity_tokens
        self.max_seqs = perf.max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.hooks = hooks
        self.endpoint: object | None = None
        self.node: object | None = None
        self.state = InstanceState.SERVING
        self.state_since = 0.0
        self.ready_at = 0.0
        self.gpu_hours: dict[InstanceState, float] = {}
        self.t0 = 0.0
        self.v = 0.0
        self.busy_until = -_INF
        self.prefilling: list[Job] = []
        self.prefill_work = 0  # Σ (prompt + output) tokens of the prefilling batch
        self.kv_prefill = 0
        self._a = 0.0  # Σ (context_i - admit_v_i) over running jobs
        self._n = 0
        self._sum_finish_v = 0.0
        self._run_heap: list[tuple[float, int, Job]] = []
        self._running: dict[Job, None] = {}  # insertion order = admission order (LIFO victim)
        self._seq = 0
        self.iter_time = 0.0
        self.waiting0: deque[Job] = deque()
        self.waiting1: deque[Job] = deque()
        self.waiting_tokens = 0
        self.event_time = _INF
        self.tokens_in = 0  # prompt tokens accepted (for observed tokens/s)
        #: the admitted request whose prompt is being prefilled in chunks (its whole prompt
        #: reserved in `kv_prefill`), the prompt tokens done, this step's chunk, and the
        #: virtual iteration after which its next chunk may start
        self.chunk_job: Job | None = None
        self.chunk_done = 0
        self.chunk_tokens = 0
        self.chunk_resume_v = 0.0

    # ---- read-only views (no state change), used by routers and metrics ----------------

    def interactive_running(self) -> int:
        """Interactive-tier requests sent here and not finished (waiting for admission,
        prefilling, in chunked prefill or decoding): Chiron's "instance running an
        interactive request", counted as the router counts its in-flight requests per pod
        (from sending to the answer's end)."""
        n = 0
        for jobs in (self._running, self.prefilling, self.waiting0, self.waiting1):
            n += sum(1 for job in jobs if job.req.tier.interactive)
        chunk = self.chunk_job
        if chunk is not None and chunk not in self.prefilling and chunk.req.tier.interactive:
            n += 1
        return n

    def v_at(self, t: float) -> float:
        """Virtual iteration count at time t without advancing the instance."""
        if self.prefilling or self._n == 0:
            return self.v
        start = self.t0 if self.t0 > self.busy_until else self.busy_until
        if t <= start:
            return self.v
        return self.v + (t - start) / self.iter_time

    def kv_at(self, t: float) -> float:
        """KV tokens in use at time t (running sequences + prompts being prefilled)."""
        return self.kv_prefill + self._a + self._n * self.v_at(t)

    def remaining_tokens_at(self, t: float) -> float:
        """Tokens still to process: queued prompts+outputs, prefilling, and decode left."""
        return self.waiting_tokens + self.prefill_work + self._sum_finish_v - self._n * self.v_at(t)

    @property
    def running(self) -> int:
        between_chunks = self.chunk_job is not None and not self.prefilling
        return self._n + len(self.prefilling) + between_chunks

    @property
    def waiting(self) -> int:
        return len(self.waiting0) + len(self.waiting1)

    @property
    def idle(self) -> bool:
        return not (self._n or self.prefilling or self.waiting0 or self.waiting1 or self.chunk_job)

    def enqueue(self, job: Job, now: float) -> None:
        """A request arrives at this instance's local queue."""
        job.instance = self
        if job.prio == 0:
            self.waiting0.append(job)
        else:
            self.waiting1.append(job)
        self.waiting_tokens += job.prompt_left + job.out_left
        self.tokens_in += job.req.prompt_tokens
        if not self.prefilling:
            self.update(now)

    def update(self, now: float) -> None:
        """Bring the instance to `now`: finish prefills, finishes, preemptions, admissions."""
        if self.prefilling:
            if now + _EPS < self.busy_until:
                return
            self._end_prefill(self.busy_until)
        elif self._n:
            start = self.t0 if self.t0 > self.busy_until else self.busy_until
            if now > start:
                self.v += (now - start) / self.iter_time
        self.t0 = now
        heap = self._run_heap
        # finishing within 1e-6 iterations counts as now: float time cannot resolve
        # sub-nanosecond steps at t ~ 1e5-1e6 s
        lim = self.v + 1e-6
        if heap and heap[0][0] <= lim:
            running = self._running
            on_finish = self.hooks.on_finish
            while heap and heap[0][0] <= lim:
                fv, _, job = heappop(heap)
                if job.done or job.instance is not self or job.finish_v != fv:
                    continue
                del running[job]
                self._n -= 1
                self._a -= job.context - job.admit_v
                self._sum_finish_v -= fv
                job.done = True
                job.finish_time = now
                job.instance = None
                on_finish(job, now)
        # KV full: preempt newest sequences until it fits (vLLM recompute preemption); as in
        # vLLM, a step that preempts admits nothing new
        if self._n and self.kv_prefill + self._a + self._n * self.v > self.kv_cap + _EPS:
            self._preempt_until_fits()
        elif not self.prefilling and (self.waiting0 or self.waiting1 or self.chunk_job):
            self._admit(now)
        self._reschedule(now)
        if self.state is not _SERVING and self.idle:
            self.hooks.on_idle(self, now)

    def _preempt_until_fits(self) -> None:
        while self._n and self.kv_prefill + self._a + self._n * self.v > self.kv_cap + _EPS:
            job, _ = self._running.popitem()
            generated = int(self.v - job.admit_v)
            self._n -= 1
            self._a -= job.context - job.admit_v
            self._sum_finish_v -= job.finish_v
            job.finish_v = -1.0
            job.out_left = max(1, job.out_left - generated)
            job.prompt_left = job.context + generated
            job.preemptions += 1
            # recompute needs the whole context again; head of its priority queue
            (self.waiting0 if job.prio == 0 else self.waiting1).appendleft(job)
            self.waiting_tokens += job.prompt_left + job.out_left
            self.hooks.on_preempt(job, self.t0)

    def _admit(self, now: float) -> None:
        # vLLM keeps a watermark of free blocks (1%) so admission does not thrash
        free = self.kv_cap * 0.99 - (self.kv_prefill + self._a + self._n * self.v)
        slots = self.max_seqs - self._n
        budget = self.max_batched_tokens
        batch: list[Job] = []
        tokens = 0
        work = 0
        cj = self.chunk_job
        if cj is not None:
            # a prompt part-way through its chunks goes first (vLLM schedules requests it
            # already runs before new ones), once the running batch has decoded one token
            if self._n and self.v < self.chunk_resume_v - 1e-6:
                return
            left = cj.prompt_left - self.chunk_done
            tokens = self.chunk_tokens = min(left, budget)
            work = left + cj.out_left
            batch.append(cj)
            slots -= 1
            if tokens < left:  # not its last chunk: the step is full
                self._start_prefill(batch, tokens, work, now)
                return
        w0, w1 = self.waiting0, self.waiting1
        if self.order is not None and len(w0) > 1:
            w0 = self._sort_waiting(now)
        while slots > 0:
            q = w0 if w0 else w1
            if not q:
                break
            job = q[0]
            need = job.prompt_left
            if need > free or (batch and tokens + need > budget):
                if need > self.kv_cap:  # can never fit: drop, reported unfinished
                    q.popleft()
                    self.waiting_tokens -= job.prompt_left + job.out_left
                    job.done = True
                    job.instance = None
                    self.hooks.on_finish(job, -1.0)
                    continue
                break
            q.popleft()
            batch.append(job)
            free -= need
            slots -= 1
            self.waiting_tokens -= need + job.out_left
            work += need + job.out_left
            self.kv_prefill += need  # reserved whole, chunked or not
            if need > budget:  # alone in its step (the check above): prefill it in chunks
                self.chunk_job = job
                self.chunk_done = 0
                tokens = self.chunk_tokens = budget
                break
            tokens += need
        if batch:
            self._start_prefill(batch, tokens, work, now)

    def _sort_waiting(self, now: float) -> deque[Job]:
        """The priority-0 queue in the instance's order at `now` (dispatch.instance_order)."""
        assert self.order is not None
        key = sort_key(self.order, now)
        jobs = sorted(
            self.waiting0,
            key=lambda j: key(waiting_of(j.req.tier, j.req.arrival, j.first_token >= 0)),
        )
        self.waiting0 = w0 = deque(jobs)
        return w0

    def _start_prefill(self, batch: list[Job], tokens: int, work: int, now: float) -> None:
        self.prefilling = batch
        self.prefill_work = work
        self.busy_until = now + self.perf.prefill_curve(tokens)

    def _end_prefill(self, t: float) -> None:
        batch = self.prefilling
        self.prefilling = []
        self.prefill_work = 0
        v = self.v
        hooks = self.hooks
        running = self._running
        for job in batch:
            if job is self.chunk_job:
                self.chunk_done += self.chunk_tokens
                if self.chunk_done < job.prompt_left:  # more chunks: one decode step first
                    self.chunk_resume_v = v + 1.0
                    self.prefill_work = job.prompt_left - self.chunk_done + job.out_left
                    continue
                self.chunk_job = None
                self.chunk_done = 0
            self.kv_prefill -= job.prompt_left
            if job.first_token < 0:
                job.first_token = t
                hooks.on_first_token(job, t)
            out_left = job.out_left - 1
            job.out_left = out_left
            if out_left <= 0:
                job.done = True
                job.finish_time = t
                job.instance = None
                hooks.on_finish(job, t)
                continue
            context = job.context = job.prompt_left + 1
            job.prompt_left = 0
            job.admit_v = v
            finish_v = job.finish_v = v + out_left
            self._a += context - v
            self._n += 1
            self._sum_finish_v += finish_v
            running[job] = None
            self._seq += 1
            heappush(self._run_heap, (finish_v, self._seq, job))
            hooks.on_decode(job, t)
        self.busy_until = t
        self.t0 = t

    def _reschedule(self, now: float) -> None:
        if self.prefilling:
            when = self.busy_until
        elif self._n:
            n, v = self._n, self.v
            kv = self.kv_prefill + self._a + n * v
            k = int(kv) // 128
            lut = self._dlut
            it = lut[k] if 0 <= k < len(lut) else self.perf.decode_curve(kv)
            self.iter_time = it
            heap = self._run_heap
            dv = _INF
            while heap:
                fv, _, j = heap[0]
                if j.done or j.instance is not self or j.finish_v != fv:
                    heappop(heap)  # stale: finished or preempted earlier
                    continue
                dv = fv - v
                break
            dv_full = (self.kv_cap - kv) / n
            if dv_full < dv:
                dv = dv_full if dv_full > 1e-6 else 1e-6
            if self.chunk_job is not None:  # the next chunk after this decode iteration
                dv_chunk = self.chunk_resume_v - v
                if dv_chunk < dv:
                    dv = dv_chunk if dv_chunk > 1e-6 else 1e-6
            when = now + dv * it
            if when <= now:
                when = now + 1e-6
        elif self.chunk_job is not None:  # a chunk left and nothing decoding: go on now
            when = now + 1e-6
        else:
            when = _INF
        if when != self.event_time:
            self.event_time = when
            if when < _INF:
                self.hooks.schedule(self, when)

    def abandon_all(self) -> list[Job]:
        """Remove and return every unfinished job (used when the run ends)."""
        jobs = list(self._running) + self.prefilling + list(self.waiting0) + list(self.waiting1)
        if self.chunk_job is not None and self.chunk_job not in self.prefilling:
            jobs.append(self.chunk_job)
        self.chunk_job = None
        self.chunk_done = 0
        self._running.clear()
        self._run_heap.clear()
        self.prefilling = []
        self.prefill_work = 0
        self.waiting0.clear()
        self.waiting1.clear()
        self._n = 0
        self._a = 0.0
        self._sum_finish_v = 0.0
        self.kv_prefill = 0
        self.waiting_tokens = 0
        return jobs
