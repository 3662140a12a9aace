"""`sageserve compare` end to end on the tiny scenario: the summary holds every point and
each frontier, the report is written, bad input stops before any run, and a Dask cluster
gives the same points as the local pool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.commands.compare import compare
from sageserve.compare.grid import expand, parse_grid
from sageserve.compare.output import SCHEMA
from sageserve.compare.runner import Backend, DaskBackend, LocalBackend, Outcome, Task, run_all

TINY = Path(__file__).parents[1] / "sim" / "fixtures" / "tiny"
GRID = [
    "--grid",
    "reactive:thresholds.scaleOutEmu=0.5,0.7",
    "--grid",
    "lt-ua:forecast.quantile=0.5,0.9",
]


def run_cli(out: Path, *extra: str) -> tuple[int, str]:
    args = ["compare", "-s", str(TINY), "-o", str(out), "-p", "reactive,lt-ua", *GRID, *extra]
    res = CliRunner().invoke(app, args)
    return res.exit_code, res.output


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("compare")
    code, output = run_cli(out, "--workers", "2")
    assert code == 0, output
    return out, output


@pytest.mark.slow
def test_compare_writes_every_point_and_each_frontier(tiny_run: tuple[Path, str]) -> None:
    tmp_path, output = tiny_run
    assert "GPU-hours at 95.00% iw-f attainment" in output
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["schema"] == SCHEMA
    assert (doc["tier"], doc["target"], doc["baseline"]) == ("iw-f", 0.95, "reactive")
    assert doc["runs"]["count"] == 4 and doc["runs"]["failed"] == 0
    assert doc["bounds"]["floor_gpu_hours"] <= doc["bounds"]["oracle_gpu_hours"]
    assert list(doc["policies"]) == ["reactive", "lt-ua"]
    for name, labels in (
        ("reactive", ["scaleOutEmu=0.5", "scaleOutEmu=0.7"]),
        ("lt-ua", ["quantile=0.5", "quantile=0.9"]),
    ):
        p = doc["policies"][name]
        assert [q["label"] for q in p["points"]] == labels
        for q in p["points"]:
            assert q["error"] is None
            assert 0.0 <= q["attainment"] <= 1.0 and q["gpu_hours"] > 0
            assert q["summary"]["fleet"]["gpu_hours"]["internal"] == q["gpu_hours"]
            assert q["settings"][0].startswith(next(iter(q["knobs"])))
        # the frontier is made of the points marked on it, cheapest first
        front = [(f["label"], f["gpu_hours"], f["attainment"]) for f in p["frontier"]]
        marked = sorted(
            (
                (q["label"], q["gpu_hours"], q["attainment"])
                for q in p["points"]
                if q["on_frontier"]
            ),
            key=lambda t: t[1],
        )
        assert front == marked and front
        at = p["at_target"]
        assert at["status"] in {"exact", "interpolated", "at-most", "unreachable"}
        assert (at["gpu_hours"] is None) == (at["status"] == "unreachable")
    for f in ("report.html", "frontier.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert "frontier.png" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_a_log_gets_a_line_per_run_and_the_output_ends_with_the_pick(
    tiny_run: tuple[Path, str],
) -> None:
    tmp_path, output = tiny_run
    doc = json.loads((tmp_path / "summary.json").read_text())
    flat = " ".join(output.split())  # rich wraps at the terminal's width
    assert "iw-f (TTFT ≤ 1 s) attainment, target 95.00%" in flat
    for policy in doc["policies"].values():
        for q in policy["points"]:
            assert f"{q['label']}: done," in flat
    assert [f"{i}/4 " in flat for i in range(1, 5)] == [True] * 4
    assert flat.endswith(doc["recommendation"])


@pytest.mark.slow
def test_from_reads_the_same_points_at_another_target(
    tiny_run: tuple[Path, str], tmp_path: Path
) -> None:
    first = json.loads((tiny_run[0] / "summary.json").read_text())
    args = ["compare", "--from", str(tiny_run[0] / "summary.json"), "--target", "1.0"]
    res = CliRunner().invoke(app, [*args, "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["target"] == 1.0
    for name, p in again["policies"].items():
        assert p["points"] == first["policies"][name]["points"]
        assert p["frontier"] == first["policies"][name]["frontier"]
        best = p["frontier"][-1]
        status = "exact" if best["attainment"] == 1.0 else "unreachable"
        assert p["at_target"]["status"] == status
    res = CliRunner().invoke(app, [*args, "-o", str(tiny_run[0])])
    assert res.exit_code == 2 and "would overwrite" in res.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            [
                "--grid",
                "reactive:thresholds.scaleOutEmu=0.2,0.7",
                "--set",
                "thresholds.scaleInEmu=0.5",
            ],
            "scaleInEmu must be below",
        ),
        (["--grid", "siloed:thresholds.scaleOutEmu=0.5"], "add it to --policy"),
        (["--target", "95"], "--target 95.0"),
        (["--tier", "nope"], "--tier 'nope'"),
    ],
)
def test_bad_input_stops_before_any_run(tmp_path: Path, extra: list[str], message: str) -> None:
    code, output = run_cli(tmp_path, *extra)
    assert code == 2, output
    assert message in " ".join(output.split())  # rich wraps at the terminal's width
    assert not (tmp_path / "summary.json").exists()


def _figures(doc: dict[str, Any]) -> dict[tuple[str, str], tuple[float, float]]:
    return {
        (name, q["label"]): (q["gpu_hours"], q["attainment"])
        for name, p in doc["policies"].items()
        for q in p["points"]
    }


@pytest.mark.slow
def test_a_dask_cluster_gives_the_same_points_as_the_local_pool(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    console = Console(width=200, record=True)
    grids = ["reactive:thresholds.scaleOutEmu=0.5,0.7"]
    local = compare(
        TINY,
        ["reactive"],
        0.95,
        tmp_path / "local",
        console,
        workers=1,
        grids=grids,
        bounds=False,
        report=False,
    )
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        remote = compare(
            TINY,
            ["reactive"],
            0.95,
            tmp_path / "dask",
            console,
            address=cluster.scheduler_address,
            grids=grids,
            bounds=False,
            report=False,
        )
    assert remote["runs"]["backend"].startswith(f"Dask cluster {cluster.scheduler_address}")
    assert remote["runs"]["failed"] == 0
    assert _figures(remote) == _figures(local)
    assert remote["policies"]["reactive"]["frontier"] == local["policies"]["reactive"]["frontier"]


def _progress_of(backend: Backend) -> dict[int, list[float]]:
    jobs = expand(["reactive"], parse_grid(["reactive:thresholds.scaleOutEmu=0.6,0.7"]))
    tasks = [Task(i, str(TINY.resolve()), j, None) for i, j in enumerate(jobs)]
    seen: dict[int, list[float]] = {t.index: [] for t in tasks}
    done: list[Outcome] = []
    try:
        outcomes, _ = run_all(backend, tasks, lambda i, f: seen[i].append(f), done.append)
    finally:
        backend.close()
    assert [o.error for o in outcomes] == [None, None] and len(done) == 2
    return seen


@pytest.mark.slow
def test_progress_comes_back_from_pool_processes() -> None:
    for fractions in _progress_of(LocalBackend(2)).values():
        assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) > 2


@pytest.mark.slow
def test_progress_comes_back_from_dask_workers() -> None:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        seen = _progress_of(DaskBackend(cluster.scheduler_address))
    for fractions in seen.values():
        assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) > 2
