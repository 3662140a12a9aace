"""History for Prometheus: the twin's metrics over past hours, as TSDB blocks.

The forecaster needs hours to days of tokens/s per (model, region) before its first plan.
The twin simulates the hours before its start on the pods that run now (as if they had
been running all along), samples every pod's metrics every `step` seconds, writes them as
OpenMetrics text with timestamps, and turns that into blocks with
`promtool tsdb create-blocks-from openmetrics`. Moving the blocks into Prometheus's data
directory makes them queryable at its next block reload (at most a minute; Prometheus
≥ 2.39 accepts blocks that overlap its head, older ones need
`--storage.tsdb.allow-overlapping-blocks`).

The series carry the labels a live scrape of the twin adds (pod labels, `job`,
`instance`), and the simulation that produced the history goes on live, so history and
live samples form one series per pod, with counters continuing rather than resetting.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TextIO

from prometheus_client.core import Metric

from sageserve.twin.exposition import encode, families
from sageserve.twin.load import TwinSim
from sageserve.twin.pods import PodInfo


@cache
def _encoded(family: str, typ: str, sample: str) -> tuple[str, str]:
    """(family name, sample name) as prometheus-client's OpenMetrics encoder writes them.

    Asked of the encoder itself, because its escaping differs between versions and between
    header and sample lines (0.22+ writes `vllm:x` in `# TYPE` and `vllm_x` in samples):
    history must carry exactly the names Prometheus stores when it scrapes the live twin.
    """
    probe = Metric(family, "probe", typ)
    probe.add_sample(sample, {}, 0.0)
    lines = encode([probe], "application/openmetrics-text; version=1.0.0")[0].decode()
    header = next(ln.split(" ")[2] for ln in lines.splitlines() if ln.startswith("# TYPE "))
    body = next(ln for ln in lines.splitlines() if not ln.startswith("#"))
    return header, body.split(" ", 1)[0].split("{", 1)[0]


@dataclass(frozen=True)
class BackfillResult:
    """What a backfill produced."""

    openmetrics: Path
    blocks: tuple[Path, ...]
    series: int
    samples: int
    bytes: int
    simulate_s: float
    promtool_s: float


def _number(v: float) -> str:
    """A sample value or timestamp as Prometheus's text formats write it."""
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    if v != v:
        return "NaN"
    return repr(float(v))


def _label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(items: Sequence[tuple[str, str]]) -> str:
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_label_value(v)}"' for k, v in items) + "}"


class _Recorder:
    """Sample values per series over a fixed time grid, grouped by metric family."""

    def __init__(self) -> None:
        self.times = array("d")
        # family name -> (type, help, {(base labels) -> {(sample name, labels) -> values}})
        self.families: dict[
            str,
            tuple[str, str, dict[tuple[tuple[str, str], ...], dict[tuple[str, str], array[float]]]],
        ] = {}

    def record(self, ts: float, metrics: Sequence[Metric], extra: Mapping[str, str]) -> None:
        step = len(self.times)
        self.times.append(ts)
        for m in metrics:
            fam = self.families.setdefault(m.name, (m.type, m.documentation, {}))[2]
            for s in m.samples:
                labels = {**s.labels, **extra}
                base = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
                key = (s.name, _labels(sorted(labels.items())))
                values = fam.setdefault(base, {}).setdefault(key, array("d"))
                if len(values) != step:  # a series that was missing: pad (never happens
                    values.extend([float("nan")] * (step - len(values)))  # with fixed pods)
                values.append(float(s.value))

    def write(self, out: TextIO) -> tuple[int, int]:
        """OpenMetrics text; each metric point's samples (a histogram's buckets, count and
        sum) stay together, points of a series in time order. Returns (series, samples)."""
        series = samples = 0
        times = [_number(round(t, 3)) for t in self.times]
        for name, (typ, doc, groups) in self.families.items():
            header = ""
            for group in groups.values():
                keys = list(group)
                series += len(keys)
                names = [_encoded(name, typ, sample) for sample, _ in keys]
                if not header:
                    header = names[0][0]
                    out.write(f"# HELP {header} {doc}\n# TYPE {header} {typ}\n")
                prefixes = [n[1] + labels for n, (_, labels) in zip(names, keys, strict=True)]
                columns = [group[k] for k in keys]
                for i, ts in enumerate(times):
                    for prefix, values in zip(prefixes, columns, strict=True):
                        if i < len(values) and values[i] == values[i]:  # skip NaN padding
                            out.write(f"{prefix} {_number(values[i])} {ts}\n")
                            samples += 1
        out.write("# EOF\n")
        return series, samples


def simulate_history(
    sim: TwinSim,
    pods: Sequence[PodInfo],
    seconds: float,
    step: float,
    unix_end: float,
    out: TextIO,
    extra_labels: Mapping[str, str] | None = None,
    histograms: bool = False,
) -> tuple[int, int]:
    """Run `sim` from `sim.now` for `seconds` on `pods` (all serving), sampling every
    `step`; the last sample is stamped `unix_end`. Writes OpenMetrics to `out` and returns
    (series, samples). `sim` is left at the end of the history, ready to go on live."""
    if step <= 0 or seconds < step:
        raise ValueError(f"need step > 0 and at least one step of history (got {seconds}, {step})")
    sim.sync([replace(p, serving=True) for p in pods])
    rec = _Recorder()
    start = sim.now
    n = int(seconds // step)
    extra = dict(extra_labels or {})
    for k in range(1, n + 1):
        t = start + k * step
        sim.advance(t)
        fams = families(sim.samples(), with_pod_labels=True, histograms=histograms)
        rec.record(unix_end - (start + n * step - t), fams, extra)
    return rec.write(out)


def create_blocks(openmetrics: Path, out_dir: Path, promtool: str = "promtool") -> list[Path]:
    """`promtool tsdb create-blocks-from openmetrics`; returns the new block directories."""
    out_dir.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in out_dir.iterdir()}
    proc = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(out_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"promtool could not create blocks from {openmetrics} (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return sorted(
        p for p in out_dir.iterdir() if p.is_dir() and p.name not in before and p.name != "wal"
    )


def install_blocks(blocks: Sequence[Path], data_dir: Path) -> list[Path]:
    """Move blocks into a Prometheus data directory (picked up at its next block reload)."""
    if not data_dir.is_dir():
        raise FileNotFoundError(f"{data_dir}: no Prometheus data directory")
    moved = []
    for b in blocks:
        dest = data_dir / b.name
        shutil.move(str(b), str(dest))
        moved.append(dest)
    return moved


def backfill(
    sim: TwinSim,
    pods: Sequence[PodInfo],
    seconds: float,
    step: float,
    unix_end: float,
    work_dir: Path,
    extra_labels: Mapping[str, str] | None = None,
    histograms: bool = False,
    promtool: str = "promtool",
) -> BackfillResult:
    """Simulate `seconds` of history into `work_dir/history.om.txt`, then blocks under
    `work_dir/blocks`."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "history.om.txt"
    started = time.monotonic()
    with path.open("w") as f:
        series, samples = simulate_history(
            sim, pods, seconds, step, unix_end, f, extra_labels, histograms
        )
    simulated = time.monotonic() - started
    started = time.monotonic()
    blocks = create_blocks(path, work_dir / "blocks", promtool)
    return BackfillResult(
        path,
        tuple(blocks),
        series,
        samples,
        path.stat().st_size,
        simulated,
        time.monotonic() - started,
    )
