"""Streaming trace readers: Azure LLM 2023 request CSVs, JSON-lines request traces and
ServeGen per-client windows.

All yield `TraceRow(t, client, prompt, output)` in time order, relative to the trace's
own t=0, lazily. Assigning model, region and tier is the workload mapping's job
(`sim.workload`), because no public trace carries them.

ServeGen is not request-level: for each client and 10-minute window it gives a mean rate
and a fitted inter-arrival distribution (Gamma or Weibull, shape p1, scale p2), and for each
6-hour window the client's token-count distribution (we ship p50/p90/p99/max). We turn it
into requests one window at a time:

- inter-arrival times are drawn from the fitted distribution and rescaled so their mean is
  exactly 1/(rate × rate_scale): the shape (burstiness, CV) is the client's, the volume is
  the published rate, times the scenario's scale; the first arrival is at a uniform phase of
  one inter-arrival time, so windows do not all start with a request at t=0;
- token counts are drawn by inverse-CDF sampling through the client's quantile knots
  (0 → 1 token, 0.5 → p50, 0.9 → p90, 0.99 → p99, 1 → max) of the enclosing 6-hour window;
  clients without token data borrow the knots of the largest client with data in that
  window.

Only the per-window rate table (a few hundred thousand rows) is held in memory; requests
are generated window by window and discarded once yielded.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

WINDOW_S = 600.0
TOKEN_WINDOW_S = 6 * 3600.0


@dataclass(frozen=True, slots=True)
class TraceRow:
    t: float
    client: int
    prompt: int
    output: int


# ---- Azure 2023 ------------------------------------------------------------------------------


def _parse_ts(s: str) -> float:
    # "2023-11-16 18:17:03.9799600": 7 fractional digits, more than datetime accepts
    if "." in s:
        head, frac = s.split(".", 1)
        return datetime.fromisoformat(head).timestamp() + float("0." + frac)
    return datetime.fromisoformat(s).timestamp()


def azure2023_rows(
    path: Path,
    start_s: float = 0.0,
    end_s: float = math.inf,
    repeat: bool = False,
    rate_scale: float = 1.0,
    seed: int = 0,
) -> Iterator[TraceRow]:
    """Requests of an Azure 2023 CSV (gz or plain), times relative to the first request.

    `repeat` replays the hour back to back (period = span + mean gap) so a 1-hour trace
    can drive a longer run. `rate_scale` < 1 thins requests at random (seeded); > 1 adds
    copies (integer part) plus a thinned copy (fraction), each copy jittered by up to 1 s.
    """
    yield from _azure2023(path, start_s, end_s, repeat, rate_scale, seed)


def _azure2023(
    path: Path, start_s: float, end_s: float, repeat: bool, rate_scale: float, seed: int
) -> Iterator[TraceRow]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rd = csv.reader(f)
        next(rd)
        raw = [(_parse_ts(r[0]), int(r[1]), int(r[2])) for r in rd if r]
    # a 1-hour trace is small (≤ 20k rows); keep its rows, stream the replay
    return _replay(raw, start_s, end_s, repeat, rate_scale, seed)


def _replay(
    raw: list[tuple[float, int, int]],
    start_s: float,
    end_s: float,
    repeat: bool,
    rate_scale: float,
    seed: int,
) -> Iterator[TraceRow]:
    """Request-level rows (time, prompt, output) replayed from the first one's time, with
    the `repeat` and `rate_scale` rules of `azure2023_rows`."""
    if not raw:
        return
    raw.sort()
    t0 = raw[0][0]
    base = [(t - t0, p, o) for t, p, o in raw]
    span = base[-1][0] + (base[-1][0] / max(1, len(base) - 1))
    if span <= 0:  # one request, or all at one instant: replay once per second
        span = 1.0
    rng = np.random.default_rng(seed)
    whole = int(rate_scale)
    frac = rate_scale - whole
    offset = 0.0
    while True:
        buf: list[TraceRow] = []
        for t, p, o in base:
            tt = t + offset
            if tt < start_s:
                continue
            if tt >= end_s:
                break
            copies = whole + (1 if frac > 0 and rng.random() < frac else 0)
            for c in range(copies):
                jitter = float(rng.random()) if c else 0.0
                buf.append(TraceRow(tt + jitter, 0, max(1, p), max(1, o)))
        buf.sort(key=lambda r: r.t)
        yield from buf
        offset += span
        if not repeat or offset >= end_s:
            return


# ---- JSON-lines request traces ---------------------------------------------------------------


class TraceFormatError(ValueError):
    """A line of a request trace that cannot be read; the message names the line and field."""


def _positive_int(doc: dict[str, object], name: str, where: str) -> int:
    v = doc.get(name)
    if v is None:
        raise TraceFormatError(f"{where}: field {name!r} is missing")
    if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or v < 1:
        raise TraceFormatError(f"{where}: field {name!r} must be a positive integer, got {v!r}")
    return int(v)


def parse_jsonl_line(line: str, where: str) -> tuple[float, int, int] | None:
    """(time in seconds, prompt tokens, output tokens) of one JSON-lines trace line, None for
    a blank line. `where` ("path:line") prefixes every error."""
    if not line.strip():
        return None
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"{where}: not a JSON object ({e.msg})") from None
    if not isinstance(doc, dict):
        raise TraceFormatError(f"{where}: not a JSON object, got {type(doc).__name__}")
    ts = doc.get("timestamp")
    if ts is None:
        raise TraceFormatError(f"{where}: field 'timestamp' is missing")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise TraceFormatError(
            f"{where}: field 'timestamp' must be a number of milliseconds ≥ 0, got {ts!r}"
        )
    prompt = _positive_int(doc, "input_length", where)
    output = _positive_int(doc, "output_length", where)
    hashes = doc.get("hash_ids")
    if hashes is not None and (
        not isinstance(hashes, list)
        or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes)
    ):
        raise TraceFormatError(f"{where}: field 'hash_ids' must be a list of integers")
    return float(ts) / 1000.0, prompt, output


def jsonl_rows(
    path: Path,
    start_s: float = 0.0,
    end_s: float = math.inf,
    repeat: bool = False,
    rate_scale: float = 1.0,
    seed: int = 0,
) -> Iterator[TraceRow]:
    """Requests of a JSON-lines trace (gz or plain), one request per line:
    `{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}`
    (`hash_ids`, the prompt's prefix-block hashes of Mooncake-style traces, is optional and
    checked but unused: the instance model has no prefix cache). Times are relative to the
    first request, as for Azure 2023, and `repeat` / `rate_scale` follow the same rules.
    A bad line stops the read with a `TraceFormatError` naming the line and the field."""
    yield from _replay(read_jsonl(path), start_s, end_s, repeat, rate_scale, seed)


def read_jsonl(path: Path) -> list[tuple[float, int, int]]:
    """Every request of a JSON-lines trace as (seconds, prompt, output), in file order."""
    opener = gzip.open if str(path).endswith(".gz") else open
    raw: list[tuple[float, int, int]] = []
    with opener(path, "rt") as f:
        for n, line in enumerate(f, 1):
            row = parse_jsonl_line(line, f"{path}:{n}")
            if row is not None:
                raw.append(row)
    return raw


def request_trace(path: Path) -> list[tuple[float, int, int]]:
    """A request-level trace of either format, by name: `*.jsonl[.gz]` JSON lines, else an
    Azure 2023 CSV; (seconds from the first request, prompt, output) in time order."""
    rows = jsonl_rows(path) if is_jsonl(path) else azure2023_rows(path)
    return [(r.t, r.prompt, r.output) for r in rows]


def is_jsonl(path: Path) -> bool:
    """Whether a request trace's name says JSON lines (`.jsonl`, `.jsonl.gz`)."""
    return str(path).endswith((".jsonl", ".jsonl.gz"))


