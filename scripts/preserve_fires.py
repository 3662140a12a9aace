"""How often PreServe's KV-projection rules act on a scenario (PreServe §4.3.2, §4.3.3).

Runs the scenario's window under the `preserve` strategy once per in-region picker and counts:

- `overload_checks` / `overload_fires`: pace steps that evaluated the in-window scale-up rule
  and those where at least one instance was projected above 95 % KV in more than 10 % of its
  look-ahead (`pace.preserve.overloaded_count` > 0);
- `penalty_picks` / `picks`: routing decisions where the `preserve` picker's memory penalty
  (projected KV above 80 %) changed the score of at least one candidate.

Usage: PYTHONPATH=operator python3 scripts/preserve_fires.py scenarios/preserve-memory-bound [HOURS]
(HOURS cuts the scenario's window to its first HOURS hours.)
The counters wrap the pure rules the simulator calls; the rules themselves are not changed.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sageserve.dispatch.instance_picker as picker_mod
import sageserve.pace.preserve as preserve_mod
from sageserve.sim.engine import Simulation
from sageserve.sim.scenario import load_scenario


def main(argv: Sequence[str]) -> None:
    sc = load_scenario(Path(argv[0]))
    out: dict[str, Any] = {}
    original_count = preserve_mod.overloaded_count
    original_score = picker_mod.preserve_score
    for picker in ("token-jsq", "preserve"):
        counts = {"overload_checks": 0, "overload_fires": 0, "picks": 0, "penalty_picks": 0}

        def count_overloaded(*args: Any, counts: dict[str, int] = counts, **kw: Any) -> int:
            n = original_count(*args, **kw)
            counts["overload_checks"] += 1
            counts["overload_fires"] += n > 0
            return n

        def pick(self: Any, req: Any, candidates: Any, counts: dict[str, int] = counts) -> Any:
            scores = [(k, original_score(req, v)) for k, v in candidates]
            weight = picker_mod.MEMORY_PENALTY_WEIGHT
            picker_mod.MEMORY_PENALTY_WEIGHT = 0.0
            try:
                plain = [original_score(req, v) for _, v in candidates]
            finally:
                picker_mod.MEMORY_PENALTY_WEIGHT = weight
            counts["picks"] += 1
            counts["penalty_picks"] += any(s != p for (_, s), p in zip(scores, plain, strict=True))
            return picker_mod._argmin(scores)

        preserve_mod.overloaded_count = count_overloaded
        original_pick = picker_mod.PreServe.pick
        picker_mod.PreServe.pick = pick  # type: ignore[method-assign]
        try:
            cfg = dataclasses.replace(sc.sim_config(), picker=picker)
            if len(argv) > 1:
                cfg = dataclasses.replace(cfg, end_s=cfg.start_s + float(argv[1]) * 3600.0)
            strategy = sc.strategy("preserve")
            planner = sc.planner_for(strategy) if strategy.plan_cadence.plans else None
            history = sc.history(cfg.history_minutes) if planner else None
            result = Simulation(cfg, strategy, sc.requests(), None, planner, history).run()
        finally:
            preserve_mod.overloaded_count = original_count
            picker_mod.PreServe.pick = original_pick  # type: ignore[method-assign]
        out[picker] = {**counts, "scaling_events": dict(sorted(result.events.items()))}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
