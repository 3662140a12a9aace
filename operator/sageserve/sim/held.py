"""The simulator's held requests: those for a model with nothing serving in any region.

The router holds such a request while the model comes from zero, at most `hold_s` (then
503) and at most `max_held` at once (past it 429), by `dispatch.hold`; the simulator holds
them by the same rule. A held request waits in its endpoint's backlog, which the decision
step reads as waiting work (and so scales the endpoint from zero); when an instance comes up
in time it is served, otherwise it leaves the backlog and counts as refused
(`TierModelStats.refused_no_instance`), the request a client would have seen answered 503 or
429. Only runs in which a model has nothing serving anywhere pay for it: the engine builds
this on the first hold.
"""

from __future__ import annotations

from collections.abc import Callable

from sageserve.dispatch.hold import Hold, admit, hold_until
from sageserve.sim.cluster import Endpoint
from sageserve.sim.instance import Job


class HeldRequests:
    """The requests held now, each with its endpoint."""

    __slots__ = ("_held", "_refuse", "call_at", "hold_s", "max_held")

    def __init__(
        self,
        hold_s: float,
        max_held: int,
        call_at: Callable[[float, Callable[[float], None]], None],
        refuse: Callable[[Job], None],
    ) -> None:
        """`call_at(when, fn)` runs `fn(when)` in the event order (the hold's end);
        `refuse(job)` counts a request refused."""
        self.hold_s = hold_s
        self.max_held = max_held
        self.call_at = call_at
        self._refuse = refuse
        #: id(job) -> (job, the endpoint whose backlog it waits in)
        self._held: dict[int, tuple[Job, Endpoint]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, job: Job, ep: Endpoint, now: float) -> Hold:
        """A request for a model with nothing serving anywhere arrives at `ep`: held in its
        backlog until an instance comes or the hold ends, or refused at once as busy."""
        decision = admit(len(self._held), self.max_held)
        if decision is Hold.BUSY:
            self._refuse(job)
            return decision
        self._held[id(job)] = (job, ep)
        ep.backlog.append(job)
        self.call_at(hold_until(now, self.hold_s), lambda when: self._end(job, when))
        return decision

    def served(self, jobs: list[Job]) -> None:
        """These requests left a backlog for an instance: no longer held."""
        held = self._held
        if held:
            for job in jobs:
                held.pop(id(job), None)

    def _end(self, job: Job, now: float) -> None:
        """The hold of `job` ran out (`hold_until`): refused unless served meanwhile."""
        entry = self._held.pop(id(job), None)
        if entry is None:  # served in time
            return
        entry[1].backlog.remove(job)
        self._refuse(job)


__all__ = ["HeldRequests"]
