"""Reading the fleet's signals from Prometheus (thin adapter over prometheus-api-client).

Every failure to get an answer — unreachable server, HTTP error, malformed reply, an
answer too slow — becomes one exception, `MetricsUnavailable` (`MetricsTooSlow` for the
last), because the caller's rule is the same for all of them: hold the current sizes and
say so (DESIGN.md, failure behaviour).

Query time is bounded: every request carries a client-side timeout (`timeout_s`, cut to
what is left of the caller's `deadline`), so a slow or hung Prometheus costs a reader at
most that long; nothing is retried here (the caller's next pass is the retry: the
client's default of 3 retries with backoff made one failed read take up to 4 timeouts
and 7 s of backoff). Requests are synchronous: a caller that reads from one thread has at
most one query in flight, and a request given up on is closed, not left running.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from sageserve.metrics import picker, queries, vllm
from sageserve.metrics.engines import ENGINES, Signal
from sageserve.metrics.engines import names as engines_names
from sageserve.metrics.picker import PICKERS, PickerKind, PickerSignals


class MetricsUnavailable(RuntimeError):
    """Prometheus could not answer; the message says why."""


class MetricsTooSlow(MetricsUnavailable):
    """Prometheus did not answer within the reader's timeout or the caller's deadline."""


def request_timeout(timeout_s: float, deadline: float | None, now: float) -> float:
    """Seconds one request may take: `timeout_s`, or less when the caller's `deadline`
    (monotonic seconds) comes sooner. Raises `MetricsTooSlow` when the deadline has passed:
    a read that would start after it is not started."""
    if deadline is None:
        return timeout_s
    left = deadline - now
    if left <= 0:
        raise MetricsTooSlow(f"no time left for another query ({-left:.1f} s past the deadline)")
    return min(timeout_s, left)


#: (namespace, model deployment, region) → value.
Series = dict[tuple[str, str, str], float]


@dataclass(frozen=True)
class PodLoad:
    """One pod's vLLM load: KV usage (0–1), KV capacity in tokens when the pod exports its
    cache configuration, and queued requests."""

    kv_usage: float
    kv_capacity_tokens: float | None = None
    waiting: int = 0


def _key(labels: Mapping[str, str]) -> tuple[str, str, str]:
    return (
        labels.get(vllm.LABEL_NAMESPACE, ""),
        labels.get(vllm.LABEL_MODEL_DEPLOYMENT, ""),
        labels.get(vllm.LABEL_REGION, ""),
    )


def kv_capacities(
    info: list[tuple[Mapping[str, str], float]],
    gauges: list[tuple[Mapping[str, str], float]],
) -> dict[str, float]:
    """Each pod's KV-cache size in tokens, from whichever form its engine exports
    (`metrics.engines`): an info gauge's labels (vLLM's `num_gpu_blocks` × `block_size`,
    SGLang's `num_pages` × `page_size`) or two gauges (trtllm-serve's blocks × tokens per
    block). Pods with neither, or with a size that is not a finite positive number, are
    absent: their usage then weighs as much as every other pod's (`controller.observe`)."""
    out: dict[str, float] = {}
    label_pairs = {
        (row.cache_blocks_label, row.cache_block_size_label)
        for row in ENGINES.values()
        if row.cache_config
    }
    for labels, _ in info:
        pod = labels.get(vllm.LABEL_POD, "")
        for blocks_label, size_label in sorted(label_pairs):
            if blocks_label not in labels:
                continue
            try:
                size = float(labels[blocks_label]) * float(labels.get(size_label, "16"))
            except ValueError:
                continue
            if pod and math.isfinite(size) and size > 0:
                out[pod] = size
    blocks: dict[str, float] = {}
    per_block: dict[str, float] = {}
    block_names = set(engines_names(Signal.CACHE_BLOCKS))
    for labels, value in gauges:
        pod = labels.get(vllm.LABEL_POD, "")
        name = labels.get("__name__", "")
        target = blocks if name in block_names else per_block
        if pod and math.isfinite(value) and value > 0:
            target[pod] = value
    for pod, n in blocks.items():
        if pod in per_block:
            out[pod] = n * per_block[pod]
    return out


