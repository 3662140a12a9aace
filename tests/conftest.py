"""Test tiers (`docs/testing.md`).

- **fast**: pure and in-process tests; no Go-built binaries, no PostgreSQL, Prometheus,
  promtool or helm. `pytest -m "not e2e and not integration and not slow"`; before every
  commit.
- **integration**: real PostgreSQL, Prometheus, promtool or helm (marked here by what a
  test uses, or in its module).
- **e2e**: the real control plane (`tests/e2e`, marked in its conftest).
- **slow**: several seconds or more each (a simulation, a subprocess, a fuzz run), marked
  on the test.

`./scripts/test` runs every tier; CI runs `./scripts/test`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# One BLAS thread per process: the suite runs as two pytest workers beside control planes,
# operators and twins on a 2-core machine, where OpenBLAS's own threads can spin waiting for
# a core (the likely reason a regression fit of 2 s alone took 81 s in a loaded CI run).
# Set before any test module imports numpy, and inherited by every process a test starts.
for _blas in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas, "1")

# pytest-xdist starts its workers with COLUMNS=80 and LINES=24; the CLI's console reads
# them once, when `sageserve.cli` is imported, and a test that sets COLUMNS for one command
# would still get 80-column tables. Without them the worker behaves as a plain run.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


def _encodable(value: Any) -> Any:
    """`value` with every string UTF-8 encodable (a lone surrogate written as `\\udcxx`)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_encodable(v) for v in value)
    return value


@pytest.hookimpl(hookwrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: Any) -> Iterator[None]:
    """A report a worker sends back with its strings made UTF-8 encodable: a fuzz test's
    captured log may hold a request path with a lone surrogate (undecodable bytes a hostile
    client sent), and execnet refuses such a string, which would take the worker and every
    test queued on it down with it."""
    outcome = yield
    data = outcome.get_result()  # type: ignore[attr-defined]
    if data is not None:
        outcome.force_result(_encodable(data))  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _environment_as_found() -> Iterator[None]:
    """Each test leaves `os.environ` as it found it: the operator's CLI hands its flags to
    the handlers through the environment, and a value one test's command wrote would reach
    every operator a later test starts on the same worker (in process or as a child)."""
    saved = os.environ.copy()
    yield
    for key in set(os.environ) | set(saved):
        if key == "PYTEST_CURRENT_TEST":  # pytest's own, rewritten each phase
            continue
        if key not in saved:
            del os.environ[key]
        elif os.environ.get(key) != saved[key]:
            os.environ[key] = saved[key]


#: fixtures that start a real server or call a real binary
INTEGRATION_FIXTURES = frozenset({"pg_server", "prometheus_url"})
#: parameter values that select a real server (the batch store's backends)
INTEGRATION_PARAMS = frozenset({"postgresql"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(item, "callspec", None)
        values = params.params.values() if params is not None else ()
        uses = set(getattr(item, "fixturenames", ()))
        if uses & INTEGRATION_FIXTURES or any(
            isinstance(v, str) and v in INTEGRATION_PARAMS for v in values
        ):
            item.add_marker(pytest.mark.integration)
