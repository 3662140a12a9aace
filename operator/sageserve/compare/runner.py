"""Running a comparison's simulations: a local process pool by default, a Dask cluster on
request.

Why parallel: the points of a sweep are independent simulations of the same scenario (one
policy, one set of knob values, the same seeded request stream), each single-threaded and
CPU-bound, so they spread over processes with nothing shared but the scenario's files.

Why Dask for a cluster: it is pure Python and installs with pip
(`pip install 'sageserve[cluster]'`), its `Client` has the same `submit` / future API as
`concurrent.futures`, so the local pool and a cluster share one loop here, and a cluster is
one command per machine (`dask scheduler`, `dask worker ADDR --nthreads 1`). Ray would do
the same with a larger install and its own object store, which runs this small do not need.

Each run reads the scenario from its path, so a Dask worker needs the sageserve package and
the scenario's files (manifests and traces) at the same path as the client: a shared file
system or the same checkout on every machine.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import queue as stdlib_queue
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sageserve.compare.grid import Job

if TYPE_CHECKING:
    from sageserve.sim.bounds import BoundsWork

#: The progress queue of a local worker process (set by the pool's initializer).
_LOCAL_QUEUE: Any = None

#: Fractions of a run between two progress reports (a Dask queue put is a network call).
PROGRESS_STEP = 0.01


@dataclass(frozen=True)
class Task:
    """What a worker needs for one run; small and picklable."""

    index: int
    scenario: str  # absolute path of the scenario directory
    job: Job
    seed: int | None


def point_metrics(table_row: dict[str, Any], policy: dict[str, Any]) -> dict[str, Any]:
    """The figures of a point, from `sim.run`'s comparison row and summary entry."""
    return {
        "gpu_hours": table_row["gpu_hours"],
        "provisioning_gpu_hours": table_row["provisioning_gpu_hours"],
        "instance_hours": table_row["instance_hours"],
        "slo": {t: v for t, v in table_row["slo"].items() if v == v},  # NaN: no requests
        "iw_ttft_p95_s": table_row["iw_ttft_p95_s"],
        "unfinished": table_row["unfinished"],
        "refused": table_row["refused"],
        "refused_no_instance": table_row.get("refused_no_instance", 0),
        "scale_events": table_row["scale_events"],
        **niw_metrics(table_row.get("niw", {})),
        "summary": policy,
    }


def niw_metrics(niw: dict[str, Any]) -> dict[str, Any]:
    """A point's batch deadline figures (`sim.results.batch_totals`): its NIW deadline
    attainment and the deadlines it missed inside the horizon (served late or not served),
    by which the frontier keeps it off (`compare.frontier`)."""
    return {
        "niw_deadline_attainment": niw.get("deadline_attainment"),
        "niw_missed": int(niw.get("misses", 0)),
        "niw_queued_beyond_horizon": int(niw.get("queued_beyond_horizon", 0)),
        "niw_feasible_at_max": niw.get("feasible_at_max"),
    }


#: Dask queues a worker process has opened, by name.
_DASK_QUEUES: dict[str, Any] = {}


@dataclass(frozen=True)
class DaskSink:
    """The progress queue of a Dask run, by name: the queue object itself cannot travel in
    a task's arguments (the scheduler would open it while unpickling the graph, on its own
    event loop, and wait for itself)."""

    name: str

    def put(self, item: tuple[int, float]) -> None:
        q = _DASK_QUEUES.get(self.name)
        if q is None:
            dist: Any = importlib.import_module("distributed")
            q = _DASK_QUEUES[self.name] = dist.Queue(name=self.name, client=dist.get_client())
        q.put(list(item))  # msgpack-encodable


def _report(sink: Any, index: int, fraction: float) -> None:
    target = sink if sink is not None else _LOCAL_QUEUE
    if target is not None:
        target.put((index, fraction))


def run_task(task: Task, sink: Any = None) -> dict[str, Any]:
    """One simulation through the simulator's public entry points (what `sageserve simulate
    --policy P --set ...` runs); progress goes to `sink` (a Dask queue) or the local pool's
    queue. Returns the point's figures and the policy's `sageserve.sim.summary/v1` entry."""
    from sageserve.sim.run import run_policies
    from sageserve.sim.scenario import load_scenario, with_policy_settings

    t0 = time.perf_counter()
    sc = with_policy_settings(load_scenario(Path(task.scenario)), task.job.settings)
    last = -1.0

    def on_progress(_name: str, fraction: float) -> None:
        nonlocal last
        if fraction >= 1.0 or fraction - last >= PROGRESS_STEP:
            last = fraction
            _report(sink, task.index, min(1.0, max(0.0, fraction)))

    cmp = run_policies(sc, [task.job.policy], task.seed, on_progress)
    out = point_metrics(cmp.table[0], cmp.summary["policies"][task.job.policy])
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out


def bounds_task(scenario: str, seed: int | None = None) -> BoundsWork:
    """Floor, lower bound and θ-sized estimate of the scenario's GPU-hours (`sim.bounds`):
    how much there was to save; the capacity-at-SLO bound follows from the runs
    (`BoundsWork.at_capacity`)."""
    from sageserve.sim.bounds import bounds_work
    from sageserve.sim.scenario import load_scenario

    return bounds_work(load_scenario(Path(scenario)).with_seed(seed))


