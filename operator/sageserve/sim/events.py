"""The event queue every simulated world shares: one heap discipline, one staleness rule.

Four event loops advance simulated serving instances: the simulator's engine
(`sim.engine.Simulation`, `sageserve simulate`), the OServe fleet of `sageserve bench
oserve` (`sim.oserve_fleet`), the Aegaeon harness of `sageserve bench pool`
(`sim.pool_serving`) and the digital twin's load (`twin.load.TwinSim`). Each is a
simulation as a value in, a summary out (the shape of Vidur's simulator); they differ in
what they do per event, not in how events are ordered. Keeping the order in one place means
two events due at the same instant run in the same order in every world, so a fleet
replayed by the twin and by `simulate` sees the same sequence.

Ordering guarantees. An event is the tuple `(when, seq, kind, obj)`:

- events run in time order (`when` ascending);
- events due at the same time run in the order they were pushed: `seq` is a counter that
  grows with every push, so it is unique and the tuple comparison never reaches `kind` or
  `obj`. `kind` does not take part in ordering, in any of the four loops: an instance
  event, a ready event and a callback due together run in push order, whatever their kind
  (each loop keeps its own numbering of kinds; `INSTANCE`, 0, is the one they all share).

Staleness. An instance keeps a single pending event time (`Instance.event_time`); when it
reschedules, the older entry stays in the heap. An instance event is stale when the
instance's `event_time` no longer equals the event's `when`; a live one is consumed
(`event_time` reset to infinity) before the instance is updated (`fire`).

The engine's hot loop reads `heap` directly and inlines the pop, as it did before this
module existed; everything else goes through the methods.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import Protocol

#: The tuple layout: (when, seq, kind, obj). `seq` breaks ties in push order.
Event = tuple[float, int, int, object]

#: The kind of an instance's own event (prefill end, a request finishing, KV full), in
#: every loop. Other kinds are each loop's own.
INSTANCE = 0

_INF = math.inf
_heappush = heapq.heappush
_heappop = heapq.heappop


class Scheduled(Protocol):
    """What `fire` needs of an instance: its one pending event time and its update."""

    event_time: float

    def update(self, now: float) -> None: ...


def is_stale(inst: Scheduled, when: float) -> bool:
    """An instance event at `when` is stale when the instance has rescheduled since."""
    return inst.event_time != when


def fire(inst: Scheduled, when: float) -> bool:
    """Run an instance event popped at `when`; False (and nothing done) when it is stale."""
    if inst.event_time != when:
        return False
    inst.event_time = _INF
    inst.update(when)
    return True


class EventQueue:
    """A time-ordered queue of events; ties run in push order (see the module docstring)."""

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        #: the heap itself, for a hot loop to read (`heap[0][0]`) and pop from directly
        self.heap: list[Event] = []
        #: the number of events pushed so far (the last `seq` given)
        self.seq = 0

    def push(self, when: float, kind: int, obj: object) -> None:
        """Add an event due at `when`; it runs after every event already due then."""
        seq = self.seq = self.seq + 1
        _heappush(self.heap, (when, seq, kind, obj))

    def schedule(self, inst: object, when: float) -> None:
        """Add an instance's own event (`InstanceHooks.schedule`'s signature)."""
        seq = self.seq = self.seq + 1
        _heappush(self.heap, (when, seq, INSTANCE, inst))

    def pop(self) -> Event:
        """Remove and return the earliest event (IndexError when empty)."""
        return _heappop(self.heap)

    def pop_due(self, until: float) -> Iterator[Event]:
        """Remove and yield, in order, every event due at or before `until`.

        Events pushed while iterating are yielded too when they fall due by `until`.
        """
        heap = self.heap
        while heap and heap[0][0] <= until:
            yield _heappop(heap)

    def peek_time(self) -> float:
        """When the earliest event is due; infinity when the queue is empty."""
        heap = self.heap
        return heap[0][0] if heap else _INF

    def __len__(self) -> int:
        return len(self.heap)

    def __bool__(self) -> bool:
        return bool(self.heap)
