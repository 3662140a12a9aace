"""The achievable reference: LT-UA planning on the realised future (`forecast.realised`).

Why: the lower bound (`sim.lower_bound`) is a fluid LP at peak efficiency with no start-up
and no whole instances; no policy reaches it, so "x times the bound" does not say how much
of a policy's distance is its forecaster's. LT-UA run with the load that did arrive as its
forecast (every other rule of the run unchanged: pacing, start-up, spot, routing, batch
release) is what LT-UA achieves when forecasting costs nothing. `sageserve simulate
--reference` and `sageserve compare --reference` run it next to the bounds and keep it in
the summary JSON under `reference`.

What the realised forecaster is given is what its interface asks of a forecaster at plan
time (`plan.cycle.run_plan_cycle`): per (model, region), the interactive tokens/s (prompt
and output) of each `forecast.granularitySeconds` step after now, up to the horizon. It is
counted from the workload by home region (the region a request arrives at), as the
simulator counts the history before the window; the run's own history is by served region,
so the two differ by what spills over.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.sim.workload import TokenSeries

#: The strategy the reference runs and the setting that gives it the realised future.
REFERENCE_POLICY = "lt-ua"
REFERENCE_SETTING = "forecast.method=realised"


def realised_future(
    series: TokenSeries, now: float, policy: ScalingPolicySpec
) -> dict[tuple[str, str], list[float]]:
    """Per (model, region), the interactive tokens/s of each forecast step after `now`, up to
    `forecast.horizonSeconds` (fewer where the window ends first)."""
    step = float(policy.forecast.granularity_seconds)
    horizon = math.ceil(float(policy.forecast.horizon_seconds) / 60.0 - 1e-9)
    begin = max(0, int((now - series.start_s) // 60.0))
    out: dict[tuple[str, str], list[float]] = {}
    for key in sorted(set(series.iw_prompt) | set(series.iw_decode)):
        prompt = series.iw_prompt.get(key)
        decode = series.iw_decode.get(key)
        size = max(
            len(prompt) if prompt is not None else 0, len(decode) if decode is not None else 0
        )
        minutes = [
            (float(prompt[i]) if prompt is not None else 0.0)
            + (float(decode[i]) if decode is not None else 0.0)
            for i in range(begin, min(size, begin + horizon))
        ]
        if step >= 60.0:
            k = max(1, round(step / 60.0))
            out[key] = [
                sum(minutes[i : i + k]) / len(minutes[i : i + k]) for i in range(0, len(minutes), k)
            ]
        else:
            out[key] = [m for m in minutes for _ in range(round(60.0 / step))]
    return out


def reference_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    """The `reference` entry of the summaries, from the reference run's comparison row."""
    niw = row.get("niw") or {}
    return {
        "policy": REFERENCE_POLICY,
        "setting": REFERENCE_SETTING,
        "gpu_hours": round(float(row["gpu_hours"]), 3),
        "slo": {t: v for t, v in row["slo"].items() if v == v},  # NaN: no requests
        "niw_deadline_attainment": niw.get("deadline_attainment"),
        "niw_missed": int(niw.get("misses", 0)),
        "scale_events": int(row["scale_events"]),
    }


def describe_reference(ref: Mapping[str, Any], tier: str | None = None) -> str:
    """One line for the console and the reports."""
    slo = ref.get("slo") or {}
    shown = {tier: slo[tier]} if tier in slo else slo
    attain = ", ".join(f"{t} {v:.2%}" for t, v in sorted(shown.items()))
    niw = ref.get("niw_deadline_attainment")
    batch = f", NIW by deadline {niw:.2%}" if niw is not None else ""
    return (
        f"achievable reference {ref['gpu_hours']:,.1f} GPU-h ({ref['policy']} with the "
        f"realised future as its forecast: {attain}{batch})"
    )
