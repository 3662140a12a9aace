"""Per-type capacity n_{k,j} measured on the simulator at a latency SLO (OServe).

Why: the layout search and the assignment LP need n_{k,j}, the requests/s of request type j
one replica of layout k sustains. `perf/capacity.py` computes it analytically as the maximum
throughput, with no latency in it: on H100 it ranks TP4 best for every type, on A100 deep
pipelines whose per-request latency the simulator shows to be poor. OServe's gains come from
layouts differing in *latency* (a faster decode step matters for long outputs under a
per-token SLO). So here n is measured the way `sim/calibrate.py` measures θ: one replica of
the layout (the simulator's own `Instance`, through the benchmark's `sim/oserve_fleet.Fleet`
with a single replica, so no second instance model), fed Poisson arrivals of that type's
requests, and a bisection on the rate.

n_{k,j} is the highest request rate at which at least `attainment` (default 90 %) of the
measured requests finish with TTFT ≤ `ttft_s` (5 s) and a time per output token after the
first ≤ `tpot_s` (0.2 s), the SLO `sageserve bench oserve` scores goodput with. Settled:
- a type's requests are the scenario's requests whose (prompt, output) fall in the type's
  k-means cell (true lengths), drawn uniformly with replacement (sizes vary inside a type);
- each probe replays `requests` arrivals (default 2,000), so its window is requests / rate
  seconds: short for the cheap types, longer for the slow ones, a bounded cost per probe;
  the first `warmup_share` (20 %) of the arrivals are replayed but not scored (the replica
  starts empty); a request unfinished `drain_s` after the last arrival misses the SLO;
- the bisection starts from hi = 2 × the analytical n (doubled while it still holds, at most
  `max_doublings` times) and runs `steps` halvings (default 7: within 0.8 % of hi);
- arrivals depend on (seed, rate, type) only, never on the SLO, so a looser SLO never gives
  a lower n: the two bisections follow the same probes until the first one the looser SLO
  holds and the tighter does not, and from there the looser searches above it, the tighter
  below;
- a request longer than the context (or the KV cache) is refused by the instance and never
  finishes, so such a type gets n = 0.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sageserve.core.types import Request, Tier, TierKind
from sageserve.dispatch.length_predictor import make_predictor
from sageserve.forecast.request_types import RequestTypes
from sageserve.perf.capacity import type_capacity
from sageserve.perf.model import VariantPerf
from sageserve.plan.layout_search import Strategy
from sageserve.sim.oserve_fleet import Fleet, nearest_type

_TIER = Tier("calibration", TierKind.INTERACTIVE)
_MODEL = "calibration"
_REGION = "calibration"


@dataclass(frozen=True)
class SloSpec:
    """The latency SLO n is measured at (the bench's goodput SLO, and an attainment)."""

    ttft_s: float = 5.0
    tpot_s: float = 0.2
    attainment: float = 0.9

    def met(self, ttft: float, e2e: float, output: int) -> bool:
        if math.isnan(e2e):
            return False
        tpot = (e2e - ttft) / (output - 1) if output > 1 else 0.0
        return ttft <= self.ttft_s and tpot <= self.tpot_s


@dataclass(frozen=True)
class TypeProbe:
    """One simulated rate of one type on one layout."""

    rate: float
    attainment: float
    finished_share: float

    def holds(self, slo: SloSpec) -> bool:
        return self.attainment >= slo.attainment


@dataclass(frozen=True)
class ProbeSettings:
    """How long and how precisely each (layout, type) is probed (see the module doc)."""

    requests: int = 2000
    warmup_share: float = 0.2
    drain_s: float = 600.0
    steps: int = 7
    max_doublings: int = 4
    seed: int = 0


def type_members(
    types: RequestTypes, sizes: Sequence[tuple[int, int]]
) -> list[list[tuple[int, int]]]:
    """The (prompt, output) sizes of each type's cell, on true lengths."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(types.k)]
    for p, o in sizes:
        out[nearest_type(types, p, o)].append((p, o))
    return out


def poisson_requests(
    sizes: Sequence[tuple[int, int]], rate: float, n: int, seed: int
) -> list[Request]:
    """`n` Poisson arrivals at `rate` req/s, sizes drawn uniformly from `sizes`."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        p, o = sizes[rng.randrange(len(sizes))]
        out.append(Request(i, t, _MODEL, _TIER, _REGION, p, o))
    return out


def probe_type(
    perf: VariantPerf,
    types: RequestTypes,
    sizes: Sequence[tuple[int, int]],
    rate: float,
    slo: SloSpec,
    settings: ProbeSettings = ProbeSettings(),
    seed: int = 0,
) -> TypeProbe:
    """One replica of `perf` at `rate` req/s of `sizes`: the SLO attainment after warm-up."""
    reqs = poisson_requests(sizes, rate, settings.requests, seed)
    first = int(len(reqs) * settings.warmup_share)
    scored_ids = {r.id for r in reqs[first:]}
    # vLLM refuses a request longer than the context: it is never sent, and misses the SLO
    served = [r for r in reqs if fits(perf, r.prompt_tokens, r.output_tokens)]
    good = finished = 0
    if served:
        strategy = Strategy(perf.tensor_parallel, perf.pipeline_parallel)
        fleet = Fleet(lambda _s: perf, [strategy], types, make_predictor("oracle"), 0.0)
        fleet.run(served, 0.0, reqs[-1].arrival + 1e-9, settings.drain_s)
        for r, o in zip(served, fleet.outcomes, strict=True):
            if r.id not in scored_ids:
                continue
            finished += not math.isnan(o.e2e)
            good += slo.met(o.ttft, o.e2e, o.output)
    n = max(1, len(scored_ids))
    return TypeProbe(rate, good / n, finished / n)


def fits(perf: VariantPerf, prompt: int, output: int) -> bool:
    """Whether vLLM would take the request: within the context length and the KV cache."""
    total = prompt + output
    if perf.context_length and total > perf.context_length:
        return False
    return total <= perf.kv_capacity_tokens


def bisect_rate(holds: Callable[[float], bool], hi: float, steps: int, max_doublings: int) -> float:
    """The highest rate in [0, hi · 2^max_doublings] that `holds`, by doubling then `steps`
    halvings (0 when even the smallest probed rate fails)."""
    lo = 0.0
    for _ in range(max_doublings):
        if not holds(hi):
            break
        lo, hi = hi, hi * 2
    else:
        if holds(hi):
            return hi
    for _ in range(steps):
        mid = (lo + hi) / 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo


def measure_type_capacity(
    perf: VariantPerf,
    types: RequestTypes,
    sizes: Sequence[tuple[int, int]],
    slo: SloSpec = SloSpec(),
    settings: ProbeSettings = ProbeSettings(),
    hi: float | None = None,
    type_index: int = 0,
    on_probe: Callable[[TypeProbe], None] | None = None,
) -> tuple[float, list[TypeProbe]]:
    """n of one (layout, type) at `slo`, and the probes that found it (module doc)."""
    if not any(fits(perf, p, o) for p, o in sizes):
        return 0.0, []
    if hi is None:
        mp = sum(p for p, _ in sizes) / len(sizes)
        mo = sum(o for _, o in sizes) / len(sizes)
        hi = 2.0 * type_capacity(perf, mp, mo)
    if not hi > 0 or math.isinf(hi):
        hi = 1.0
    probes: list[TypeProbe] = []
    cache: dict[float, TypeProbe] = {}

    def holds(rate: float) -> bool:
        p = cache.get(rate)
        if p is None:
            p = probe_type(
                perf, types, sizes, rate, slo, settings, settings.seed + 1009 * type_index
            )
            cache[rate] = p
            probes.append(p)
            if on_probe is not None:
                on_probe(p)
        return p.holds(slo)

    return bisect_rate(holds, hi, settings.steps, settings.max_doublings), probes


@dataclass
class TypeCapacityTable:
    """n_{k,j} per layout and type, with what it was measured on (the file `calibrate
    --by-type --out` writes and `bench oserve --capacity FILE` reads)."""

    model: str
    gpu_type: str
    slo: SloSpec
    #: (prompt, output) tokens of each type's centroid, in type order
    centroids: list[tuple[float, float]]
    #: layout name (`Strategy.__str__`) → n per type
    capacity: dict[str, list[float]]
    analytical: dict[str, list[float]] = field(default_factory=dict)
    derived: dict[str, bool] = field(default_factory=dict)
    settings: ProbeSettings = ProbeSettings()
    source: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "sageserve.io/type-capacity",
            "model": self.model,
            "gpuType": self.gpu_type,
            "slo": {
                "ttftSeconds": self.slo.ttft_s,
                "tpotSeconds": self.slo.tpot_s,
                "attainment": self.slo.attainment,
            },
            "types": [{"promptTokens": p, "outputTokens": o} for p, o in self.centroids],
            "capacity": self.capacity,
            "analytical": self.analytical,
            "derived": self.derived,
            "settings": self.settings.__dict__,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TypeCapacityTable:
        if d.get("kind") != "sageserve.io/type-capacity":
            raise ValueError("not a type-capacity file (kind: sageserve.io/type-capacity)")
        s = d["slo"]
        return cls(
            model=str(d["model"]),
            gpu_type=str(d["gpuType"]),
            slo=SloSpec(float(s["ttftSeconds"]), float(s["tpotSeconds"]), float(s["attainment"])),
            centroids=[(float(t["promptTokens"]), float(t["outputTokens"])) for t in d["types"]],
            capacity={k: [float(x) for x in v] for k, v in d["capacity"].items()},
            analytical={k: [float(x) for x in v] for k, v in d.get("analytical", {}).items()},
            derived={k: bool(v) for k, v in d.get("derived", {}).items()},
            settings=ProbeSettings(**d.get("settings", {})),
            source=dict(d.get("source", {})),
        )

    def save(self, path: Path) -> None:
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path.suffix in (".yaml", ".yml"):
            import yaml

            text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        path.write_text(text)

    @classmethod
    def load(cls, path: Path) -> TypeCapacityTable:
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            return cls.from_dict(yaml.safe_load(text))
        return cls.from_dict(json.loads(text))

    def matches(self, types: RequestTypes, rel: float = 0.01) -> bool:
        """Whether the file's types are `types` (centroids within `rel`, same order)."""
        if len(self.centroids) != types.k:
            return False
        for j, (p, o) in enumerate(self.centroids):
            tp, to = types.centroid_tokens(j)
            if abs(p - tp) > rel * max(1.0, tp) or abs(o - to) > rel * max(1.0, to):
                return False
        return True


def calibrate_types(
    perf: Mapping[Strategy, VariantPerf],
    types: RequestTypes,
    sizes: Sequence[tuple[int, int]],
    slo: SloSpec = SloSpec(),
    settings: ProbeSettings = ProbeSettings(),
    on_probe: Callable[[Strategy, int, TypeProbe], None] | None = None,
) -> dict[Strategy, tuple[float, ...]]:
    """n_{k,j} of every layout in `perf` and every type, measured (module doc)."""
    members = type_members(types, sizes)
    out: dict[Strategy, tuple[float, ...]] = {}
    for s, v in perf.items():
        row = []
        for j in range(types.k):

            def report(p: TypeProbe, _s: Strategy = s, _j: int = j) -> None:
                if on_probe is not None:
                    on_probe(_s, _j, p)

            n, _ = measure_type_capacity(
                v, types, members[j], slo, settings, type_index=j, on_probe=report
            )
            row.append(n)
        out[s] = tuple(row)
    return out


# ---- capacity sources, chosen by name --------------------------------------------------------


class CapacityContext:
    """What a capacity source may read: the layouts' profiles, the types, the requests the
    types were fitted on (their sizes), the SLO and probe settings, and an optional file."""

    def __init__(
        self,
        perf: Mapping[Strategy, VariantPerf],
        types: RequestTypes,
        sizes: Sequence[tuple[int, int]],
        slo: SloSpec = SloSpec(),
        settings: ProbeSettings = ProbeSettings(),
        file: Path | None = None,
    ) -> None:
        self.perf = perf
        self.types = types
        self.sizes = sizes
        self.slo = slo
        self.settings = settings
        self.file = file


def _analytical(ctx: CapacityContext) -> dict[Strategy, tuple[float, ...]]:
    lengths = [ctx.types.centroid_tokens(j) for j in range(ctx.types.k)]
    return {s: tuple(type_capacity(v, i, o) for i, o in lengths) for s, v in ctx.perf.items()}


def _measured(ctx: CapacityContext) -> dict[Strategy, tuple[float, ...]]:
    if ctx.file is None:
        return calibrate_types(ctx.perf, ctx.types, ctx.sizes, ctx.slo, ctx.settings)
    table = TypeCapacityTable.load(ctx.file)
    if not table.matches(ctx.types):
        raise ValueError(
            f"{ctx.file}: its request types {table.centroids} are not the ones fitted here "
            f"{[ctx.types.centroid_tokens(j) for j in range(ctx.types.k)]}: run `sageserve "
            "calibrate --by-type` with the same scenario, hours, types and seed"
        )
    out: dict[Strategy, tuple[float, ...]] = {}
    for s in ctx.perf:
        row = table.capacity.get(str(s))
        if row is None:
            raise ValueError(f"{ctx.file}: no capacity for layout {s}")
        out[s] = tuple(row)
    return out


#: n_{k,j} sources by name: `analytical` (perf/capacity.py, maximum throughput at the type's
#: centroid, no SLO) and `measured` (this module: the simulator at the SLO, or a file of it)
CAPACITY_SOURCES: dict[str, Callable[[CapacityContext], dict[Strategy, tuple[float, ...]]]] = {
    "analytical": _analytical,
    "measured": _measured,
}


def capacity_table(name: str, ctx: CapacityContext) -> dict[Strategy, tuple[float, ...]]:
    """n_{k,j} from the source registered as `name`."""
    source = CAPACITY_SOURCES.get(name)
    if source is None:
        raise ValueError(
            f"unknown capacity source {name!r}: choose one of {sorted(CAPACITY_SOURCES)}"
        )
    return source(ctx)
