"""Per-instance load anticipator: the KV cache an instance will hold over its next iterations
(PreServe §4.3.1, Fig. 7).

KV-cache usage measured now is late: every running request keeps growing by one token per
decode iteration, so an instance that looks half full can be out of memory (and preempt)
a hundred iterations later. PreServe keeps, per instance, a look-ahead map U: the projected
KV tokens at each future iteration, from each request's prompt tokens P and predicted
output D: a request holds P + i tokens at its i-th decode iteration, i ∈ [0, D).

The paper's corrections, both applied here:
- a request that finishes before its prediction frees its tokens at once (its remaining
  projection, i ∈ [D̂, D), is subtracted);
- a request still running at its predicted end is extended by 0.2 × its length so far
  (the paper's "0.2 D̂", read with the length known at that moment), again and again until
  it finishes.

Requests still waiting (or being prefilled) are projected as if they started decoding at
the next iteration: the KV they are about to claim is part of what the instance must hold,
and a queue that cannot be admitted is exactly the overload the router should avoid.
Projected usage is capped at the capacity: the engine cannot hold more (it preempts), so a
projection above it says "full", not "by how much".

Incremental, so a routing decision costs the same after a million requests as after ten:
the running requests are summarised by their count and Σ(context − start iteration), and by
how many of them (and their Σ) end at each future iteration (a dict keyed by iteration);
the waiting ones by count, Σ prompt, and how many end at each offset. Admitting, finishing
or extending a request is O(log n) (a heap of predicted ends, cleaned lazily); projecting l
iterations ahead, with or without a virtual request, is O(l) (paper: l = 100).

Time is the instance's own decode-iteration counter, an integer the caller advances (the
simulator: an instance's virtual iteration count; a router: tokens streamed by the pod).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: PreServe §4.3.1: the look-ahead horizon l of the scaler and the router.
LOOKAHEAD_ITERATIONS = 100
#: PreServe §4.3.1: a request past its predicted end is extended by this share of its length.
OVERRUN_EXTENSION = 0.2


@dataclass(slots=True)
class _Running:
    start: int
    base: int  # context at start - start: holds base + t tokens at iteration t
    end: int  # predicted end iteration (exclusive), extended on overrun


class LoadAnticipator:
    """The look-ahead map of one instance (PreServe §4.3.1); see the module doc."""

    __slots__ = (
        "_base",
        "_dw",
        "_ends",
        "_ends_sum",
        "_heap",
        "_n",
        "_nw",
        "_pw",
        "_run",
        "_wait",
        "_wends",
        "capacity",
        "extension",
        "horizon",
        "now",
    )

    def __init__(
        self,
        capacity_tokens: int,
        extension: float = OVERRUN_EXTENSION,
        horizon: int = LOOKAHEAD_ITERATIONS,
    ) -> None:
        if capacity_tokens < 1:
            raise ValueError(f"capacity_tokens must be ≥ 1, got {capacity_tokens}")
        if extension <= 0:
            raise ValueError(f"extension must be > 0, got {extension}")
        if horizon < 1:
            raise ValueError(f"horizon must be ≥ 1, got {horizon}")
        self.capacity = capacity_tokens
        self.extension = extension
        self.horizon = horizon
        self.now = 0
        self._run: dict[int, _Running] = {}
        self._n = 0
        self._base = 0
        self._ends_sum = 0
        self._ends: dict[int, list[int]] = {}  # end iteration -> [count, Σ base]
        self._heap: list[tuple[int, int]] = []  # (end, request id), stale entries skipped
        self._wait: dict[int, tuple[int, int]] = {}  # request id -> (prompt, predicted)
        self._nw = 0
        self._pw = 0
        self._dw = 0
        self._wends: dict[int, list[int]] = {}  # predicted length -> [count, Σ prompt]

    # ---- updates -----------------------------------------------------------------------------

    def enqueue(self, rid: int, prompt_tokens: int, predicted_output: int) -> None:
        """A request joins the instance's queue (not yet decoding)."""
        if rid in self._wait or rid in self._run:
            raise ValueError(f"request {rid} is already on this instance")
        p, d = max(1, prompt_tokens), max(1, predicted_output)
        self._wait[rid] = (p, d)
        self._nw += 1
        self._pw += p
        self._dw += d
        e = self._wends.get(d)
        if e is None:
            self._wends[d] = [1, p]
        else:
            e[0] += 1
            e[1] += p

    def start(self, rid: int, now: int, context_tokens: int, predicted_left: int) -> None:
        """A request's prefill is done: from iteration `now` it decodes, holding
        `context_tokens` now and one more per iteration for `predicted_left` iterations."""
        self._unwait(rid)
        if rid in self._run:
            raise ValueError(f"request {rid} is already decoding on this instance")
        heap = self._heap
        if now > self.now or (heap and heap[0][0] <= self.now):
            self.advance(now)
        start = self.now
        base = (context_tokens if context_tokens > 1 else 1) - start
        end = start + (predicted_left if predicted_left > 1 else 1)
        self._run[rid] = _Running(start, base, end)
        self._n += 1
        self._base += base
        self._add_end(end, base)
        heapq.heappush(heap, (end, rid))

    def finish(self, rid: int) -> None:
        """A request left the instance (finished, early or late, or preempted: then
        `enqueue` it again with its new prompt): its tokens are freed at once (§4.3.1)."""
        if rid in self._wait:
            self._unwait(rid)
            return
        r = self._run.pop(rid, None)
        if r is None:
            return
        self._n -= 1
        self._base -= r.base
        self._drop_end(r.end, r.base)
        if len(self._heap) > 2 * self._n + 64:  # finished requests' entries: compact
            self._heap = [(x.end, i) for i, x in self._run.items()]
            heapq.heapify(self._heap)

    def advance(self, now: int) -> None:
        """Move to iteration `now`; a running request that reached its predicted end is
        extended by `extension` × its length so far, until its end is in the future."""
        if now > self.now:
            self.now = now
        now = self.now
        heap = self._heap
        if not heap or heap[0][0] > now:
            return
        run, ends, ext = self._run, self._ends, self.extension
        heappop, heappush, ceil = heapq.heappop, heapq.heappush, math.ceil
        while heap and heap[0][0] <= now:
            end, rid = heappop(heap)
            r = run.get(rid)
            if r is None or r.end != end:
                continue  # finished, or already extended
            new_end = end
            while new_end <= now:
                new_end += max(1, ceil(ext * (new_end - r.start)))
            # `_drop_end(end, base)` then `_add_end(new_end, base)`, inline: this runs for
            # every overrun of every request
            base = r.base
            self._ends_sum += new_end - end
            e = ends[end]
            e[0] -= 1
            e[1] -= base
            if not e[0]:
                del ends[end]
            later = ends.get(new_end)
            if later is None:
                ends[new_end] = [1, base]
            else:
                later[0] += 1
                later[1] += base
            r.end = new_end
            heappush(heap, (new_end, rid))

    def _unwait(self, rid: int) -> bool:
        w = self._wait.pop(rid, None)
        if w is None:
            return False
        p, d = w
        self._nw -= 1
        self._pw -= p
        self._dw -= d
        e = self._wends[d]
        e[0] -= 1
        e[1] -= p
        if not e[0]:
            del self._wends[d]
        return True

    def _add_end(self, end: int, base: int) -> None:
        self._ends_sum += end
        e = self._ends.get(end)
        if e is None:
            self._ends[end] = [1, base]
        else:
            e[0] += 1
            e[1] += base

    def _drop_end(self, end: int, base: int) -> None:
        self._ends_sum -= end
        e = self._ends[end]
        e[0] -= 1
        e[1] -= base
        if not e[0]:
            del self._ends[end]

    # ---- views -------------------------------------------------------------------------------

    @property
    def requests(self) -> int:
        """Requests on the instance, decoding or waiting (least-request's load)."""
        return self._n + self._nw

    @property
    def queued_prefill_tokens(self) -> int:
        """Prompt tokens still to prefill (PreServe §4.3.3's queued_p)."""
        return self._pw

    def predicted_decode_tokens(self, now: int) -> int:
        """Output tokens still to generate by the predictions, overruns extended
        (PreServe §4.3.3's current_d)."""
        heap = self._heap
        if now > self.now or (heap and heap[0][0] <= self.now):  # the pickers' hot path
            self.advance(now)
        return self._ends_sum - self._n * self.now + self._dw

    def tokens_left(self, now: int) -> int:
        """Prompt tokens to prefill plus predicted output left: token-JSQ's load, read for
        every candidate of every request (one call: `predicted_decode_tokens` inline)."""
        heap = self._heap
        if now > self.now or (heap and heap[0][0] <= self.now):
            self.advance(now)
        return self._pw + self._ends_sum - self._n * self.now + self._dw

    def projection(
        self, now: int, prompt_tokens: int = 0, predicted_output: int = 0
    ) -> list[float]:
        """Projected KV usage (fraction of capacity, in [0, 1]) at iterations now, now+1,
        ..., now+horizon-1; with `prompt_tokens` > 0, as if that request were added
        (the router's "virtual add", §4.3.3)."""
        self.advance(now)
        now = self.now
        n, s = self._n, self._base
        nw, pw = self._nw, self._pw
        ends, wends = self._ends, self._wends
        cap = self.capacity
        extra_d = predicted_output if prompt_tokens > 0 else 0
        out: list[float] = []
        for k in range(self.horizon):
            t = now + k
            e = ends.get(t)
            if e is not None:
                n -= e[0]
                s -= e[1]
            w = wends.get(k)
            if w is not None:
                nw -= w[0]
                pw -= w[1]
            u = s + t * n + pw + k * nw
            if k < extra_d:
                u += prompt_tokens + k
            out.append(1.0 if u >= cap else (u / cap if u > 0 else 0.0))
        return out

    def peak(self, now: int, prompt_tokens: int = 0, predicted_output: int = 0) -> float:
        """The highest projected usage over the horizon (with the virtual request, if any):
        PreServe §4.3.3's U_k."""
        return max(self.projection(now, prompt_tokens, predicted_output))

    def overloaded(self, now: int, level: float = 0.95, share: float = 0.10) -> bool:
        """PreServe §4.3.2's "potentially overloaded": projected usage above `level` in
        more than `share` of the look-ahead iterations."""
        above = sum(1 for u in self.projection(now) if u > level)
        return above > share * self.horizon