def reference_task(
    scenario: str, seed: int | None = None, settings: Sequence[str] = ()
) -> dict[str, Any]:
    """The achievable reference (`sim.reference`): LT-UA with the realised future as its
    forecast, under the comparison's common settings."""
    from sageserve.sim.reference import REFERENCE_POLICY, REFERENCE_SETTING, reference_dict
    from sageserve.sim.run import run_policies
    from sageserve.sim.scenario import load_scenario, with_policy_settings

    sc = with_policy_settings(load_scenario(Path(scenario)), [*settings, REFERENCE_SETTING])
    cmp = run_policies(sc, [REFERENCE_POLICY], seed)
    return reference_dict(cmp.table[0])


class Future(Protocol):
    """What this module uses of a `concurrent.futures` or `distributed` future."""

    def done(self) -> bool: ...

    def result(self) -> Any: ...

    def cancel(self) -> Any: ...


class Backend(Protocol):
    """Where runs execute: `submit` as `concurrent.futures` has it, plus progress."""

    description: str

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future: ...

    def sink(self) -> Any: ...

    def drain(self) -> list[tuple[int, float]]: ...

    def close(self) -> None: ...


def _init_worker(q: Any) -> None:
    global _LOCAL_QUEUE
    _LOCAL_QUEUE = q


def default_workers() -> int:
    """Every core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class LocalBackend:
    """A process pool on this machine; needs no server. Processes are spawned (not forked)
    so that a worker never inherits the parent's threads (the progress display's)."""

    def __init__(self, workers: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._queue = ctx.Queue()
        self._pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(self._queue,)
        )
        self.description = f"local pool of {workers} process{'es' if workers > 1 else ''}"

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._pool.submit(fn, *args)

    def sink(self) -> Any:
        return None  # workers use the queue the initializer gave them

    def drain(self) -> list[tuple[int, float]]:
        items: list[tuple[int, float]] = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except stdlib_queue.Empty:
                return items

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._queue.close()


class DaskBackend:
    """A Dask distributed cluster at `address` (`dask scheduler` prints it). Progress comes
    back through a `distributed.Queue`; workers should run one thread each (`dask worker
    ADDR --nthreads 1 --nworkers N`): a simulation is pure Python and holds the GIL."""

    def __init__(self, address: str) -> None:
        try:  # the optional extra; untyped, so reached through Any
            dist: Any = importlib.import_module("distributed")
        except ImportError as e:
            raise ValueError(
                "--address needs Dask distributed: install sageserve's `cluster` extra"
            ) from e
        self._client: Any = dist.Client(address)
        self._queue: Any = dist.Queue(client=self._client)
        workers = self._client.scheduler_info().get("workers", {})
        threads = sum(int(w.get("nthreads", 1)) for w in workers.values())
        self.description = f"Dask cluster {address} ({len(workers)} workers, {threads} threads)"

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = self._client.submit(fn, *args, pure=False)
        return fut

    def sink(self) -> Any:
        return DaskSink(self._queue.name)

    def drain(self) -> list[tuple[int, float]]:
        return [(int(i), float(f)) for i, f in self._queue.get(batch=True)]

    def close(self) -> None:
        self._client.close()


def make_backend(workers: int | None, address: str | None) -> Backend:
    if address:
        return DaskBackend(address)
    return LocalBackend(max(1, workers or default_workers()))


@dataclass
class Outcome:
    """A finished run: its figures, or the error that stopped it."""

    task: Task
    result: dict[str, Any] | None
    error: str | None


def run_all(
    backend: Backend,
    tasks: Sequence[Task],
    on_progress: Callable[[int, float], None],
    on_done: Callable[[Outcome], None],
    extra: Iterable[tuple[Callable[..., Any], tuple[Any, ...]]] = (),
    poll_s: float = 0.2,
) -> tuple[list[Outcome], list[Any]]:
    """Submit every task (and the `extra` calls), report progress until all are done.

    A run that fails is recorded with its error and the others go on: one bad point must
    not cost the whole sweep. Returns the outcomes in task order and the extra results.
    """
    pending: dict[int, tuple[Future, Task]] = {}
    for t in tasks:
        pending[t.index] = (backend.submit(run_task, t, backend.sink()), t)
    extras = [backend.submit(fn, *args) for fn, args in extra]
    outcomes: dict[int, Outcome] = {}
    try:
        while pending:
            for index, fraction in backend.drain():
                on_progress(index, fraction)
            for index, (fut, task) in list(pending.items()):
                if not fut.done():
                    continue
                del pending[index]
                try:
                    outcome = Outcome(task, fut.result(), None)
                except Exception as e:  # a failed run is reported, not fatal
                    outcome = Outcome(task, None, f"{type(e).__name__}: {e}")
                outcomes[index] = outcome
                on_done(outcome)
            if pending:
                time.sleep(poll_s)
        extra_results = []
        for fut in extras:
            try:
                extra_results.append(fut.result())
            except Exception:  # bounds and reference are a courtesy; the comparison stands
                extra_results.append(None)
    except BaseException:
        for fut, _ in pending.values():
            fut.cancel()
        raise
    return [outcomes[t.index] for t in tasks], extra_results
