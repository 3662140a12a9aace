"""Bodies of ``sageserve plan`` and ``sageserve bench plan``."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from sageserve.plan.ilp import PlanOptions, solve_plan
from sageserve.plan.problem import PlanProblem


class PlanInputError(ValueError):
    """Bad problem.json; the message names each offending field."""


def load_problem(path: Path) -> PlanProblem:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanInputError(f"{path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanInputError(f"{path}: not valid JSON: {exc}") from None
    try:
        return PlanProblem.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(part) for part in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{loc}: {msg}" if loc else msg)
        raise PlanInputError(f"{path}: invalid plan input:\n  " + "\n  ".join(lines)) from None


def plan_command(input_path: Path, output: Path | None, options: PlanOptions) -> str:
    """Solve and return the JSON text (also written to ``output`` when given)."""
    problem = load_problem(input_path)
    result = solve_plan(problem, options)
    text = result.model_dump_json(indent=2, exclude_none=True) + "\n"
    if output is not None:
        output.write_text(text, encoding="utf-8")
    return text


def bench_plan_command(
    sizes: list[tuple[int, int, int]],
    seeds: int,
    options: PlanOptions,
    console: Console,
    inventory: bool = True,
) -> None:
    from sageserve.plan.bench import bench_plan

    table = Table(
        title=f"solve_plan on synthetic fleets ({options.solver}, gap {options.mip_gap:g}, "
        f"limit {options.time_limit:g} s, {options.threads} thread, "
        f"{'with' if inventory else 'without'} GPU inventory)"
    )
    for col in ("size m×r×g", "seed", "status", "solve s", "gap", "objective"):
        table.add_column(col, justify="right")
    for row in bench_plan(sizes, seeds, options, inventory):
        table.add_row(
            row.size,
            str(row.seed),
            row.status,
            f"{row.seconds:.2f}",
            "-" if row.gap is None else f"{row.gap:.2e}",
            "-" if row.objective is None else f"{row.objective:.1f}",
        )
    console.print(table)
