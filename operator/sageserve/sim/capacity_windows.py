"""The simulator's windows for θ learned from the fleet (`plan.learned_capacity`).

What the operator reads from Prometheus per (model, variant, region) and minute, counted
from the run itself: the tokens the variant's instances were given (prompt + output, what
vLLM's prompt and generation counters count once served), its serving instances, their EMU
averaged over the pace ticks of the minute (as `avg_over_time` of each pod's KV usage over
the scrapes), and whether every interactive tier with first tokens in the minute kept its
TTFT P95 within its SLO (the endpoint's minute histogram, the routers' histogram in a
cluster). The learning rule itself is the pure step's, shared with the operator.

Every run counts its minutes, for the most tokens/s one instance of each (model, variant)
served in a minute that kept the SLO (`peak_at_slo`): the fleet's measured capacity at SLO,
which the capacity-at-SLO bound (`sim.lower_bound.capacity_bound`) sizes with. Only a run
whose ScalingPolicy sets `spec.capacity.learn` keeps the windows, samples EMU and plans with
what they teach, so a run without it decides exactly as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sageserve.plan.learned_capacity import (
    CapacityKey,
    CapacityWindow,
    LearnedCapacity,
    LearnSettings,
    learn,
    planned_theta,
    tier_slo_met,
)
from sageserve.sim.cluster import Deployment, Endpoint


@dataclass(frozen=True)
class CapacitySetup:
    """The learning settings and the declared θ per (model, variant, region)."""

    settings: LearnSettings
    declared: Mapping[CapacityKey, float]


class CapacityWindows:
    """Windows per (model, variant, region), one a minute, and the θ they teach."""

    def __init__(self, setup: CapacitySetup) -> None:
        self.setup = setup
        self.windows: deque[CapacityWindow] = deque()
        #: the run learns θ (else it only measures `peak_at_slo`)
        self.learning = setup.settings.learn
        #: per (model, variant): the most tokens/s per instance in a minute that kept the
        #: SLO (or had no interactive first token to judge it by)
        self.peak_at_slo: dict[tuple[str, str], float] = {}
        self._tokens: dict[Deployment, int] = {}
        #: per deployment: Σ EMU over the pace ticks of the minute, and the ticks
        self._emu: dict[Deployment, tuple[float, int]] = {}

    def count(self, dep: object, tokens: int) -> None:
        """A request given to an instance of `dep`."""
        if isinstance(dep, Deployment):
            self._tokens[dep] = self._tokens.get(dep, 0) + tokens

    def sample(self, now: float, endpoints: Iterable[Endpoint]) -> None:
        """Each pod set's EMU at a pace tick (a scrape of its pods' KV usage)."""
        for ep in endpoints:
            if ep.pooled is not None:
                continue
            for dep in ep.deployments:
                if dep.instances:
                    s, n = self._emu.get(dep, (0.0, 0))
                    self._emu[dep] = (s + dep.emu(now), n + 1)

    def minute(self, now: float, endpoints: Iterable[Endpoint]) -> None:
        """Close the minute: one window per pod set that served; the endpoint's TTFT
        window must already be rolled (its P95 and counts are the minute's)."""
        for ep in endpoints:
            if ep.pooled is not None:
                continue
            met = tier_slo_met(ep.ttft.p95, ep.ttft.samples, ep.ttft_slo)
            for dep in ep.deployments:
                n = len(dep.instances)
                tokens = self._tokens.pop(dep, 0)
                s, k = self._emu.pop(dep, (0.0, 0))
                if n == 0:
                    continue
                key = ep.key
                if met is not False:
                    pk = (key.model, dep.variant)
                    tps = tokens / 60.0 / n
                    if tps > self.peak_at_slo.get(pk, 0.0):
                        self.peak_at_slo[pk] = tps
                if not self.learning:
                    continue
                emu = s / k if k else dep.emu(now)
                self.windows.append(
                    CapacityWindow(
                        now, key.model, dep.variant, key.region, tokens / 60.0, n, emu, met
                    )
                )
        horizon = now - self.setup.settings.history_s
        while self.windows and self.windows[0].at < horizon:
            self.windows.popleft()

    def learned(self, now: float) -> dict[CapacityKey, LearnedCapacity]:
        return learn(self.windows, self.setup.declared, now, self.setup.settings)

    def plan_theta(self, now: float) -> dict[CapacityKey, float]:
        """θ per (model, variant, region) the plan sizes with: the trusted learned ones (none
        when the run does not learn)."""
        return planned_theta(self.learned(now)) if self.learning else {}
