"""Per-client state stays bounded however many clients a caller invents.

The spill ledger and the `client-quantile` predictor keep one entry per key they see; the
router's keys come from requests (an API key, a `user` string), so 100,000 distinct users
used to be 100,000 entries until restart. Both keep the most recently used 10,000 and
go on working for the clients that matter: the ones seen lately."""

from __future__ import annotations

import pytest

from sageserve.dispatch.length_predictor import (
    DEFAULT_MAX_CLIENTS,
    ClientQuantilePredictor,
    LengthQuery,
)
from sageserve.dispatch.region_router import DEFAULT_SPILL_KEYS, SpillLedger, route_region
from sageserve.router.anticipate import PodAnticipators, client_id

USERS = 100_000


def test_the_predictor_keeps_at_most_the_cap_and_still_predicts() -> None:
    p = ClientQuantilePredictor()
    regular = 1  # a client seen all along, with long answers
    for _ in range(16):
        p.observe(regular, 10, 4000)
    for u in range(USERS):
        p.observe(1000 + u, 10, 50)  # one short answer per invented user
        if u % 1000 == 0:
            p.predict(LengthQuery(regular, 10))  # the regular keeps using the router
    assert p.clients == DEFAULT_MAX_CLIENTS == 10_000
    assert 3700 <= p.predict(LengthQuery(regular, 10)) <= 4300  # its own median, kept
    assert 45 <= p.predict(LengthQuery(1000, 10)) <= 55  # forgotten: all clients' median
    for _ in range(16):  # a forgotten client learns again
        p.observe(1000, 10, 900)
    assert 850 <= p.predict(LengthQuery(1000, 10)) <= 950
    assert p.clients == 10_000


@pytest.mark.slow
def test_the_routers_anticipators_stay_bounded_by_user() -> None:
    ants = PodAnticipators()
    for u in range(USERS):
        client = client_id(f"user-{u}")
        arrival = ants.arrival("m", client, 100)
        ticket = ants.sent("pod-0", "m", client, arrival)
        ants.answered(ticket, 64)
    predictor = ants.predictor("m")
    assert isinstance(predictor, ClientQuantilePredictor)
    assert predictor.clients == 10_000
    assert ants.arrival("m", client_id("someone new"), 100).predicted_output in range(60, 70)


def test_the_spill_ledger_keeps_at_most_the_cap_and_still_bounds_spill() -> None:
    ledger = SpillLedger()
    bounds = {"east": {"west": 0.2}}
    for u in range(USERS):
        ledger.record("m", f"home-{u}", "east", 1.0, float(u) / 1000)
    assert len(ledger) == DEFAULT_SPILL_KEYS == 10_000
    # the bounded rule still works for a real home: at most 20 % of east's tokens go west
    t = USERS / 1000
    west = 0
    for i in range(200):
        chosen = route_region(
            "m", "east", [("east", 0.9), ("west", 0.1)], str, 10.0, t + i * 0.01, ledger, bounds
        )
        west += chosen == "west"
    assert 30 <= west <= 45  # ≈ 20 % of 200
    assert len(ledger) == 10_000
