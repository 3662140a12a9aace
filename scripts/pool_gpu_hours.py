"""GPU-hours of a long-tail scenario's dedicated baseline (with and without its floor and
engine start-up) against the pool sized by `plan/pool_sizing.py` (Aegaeon §7.5).

Usage: PYTHONPATH=operator python3 scripts/pool_gpu_hours.py scenarios/aegaeon-small-models 1
(the second argument cuts the window to that many hours). A quicker view than
`sageserve bench pool`, which also searches the smallest fleets meeting the SLO.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from sageserve.commands.bench_pool import pool_shape, tail_attainment
from sageserve.plan.pool_sizing import size_pool
from sageserve.sim.longtail import load_long_tail
from sageserve.sim.pool_serving import PoolOutcome, simulate_pool


def main(directory: str, hours: float) -> None:
    lt = load_long_tail(Path(directory), hours=hours)
    s = lt.setup
    plan = size_pool(lt.forecasts(), pool_shape(lt), lt.dedicated_threshold)
    cold = [m for m in lt.models if m not in plan.dedicated]
    common = {"start_s": lt.start_s, "end_s": lt.end_s, "hot": plan.dedicated}

    def show(name: str, o: PoolOutcome) -> None:
        print(
            f"{name:44s} GPU-h {o.gpu_hours:7.2f}  peak GPUs {o.gpus:4d}  "
            f"long-tail attainment {tail_attainment(o, cold):.3f}  switches {o.switches}",
            flush=True,
        )

    print(f"{lt.name}: {len(lt.models)} models, {len(lt.requests):,} requests, {hours:g} h")
    show(
        f"dedicated, floor {s.dedicated_floor}, start-up {s.startup_s:g} s",
        simulate_pool("dedicated", lt.requests, s, models=lt.models, **common),
    )
    bare = dataclasses.replace(s, dedicated_floor=0, startup_s=0.0)
    show(
        "dedicated, scale-to-zero, no start-up",
        simulate_pool("dedicated", lt.requests, bare, models=lt.models, **common),
    )
    show(
        f"pooled {plan.prefill_instances} prefill + {plan.decode_instances} decode (sized)",
        simulate_pool(
            "pooled",
            lt.requests,
            s,
            prefill=plan.prefill_instances,
            decode=plan.decode_instances,
            **common,
        ),
    )


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.0)
