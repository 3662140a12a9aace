"""`sageserve bench layout` runs end to end on a small trace (figures are printed, not
asserted; only their consistency is checked here)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from sageserve.commands.bench_layout import bench_layout_command


def _trace(path: Path) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(120):
        prompt, output = (2000 + 7 * i, 12) if i % 2 else (150 + i, 300 + 3 * i)
        lines.append(f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.0000000,{prompt},{output}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bench_layout_reports_search_against_homogeneous(tmp_path: Path) -> None:
    out_json = tmp_path / "layout.json"
    console = Console(file=io.StringIO(), width=160)
    out = bench_layout_command(
        "llama-2-70b",
        "NVIDIA-A100-SXM4-80GB",
        16,
        2,
        [_trace(tmp_path / "t.csv")],
        1.2,
        0,
        8,
        out_json,
        console,
    )
    assert json.loads(out_json.read_text())["search"]["layout"] == out["search"]["layout"]
    home, found = out["homogeneous"], out["search"]
    assert out["offered"] == pytest.approx(1.2 * home["capacity_at_mix"])
    assert found["throughput"] >= found["initial_throughput"] - 1e-6
    assert sum(len(t) for t in out["assignment"]["weights"]) == 2 * len(
        out["assignment"]["replicas"]
    )
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "layout search" in text and "wall time" in text