@dataclass(frozen=True)
class TierTtft:
    """One endpoint's time to first token per tier over the last minute."""

    p95_s: dict[str, float]
    samples: dict[str, int]


@dataclass
class PrometheusReader:
    """The queries the pacing and planning loops need, as plain dictionaries."""

    url: str
    timeout_s: float = 10.0
    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    verify_tls: bool = True
    #: monotonic time by which every read must be done (None: each read gets `timeout_s`)
    deadline: float | None = None

    def __post_init__(self) -> None:
        headers = {"Authorization": f"Bearer {self.bearer_token}"} if self.bearer_token else None
        self._prom = PrometheusConnect(
            url=self.url,
            headers=headers,
            auth=self.basic_auth,
            disable_ssl=not self.verify_tls,
            retry=Retry(total=False),
        )

    def _ask(self, call: Callable[[float], Any]) -> Any:
        """`call(timeout)` within the time allowed (see the module doc), its failures as
        `MetricsTooSlow` or `MetricsUnavailable`."""
        timeout = request_timeout(self.timeout_s, self.deadline, time.monotonic())
        try:
            return call(timeout)
        except requests.Timeout as exc:
            raise MetricsTooSlow(
                f"Prometheus at {self.url} did not answer within {timeout:.1f} s"
            ) from exc
        except Exception as exc:  # connection, HTTP and decoding errors alike
            raise MetricsUnavailable(f"Prometheus at {self.url} did not answer: {exc}") from exc

    def _query(self, expr: str) -> Any:
        """`expr` as an instant query, Prometheus' own evaluation timeout the request's."""
        return self._ask(
            lambda timeout: self._prom.custom_query(
                expr, params={"timeout": f"{max(1, int(timeout * 1000))}ms"}, timeout=timeout
            )
        )

    def instant(self, expr: str) -> Series:
        """An instant vector grouped by (namespace, model deployment, region)."""
        result = self._query(expr)
        out: Series = {}
        for sample in result:
            try:
                out[_key(sample["metric"])] = float(sample["value"][1])
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise MetricsUnavailable(f"unexpected sample from Prometheus: {sample!r}") from exc
        return out

    def history(
        self, expr: str, end: float, seconds: float, step: float
    ) -> dict[tuple[str, str, str], list[float]]:
        """A range query on a fixed grid of `step` seconds ending at `end` (Unix time).

        Missing points are NaN (a gap the forecaster knows how to treat), so every series
        has the same length whatever Prometheus returned.
        """
        return {_key(labels): values for labels, values in self._range(expr, end, seconds, step)}

    def series(
        self, expr: str, end: float, seconds: float, step: float
    ) -> list[tuple[Mapping[str, str], list[float]]]:
        """A range query on `history`'s grid, each series with every label kept (a pod
        set's variant, a tier)."""
        return self._range(expr, end, seconds, step)

    def _range(
        self, expr: str, end: float, seconds: float, step: float
    ) -> list[tuple[Mapping[str, str], list[float]]]:
        """`history`'s range query, each series with every label kept."""
        n = max(1, int(seconds // step))
        start = end - (n - 1) * step
        result = self._ask(
            lambda timeout: self._prom.custom_query_range(
                expr,
                start_time=datetime.fromtimestamp(start, UTC),
                end_time=datetime.fromtimestamp(end, UTC),
                step=f"{step:g}s",
                timeout=timeout,
            )
        )
        out: list[tuple[Mapping[str, str], list[float]]] = []
        try:
            for series in result:
                values = [math.nan] * n
                for t, v in series.get("values", []):
                    i = round((float(t) - start) / step)
                    if 0 <= i < n:
                        values[i] = float(v)
                out.append((series["metric"], values))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MetricsUnavailable(f"unexpected series from Prometheus: {exc}") from exc
        return out

    def samples(self, expr: str) -> list[tuple[Mapping[str, str], float]]:
        """An instant vector as (labels, value) pairs, every label kept."""
        result = self._query(expr)
        try:
            return [(s["metric"], float(s["value"][1])) for s in result]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise MetricsUnavailable(f"unexpected sample from Prometheus: {result!r}") from exc

    def request_shapes(
        self, namespace: str, model: str, region: str, seconds: int
    ) -> dict[tuple[str, str], float]:
        """Requests answered per (prompt_le, output_le) bucket of one (model, region) over
        the last `seconds` (`queries.request_shapes`); buckets without a finite count > 0
        are left out."""
        out: dict[tuple[str, str], float] = {}
        for labels, value in self.samples(
            queries.request_shapes(namespace, model, region, seconds)
        ):
            p, o = labels.get("prompt_le"), labels.get("output_le")
            if p and o and math.isfinite(value) and value > 0:
                out[(str(p), str(o))] = value
        return out

    def request_shape_series(
        self, namespace: str, model: str, region: str, seconds: float, step: float = 60.0
    ) -> dict[tuple[str, str], list[float]]:
        """Requests/s answered per (prompt_le, output_le) bucket of one (model, region) on a
        grid of `step` seconds over the last `seconds` (`queries.request_shape_rates`, a
        rate over max(step, 60 s) as `token_histories` reads tokens), oldest first, the last
        point now. Missing points are NaN, as in every history."""
        window = f"{max(int(step), 60)}s"
        expr = queries.request_shape_rates(namespace, model, region, window)
        out: dict[tuple[str, str], list[float]] = {}
        for labels, values in self._range(expr, time.time(), seconds, step):
            p, o = labels.get("prompt_le"), labels.get("output_le")
            if p and o:
                out[(str(p), str(o))] = values
        return out

    def pod_loads(self, namespace: str) -> dict[str, PodLoad]:
        """KV usage, KV capacity and queue of every pod of `namespace` that reports, by pod,
        whichever engine it runs (`metrics.engines`).

        Non-finite or out-of-range readings (NaN, ±Inf, usage outside 0–1) are left out, as
        if the pod had not reported: never acted on."""
        loads: dict[str, PodLoad] = {}
        for labels, value in self.samples(queries.kv_usage_per_pod(namespace)):
            pod = labels.get(vllm.LABEL_POD)
            if pod and math.isfinite(value) and 0.0 <= value <= 1.0:
                loads[pod] = PodLoad(value)
        for pod, blocks in kv_capacities(
            self.samples(queries.kv_blocks_per_pod(namespace)),
            self.samples(queries.kv_block_gauges_per_pod(namespace)),
        ).items():
            if pod in loads:
                loads[pod] = replace(loads[pod], kv_capacity_tokens=blocks)
        for labels, value in self.samples(queries.waiting_per_pod(namespace)):
            pod = labels.get(vllm.LABEL_POD, "")
            if pod in loads and math.isfinite(value) and value >= 0:
                loads[pod] = replace(loads[pod], waiting=int(value))
        return loads

    def pod_projections(self, namespace: str) -> dict[str, tuple[float, ...]]:
        """Each pod's projected KV usage over the look-ahead, rebuilt from the quantiles the
        routers export (`dispatch.anticipator.projection_from_quantiles`); pods no router
        projects are absent. Non-finite readings are left out."""
        from sageserve.dispatch.anticipator import projection_from_quantiles

        by_pod: dict[str, dict[float, float]] = {}
        for labels, value in self.samples(queries.projected_kv_per_pod(namespace)):
            pod = labels.get(vllm.LABEL_POD, "")
            try:
                q = float(labels.get("quantile", ""))
            except ValueError:
                continue
            if pod and math.isfinite(value) and math.isfinite(q):
                by_pod.setdefault(pod, {})[q] = value
        return {pod: projection_from_quantiles(qs) for pod, qs in by_pod.items()}

    def pod_interactive_running(self, namespace: str) -> dict[str, int]:
        """Each pod's interactive-tier requests in flight as the routers count them (pods
        no router sent an interactive request to are absent: none running)."""
        out: dict[str, int] = {}
        for labels, value in self.samples(queries.pod_interactive_in_flight(namespace)):
            pod = labels.get(vllm.LABEL_POD, "")
            if pod and math.isfinite(value):
                out[pod] = max(0, round(value))
        return out

    def held_requests(self, namespace: str) -> Series:
        """Requests the router holds per (model, region) while nothing serves there."""
        return self.instant(queries.held_requests(namespace))

    def tier_ttft(self, namespace: str) -> dict[tuple[str, str, str], TierTtft]:
        """Per (namespace, model, region): each tier's TTFT P95 over the last minute and the
        first tokens it counted, from the routers' histogram of streamed answers
        (`queries.router_ttft_p95`). Non-finite quantiles (no first token in the minute)
        are left out."""
        out: dict[tuple[str, str, str], TierTtft] = {}
        reads = ((queries.router_ttft_p95(namespace), 0), (queries.router_ttft_count(namespace), 1))
        for expr, slot in reads:
            for labels, value in self.samples(expr):
                tier = labels.get("tier", "")
                if not tier or not math.isfinite(value) or value < 0:
                    continue
                entry = out.setdefault(_key(labels), TierTtft({}, {}))
                if slot == 0:
                    entry.p95_s[tier] = value
                else:
                    entry.samples[tier] = round(value)
        return out

    def batch_deadline_needs(self, namespace: str) -> dict[str, float]:
        """Tokens/s each model's batch queue needs to meet every deadline, by model
        deployment (`queries.batch_deadline_need`: the routers' gauge, their largest
        reading). Models no router reports are absent (no need known: no deadline signal);
        non-finite or negative readings are left out, never acted on."""
        out: dict[str, float] = {}
        for labels, value in self.samples(queries.batch_deadline_need(namespace)):
            model = labels.get(vllm.LABEL_MODEL_DEPLOYMENT, "")
            if model and math.isfinite(value) and value >= 0:
                out[model] = value
        return out

    def tokens_per_second(self, namespace: str, window: str = "1m") -> Series:
        """Observed tokens/s per (model, region) in `namespace`."""
        return self.instant(queries.tokens_per_second(window, namespace))

    def token_histories(
        self, namespace: str, end: float, seconds: float, step: float = 60.0
    ) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]]]:
        """(prompt, generation) tokens/s per (model, region) of `namespace` on a grid of
        `step` seconds ending at `end`: PreServe's P and D series, read apart (§4.1)."""
        window = f"{max(int(step), 60)}s"

        def read(expr: str) -> dict[tuple[str, str], list[float]]:
            got = self.history(expr, end=end, seconds=seconds, step=step)
            return {(m, r): v for (ns, m, r), v in got.items() if ns == namespace}

        return (
            read(queries.prompt_tokens_per_second(window, namespace)),
            read(queries.generation_tokens_per_second(window, namespace)),
        )

    def picker_signals(self, namespace: str, kind: PickerKind) -> dict[str, PickerSignals]:
        """What the endpoint picker `kind` reports per InferencePool of `namespace`
        (`metrics.picker`'s table), by pool name. A pool with no engine-queue gauge is
        absent (the picker reports nothing of it: the caller says so, never reads it as an
        idle pool); its flow-control queue is 0 when that series is absent (flow control
        off). Non-finite or negative readings are left out."""
        if kind is PickerKind.NONE:
            return {}
        table = PICKERS[kind]

        def per_pool(expr: str | None) -> dict[str, float]:
            if expr is None:
                return {}
            out: dict[str, float] = {}
            for labels, value in self.samples(expr):
                pool = labels.get(picker.POOL_LABEL, "")
                if pool and math.isfinite(value) and value >= 0:
                    out[pool] = value
            return out

        return picker.combine(
            per_pool(picker.engine_queue(table, namespace)),
            per_pool(picker.gateway_queue(table, namespace)),
            per_pool(picker.saturation(table, namespace)),
            per_pool(picker.running(table, namespace)),
        )
