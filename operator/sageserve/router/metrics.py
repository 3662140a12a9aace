"""The router's own metrics (prometheus-client): what it routed, how fast, what it holds.

`sageserve_router_held_requests{namespace, model_deployment, region}` is the demand signal
of an endpoint with nothing serving: the operator reads it (`metrics.queries
.held_requests`) and scales that endpoint from zero. `sageserve_router_tokens_total` per
tier is the plan loop's split of load into interactive and batch (`metrics.queries
.router_tokens`; SageServe §6.3 forecasts interactive load and adds β of batch). Their labels
name the endpoint, so the scrape must keep them (`honor_labels`, as the chart's
ServiceMonitor sets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from sageserve.batch.objects import QueueDepth
from sageserve.dispatch.anticipator import projection_quantiles
from sageserve.forecast.request_types import shape_bucket
from sageserve.metrics.queries import (
    BATCH_ACCEPTED_TOKENS,
    BATCH_DEADLINE_NEED,
    HELD_REQUESTS,
    POD_INTERACTIVE,
    PROJECTED_KV,
    REQUEST_SHAPES,
    ROUTER_TOKENS,
)
from sageserve.metrics.vllm import TTFT_BUCKETS
from sageserve.router.fleet import Fleet, ModelRoute

ENDPOINT = ("namespace", "model_deployment", "region")
#: The router's own limits a request can be refused at (`limit` of
#: `sageserve_router_refused_requests_total`: a fixed set, never client text).
LIMIT_HELD_REQUESTS = "max_held_requests"
LIMIT_INFLIGHT_BYTES = "max_inflight_bytes"
LIMITS = (LIMIT_HELD_REQUESTS, LIMIT_INFLIGHT_BYTES)


def code_label(code: int) -> str:
    """An HTTP status as a label value: 100-599, else "other" (a pod's answer is not the
    router's to trust with a label either)."""
    return str(code) if 100 <= code <= 599 else "other"


#: Seconds per output token: PreServe's SLO is 0.2 s; a healthy 70B decode step is 20-80 ms.
NORMALIZED_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "sageserve_router_requests",
            "Requests answered",
            [*ENDPOINT, "tier", "code"],
            registry=r,
        )
        self.first_token = Histogram(
            "sageserve_router_ttft_seconds",
            "Time to the first byte of the answer; with stream=true, the first token's",
            [*ENDPOINT, "tier", "stream"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.end_to_end = Histogram(
            "sageserve_router_e2e_seconds",
            "Time to the last byte of the answer",
            [*ENDPOINT, "tier"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.normalized_latency = Histogram(
            "sageserve_router_normalized_latency_seconds",
            "End-to-end time ÷ output tokens of each answer (PreServe §5's normalized latency)",
            [*ENDPOINT, "tier"],
            buckets=NORMALIZED_BUCKETS,
            registry=r,
        )
        self.held = Gauge(
            HELD_REQUESTS,
            "Requests waiting for a model with no ready pod",
            list(ENDPOINT),
            registry=r,
        )
        self.tokens = Counter(
            ROUTER_TOKENS,
            "Prompt and completion tokens of answered requests (the pod's usage when it "
            "reports one, else estimated)",
            [*ENDPOINT, "tier"],
            registry=r,
        )
        self.in_flight = Gauge(
            "sageserve_router_in_flight_requests",
            "Requests sent to a pod and not answered yet",
            [*ENDPOINT, "tier"],
            registry=r,
        )
        self.pod_interactive = Gauge(
            POD_INTERACTIVE,
            "Interactive-tier requests sent to a pod and not answered yet (the operator's "
            "chiron strategy counts the pods running at least one)",
            [*ENDPOINT, "pod"],
            registry=r,
        )
        #: interactive requests in flight per pod's labels (the gauge's value, kept here so
        #: that a pod's series goes when it reaches 0)
        self._pod_in_flight: dict[tuple[str, str, str, str], int] = {}
        self.shapes = Counter(
            REQUEST_SHAPES,
            "Answered requests by prompt and output length (log-2 buckets, upper bounds in "
            "tokens): the history of OServe's request types",
            [*ENDPOINT, "prompt_le", "output_le"],
            registry=r,
        )
        self.deferred = Gauge(
            "sageserve_router_deferred_requests",
            "Batch-tier requests waiting for their region's EMU to fall under the Queue "
            "Manager's release threshold",
            [*ENDPOINT, "tier"],
            registry=r,
        )
        self.accepted_tokens = Counter(
            BATCH_ACCEPTED_TOKENS,
            "Estimated tokens of Batch API requests accepted into the queue (batch load "
            "received: the plan's β)",
            [*ENDPOINT, "tier"],
            registry=r,
        )
        self.queued = Gauge(
            "sageserve_batch_queued_requests",
            "Batch API requests waiting in the queue for a trough",
            ["namespace", "model_deployment", "tier"],
            registry=r,
        )
        self.queued_age = Gauge(
            "sageserve_batch_oldest_queued_seconds",
            "Age of the oldest waiting Batch API request",
            ["namespace", "model_deployment", "tier"],
            registry=r,
        )
        self.deadline_needed = Gauge(
            BATCH_DEADLINE_NEED,
            "Tokens/s the waiting Batch API requests need, served earliest deadline first, "
            "to all finish by their deadlines (every replica reads the same queue)",
            ["namespace", "model_deployment"],
            registry=r,
        )
        self.deadline_at_risk = Gauge(
            "sageserve_router_batch_deadline_at_risk",
            "1 when the waiting Batch API requests would miss a deadline even at the "
            "model's maxInstances (capacityTokensPerSecond × maxInstances), else 0",
            ["namespace", "model_deployment"],
            registry=r,
        )
        self.batches_closed = Counter(
            "sageserve_batch_batches_closed",
            "Batches closed by this replica, by final status (expired: past its deadline, "
            "its unfinished requests listed in the error file)",
            ["status"],
            registry=r,
        )
        self.rate_limited = Counter(
            "sageserve_router_rate_limited",
            "Requests refused (429) by their tier's rate limits (WorkloadTier spec.limits), "
            "by the limit that refused them: requests or tokens",
            ["namespace", "tier", "limit"],
            registry=r,
        )
        self.retries = Counter(
            "sageserve_router_retries",
            "Requests retried on another pod",
            list(ENDPOINT),
            registry=r,
        )
        self.refusals = Counter(
            "sageserve_router_refused_requests",
            "Requests answered 429 because the router was at one of its limits "
            "(max_held_requests, max_inflight_bytes)",
            ["limit"],
            registry=r,
        )
        for limit in LIMITS:  # both series exist from the start, at 0
            self.refusals.labels(limit)
        self.inflight_bytes = Gauge(
            "sageserve_router_inflight_body_bytes",
            "Bytes of request bodies the router has (being read, held or forwarded), "
            "against --max-inflight-bytes",
            registry=r,
        )

    def count(self, m: ModelRoute, region: str, tier: str, code: int) -> None:
        self.requests.labels(m.namespace, m.name, region, tier, code_label(code)).inc()

    def refused(self, limit: str) -> None:
        """A request refused at one of the router's `LIMITS`."""
        assert limit in LIMITS, limit
        self.refusals.labels(limit).inc()

    def body_bytes(self, read: Callable[[], float]) -> None:
        """Export the request-body bytes the router has, read at scrape time."""
        self.inflight_bytes.set_function(read)

    def limited(self, namespace: str, tier: str, limit: str) -> None:
        """One request refused by a rate limit; `tier` is a tier discovery listed and
        `limit` "requests" or "tokens", so the label sets stay bounded."""
        self.rate_limited.labels(namespace, tier, limit).inc()

    def ttft(self, m: ModelRoute, region: str, tier: str, seconds: float, stream: bool) -> None:
        """The first byte's time; for a streamed answer that is the first token's (a
        non-streamed answer's first byte is its end), which the operator's TTFT signal
        reads (`queries.router_ttft_p95`)."""
        label = "true" if stream else "false"
        self.first_token.labels(m.namespace, m.name, region, tier, label).observe(seconds)

    def e2e(self, m: ModelRoute, region: str, tier: str, seconds: float) -> None:
        self.end_to_end.labels(m.namespace, m.name, region, tier).observe(seconds)

    def normalized(
        self, m: ModelRoute, region: str, tier: str, seconds: float, output_tokens: int | None
    ) -> None:
        """PreServe's normalized latency of one answer, when its output length is known."""
        if output_tokens:
            value = seconds / output_tokens
            self.normalized_latency.labels(m.namespace, m.name, region, tier).observe(value)

    def served(self, m: ModelRoute, region: str, tier: str, tokens: float) -> None:
        self.tokens.labels(m.namespace, m.name, region, tier).inc(max(tokens, 0.0))

    def shape(self, m: ModelRoute, region: str, prompt: float, output: int | None) -> None:
        """One answered request's (prompt, output) lengths, when its output is known."""
        if output:
            labels = (m.namespace, m.name, region, shape_bucket(prompt), shape_bucket(output))
            self.shapes.labels(*labels).inc()

    def flying(self, m: ModelRoute, region: str, tier: str) -> AbstractContextManager[None]:
        return self.in_flight.labels(m.namespace, m.name, region, tier).track_inprogress()

    def interactive_on_pod(
        self, m: ModelRoute, region: str, pod: str, interactive: bool
    ) -> AbstractContextManager[None]:
        """An interactive request in flight on `pod` (nothing counted for batch work). A
        pod's series is removed when its last request is answered, so the label set follows
        the pods serving now, not every pod that ever served (pods come and go with scaling)."""
        if not interactive:
            return nullcontext()
        return self._on_pod((m.namespace, m.name, region, pod))

    @contextmanager
    def _on_pod(self, labels: tuple[str, str, str, str]) -> Iterator[None]:
        self._pod_in_flight[labels] = self._pod_in_flight.get(labels, 0) + 1
        self.pod_interactive.labels(*labels).set(self._pod_in_flight[labels])
        try:
            yield
        finally:
            left = self._pod_in_flight[labels] - 1
            if left:
                self._pod_in_flight[labels] = left
                self.pod_interactive.labels(*labels).set(left)
            else:
                del self._pod_in_flight[labels]
                self.pod_interactive.remove(*labels)

    def deferring(self, m: ModelRoute, region: str, tier: str) -> AbstractContextManager[None]:
        return self.deferred.labels(m.namespace, m.name, region, tier).track_inprogress()

    def holding(self, m: ModelRoute, region: str) -> AbstractContextManager[None]:
        return self.held.labels(m.namespace, m.name, region).track_inprogress()

    def queue_depth(
        self, depth: Iterable[QueueDepth], models: Mapping[str, ModelRoute], now: float
    ) -> None:
        """The queue as last read: depth and age per (model deployment, tier)."""
        self.queued.clear()
        self.queued_age.clear()
        for d in depth:
            m = models.get(d.model)
            labels = (m.namespace, m.name) if m else ("", d.model)
            self.queued.labels(*labels, d.tier or "").set(d.queued)
            self.queued_age.labels(*labels, d.tier or "").set(max(0.0, now - d.oldest_arrival))

    def deadline_need(
        self,
        need: Mapping[str, float],
        at_risk: Iterable[str],
        models: Mapping[str, ModelRoute],
    ) -> None:
        """The queue's deadline need (tokens/s, by served model) and the models at risk,
        as last read: one series each per model deployment the fleet serves, 0 without
        waiting work (models sharing a deployment, a ModelPool's, add up)."""
        risky = set(at_risk)
        totals: dict[tuple[str, str], float] = {}
        flags: dict[tuple[str, str], float] = {}
        for served, m in models.items():
            key = (m.namespace, m.name)
            totals[key] = totals.get(key, 0.0) + max(0.0, need.get(served, 0.0))
            flags[key] = max(flags.get(key, 0.0), 1.0 if served in risky else 0.0)
        self.deadline_needed.clear()
        self.deadline_at_risk.clear()
        for key, value in sorted(totals.items()):
            self.deadline_needed.labels(*key).set(value)
            self.deadline_at_risk.labels(*key).set(flags[key])

    def accepted(self, m: ModelRoute, region: str, tier: str, tokens: float) -> None:
        self.accepted_tokens.labels(m.namespace, m.name, region, tier).inc(max(tokens, 0.0))

    def batch_closed(self, status: str) -> None:
        self.batches_closed.labels(status).inc()

    def watch(self, fleet: Fleet) -> None:
        """Export the router's EMU estimate of each endpoint with a ready pod, and each
        pod's projected KV usage, as read at scrape time: what its region router, Queue
        Manager and the operator's `preserve` strategy decide on."""
        self.registry.register(_EndpointEmu(fleet))
        self.registry.register(_PodProjection(fleet))
        self.registry.register(_LayoutDispatch(fleet))

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _EndpointEmu(Collector):
    """`sageserve_router_endpoint_emu`: Prometheus' last EMU reading of an endpoint plus
    what this router sent it since (`Fleet.estimated_emu`). An operator at 3 a.m. asking
    why batch work is (not) being released compares it with the Queue Manager's 60 % and
    50 % (SageServe §6.2)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "sageserve_router_endpoint_emu",
            "The router's estimate of an endpoint's effective memory utilization (KV usage)",
            labels=list(ENDPOINT),
        )
        for endpoint in sorted(k for k, pods in self.fleet.backends.items() if pods):
            family.add_metric(list(endpoint), self.fleet.estimated_emu(endpoint))
        yield family


class _PodProjection(Collector):
    """`sageserve_router_projected_kv_usage{..., pod, quantile}`: the deciles and peak of
    each ready pod's projected KV usage over the look-ahead (`dispatch.anticipator`), from the
    requests this router sent it. The operator rebuilds the projection from them for the
    `preserve` strategy's in-window rules (PreServe §4.3.2)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            PROJECTED_KV,
            "Quantiles of a pod's projected KV-cache usage over the next decode iterations",
            labels=[*ENDPOINT, "pod", "quantile"],
        )
        for endpoint in sorted(self.fleet.backends):
            for b in self.fleet.backends[endpoint]:
                projection = self.fleet.anticipators.projection(b.pod)
                for q, value in projection_quantiles(projection):
                    family.add_metric([*endpoint, b.pod, f"{q:g}"], value)
        yield family


class _LayoutDispatch(Collector):
    """`sageserve_router_layout_dispatch_total{..., type, variant, overflow}`: requests the
    router sent by request type to a variant of an OServe layout (`Fleet._by_type`, OServe
    §4.2), `overflow="true"` where the preferred variant's pod was swamped and another
    variant's took the request. Per type, the variants' shares show whether the plan's
    weights are followed; a high overflow share, that they no longer fit the traffic."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "sageserve_router_layout_dispatch",
            "Requests dispatched by request type to a variant of an OServe layout",
            labels=[*ENDPOINT, "type", "variant", "overflow"],
        )
        for (endpoint, j, variant, over), n in sorted(self.fleet.layout_dispatches.items()):
            family.add_metric([*endpoint, str(j), variant, str(over).lower()], n)
        yield family
