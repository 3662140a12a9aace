"""Which share of each trace a scenario's models would refuse for their context length.

Why: a trace recorded on a long-context service (ServeGen's m-large reaches 38k tokens a
request, m-small 150k) replayed on Bloom-176B (2,048) or Llama-2-70B (4,096) asks for more
than the model holds; vLLM refuses such a request at arrival (HTTP 400), and so do the
simulator and the twin. This counts, per source, model and tier, the requests beyond the
mapped model's context, and those still refused after the source's `overflow` models
(`sim.workload`), so that a scenario's mapping can be checked before a long run and its
refusals stated in the docs (docs/simulator.md).

    python -m sageserve.sim.context scenarios/peak-day
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sageserve.sim.scenario import Scenario, load_scenario
from sageserve.sim.workload import Workload, fits, labelled_rows, overflow_model


@dataclass
class SourceRefusals:
    """One source's requests per (model, tier) as mapped, those beyond the model's context,
    their tokens, where the overflow sent them, and those still refused."""

    source: str
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    tokens: Counter[tuple[str, str]] = field(default_factory=Counter)
    beyond: Counter[tuple[str, str]] = field(default_factory=Counter)
    beyond_tokens: Counter[tuple[str, str]] = field(default_factory=Counter)
    overflow: Counter[tuple[str, str]] = field(default_factory=Counter)
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)

    def models(self) -> list[str]:
        return sorted({m for m, _ in self.requests})

    def count(self, model: str, what: Counter[tuple[str, str]]) -> int:
        """`what` summed over the tiers of `model`."""
        return sum(v for (m, _), v in what.items() if m == model)

    def share(
        self, model: str, part: Counter[tuple[str, str]], of: Counter[tuple[str, str]]
    ) -> float:
        n = self.count(model, of)
        return self.count(model, part) / n if n else 0.0


def refusals(sc: Scenario, workload: Workload | None = None) -> list[SourceRefusals]:
    """Per source of `sc` (over `workload`'s window, default the scenario's): requests
    beyond their model's context, before and after the source's overflow models."""
    wl = workload or sc.workload
    ctx = sc.contexts()
    out = []
    for idx, src in enumerate(wl.sources):
        r = SourceRefusals(src.name)
        for _t, _i, _k, model, _region, tier, p, o in labelled_rows(src, idx, wl, sc.tiers):
            key = (model, tier.name)
            r.requests[key] += 1
            r.tokens[key] += p + o
            if fits(model, p + o, ctx):
                continue
            r.beyond[key] += 1
            r.beyond_tokens[key] += p + o
            to = overflow_model(model, p + o, src.overflow, ctx)
            if fits(to, p + o, ctx):
                r.overflow[(model, to)] += 1
            else:
                r.refused[key] += 1
        out.append(r)
    return out


def describe(sc: Scenario, rows: Sequence[SourceRefusals]) -> str:
    """The check as text: one line per (source, model), then where the overflow sent what."""
    ctx = sc.contexts()
    lines = []
    for r in rows:
        lines.append(f"source {r.source}:")
        for m in r.models():
            tiers = ", ".join(
                f"{t} {r.beyond[(m, t)] / n:.2%}"
                for (mm, t), n in sorted(r.requests.items())
                if mm == m
            )
            lines.append(
                f"  {m} (context {ctx.get(m, 0):,}): {r.count(m, r.requests):,} requests; "
                f"beyond its context {r.share(m, r.beyond, r.requests):.2%} of them ({tiers}), "
                f"{r.share(m, r.beyond_tokens, r.tokens):.2%} of their tokens; "
                f"refused after overflow {r.count(m, r.refused):,}"
            )
        for (a, b), n in sorted(r.overflow.items()):
            lines.append(f"  overflow {a} -> {b}: {n:,} requests")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m sageserve.sim.context SCENARIO_DIR", file=sys.stderr)
        return 2
    sc = load_scenario(Path(args[0]))
    rows = refusals(sc)
    print(f"scenario {sc.name}")
    print(describe(sc, rows))
    return 1 if any(r.refused for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
