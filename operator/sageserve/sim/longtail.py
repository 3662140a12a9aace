"""The long-tail scenario: each client of a ServeGen service as a model of its own.

Aegaeon (§2.2, §7.5) studies a market of many models, most of them rarely used. No public
trace names such a market's models, but ServeGen publishes per-client (tenant) arrival
processes of one service; taking every client as its own fine-tuned variant of one base
model gives a fleet of ~160 models with the skew of a real one (most clients send a few
requests a day, a handful send several per second). Requests are generated as
`sim.traces.servegen_rows` does for every other scenario; a request longer than the base
model's context is refused (vLLM answers HTTP 400), counted, and not replayed.

The scenario file (``long-tail.yaml`` in ``scenarios/long-tail``; not named
``scenario.yaml``, since ``sageserve simulate`` cannot replay it) names the base variant,
its θ, the trace, the rate scale, the SLO and the pool settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sageserve.perf.model import VariantPerf, load_catalog
from sageserve.plan.pool_sizing import ModelForecast
from sageserve.sim.pool_serving import PoolRequest, PoolSetup
from sageserve.sim.traces import ServeGenTable, load_token_knots, servegen_rows
from sageserve.sim.workload import parse_duration

#: the forecast window whose busiest instance sizes a dedicated model (ServeGen's 10 minutes)
PEAK_WINDOW_S = 600.0


@dataclass(frozen=True)
class LongTail:
    """A loaded long-tail scenario: the requests, the base variant and the pool settings."""

    name: str
    #: the seed the requests were drawn with (the file's, or the caller's)
    seed: int
    start_s: float
    end_s: float
    requests: list[PoolRequest]
    refused: int
    perf: VariantPerf
    theta_tps: float
    setup: PoolSetup
    target_attainment: float
    dedicated_threshold: float

    @property
    def models(self) -> list[str]:
        return sorted({r.model for r in self.requests})

    def forecasts(self) -> list[ModelForecast]:
        """Each model's mean rate and request size over the window (perfect foresight: the
        forecast a planner would have with no error)."""
        span = self.end_s - self.start_s
        acc: dict[str, list[float]] = {}
        per_window: dict[tuple[str, int], float] = {}
        for r in self.requests:
            a = acc.setdefault(r.model, [0.0, 0.0, 0.0])
            a[0] += 1
            a[1] += r.prompt
            a[2] += r.output
            key = (r.model, int((r.t - self.start_s) // PEAK_WINDOW_S))
            per_window[key] = per_window.get(key, 0.0) + r.prompt + r.output
        peak: dict[str, float] = {}
        for (m, _), tokens in per_window.items():
            peak[m] = max(peak.get(m, 0.0), tokens / min(PEAK_WINDOW_S, span))
        return [
            ModelForecast(m, n / span, p / n, o / n, peak[m])
            for m, (n, p, o) in sorted(acc.items())
        ]


def _get(doc: dict[str, Any], path: str) -> Any:
    cur: Any = doc
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            raise ValueError(f"long-tail.yaml: {path} is missing")
        cur = cur[key]
    return cur


def load_long_tail(
    directory: Path, hours: float | None = None, seed: int | None = None
) -> LongTail:
    """Read ``directory/long-tail.yaml`` and generate its requests (``hours`` cuts the window;
    ``seed``, when given, replaces the file's ``seed``). The per-client rates of each 10-minute
    window and the token-size distributions are the trace's; the seed draws the arrival times
    within each window and each request's sizes, so another seed is another day with the same
    clients and the same rates."""
    if seed is not None and seed < 0:
        raise ValueError(f"seed: must be >= 0, got {seed}")
    path = Path(directory) / "long-tail.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no long-tail.yaml")
    doc = yaml.safe_load(path.read_text()) or {}
    start = parse_duration(str(_get(doc, "window.start")))
    span = parse_duration(str(_get(doc, "window.duration")))
    if hours is not None:
        if hours <= 0:
            raise ValueError(f"hours: must be > 0, got {hours}")
        span = min(span, hours * 3600.0)
    base = _get(doc, "base")
    perf = load_catalog().get(
        str(_get(doc, "base.model")),
        str(_get(doc, "base.gpuType")),
        int(base.get("gpusPerInstance", 4)),
    )
    theta = float(_get(doc, "base.capacityTokensPerSecond"))
    if theta <= 0:
        raise ValueError(f"base.capacityTokensPerSecond: must be > 0, got {theta}")
    src = _get(doc, "source")
    windows = (path.parent / str(_get(doc, "source.windows"))).resolve()
    tokens = (path.parent / str(_get(doc, "source.tokens"))).resolve()
    for field, p in (("source.windows", windows), ("source.tokens", tokens)):
        if not p.exists():
            raise FileNotFoundError(f"long-tail.yaml: {field}: {p} does not exist")
    scale = float(src.get("rateScale", 1.0))
    if scale <= 0:
        raise ValueError(f"source.rateScale: must be > 0, got {scale}")
    prefix = str(src.get("modelPrefix", "client-"))
    table = ServeGenTable.load(windows)
    knots = load_token_knots(tokens, table.client_volume())
    context = perf.context_length or 10**9
    draw_seed = int(doc.get("seed", 0)) if seed is None else seed
    reqs: list[PoolRequest] = []
    refused = 0
    for row in servegen_rows(table, knots, start, start + span, scale, draw_seed):
        if row.prompt + row.output > context:
            refused += 1
            continue
        reqs.append(PoolRequest(row.t, f"{prefix}{row.client}", row.prompt, row.output))
    slo = doc.get("slo") or {}
    pool = doc.get("pool") or {}
    setup = PoolSetup.from_profile(
        perf,
        ttft_s=float(slo.get("ttftSeconds", 10.0)),
        tbt_s=float(slo.get("tbtSeconds", 0.1)),
        keep_alive_s=float(pool.get("keepAliveSeconds", 60.0)),
        startup_s=float(base.get("startupSeconds", 0.0)),
        dedicated_floor=int(pool.get("dedicatedMinInstances", 0)),
    )
    return LongTail(
        name=str(doc.get("name", directory.name)),
        seed=draw_seed,
        start_s=start,
        end_s=start + span,
        requests=reqs,
        refused=refused,
        perf=perf,
        theta_tps=theta,
        setup=setup,
        target_attainment=float(slo.get("attainment", 0.9)),
        dedicated_threshold=float(pool.get("dedicatedThreshold", 0.5)),
    )
