"""History as OpenMetrics, turned into TSDB blocks by the real promtool."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import pytest

from sageserve.twin.backfill import backfill, install_blocks, simulate_history
from tests.twin.helpers import pod, sim

END = 1_750_000_000.0  # Unix seconds of the last sample
LIVE = {"job": "sageserve-e2e", "instance": "127.0.0.1:9999"}


def dump(blocks_dir: Path, match: str) -> list[tuple[str, float, int]]:
    """(series, value, timestamp ms) of every sample promtool reads back from the blocks."""
    (blocks_dir / "wal").mkdir(exist_ok=True)  # dump opens the directory as a database
    out = subprocess.run(
        ["promtool", "tsdb", "dump", f"--match={match}", str(blocks_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        m = re.fullmatch(r"(\{.*\}) (\S+) (\d+)", line)
        assert m, line
        rows.append((m.group(1), float(m.group(2)), int(m.group(3))))
    return rows


def test_history_text_is_openmetrics_with_timestamps_ending_at_the_given_time() -> None:
    s = sim(load=2)
    out = io.StringIO()
    series, samples = simulate_history(s, [pod("a")], 600, 60, END, out, LIVE)
    text = out.getvalue()
    assert text.endswith("# EOF\n")
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert len(lines) == samples == 10 * series
    stamps = sorted({float(ln.rsplit(" ", 1)[1]) for ln in lines})
    assert stamps[0] == END - 540 and stamps[-1] == END
    assert all('job="sageserve-e2e"' in ln and 'pod="a"' in ln for ln in lines)
    assert s.now == 600  # the simulation stands at the end of the history, ready to go on


@pytest.mark.integration
@pytest.mark.slow
def test_promtool_turns_the_history_into_blocks_holding_every_pod_series(tmp_path: Path) -> None:
    s = sim(load=2)
    result = backfill(s, [pod("a"), pod("b")], 3 * 3600, 30, END, tmp_path, LIVE, histograms=True)
    assert result.blocks and all((b / "meta.json").is_file() for b in result.blocks)
    blocks_dir = tmp_path / "blocks"
    kv = dump(blocks_dir, '{__name__=~"vllm[:_]kv_cache_usage_perc"}')
    assert {re.search(r'pod="(\w+)"', r[0]).group(1) for r in kv} == {"a", "b"}  # type: ignore[union-attr]
    assert len(kv) == 2 * 3 * 120
    assert min(r[2] for r in kv) == (END - 3 * 3600 + 30) * 1000
    assert max(r[2] for r in kv) == END * 1000
    prompt = [r for r in dump(blocks_dir, '{__name__=~"vllm[:_]prompt_tokens_total", pod="a"}')]
    values = [v for _, v, _ in sorted(prompt, key=lambda r: r[2])]
    assert values == sorted(values) and values[-1] > 0  # a counter: never goes down
    assert dump(blocks_dir, '{__name__=~"vllm[:_]time_to_first_token_seconds_bucket"}')


@pytest.mark.integration
def test_blocks_move_into_a_data_directory(tmp_path: Path) -> None:
    result = backfill(sim(), [pod("a")], 3600, 60, END, tmp_path / "work")
    data = tmp_path / "data"
    data.mkdir()
    moved = install_blocks(result.blocks, data)
    assert [p.name for p in moved] == [b.name for b in result.blocks]
    assert all((p / "meta.json").is_file() for p in moved)
    with pytest.raises(FileNotFoundError):
        install_blocks(moved, tmp_path / "missing")


def test_too_short_a_history_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one step"):
        simulate_history(sim(), [pod("a")], 10, 60, END, io.StringIO())
