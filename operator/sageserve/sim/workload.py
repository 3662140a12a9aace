"""Workload files: which real traces drive a scenario, and how their requests are labelled.

No public trace has a region or a tier, so the mapping is explicit and seeded:

```yaml
seed: 7                        # every random draw of the run derives from it
window: {start: 1d, duration: 1d}   # offset into the traces; units s, m, h, d
regionOrder: [us-east, us-central, us-west]   # router preference after the home region
sources:
- name: large
  type: servegen               # or azure2023, or jsonl (a JSON-lines request trace)
  windows: ../../data/traces/servegen-bailian/language_m-large_client_windows_10min.csv.xz
  tokens:  ../../data/traces/servegen-bailian/language_m-large_client_token_stats_6h.csv
  rateScale: 0.002             # multiplies every client's rate
  assign: client               # client: one model/region/tier per client; request: per request
  models:  {llama-2-70b: 0.6, bloom-176b: 0.4}    # shares
  overflow: [llama-3-1-8b]     # optional: where a request too long for its model goes
  regions: {us-east: 0.5, us-central: 0.3, us-west: 0.2}
  tiers:   {iw-f: 0.45, iw-n: 0.27, niw: 0.28}
```

With `assign: client` (the default) clients are visited in a seeded random order and each
goes to the category with the largest remaining deficit of request volume, so the shares
hold in volume while each client (a tenant) keeps one model, home region and tier. Each
dimension uses its own order, so they are independent. Paths are relative to the workload
file.

`overflow` (optional) lists models, in order, that take a request whose prompt + output
exceeds the context length of the model it was mapped to: the first whose context holds it
(a client that knows its model's window sends a longer request to a long-context model, as
LiteLLM's `context_window_fallbacks` does). A request no model of the list holds stays with
its model, which refuses it at arrival (vLLM's HTTP 400). Traces from a long-context service
replayed on short-context models need it: without it, Bloom-176B (2,048 tokens) would refuse
a third of ServeGen m-large's IW-F requests on `scenarios/peak-day` (docs/simulator.md).
"""

from __future__ import annotations

import heapq
import math
import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sageserve.core.types import Request, Tier
from sageserve.sim import traces

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(v: Any) -> float:
    """Seconds from 90, "90s", "15m", "6h", "7d" or "1d12h"."""
    if isinstance(v, int | float):
        return float(v)
    s = str(v).strip()
    if re.fullmatch(r"[0-9.]+", s):
        return float(s)
    parts = re.findall(r"([0-9.]+)\s*([smhd])", s)
    if not parts or "".join(a + b for a, b in parts) != s.replace(" ", ""):
        raise ValueError(f"bad duration {v!r}: use seconds or e.g. 15m, 6h, 7d, 1d12h")
    return sum(float(a) * _UNITS[b] for a, b in parts)


@dataclass
class Source:
    name: str
    type: str
    paths: dict[str, Path]
    rate_scale: float
    assign: str
    models: dict[str, float]
    regions: dict[str, float]
    tiers: dict[str, float]
    repeat: bool = False
    #: models, in order, for a request longer than its model's context (see the module doc)
    overflow: tuple[str, ...] = ()


@dataclass
class Workload:
    seed: int
    start_s: float
    duration_s: float
    region_order: list[str]
    sources: list[Source] = field(default_factory=list)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


def _shares(raw: Any, what: str, src: str) -> dict[str, float]:
    if isinstance(raw, str):
        return {raw: 1.0}
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(f"source {src}: {what} must be a name or a mapping name -> share")
    out = {str(k): float(v) for k, v in raw.items()}
    if any(v < 0 for v in out.values()) or sum(out.values()) <= 0:
        raise ValueError(f"source {src}: {what} shares must be ≥ 0 with a positive sum")
    tot = sum(out.values())
    return {k: v / tot for k, v in out.items()}


