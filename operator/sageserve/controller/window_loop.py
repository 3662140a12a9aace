"""The window loop: every `spec.preserve.windowSeconds`, PreServe's window plan for a
`preserve` policy (PreServe §4.1, Alg. 2).

Reads, per (model, region), the prompt and the generated tokens/s per minute apart (vLLM's
`vllm:prompt_tokens_total` and `vllm:generation_tokens_total`, `PrometheusReader.
token_histories`) over as much history as the forecaster fits on
(`plan.preserve.window_history_minutes`), and calls `plan.preserve.plan_window`, the
function the simulator's window planner calls (`sim.scenario.Scenario.window_planner`):
N = ⌈max(P̂/μ_p, D̂/μ_d, (P̂ + D̂)/μ_t)⌉ per endpoint. The plan goes where the hourly cycle's
goes: `status.plan` (solverStatus `window`, P̂ and D̂ per endpoint) and the pace loop's plan
in force, which `pace.preserve` turns into each window's boundary move.

Precedence, settled: for `preserve` the window plan *replaces* the hourly cycle (the pace
loop runs this pass, not `PlanPass`, every window), as in the simulator, where
`Scenario.planner_for` gives `preserve` the window planner and no hourly one. One planner
per strategy means one plan in force and one `status.plan`, so nothing overwrites the
window's targets between windows, and a restarted operator restores the last window plan
from status as it restores an hourly plan. The cost: a `preserve` policy's ModelPools are
not sized (the hourly cycle sizes pools).

Batch work: vLLM's counters count every request; when the router (or
`spec.forecast.batchTokensQuery`) counts batch tokens, they are taken out of P and D in each
minute's prompt : generated proportion and the last hour of them is the β the plan adds
(`plan.preserve.window_inputs`, which the simulator's window planner calls on the same
counts, `sim.window_tokens`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sageserve.api.model_deployment import ModelDeployment
from sageserve.controller.plan_loop import PlanPass, router_batch_queries, target_entries
from sageserve.metrics.exporter import OPERATOR_METRICS
from sageserve.metrics.prometheus import MetricsUnavailable, PrometheusReader
from sageserve.plan.preserve import (
    WindowPlan,
    plan_window,
    window_history_minutes,
    window_inputs,
)

Series = dict[tuple[str, str], list[float]]
#: The window plan reads tokens/s per minute (`plan.preserve.window_means`).
MINUTE = 60.0


def window_status(
    window: WindowPlan,
    mds: Sequence[ModelDeployment],
    current: Mapping[tuple[str, str, str], int],
    now: datetime,
    seconds: float = 0.0,
) -> dict[str, Any]:
    """`status.plan` of a ScalingPolicy for one window plan (pure): P̂ and D̂ per endpoint
    beside their sum, and the targets, in the hourly plan's shape (`plan_loop.plan_status`),
    so `plan_loop.recorded_plan` restores it."""
    forecasts = []
    for (m, r), f in sorted(window.forecasts.items()):
        total = round(f.prompt_tps + f.decode_tps, 3)
        entry: dict[str, Any] = {
            "model": m,
            "region": r,
            "tokensPerSecond": total,
            "expectedTokensPerSecond": total,
            "promptTokensPerSecond": round(f.prompt_tps, 3),
            "decodeTokensPerSecond": round(f.decode_tps, 3),
            "method": f.method[:64],
        }
        mu = window.rates.get((m, r))
        if mu is not None and mu.total > 0:
            entry["instanceTokensPerSecond"] = round(mu.total, 3)
        if f.notes:
            entry["fallbackReason"] = "; ".join(f.notes)[:1024]
        forecasts.append(entry)
    return {
        "computedAt": now.isoformat().replace("+00:00", "Z"),
        "strategy": "preserve",
        "solverStatus": "window",
        "solverSeconds": round(seconds, 4),
        "forecasts": forecasts,
        "targets": target_entries(window.targets, mds, current),
        "shortfalls": [],
        "spillover": [],
    }


class WindowPass(PlanPass):
    """One window plan for one `preserve` policy (PreServe §4.1, Alg. 2)."""

    def run_window(self, reader: PrometheusReader) -> WindowPlan | None:
        """Plan the next window, write status, return the plan (None: nothing to plan, or
        Prometheus did not answer; the plan in force stays)."""
        spec = self.policy.spec
        mds = self.models()
        if not mds:
            return None
        started = time.monotonic()
        end = time.time()
        seconds = MINUTE * window_history_minutes(spec)
        try:
            prompt, decode = reader.token_histories(self.namespace, end, seconds, MINUTE)
            batch = self.batch(reader, end, seconds)
        except MetricsUnavailable as exc:
            self.set("PlanReady", False, "PrometheusUnreachable", f"no window plan: {exc}")
            return None
        current = self.sizes(mds, self.kube.deployments_by_owner(self.namespace))
        held, clusters = self.fleet()
        current.update(self.held_sizes(held))
        theta = self.learned_capacity(reader, mds)
        window = plan_window(mds, spec, *window_inputs(prompt, decode, batch), current, theta, held)
        status = window_status(window, mds, current, datetime.now(UTC), time.monotonic() - started)
        self.kube.patch_status(
            self.namespace,
            "scalingpolicies",
            self.policy.metadata.name,
            {"plan": status, **({"clusters": clusters} if clusters is not None else {})},
        )
        OPERATOR_METRICS.record_plan(self.namespace, status, "window")
        planned = sorted(window.forecasts.items())
        sizes = ", ".join(f"{m}/{r} {f.instances}" for (m, r), f in planned)
        self.set("PlanReady", True, "Planned", f"window plan (PreServe Alg. 2): {sizes}")
        return window

    def batch(self, reader: PrometheusReader, end: float, seconds: float) -> Series:
        """Batch tokens/s per minute per (model, region): the policy's query, else what the
        router counted for the namespace's batch tiers; empty when neither exists."""
        spec = self.policy.spec
        window = f"{int(MINUTE)}s"
        query = spec.forecast.batch_tokens_query or next(
            iter(
                router_batch_queries(
                    window, self.namespace, self.kube.objects(self.namespace, "workloadtiers")
                )
                or ()
            ),
            None,
        )
        if not query:
            return {}
        got = reader.history(query, end=end, seconds=seconds, step=MINUTE)
        return {(m, r): v for (ns, m, r), v in got.items() if ns == self.namespace}
