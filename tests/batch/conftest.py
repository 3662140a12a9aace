"""Fixtures: a batch store on SQLite (a file in the test's directory) and on PostgreSQL
(one throwaway Debian server for the session, a fresh database per test).

Never skipped: without PostgreSQL installed the PostgreSQL cases fail with the
install command (``scripts/setup`` installs it).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from e2e import postgres  # noqa: E402
from sageserve.batch import BatchStore  # noqa: E402
from sageserve.dispatch.identity import ANONYMOUS, Principal  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OTHER = "mistral-7b"
TIERS = {MODEL: "niw", OTHER: "niw-slow"}
DEADLINES = {"niw": 86400.0, "niw-slow": 2 * 86400.0}
T0 = 1_700_000_000.0
#: two tenants: every object one creates is invisible to the other
ME = Principal("team-a", "a1b2c3d4e5f60718", frozenset({"niw"}))
THEM = Principal("team-b", "0f1e2d3c4b5a6978", frozenset({"niw"}))


def known_models(model: str, caller: Principal = ANONYMOUS) -> str | None:
    return TIERS.get(model)


def deadline_of(tier: str) -> float | None:
    return DEADLINES.get(tier)


def line(custom_id: str, model: str = MODEL, **extra: Any) -> str:
    """One request line of a batch input file for /v1/chat/completions."""
    obj: dict[str, Any] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": custom_id}]},
    }
    obj.update(extra)
    return json.dumps(obj)


def jsonl(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def read_jsonl(content: bytes) -> list[dict[str, Any]]:
    return [json.loads(x) for x in content.decode().splitlines() if x.strip()]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[postgres.PostgresServer]:
    with postgres.running(durable=False) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/queue.db"
        return
    server: postgres.PostgresServer = request.getfixturevalue("pg_server")
    name = f"t_{uuid.uuid4().hex[:16]}"
    url = server.create_database(name)
    yield url
    server.drop_database(name)


@pytest.fixture
def store(store_url: str) -> Iterator[BatchStore]:
    opened = BatchStore.open(store_url)
    yield opened
    opened.close()
