"""The OServe mixed-workload day (`scenarios/oserve-mixed/`), derived from the Azure 2023 traces.

OServe's gains come from a request mix that changes over time (§6.5, Tables 1–2: spans S1–S5
and T1–T4 moving between short- and long-output heavy mixes). The only public request-level
traces with exact token counts, Azure LLM inference 2023 (Splitwise), hold one hour of two
services: *code* (long prompts, short outputs: 2,048 / 28 tokens on average) and
*conversation* (1,155 / 211). This module turns them into an 8-hour day of one model whose
mix moves between the two, by a deterministic transformation (`derive`):

1. each service's hour is stretched to exactly 3,600 s (`t · 3600 / span`, the span being the
   last request's time after the first: 3,436 s for code, 3,502 s for conversation) and
   rotated by `hour × 450 s` (cyclically), so consecutive hours do not replay the same
   minute at the same offset;
2. hour h of the day takes service s at `PHASES[h]`'s rate × its share: the service's hour is
   replayed at `rate_s,h / (N_s / 3600)` times its own rate, by `⌊f⌋` copies of every request
   plus one more with probability `f − ⌊f⌋` (thinning when f < 1), every copy after the first
   shifted by U(0, 1) s, as `sim/traces.py` scales a trace (`rateScale`). The requests keep
   their real (prompt, output) pairs and the service's real within-hour burstiness;
3. a prompt longer than Llama-2-70B's 4,096-token context less its output is cut to
   `4096 − output` tokens (a client truncates what the model would refuse; vLLM answers
   HTTP 400 otherwise): 14.3 % of code and 8.3 % of conversation requests of the source hour;
4. written as two JSON-lines traces (`code.jsonl.gz`, `conversation.jsonl.gz`: `timestamp`
   in ms from the day's start, `input_length`, `output_length`), gzip with mtime 0 so the
   bytes depend on the inputs and the seed only.

The phases (share of code requests, total requests/s) are set so that the best homogeneous
layout on 16 × H100 (4 × TP4) runs at about 60 % of its analytical capacity at each hour's
mix (`perf/capacity.py`: 17.0 req/s on code alone, 10.8 on conversation alone), the paper's
"neither over- nor under-utilized". Hours 0–3 are the tuning part of the benchmark, hours
4–7 the held-out part (`commands/bench_oserve.py`); both hold code-heavy, conversation-heavy
and balanced hours, in a different order.
"""

from __future__ import annotations

import gzip
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sageserve.sim.traces import request_trace

#: Llama-2-70B's context length (tokens); longer prompts are cut to fit (step 3 above).
CONTEXT_TOKENS = 4096
HOUR_S = 3600.0
#: cyclic rotation of a service's hour per hour of the day (step 1)
ROTATE_S = 450.0
SERVICES = ("code", "conversation")
SEED = 20231116


@dataclass(frozen=True)
class Phase:
    """One hour of the day: the share of code requests and the total requests/s."""

    code_share: float
    rate: float


#: Hours 0-3 tune, hours 4-7 are held out (see the module doc).
PHASES: tuple[Phase, ...] = (
    Phase(0.50, 7.6),  # 0 balanced
    Phase(0.85, 9.4),  # 1 code-heavy
    Phase(0.20, 6.8),  # 2 conversation-heavy
    Phase(0.65, 8.5),  # 3 code-leaning
    Phase(0.10, 6.6),  # 4 conversation-heavy
    Phase(0.90, 9.8),  # 5 code-heavy
    Phase(0.35, 7.2),  # 6 conversation-leaning
    Phase(0.75, 8.9),  # 7 code-heavy
)
TUNING_HOURS = (0, 1, 2, 3)
HELD_OUT_HOURS = (4, 5, 6, 7)


def _service_rows(path: Path) -> list[tuple[float, int, int]]:
    """(seconds in the stretched hour, prompt, output) of one service, time order."""
    rows = request_trace(path)
    span = rows[-1][0] if rows and rows[-1][0] > 0 else HOUR_S
    return [(min(t * HOUR_S / span, HOUR_S - 1e-3), p, o) for t, p, o in rows]


def _hour(
    rows: Sequence[tuple[float, int, int]],
    hour: int,
    rate: float,
    rng: np.random.Generator,
) -> list[tuple[float, int, int]]:
    n = len(rows)
    if rate <= 0 or n == 0:
        return []
    factor = rate / (n / HOUR_S)
    whole = math.floor(factor)
    frac = factor - whole
    shift = (hour * ROTATE_S) % HOUR_S
    out: list[tuple[float, int, int]] = []
    base = hour * HOUR_S
    for t, p, o in rows:
        tt = (t - shift) % HOUR_S
        copies = whole + (1 if frac > 0 and rng.random() < frac else 0)
        prompt = max(1, min(p, CONTEXT_TOKENS - o))
        for c in range(copies):
            jitter = float(rng.random()) if c else 0.0
            out.append((base + min(tt + jitter, HOUR_S - 1e-3), prompt, max(1, o)))
    out.sort()
    return out


def derive(
    code: Path, conversation: Path, phases: Sequence[Phase] = PHASES, seed: int = SEED
) -> dict[str, list[tuple[float, int, int]]]:
    """The day's requests per service: (seconds from the day's start, prompt, output)."""
    sources = {"code": _service_rows(code), "conversation": _service_rows(conversation)}
    rng = np.random.default_rng(seed)
    out: dict[str, list[tuple[float, int, int]]] = {s: [] for s in SERVICES}
    for h, ph in enumerate(phases):
        shares = {"code": ph.code_share, "conversation": 1.0 - ph.code_share}
        for s in SERVICES:
            out[s] += _hour(sources[s], h, ph.rate * shares[s], rng)
    return out


def write_jsonl_gz(rows: Sequence[tuple[float, int, int]], path: Path) -> None:
    """A JSON-lines request trace (`sim/traces.py` reads it), byte-reproducible."""
    buf = io.StringIO()
    for t, p, o in rows:
        buf.write(
            json.dumps(
                {"timestamp": round(t * 1000.0), "input_length": p, "output_length": o},
                separators=(",", ":"),
            )
        )
        buf.write("\n")
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
        gz.write(buf.getvalue().encode())


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - a one-off tool
    """`python -m sageserve.sim.mixed_day [OUT_DIR]`: rebuild the bundled traces from
    `data/traces/azure-llm-2023/` (run from the repository root)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    out_dir = Path(args[0] if args else "scenarios/oserve-mixed")
    src = Path("data/traces/azure-llm-2023")
    day = derive(
        src / "AzureLLMInferenceTrace_code.csv.gz", src / "AzureLLMInferenceTrace_conv.csv.gz"
    )
    for s, rows in day.items():
        write_jsonl_gz(rows, out_dir / f"{s}.jsonl.gz")
        print(f"{s}: {len(rows)} requests -> {out_dir / f'{s}.jsonl.gz'}")


if __name__ == "__main__":  # pragma: no cover
    main()
