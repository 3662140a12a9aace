"""The Queue Manager on the durable queue: batch work released into the troughs.

SageServe §6.2: batch (NIW) requests wait in one global queue per model; an endpoint whose
EMU is low *signals* and receives work: **1 request under 60 % EMU, 2 under 50 %**, or
the thresholds the model's ScalingPolicy sets (`spec.routing.batchRelease`,
`ModelRoute.release_rules`, mapped as the simulator maps them: `dispatch.from_policy`), by
`dispatch.queue_manager.release_count`, the function the simulator calls; earliest deadline
first. A request whose slack runs out (deadline − its tokens ÷ the model's per-request
decode rate − 30 min, `dispatch.queue_manager.promotion_time`) is released regardless of load,
routed like an interactive request, so that it finishes by its deadline (§6.3: 24 h, or the
batch's shorter completion window). The rules and numbers are the simulator's
`BatchQueueManager`'s, so the two worlds decide alike. Every Batch API request has a
deadline, so the paper's fixed promotion age (10 h), which the simulator keeps for requests
without one, has no use here.

Each round also reads every model's waiting tokens per deadline (one query) and exports
the rate its queue needs to meet every deadline
(`sageserve_batch_deadline_need_tokens_per_second`, `dispatch.deadlines.required_tps`; the
operator's query is `metrics.queries.batch_deadline_need`), and whether even the model's
capacity at maxInstances would miss one (`dispatch.deadlines.deadline_risk`): then
`sageserve_router_batch_deadline_at_risk` is 1, a warning is logged, and every unfinished batch
with work of the model due by then says so in its `deadline_at_risk` field (stored, so
every replica answers the same).

Here the queue is the `BatchStore` (SQLite or PostgreSQL) and each router replica runs one
`BatchReleaser`. Every `signal_s` (and whenever a released request completes, as the
paper signals on completions) each endpoint of a model with queued work signals with the
router's own EMU estimate (Prometheus' reading corrected by what was sent since, so a
release raises the estimate at once and the rule limits itself) and takes nothing while
requests wait for admission at its pods (vLLM's `num_requests_waiting` at the last reading:
an endpoint out of time rather than memory). A claim is a lease
renewed while the request runs and until its answer is recorded; a replica killed
mid-request loses nothing: its leases lapse and another replica (or its restart) claims
the requests again. Answers are recorded in batches: kept in memory until `flush_size` of
them wait or `flush_s` has passed since the first (and on shutdown), then written with
`BatchStore.complete_many` in one transaction, so that commits per second do not bound
the release rate. An answer lost with its replica before the flush is run again once the
lease lapses (at-least-once execution); `complete_many` records an answer only while the
replica still holds the request, so each request is recorded once. Every `sweep_s` the
replica also deletes what retention says is due (`BatchStore.sweep`: expired files,
finished batches' requests and results; never an unfinished batch's work).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sageserve.batch.jsonl import parse_input
from sageserve.batch.objects import Answer, BatchObject, ClaimedRequest, WaitingDeadlines
from sageserve.batch.store import BatchStore
from sageserve.dispatch.deadlines import DeadlineRisk
from sageserve.dispatch.identity import Principal
from sageserve.dispatch.queue_manager import (
    DEFAULT_PROMOTION_MARGIN_S,
    PROMOTED_PER_SIGNAL,
    SIGNAL_S,
    release_count,
)
from sageserve.dispatch.request_check import estimated_tokens
from sageserve.router.app import Router
from sageserve.router.fleet import ModelRoute
from sageserve.router.metrics import RouterMetrics

log = logging.getLogger("sageserve.router")


@dataclass(frozen=True)
class ReleaseConfig:
    #: how often every endpoint with queued work signals (`dispatch.queue_manager.SIGNAL_S`,
    #: the simulator's period: the paper's once a minute, every second here, since the EMU
    #: estimate follows each release)
    signal_s: float = SIGNAL_S
    #: a claim's lease; renewed every third of it while the request runs
    lease_s: float = 120.0
    #: how often batches are closed (output and error files written, deadlines applied)
    finalize_s: float = 5.0
    #: at most this many promoted requests (slack run out) released per signal round
    #: (`dispatch.queue_manager.PROMOTED_PER_SIGNAL`, the simulator's)
    promoted_per_signal: int = PROMOTED_PER_SIGNAL
    #: slack kept when a request is promoted (`dispatch.queue_manager`, the simulator's)
    promotion_margin_s: float = DEFAULT_PROMOTION_MARGIN_S
    #: tokens/s one request is served at for a model with no perf profile
    #: (`ModelRoute.request_tps` 0); 0: as the simulator counts such a model, served at
    #: once, so promoted `promotion_margin_s` before its deadline
    request_tps: float = 0.0
    #: how often expired files and finished batches past their retention are deleted
    sweep_s: float = 60.0
    #: answers recorded in one transaction as soon as this many wait
    flush_size: int = 64
    #: ... or this long after the first of them arrived
    flush_s: float = 0.05


class BatchReleaser:
    """One replica's Queue Manager over the shared queue (`owner` names the replica)."""

    def __init__(
        self,
        store: BatchStore,
        router: Router,
        metrics: RouterMetrics,
        owner: str,
        config: ReleaseConfig = ReleaseConfig(),
    ) -> None:
        self.store = store
        self.router = router
        self.fleet = router.fleet
        self.metrics = metrics
        self.owner = owner
        self.config = config
        self.running: dict[str, asyncio.Task[None]] = {}
        #: answers received and not yet recorded, by request id (their leases are renewed)
        self.unrecorded: dict[str, Answer] = {}
        #: models this replica last judged at risk (a warning when one turns so)
        self._at_risk: set[str] = set()
        self._signal = asyncio.Event()
        self._buffered = asyncio.Event()  # something in `unrecorded`
        self._full = asyncio.Event()  # `flush_size` answers in `unrecorded`

    async def run(self) -> None:
        """Signal, release, record, renew and finalize until cancelled; on the way out the
        answers received are recorded (the requests still running are left to their
        leases)."""
        renewer = asyncio.create_task(self._renew_forever())
        finalizer = asyncio.create_task(self._finalize_forever())
        sweeper = asyncio.create_task(self._sweep_forever())
        flusher = asyncio.create_task(self._flush_forever())
        try:
            while True:
                try:
                    await self.signal_once()
                except Exception:  # the database away: try again at the next signal
                    log.exception("batch release failed; retrying")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._signal.wait(), self.config.signal_s)
                self._signal.clear()
        finally:
            for helper in (renewer, finalizer, sweeper, flusher):
                helper.cancel()
            for task in self.running.values():
                task.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
            try:
                await self.flush()
            except Exception:  # their leases lapse and they run again
                log.exception("recording %d batch answers on shutdown failed", len(self.unrecorded))

    async def signal_once(self, now: float | None = None) -> int:
        """One round of signals: the queue's deadlines read, requests whose slack ran out
        released first, then each endpoint's release by its EMU. Returns how many requests
        were released."""
        at = time.time() if now is None else now
        waiting = {w.model: w for w in await asyncio.to_thread(self.store.waiting_deadlines, at)}
        released = await self._release_out_of_slack(at, waiting)
        depth = await asyncio.to_thread(self.store.depth, at)
        self.metrics.queue_depth(depth, self.fleet.models, at)
        try:
            await self._deadlines(at, waiting)
        except Exception:  # what is said about deadlines never holds back the release
            log.exception("reporting batch deadlines failed; releasing anyway")
        for served in sorted({d.model for d in depth if d.queued > 0}):
            model = self.fleet.models.get(served)
            if model is None:
                continue  # not served now: its requests wait (and expire if never served)
            for region in model.regions:
                endpoint = (model.namespace, model.name, region)
                if not self.fleet.backends.get(endpoint):
                    continue  # nothing ready to signal from
                n = release_count(
                    self.fleet.estimated_emu(endpoint),
                    model.release_rules,
                    self.fleet.waiting(endpoint),
                )
                if n == 0:
                    continue
                claimed = await asyncio.to_thread(
                    self.store.claim, served, n, self.owner, self.config.lease_s, at
                )
                for item in claimed:
                    self._start(item, model, region)
                released += len(claimed)
        return released

    def service_tps(self, model: ModelRoute) -> float:
        """Tokens/s one request of `model` is served at: its perf profile's decode rate,
        else the configured fallback (`ReleaseConfig.request_tps`)."""
        return model.request_tps if model.request_tps > 0 else self.config.request_tps

    async def _release_out_of_slack(
        self, at: float, waiting: Mapping[str, WaitingDeadlines]
    ) -> int:
        """Release, regardless of load, the requests of served models whose promotion time
        has passed (at most `promoted_per_signal` a round), each routed like an interactive
        request to the region the router would choose for one. A model not served now
        keeps its requests waiting (they expire if it never returns)."""
        released = 0
        budget = self.config.promoted_per_signal
        margin = self.config.promotion_margin_s
        for name in sorted(waiting):
            model = self.fleet.models.get(name)
            if model is None or budget <= 0:
                continue
            rate = self.service_tps(model)
            until = waiting[name].due_until(at, rate, margin)
            if until is None:
                continue  # nothing due: no query
            claimed = await asyncio.to_thread(
                self.store.claim_out_of_slack,
                name,
                at,
                rate,
                self.owner,
                self.config.lease_s,
                budget,
                margin,
                until,
            )
            budget -= len(claimed)
            for item in claimed:
                region = self.fleet.choose_region(model, None)
                if region is None:  # no pod ready: back, not an attempt
                    await asyncio.to_thread(
                        self.store.retry, item.id, self.owner, None, started=False
                    )
                    continue
                self._start(item, model, region)
            released += len(claimed)
        return released

    async def _deadlines(self, at: float, waiting: Mapping[str, WaitingDeadlines]) -> None:
        """Export each served model's deadline need, judge its deadlines against its
        capacity at maxInstances, and say on the batches at risk that a miss is predicted
        (a model whose capacity discovery does not know is never judged at risk)."""
        need: dict[str, float] = {}
        risks: dict[str, DeadlineRisk] = {}
        for name, model in self.fleet.models.items():
            queued = waiting.get(name)
            if queued is None:
                continue
            need[name] = queued.required_tps(at)
            if model.capacity_at_max_tps > 0:
                risk = queued.risk(at, model.capacity_at_max_tps)
                if risk is not None:
                    risks[name] = risk
        self.metrics.deadline_need(need, set(risks), self.fleet.models)
        for name in sorted(set(risks) - self._at_risk):
            risk, model = risks[name], self.fleet.models[name]
            log.warning(
                "batch deadlines of %s/%s (model %s) will be missed even at maxInstances: "
                "%.0f tokens due by %s exceed %.1f tokens/s (need %.1f tokens/s); the "
                "batches due by then say so in deadline_at_risk",
                model.namespace,
                model.name,
                name,
                risk.shortfall_tokens,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(risk.until_s)),
                risk.capacity_tps,
                risk.need_tps,
            )
        for name in sorted(self._at_risk - set(risks)):
            log.info("batch deadlines of model %s can be met again at maxInstances", name)
        self._at_risk = set(risks)
        marks = {
            name: (waiting[name].latest_at_risk(risk), risk.shortfall_tps)
            for name, risk in risks.items()
        }
        await asyncio.to_thread(self.store.mark_deadline_risks, marks, at)

    async def accepted(self, batch: BatchObject, caller: Principal) -> None:
        """Count a new batch's tokens as batch load received, per model deployment and tier
        (`sageserve_batch_accepted_tokens_total`): the plan's β is 10 % of the batch load
        received in the last hour (SageServe §6.3), not of what the troughs let through."""
        content = await asyncio.to_thread(self.store.file_content, caller, batch.input_file_id)
        for (model, tier), tokens in accepted_tokens(
            content, batch.endpoint, lambda m: self.fleet.batch_tier(m, caller)
        ).items():
            route = self.fleet.models.get(model)
            if route is not None:
                home = self.router.config.home_region
                region = home if home in route.regions else route.regions[0]
                self.metrics.accepted(route, region, tier, tokens)

    def _start(self, item: ClaimedRequest, model: ModelRoute, region: str) -> None:
        task = asyncio.create_task(self._run_one(item, model, region))
        self.running[item.id] = task
        task.add_done_callback(lambda _: self.running.pop(item.id, None))

    async def _run_one(self, item: ClaimedRequest, model: ModelRoute, region: str) -> None:
        tier = item.tier or "batch"
        answer = await self.router.execute(item.url, item.body, model, region, tier)
        if answer is None:
            await asyncio.to_thread(self.store.retry, item.id, self.owner)
        else:
            status, body = answer
            self.unrecorded[item.id] = Answer(item.id, status, body)
            self._buffered.set()
            if len(self.unrecorded) >= self.config.flush_size:
                self._full.set()
        self._signal.set()  # a completion is a signal (SageServe §6.2)

    async def flush(self) -> list[str]:
        """Record every answer received so far in one transaction; returns the ids this
        recorded (one another replica holds now, or of a cancelled or expired batch, is
        dropped unrecorded). On an error the answers stay for the next flush."""
        answers = list(self.unrecorded.values())
        self._buffered.clear()
        self._full.clear()
        try:
            if not answers:
                return []
            finished = await asyncio.to_thread(self.store.complete_many, self.owner, answers)
            for answer in answers:
                if self.unrecorded.get(answer.request_id) is answer:
                    del self.unrecorded[answer.request_id]
            return finished
        finally:  # answers that came meanwhile (or were kept) wait for the next flush
            if self.unrecorded:
                self._buffered.set()
            if len(self.unrecorded) >= self.config.flush_size:
                self._full.set()

    async def _flush_forever(self) -> None:
        while True:
            await self._buffered.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self.config.flush_s)
            try:
                await self.flush()
            except Exception:  # the database away: the answers wait (their leases renewed)
                log.exception("recording %d batch answers failed; retrying", len(self.unrecorded))
                await asyncio.sleep(self.config.signal_s)

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.lease_s / 3)
            ids = sorted({*self.running, *self.unrecorded})
            if ids:
                try:
                    await asyncio.to_thread(self.store.renew, self.owner, ids, self.config.lease_s)
                except Exception:
                    log.exception("lease renewal failed")

    async def _finalize_forever(self) -> None:
        while True:
            try:
                for batch_id, status in await asyncio.to_thread(self.store.finalize):
                    log.info("batch %s %s", batch_id, status)
                    self.metrics.batch_closed(status)
            except Exception:
                log.exception("finalizing batches failed")
            await asyncio.sleep(self.config.finalize_s)

    async def _sweep_forever(self) -> None:
        while True:
            try:
                swept = await asyncio.to_thread(self.store.sweep)
                if swept.files or swept.batches:
                    log.info(
                        "retention deleted %d files and the requests of %d batches",
                        swept.files,
                        swept.batches,
                    )
            except Exception:
                log.exception("sweeping expired batch data failed")
            await asyncio.sleep(self.config.sweep_s)


def accepted_tokens(
    content: bytes, endpoint: str, batch_tier: Callable[[str], str | None]
) -> dict[tuple[str, str], float]:
    """Estimated tokens (prompt + output budget, as for a client's request) per (served
    model, batch tier) of a Batch API input file's runnable lines: the lines
    `jsonl.parse_input` accepts, by the same rule that queued them."""
    out: dict[tuple[str, str], float] = {}
    for line in parse_input(content, endpoint, batch_tier).requests:
        key = (line.model, line.tier)
        out[key] = out.get(key, 0.0) + estimated_tokens(line.body)[1]
    return out
