"""Requests for a model with no Ready instance anywhere: held while one comes from zero.

A request whose model has nothing serving in any region is *held* (not refused) while the
operator scales the model from zero, for at most `HOLD_S` seconds; then it is refused
(the router's 503 `model_starting`). At most `MAX_HELD` requests are held at once (each
holds a body and a connection): past it a new one is refused at once as busy (the router's
429). One rule for the router (`router.app`) and the simulator (`sim.held`), so that a
scale-from-zero that takes longer than the hold costs the same requests in both worlds
(SageServe §5: scaling is reactive, and an instance takes minutes to come up).
"""

from __future__ import annotations

from enum import Enum

#: Seconds a request waits for an instance of its model to come up before it is refused.
HOLD_S = 120.0
#: Requests held at once, at most; past it a new request is refused as busy.
MAX_HELD = 1000


class Hold(Enum):
    """What becomes of a request for a model with no Ready instance."""

    #: it waits for an instance
    HOLD = "hold"
    #: refused at once: `max_held` requests already wait (HTTP 429)
    BUSY = "busy"
    #: refused: it waited `hold_s` and no instance came (HTTP 503)
    GIVE_UP = "give_up"


def admit(held: int, max_held: int = MAX_HELD) -> Hold:
    """A request arrives for a model with no Ready instance while `held` requests wait."""
    return Hold.BUSY if held >= max_held else Hold.HOLD


def keep(waited_s: float, hold_s: float = HOLD_S) -> Hold:
    """A held request has waited `waited_s` seconds and still no instance is Ready."""
    return Hold.HOLD if waited_s < hold_s else Hold.GIVE_UP


def hold_until(since: float, hold_s: float = HOLD_S) -> float:
    """The instant a request held from `since` is refused if no instance came."""
    return since + hold_s


__all__ = ["HOLD_S", "MAX_HELD", "Hold", "admit", "hold_until", "keep"]