# ---- ServeGen --------------------------------------------------------------------------------


@dataclass
class TokenKnots:
    """Per (client, 6-h window) inverse-CDF knots for input and output tokens."""

    qs: np.ndarray
    by_key: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]
    fallback: dict[int, tuple[np.ndarray, np.ndarray]]

    def knots(self, client: int, window: int) -> tuple[np.ndarray, np.ndarray] | None:
        return self.by_key.get((client, window)) or self.fallback.get(window)


_QS = np.array([0.0, 0.5, 0.9, 0.99, 1.0])


def load_token_knots(path: Path, volume: dict[int, float] | None = None) -> TokenKnots:
    """Quantile knots per (client, 6-h window) from a `*_client_token_stats_6h.csv` file."""
    rows: dict[tuple[int, int], dict[str, np.ndarray]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            vals = [1.0] + [float(r[q]) for q in ("p50", "p90", "p99", "max")]
            k = np.maximum.accumulate(np.maximum(1.0, np.array(vals)))
            key = (int(r["client_id"]), int(float(r["window_start_s"])) // int(TOKEN_WINDOW_S))
            rows.setdefault(key, {})[r["field"]] = k
    by_key = {
        key: (f["input_tokens"], f["output_tokens"])
        for key, f in rows.items()
        if "input_tokens" in f and "output_tokens" in f
    }
    vol = volume or {}
    best: dict[int, tuple[float, int]] = {}
    for cid, w in by_key:
        v = vol.get(cid, 0.0)
        if w not in best or (v, -cid) > (best[w][0], -best[w][1]):
            best[w] = (v, cid)
    fallback = {w: by_key[(cid, w)] for w, (_, cid) in best.items()}
    return TokenKnots(_QS, by_key, fallback)


@dataclass
class ServeGenTable:
    """The per-client 10-minute rate table of one ServeGen model."""

    client: np.ndarray
    window: np.ndarray  # window start, seconds
    rate: np.ndarray
    dist: np.ndarray  # 0 = Gamma, 1 = Weibull, -1 = none (Poisson fallback)
    p1: np.ndarray
    p2: np.ndarray

    @classmethod
    def load(cls, path: Path) -> ServeGenTable:
        df = pd.read_csv(path, compression="infer")
        df = df[df["rate_rps"] > 0].sort_values(["window_start_s", "client_id"], kind="stable")
        dist = np.where(
            df["iat_dist"].eq("Gamma"), 0, np.where(df["iat_dist"].eq("Weibull"), 1, -1)
        )
        return cls(
            client=df["client_id"].to_numpy(np.int64),
            window=df["window_start_s"].to_numpy(np.float64),
            rate=df["rate_rps"].to_numpy(np.float64),
            dist=dist.astype(np.int64),
            p1=df["dist_p1"].fillna(0).to_numpy(np.float64),
            p2=df["dist_p2"].fillna(0).to_numpy(np.float64),
        )

    def client_volume(self) -> dict[int, float]:
        """Requests per client over the whole table (rate × window length)."""
        vol: dict[int, float] = {}
        for c, r in zip(self.client.tolist(), self.rate.tolist(), strict=True):
            vol[c] = vol.get(c, 0.0) + r * WINDOW_S
        return vol

    @property
    def span_s(self) -> float:
        return float(self.window.max()) + WINDOW_S if len(self.window) else 0.0


def _iat(rng: np.random.Generator, dist: int, p1: float, p2: float, n: int) -> np.ndarray:
    if dist == 0 and p1 > 0 and p2 > 0:
        x = rng.gamma(p1, p2, n)
    elif dist == 1 and p1 > 0 and p2 > 0:
        x = rng.weibull(p1, n) * p2
    else:
        x = rng.exponential(1.0, n)
    return x


def servegen_rows(
    table: ServeGenTable,
    knots: TokenKnots,
    start_s: float,
    end_s: float,
    rate_scale: float,
    seed: int,
    clients: Callable[[int], bool] | None = None,
) -> Iterator[TraceRow]:
    """Requests generated window by window from a ServeGen rate table (see module doc)."""
    rng = np.random.default_rng(seed)
    win = table.window
    order_starts = np.searchsorted(win, np.arange(0, table.span_s + WINDOW_S, WINDOW_S))
    first = int(start_s // WINDOW_S)
    last = math.ceil(end_s / WINDOW_S)
    for w in range(first, min(last, len(order_starts) - 1)):
        lo, hi = int(order_starts[w]), int(order_starts[w + 1])
        w0 = w * WINDOW_S
        ts: list[np.ndarray] = []
        cs: list[np.ndarray] = []
        ins: list[np.ndarray] = []
        outs: list[np.ndarray] = []
        tw = int(w0 // TOKEN_WINDOW_S)
        for i in range(lo, hi):
            cid = int(table.client[i])
            if clients is not None and not clients(cid):
                continue
            rate = float(table.rate[i]) * rate_scale
            mean_iat = 1.0 / rate
            expect = rate * WINDOW_S
            n = int(expect * 1.5 + 10 * math.sqrt(expect) + 10)
            x = _iat(rng, int(table.dist[i]), float(table.p1[i]), float(table.p2[i]), n)
            m = float(x.mean())
            x *= mean_iat / m if m > 0 else 1.0
            x[0] *= rng.random()
            t = np.cumsum(x)
            while t[-1] < WINDOW_S:
                more = _iat(rng, int(table.dist[i]), float(table.p1[i]), float(table.p2[i]), n)
                more *= mean_iat / m if m > 0 else 1.0
                t = np.concatenate([t, t[-1] + np.cumsum(more)])
            t = t[t < WINDOW_S]
            if not len(t):
                continue
            k = knots.knots(cid, tw)
            u1 = rng.random(len(t))
            u2 = rng.random(len(t))
            if k is None:
                pin = np.full(len(t), 512.0)
                pout = np.full(len(t), 128.0)
            else:
                pin = np.interp(u1, knots.qs, k[0])
                pout = np.interp(u2, knots.qs, k[1])
            ts.append(t + w0)
            cs.append(np.full(len(t), cid, dtype=np.int64))
            ins.append(pin)
            outs.append(pout)
        if not ts:
            continue
        t_all = np.concatenate(ts)
        order = np.argsort(t_all, kind="stable")
        t_all = t_all[order]
        c_all = np.concatenate(cs)[order]
        i_all = np.maximum(1, np.rint(np.concatenate(ins)[order])).astype(np.int64)
        o_all = np.maximum(1, np.rint(np.concatenate(outs)[order])).astype(np.int64)
        keep = (t_all >= start_s) & (t_all < end_s)
        for t, c, p, o in zip(
            t_all[keep].tolist(),
            c_all[keep].tolist(),
            i_all[keep].tolist(),
            o_all[keep].tolist(),
            strict=True,
        ):
            yield TraceRow(t, c, p, o)


def servegen_paths(windows: Path) -> tuple[Path, Path | None]:
    """The token-stats file that belongs to a `*_client_windows_10min.csv.xz` file."""
    name = windows.name.replace("_client_windows_10min.csv.xz", "_client_token_stats_6h.csv")
    tok = windows.with_name(name)
    return windows, (tok if tok.exists() else None)


def iter_merge_sorted(streams: Sequence[Iterator[TraceRow]]) -> Iterator[TraceRow]:
    import heapq

    return heapq.merge(*streams, key=lambda r: r.t)
