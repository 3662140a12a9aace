"""JSON-lines request traces: read like the Azure CSVs, bad lines named by line and field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sageserve.core.types import DEFAULT_TIERS
from sageserve.sim import traces
from sageserve.sim.workload import load_workload, requests


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_requests_come_back_in_time_order_relative_to_the_first(tmp_path: Path) -> None:
    p = _write(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 5000, "input_length": 10, "output_length": 3, "hash_ids": [1, 2]},
            {"timestamp": 2000, "input_length": 700, "output_length": 40},
            {"timestamp": 2500.5, "input_length": 1, "output_length": 1},
        ],
    )
    rows = list(traces.jsonl_rows(p))
    assert [(r.t, r.prompt, r.output) for r in rows] == [
        (0.0, 700, 40),
        (pytest.approx(0.5005), 1, 1),
        (3.0, 10, 3),
    ]


def test_gzip_and_blank_lines_are_read(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write('{"timestamp": 0, "input_length": 5, "output_length": 6}\n\n')
        f.write('{"timestamp": 1000, "input_length": 7, "output_length": 8}\n')
    assert traces.request_trace(p) == [(0.0, 5, 6), (1.0, 7, 8)]


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"timestamp": 1, "input_length": 5}', r"t.jsonl:2: field 'output_length' is missing"),
        (
            '{"timestamp": 1, "input_length": -3, "output_length": 2}',
            r"t.jsonl:2: field 'input_length' must be a positive integer, got -3",
        ),
        (
            '{"timestamp": 1, "input_length": 2.5, "output_length": 2}',
            r"t.jsonl:2: field 'input_length' must be a positive integer",
        ),
        (
            '{"timestamp": "noon", "input_length": 5, "output_length": 2}',
            r"t.jsonl:2: field 'timestamp' must be a number of milliseconds",
        ),
        (
            '{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": "ab"}',
            r"t.jsonl:2: field 'hash_ids' must be a list of integers",
        ),
        ("[1, 2, 3]", r"t.jsonl:2: not a JSON object, got list"),
        ("{timestamp: 1}", r"t.jsonl:2: not a JSON object"),
    ],
)
def test_a_bad_line_is_refused_naming_the_line_and_the_field(
    tmp_path: Path, line: str, match: str
) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 5, "output_length": 6}\n' + line + "\n")
    with pytest.raises(traces.TraceFormatError, match=match):
        list(traces.jsonl_rows(p))


def test_a_workload_source_of_type_jsonl_drives_the_simulator(tmp_path: Path) -> None:
    _write(
        tmp_path / "t.jsonl",
        [{"timestamp": 1000 * i, "input_length": 100 + i, "output_length": 5} for i in range(30)],
    )
    (tmp_path / "workload.yaml").write_text(
        "window: {start: 0, duration: 20s}\n"
        "sources:\n"
        "- {name: t, type: jsonl, path: t.jsonl, models: m, regions: r1, tiers: IW-F}\n"
    )
    wl = load_workload(tmp_path / "workload.yaml")
    got = list(requests(wl, DEFAULT_TIERS))
    assert [r.prompt_tokens for r in got] == [100 + i for i in range(20)]
    assert {(r.model, r.region, r.tier.name) for r in got} == {("m", "r1", "IW-F")}
