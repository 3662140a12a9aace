"""A solver-neutral MIP in arrays, and the two backends that solve it.

Why arrays rather than PuLP expressions: building 36 000 PuLP variables and their affine
expressions costs seconds of pure Python before the solver even starts (a direct PuLP + HiGHS
formulation of the 20×20×5 case took 7.6 s). The formulation in ``ilp.py`` fills numpy arrays
once and hands them to HiGHS in one ``passModel`` call. The same arrays drive the PuLP/CBC
fallback, so both backends solve exactly the same model.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import highspy

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
INF = math.inf

# ``node_limit``: stopped by the deterministic node budget with an incumbent; ``time_limit``:
# stopped by the wall-clock safety stop (the answer then depends on the machine's speed).
SolveStatus = Literal["optimal", "node_limit", "time_limit", "infeasible", "no_solution", "error"]


@dataclass
class MipModel:
    """min c·x  s.t.  row_lo ≤ A x ≤ row_hi,  col_lo ≤ x ≤ col_hi,  x integer where flagged."""

    cost: FloatArray
    col_lo: FloatArray
    col_hi: FloatArray
    integer: npt.NDArray[np.bool_]
    row_lo: FloatArray
    row_hi: FloatArray
    a_row: IntArray
    a_col: IntArray
    a_val: FloatArray
    offset: float = 0.0

    @property
    def num_cols(self) -> int:
        return int(self.cost.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.row_lo.shape[0])


@dataclass
class MipSolution:
    status: SolveStatus
    x: FloatArray = field(default_factory=lambda: np.zeros(0))
    objective: float = math.nan
    gap: float | None = None
    seconds: float = 0.0
    solver: str = ""
    message: str = ""
    nodes: int = 0  # branch-and-bound nodes the solver processed (reporting only)
    timed_out: bool = False  # the wall-clock safety stop ended the solve


class ModelBuilder:
    """Accumulates columns and sparse rows; ``build`` returns the arrays."""

    def __init__(self) -> None:
        self._cost: list[float] = []
        self._lo: list[float] = []
        self._hi: list[float] = []
        self._int: list[bool] = []
        self._row_lo: list[float] = []
        self._row_hi: list[float] = []
        self._ar: list[int] = []
        self._ac: list[int] = []
        self._av: list[float] = []

    def add_col(self, cost: float, lo: float, hi: float, integer: bool) -> int:
        self._cost.append(cost)
        self._lo.append(lo)
        self._hi.append(hi)
        self._int.append(integer)
        return len(self._cost) - 1

    def add_row(self, cols: list[int], vals: list[float], lo: float, hi: float) -> int:
        row = len(self._row_lo)
        self._row_lo.append(lo)
        self._row_hi.append(hi)
        self._ar.extend([row] * len(cols))
        self._ac.extend(cols)
        self._av.extend(vals)
        return row

    def build(self, offset: float = 0.0) -> MipModel:
        return MipModel(
            offset=offset,
            cost=np.asarray(self._cost, dtype=np.float64),
            col_lo=np.asarray(self._lo, dtype=np.float64),
            col_hi=np.asarray(self._hi, dtype=np.float64),
            integer=np.asarray(self._int, dtype=np.bool_),
            row_lo=np.asarray(self._row_lo, dtype=np.float64),
            row_hi=np.asarray(self._row_hi, dtype=np.float64),
            a_row=np.asarray(self._ar, dtype=np.int64),
            a_col=np.asarray(self._ac, dtype=np.int64),
            a_val=np.asarray(self._av, dtype=np.float64),
        )


def solve(
    model: MipModel,
    *,
    solver: str = "highs",
    time_limit: float = 60.0,
    mip_gap: float = 1e-6,
    threads: int = 1,
    start: FloatArray | None = None,
    mip_abs_gap: float = 0.0,
    node_limit: int | None = None,
    seed: int = 0,
) -> MipSolution:
    """Solve with ``highs`` (highspy, default) or ``cbc`` (PuLP's bundled CBC). Never raises
    for solver-side trouble: it returns a status with a message instead. ``start`` is a
    feasible column vector HiGHS starts from (CBC ignores it).

    ``node_limit`` (branch-and-bound nodes) is the deterministic budget: with one thread and a
    fixed ``seed`` the same model gives the same answer on any machine. ``time_limit`` is a
    wall-clock safety stop; a solve that reaches it returns ``time_limit`` and its answer
    depends on the machine."""
    if solver == "highs":
        try:
            return _solve_highs(
                model, time_limit, mip_gap, threads, start, mip_abs_gap, node_limit, seed
            )
        except ImportError as exc:  # highspy missing: fall back rather than fail the plan.
            fallback = _solve_cbc(model, time_limit, mip_gap, threads, node_limit, seed)
            fallback.message = f"highspy unavailable ({exc}); solved with CBC. {fallback.message}"
            return fallback
    if solver == "cbc":
        return _solve_cbc(model, time_limit, mip_gap, threads, node_limit, seed)
    return MipSolution(status="error", message=f"unknown solver {solver!r} (use highs or cbc)")


_highs_constructed = False


def _new_highs() -> highspy.Highs:
    """A ``highspy.Highs``, without the licence banner HiGHS writes to the process's stdout
    on its first construction.

    Why: that banner comes from the C++ constructor before any option can be set
    (``output_flag`` silences only what follows), once per process, so every process of a
    `sageserve compare` pool printed it over the progress bars. Only file descriptor 1
    redirected around the first construction hides it; later ones print nothing and are
    not touched. Anything another thread writes to stdout during that construction is lost
    with it.
    """
    global _highs_constructed
    import highspy

    if _highs_constructed:
        return highspy.Highs()  # type: ignore[no-untyped-call]
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            try:
                h = highspy.Highs()  # type: ignore[no-untyped-call]
            finally:
                _flush_c_stdout()  # what C buffered goes to /dev/null, not to the terminal
                os.dup2(saved, 1)
    finally:
        os.close(saved)
    _highs_constructed = True
    return h


def _flush_c_stdout() -> None:
    """fflush(NULL): C's stdio buffers, which Python's flush does not reach."""
    with contextlib.suppress(OSError, AttributeError):  # no C library: nothing buffered
        ctypes.CDLL(None).fflush(None)


def _solve_highs(
    model: MipModel,
    time_limit: float,
    mip_gap: float,
    threads: int,
    start_x: FloatArray | None = None,
    mip_abs_gap: float = 0.0,
    node_limit: int | None = None,
    seed: int = 0,
) -> MipSolution:
    import highspy

    start = time.perf_counter()
    h = _new_highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    if mip_abs_gap > 0:
        h.setOptionValue("mip_abs_gap", float(mip_abs_gap))
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("random_seed", int(seed))
    if node_limit is not None:
        # At least the root node: with 0 HiGHS stops before it and finds nothing.
        h.setOptionValue("mip_max_nodes", int(min(max(node_limit, 1), 2**31 - 1)))
    # Measured on plan/bench.py fleets: the gap at the time limit is mostly primal (a better
    # incumbent), so more heuristic effort than the default 0.05 pays off.
    h.setOptionValue("mip_heuristic_effort", 0.3)
    lp = highspy.HighsLp()
    n, m = model.num_cols, model.num_rows
    lp.num_col_ = n
    lp.num_row_ = m
    lp.col_cost_ = model.cost
    lp.offset_ = float(model.offset)
    lp.col_lower_ = np.where(np.isinf(model.col_lo), -highspy.kHighsInf, model.col_lo)
    lp.col_upper_ = np.where(np.isinf(model.col_hi), highspy.kHighsInf, model.col_hi)
    lp.row_lower_ = np.where(np.isinf(model.row_lo), -highspy.kHighsInf, model.row_lo)
    lp.row_upper_ = np.where(np.isinf(model.row_hi), highspy.kHighsInf, model.row_hi)
    order = np.lexsort((model.a_row, model.a_col))
    counts = np.bincount(model.a_col, minlength=n)
    starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_ = n
    lp.a_matrix_.num_row_ = m
    lp.a_matrix_.start_ = starts
    lp.a_matrix_.index_ = model.a_row[order].astype(np.int32)
    lp.a_matrix_.value_ = model.a_val[order]
    lp.integrality_ = [
        highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous
        for flag in model.integer
    ]
    h.passModel(lp)
    if start_x is not None and start_x.shape[0] == n:
        start_sol = highspy.HighsSolution()
        start_sol.col_value = list(map(float, start_x))
        h.setSolution(start_sol)
    h.run()
    seconds = time.perf_counter() - start
    status = h.getModelStatus()
    info = h.getInfo()
    has_solution = info.primal_solution_status == highspy.kSolutionStatusFeasible
    x = np.asarray(h.getSolution().col_value, dtype=np.float64) if has_solution else np.zeros(0)
    gap = float(info.mip_gap) if has_solution and math.isfinite(info.mip_gap) else None
    objective = float(info.objective_function_value) if has_solution else math.nan
    nodes = int(info.mip_node_count) if info.mip_node_count > 0 else 0
    text = h.modelStatusToString(status)
    if status == highspy.HighsModelStatus.kOptimal and has_solution:
        return MipSolution("optimal", x, objective, gap, seconds, "highs", text, nodes)
    if status == highspy.HighsModelStatus.kOptimal:
        # seen on near-degenerate LPs (a rate of 1e-6 beside 16): HiGHS reports optimal
        # but hands back no feasible primal solution; callers must not read an empty x
        return MipSolution(
            "no_solution", x, objective, gap, seconds, "highs", f"{text} without a primal solution"
        )
    if status in (highspy.HighsModelStatus.kInfeasible,):
        return MipSolution("infeasible", seconds=seconds, solver="highs", message=text)
    if status == highspy.HighsModelStatus.kTimeLimit:
        st: SolveStatus = "time_limit" if has_solution else "no_solution"
        return MipSolution(st, x, objective, gap, seconds, "highs", text, nodes, timed_out=True)
    if status == highspy.HighsModelStatus.kSolutionLimit:  # mip_max_nodes reached
        st = "node_limit" if has_solution else "no_solution"
        return MipSolution(st, x, objective, gap, seconds, "highs", text, nodes)
    if has_solution:
        return MipSolution("time_limit", x, objective, gap, seconds, "highs", text, nodes)
    return MipSolution("error", seconds=seconds, solver="highs", message=text)


def _solve_cbc(
    model: MipModel,
    time_limit: float,
    mip_gap: float,
    threads: int,
    node_limit: int | None = None,
    seed: int = 0,
) -> MipSolution:
    """CBC through PuLP: ``maxNodes`` is the deterministic budget (CBC is deterministic with
    one thread; ``seed`` > 0 sets its ``randomCbcSeed``), ``timeLimit`` the safety stop."""
    import pulp

    class _Cbc(pulp.PULP_CBC_CMD):  # type: ignore[misc]
        """Also keeps what CBC stopped on ("iterations", "time"), which PuLP drops."""

        stopped_on = ""

        def get_status(self, filename: str) -> tuple[int, int]:
            with open(filename, encoding="utf-8") as f:
                words = f.readline().split()
            if len(words) > 2 and words[0] == "Stopped":
                self.stopped_on = words[2]
            status: tuple[int, int] = super().get_status(filename)
            return status

    start = time.perf_counter()
    prob = pulp.LpProblem("plan", pulp.LpMinimize)
    xs = [
        pulp.LpVariable(
            f"x{j}",
            lowBound=None if math.isinf(model.col_lo[j]) else float(model.col_lo[j]),
            upBound=None if math.isinf(model.col_hi[j]) else float(model.col_hi[j]),
            cat=pulp.LpInteger if model.integer[j] else pulp.LpContinuous,
        )
        for j in range(model.num_cols)
    ]
    prob += (
        pulp.lpSum(float(c) * x for c, x in zip(model.cost, xs, strict=True) if c != 0.0)
        + model.offset
    )
    rows: list[list[tuple[pulp.LpVariable, float]]] = [[] for _ in range(model.num_rows)]
    for r, c, v in zip(model.a_row, model.a_col, model.a_val, strict=True):
        rows[int(r)].append((xs[int(c)], float(v)))
    for i, terms in enumerate(rows):
        expr = pulp.LpAffineExpression(terms)
        lo, hi = float(model.row_lo[i]), float(model.row_hi[i])
        if lo == hi:
            prob += expr == lo
            continue
        if not math.isinf(lo):
            prob += expr >= lo
        if not math.isinf(hi):
            prob += expr <= hi
    cmd = _Cbc(
        msg=False,
        timeLimit=time_limit,
        gapRel=mip_gap,
        threads=threads,
        maxNodes=node_limit,
        # CBC's default seed is fixed; its seed 0 would mean "from the time of day".
        options=[f"randomCbcSeed {int(seed)}"] if seed > 0 else [],
    )
    prob.solve(cmd)
    seconds = time.perf_counter() - start
    status = pulp.LpStatus[prob.status]
    values = [x.value() for x in xs]
    has_solution = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if status == "Infeasible":
        return MipSolution("infeasible", seconds=seconds, solver="cbc", message=status)
    timed_out = cmd.stopped_on == "time"
    if not has_solution or any(v is None for v in values):
        return MipSolution(
            "no_solution", seconds=seconds, solver="cbc", message=status, timed_out=timed_out
        )
    x = np.asarray([float(v) for v in values], dtype=np.float64)
    objective = float(model.cost @ x) + model.offset
    if prob.sol_status == pulp.LpSolutionOptimal:
        return MipSolution("optimal", x, objective, None, seconds, "cbc", status)
    # CBC's solution file says "Stopped on iterations" when maxNodes ends the search (this
    # passes no iteration limit), "Stopped on time" at timeLimit.
    stopped: SolveStatus = "time_limit" if timed_out else "node_limit"
    message = f"stopped on {cmd.stopped_on or 'a limit'}"
    return MipSolution(stopped, x, objective, None, seconds, "cbc", message, timed_out=timed_out)