def _names(raw: Any, what: str, src: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
        raise ValueError(f"source {src}: {what} must be a model name or a list of model names")
    return tuple(raw)


def fits(model: str, tokens: int, contexts: Mapping[str, int]) -> bool:
    """Whether `model` takes a request of `tokens` (prompt + output): within its context
    length, or it has none on record."""
    ctx = contexts.get(model)
    return ctx is None or tokens <= ctx


def overflow_model(
    model: str, tokens: int, overflow: tuple[str, ...], contexts: Mapping[str, int]
) -> str:
    """The model a request of `tokens` is sent to: `model` if it fits, else the first of
    `overflow` that holds it, else `model` (which refuses it at arrival)."""
    if fits(model, tokens, contexts):
        return model
    for alt in overflow:
        if fits(alt, tokens, contexts):
            return alt
    return model


def load_workload(path: Path) -> Workload:
    doc = yaml.safe_load(Path(path).read_text()) or {}
    base = Path(path).parent
    win = doc.get("window", {}) or {}
    wl = Workload(
        seed=int(doc.get("seed", 0)),
        start_s=parse_duration(win.get("start", 0)),
        duration_s=parse_duration(win.get("duration", "1d")),
        region_order=[str(r) for r in doc.get("regionOrder", [])],
    )
    for i, s in enumerate(doc.get("sources", [])):
        name = str(s.get("name", f"source-{i}"))
        typ = str(s.get("type", ""))
        if typ == "servegen":
            paths = {"windows": base / s["windows"]}
            if s.get("tokens"):
                paths["tokens"] = base / s["tokens"]
        elif typ in ("azure2023", "jsonl"):
            paths = {"path": base / s["path"]}
        else:
            raise ValueError(
                f"source {name}: type must be servegen, azure2023 or jsonl, got {typ!r}"
            )
        for p in paths.values():
            if not p.exists():
                raise FileNotFoundError(f"source {name}: {p} does not exist")
        assign = str(s.get("assign", "client" if typ == "servegen" else "request"))
        if assign not in ("client", "request"):
            raise ValueError(f"source {name}: assign must be client or request")
        wl.sources.append(
            Source(
                name=name,
                type=typ,
                paths=paths,
                rate_scale=float(s.get("rateScale", 1.0)),
                assign=assign,
                models=_shares(s["models"], "models", name),
                regions=_shares(s["regions"], "regions", name),
                tiers=_shares(s["tiers"], "tiers", name),
                repeat=bool(s.get("repeat", False)),
                overflow=_names(s.get("overflow"), "overflow", name),
            )
        )
    if not wl.sources:
        raise ValueError(f"{path}: a workload needs at least one source")
    return wl


def assign_by_volume(
    volume: Mapping[int, float], shares: Mapping[str, float], rng: random.Random
) -> dict[int, str]:
    """Each client to one category so that categories get ≈ their share of the volume."""
    clients = sorted(volume)
    rng.shuffle(clients)
    total = sum(volume.values()) or 1.0
    got = dict.fromkeys(shares, 0.0)
    cats = sorted(shares)
    out: dict[int, str] = {}
    for c in clients:
        best = max(cats, key=lambda k: (shares[k] * total - got[k], k))
        out[c] = best
        got[best] += volume[c]
    return out


def _labelled(
    src: Source,
    idx: int,
    wl: Workload,
    tiers: Mapping[str, Tier],
    contexts: Mapping[str, int] | None = None,
) -> Iterator[tuple[Any, ...]]:
    rows = labelled_rows(src, idx, wl, tiers, with_client=True)
    if not src.overflow or not contexts:
        yield from rows
        return
    for t, i, k, model, region, tier, p, o, *c in rows:
        alt = overflow_model(model, p + o, src.overflow, contexts)
        yield (t, i, k, alt, region, tier, p, o, *c)


def labelled_rows(
    src: Source, idx: int, wl: Workload, tiers: Mapping[str, Tier], with_client: bool = False
) -> Iterator[tuple[Any, ...]]:
    """Source `idx`'s rows in time order as (time, source, row, model, home region, tier,
    prompt, output), labelled by the source's shares (before any overflow); with
    `with_client`, the trace's client id follows."""
    seed = wl.seed * 1009 + idx
    for t in src.tiers:
        if t not in tiers:
            raise ValueError(f"source {src.name}: tier {t!r} is not a WorkloadTier of the scenario")
    if src.type == "servegen":
        table = traces.ServeGenTable.load(src.paths["windows"])
        vol = table.client_volume()
        tok = src.paths.get("tokens")
        knots = traces.load_token_knots(tok, vol) if tok else traces.TokenKnots(traces._QS, {}, {})
        rows: Iterator[traces.TraceRow] = traces.servegen_rows(
            table, knots, wl.start_s, wl.end_s, src.rate_scale, seed
        )
    else:
        vol = {0: 1.0}
        read = traces.jsonl_rows if src.type == "jsonl" else traces.azure2023_rows
        rows = read(src.paths["path"], wl.start_s, wl.end_s, src.repeat, src.rate_scale, seed)
    if src.assign == "client":
        m_of = assign_by_volume(vol, src.models, random.Random(seed + 1))
        r_of = assign_by_volume(vol, src.regions, random.Random(seed + 2))
        t_of = assign_by_volume(vol, src.tiers, random.Random(seed + 3))
        for k, row in enumerate(rows):
            c = row.client
            out = (row.t, idx, k, m_of[c], r_of[c], tiers[t_of[c]], row.prompt, row.output)
            yield (*out, c) if with_client else out
    else:
        rng = random.Random(seed + 4)
        ms, mw = list(src.models), list(src.models.values())
        rs, rw = list(src.regions), list(src.regions.values())
        ts, tw = list(src.tiers), list(src.tiers.values())
        choices = rng.choices
        for k, row in enumerate(rows):
            out = (
                row.t,
                idx,
                k,
                choices(ms, mw)[0],
                choices(rs, rw)[0],
                tiers[choices(ts, tw)[0]],
                row.prompt,
                row.output,
            )
            yield (*out, row.client) if with_client else out


def requests(
    wl: Workload, tiers: Mapping[str, Tier], contexts: Mapping[str, int] | None = None
) -> Iterator[Request]:
    """All sources merged in time order, as `Request`s numbered from 0. With `contexts`
    (context length per model), a source's `overflow` models take what its models cannot."""
    streams = [_labelled(s, i, wl, tiers, contexts) for i, s in enumerate(wl.sources)]
    merged = heapq.merge(*streams) if len(streams) > 1 else streams[0]
    for n, (t, src, _, model, region, tier, p, o, client) in enumerate(merged):
        # client ids are the trace's own: two sources may both have a client 7
        yield Request(n, t, model, tier, region, p, o, (src << 32) | client)


def window_tokens_per_minute(
    wl: Workload, tiers: Mapping[str, Tier], contexts: Mapping[str, int] | None = None
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]]]:
    """Interactive and batch tokens/s (input + output) per minute of each (model, home region)
    over the workload's window, straight from the sources (nothing routed or served). With
    `contexts`, requests go to their overflow model and those a model refuses count nowhere
    (a refused request produces no tokens, in Prometheus as in the simulator)."""
    minutes = max(1, math.ceil(wl.duration_s / 60.0))
    iw: dict[tuple[str, str], list[float]] = {}
    niw: dict[tuple[str, str], list[float]] = {}
    for req in requests(wl, tiers, contexts):
        if contexts and not fits(req.model, req.prompt_tokens + req.output_tokens, contexts):
            continue
        series = iw if req.tier.interactive else niw
        key = (req.model, req.region)
        if key not in series:
            series[key] = [0.0] * minutes
        idx = min(minutes - 1, max(0, int((req.arrival - wl.start_s) // 60.0)))
        series[key][idx] += (req.prompt_tokens + req.output_tokens) / 60.0
    return iw, niw


@dataclass(frozen=True)
class TokenSeries:
    """Prompt and output tokens/s per minute of each (model, home region), interactive and
    batch apart, from `start_s` on (PreServe's planner forecasts prompt and decode apart)."""

    start_s: float
    iw_prompt: dict[tuple[str, str], np.ndarray]
    iw_decode: dict[tuple[str, str], np.ndarray]
    niw_prompt: dict[tuple[str, str], np.ndarray]
    niw_decode: dict[tuple[str, str], np.ndarray]

    def before(
        self, series: dict[tuple[str, str], np.ndarray], now: float, minutes: int
    ) -> dict[tuple[str, str], list[float]]:
        """The `minutes` whole minutes of `series` that end at or before `now`."""
        end = int((now - self.start_s) // 60.0)
        lo = max(0, end - minutes)
        return {k: [float(x) for x in v[lo:end]] for k, v in series.items()}


def token_series(
    wl: Workload,
    tiers: Mapping[str, Tier],
    minutes_before: int,
    contexts: Mapping[str, int] | None = None,
) -> TokenSeries:
    """`TokenSeries` over the `minutes_before` minutes before the window and the window.

    A request's output tokens count in its arrival minute (the trace knows them; a router
    counts them as they stream, at most a request's duration later)."""
    minutes_before = min(minutes_before, int(wl.start_s // 60.0))
    start = wl.start_s - 60.0 * minutes_before
    whole = replace(wl, start_s=start, duration_s=wl.duration_s + 60.0 * minutes_before)
    size = max(1, math.ceil(whole.duration_s / 60.0))
    out: tuple[dict[tuple[str, str], np.ndarray], ...] = ({}, {}, {}, {})
    for req in requests(whole, tiers, contexts):
        if contexts and not fits(req.model, req.prompt_tokens + req.output_tokens, contexts):
            continue
        prompt, decode = (out[0], out[1]) if req.tier.interactive else (out[2], out[3])
        key = (req.model, req.region)
        if key not in prompt:
            prompt[key] = np.zeros(size)
            decode[key] = np.zeros(size)
        idx = min(size - 1, max(0, int((req.arrival - start) // 60.0)))
        prompt[key][idx] += req.prompt_tokens / 60.0
        decode[key][idx] += req.output_tokens / 60.0
    return TokenSeries(start, *out)


def tokens_per_minute(
    wl: Workload,
    tiers: Mapping[str, Tier],
    minutes: int,
    contexts: Mapping[str, int] | None = None,
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]]]:
    """`window_tokens_per_minute` over the `minutes` before the window. The region is the
    home region (before the window nothing was routed), the engine's own history is by
    served region; they differ only by what spilled over.

    Why: the operator's forecaster starts with days of Prometheus history; a simulation that
    started with none would hold its initial sizes for the first plan interval and charge the
    LT strategies for a cold start no real fleet has.
    """
    minutes = min(minutes, int(wl.start_s // 60.0))  # a trace has no time before 0
    if minutes <= 0:
        return {}, {}
    before = replace(wl, start_s=wl.start_s - 60.0 * minutes, duration_s=60.0 * minutes)
    return window_tokens_per_minute(before, tiers, contexts)


def requests_per_minute(
    wl: Workload,
    tiers: Mapping[str, Tier],
    minutes: int,
    contexts: Mapping[str, int] | None = None,
) -> dict[tuple[str, str], list[float]]:
    """Requests/s per minute of each (model, home region) over the `minutes` before the
    window: a pooled model's rate history, as the router's per-model request counter holds
    it when the window starts (the plan sizes ModelPools on requests, not tokens)."""
    minutes = min(minutes, int(wl.start_s // 60.0))
    if minutes <= 0:
        return {}
    before = replace(wl, start_s=wl.start_s - 60.0 * minutes, duration_s=60.0 * minutes)
    out: dict[tuple[str, str], list[float]] = {}
    for req in requests(before, tiers, contexts):
        if contexts and not fits(req.model, req.prompt_tokens + req.output_tokens, contexts):
            continue
        key = (req.model, req.region)
        if key not in out:
            out[key] = [0.0] * minutes
        idx = min(minutes - 1, max(0, int((req.arrival - before.start_s) // 60.0)))
        out[key][idx] += 1 / 60.0
    return out
