"""Pods that just failed a request get no new one for a while (outlier ejection).

Why: a pod that hangs costs each request sent to it the whole stall timeout before the
retry rule moves it elsewhere; without memory of the failure, the instance picker (fewest
tokens in flight) sends it the very next request, because a hung pod finishes nothing and
the failed request's tokens were given back. Envoy's outlier detection does the same. An
ejected pod is still used when no other pod is left, so ejection never turns a slow answer
into no answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Ejections:
    """Pods out of rotation and until when (monotonic seconds)."""

    seconds: float
    until: dict[str, float] = field(default_factory=dict)

    def eject(self, pod: str, now: float) -> None:
        self.until[pod] = now + self.seconds

    def active(self, now: float) -> frozenset[str]:
        """The pods ejected at `now` (expired entries are forgotten)."""
        for pod in [p for p, t in self.until.items() if t <= now]:
            del self.until[pod]
        return frozenset(self.until)