#: Quantiles of a projection that travel as metrics (a router exports them per pod, the
#: operator rebuilds the projection from them): deciles and the peak.
PROJECTION_QUANTILES = tuple(i / 10 for i in range(11))


def projection_quantiles(projection: Sequence[float]) -> list[tuple[float, float]]:
    """(q, value) for each of `PROJECTION_QUANTILES`: the value at rank ⌊q·(l−1) + ½⌋ of the
    sorted projection (q = 1: the peak, PreServe's U_k)."""
    ranked = sorted(projection)
    if not ranked:
        return []
    last = len(ranked) - 1
    return [(q, ranked[math.floor(q * last + 0.5)]) for q in PROJECTION_QUANTILES]


def projection_from_quantiles(
    quantiles: Mapping[float, float], horizon: int = LOOKAHEAD_ITERATIONS
) -> tuple[float, ...]:
    """A projection of `horizon` iterations with the given quantiles, each iteration at the
    next exported quantile up: never below the projection it was taken from, so an
    overload test on it errs (by less than one decile of the iterations) toward overload
    and a scale-down test toward keeping capacity. Sorted, since the rules read shares and
    the peak, not the order. Values capped at 1 (several routers' exports are summed)."""
    known = sorted((q, min(1.0, max(0.0, v))) for q, v in quantiles.items())
    if not known or horizon < 1:
        return ()
    out: list[float] = []
    for i in range(horizon):
        at = i / (horizon - 1) if horizon > 1 else 1.0
        value = next((v for q, v in known if q >= at - 1e-9), known[-1][1])
        out.append(value)
    return tuple(out)


__all__ = [
    "LOOKAHEAD_ITERATIONS",
    "OVERRUN_EXTENSION",
    "PROJECTION_QUANTILES",
    "LoadAnticipator",
    "projection_from_quantiles",
    "projection_quantiles",
]
