"""Both MIP backends solve without writing to the terminal.

Why: `sageserve compare` runs planners in a pool of processes that share the terminal with
its progress bars; HiGHS prints a licence banner on the first construction in a process
(before any option can turn it off), and CBC runs as a child process. Each backend is
checked in a fresh interpreter, where that first construction happens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import sageserve

SOLVE_ONE = """
import numpy as np
from sageserve.plan.mip import MipModel, solve

# min x  s.t.  x >= 1.5, x integer in [0, 10]: x = 2
model = MipModel(
    cost=np.array([1.0]), col_lo=np.array([0.0]), col_hi=np.array([10.0]),
    integer=np.array([True]), row_lo=np.array([1.5]), row_hi=np.array([np.inf]),
    a_row=np.array([0]), a_col=np.array([0]), a_val=np.array([1.0]),
)
for _ in range(2):
    sol = solve(model, solver={solver!r})
    assert sol.status == "optimal" and sol.solver == {solver!r} and sol.x[0] == 2.0, sol
"""


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_a_solve_writes_nothing_to_stdout(solver: str) -> None:
    operator_dir = Path(sageserve.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(operator_dir)}
    done = subprocess.run(
        [sys.executable, "-c", SOLVE_ONE.format(solver=solver)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
