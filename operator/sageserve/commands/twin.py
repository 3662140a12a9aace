"""`sageserve twin`: the command line of the metrics twin.

Module-level imports are typer and the standard library only, so registering the command
in `sageserve.cli` keeps `sageserve --help` instant; the twin's modules load when it runs.
"""

from __future__ import annotations

import logging
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

#: The trace used when --trace is not given (in a source checkout).
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[3]
    / "data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"
)

log = logging.getLogger("sageserve.twin")


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    out = {}
    for v in values or []:
        key, sep, value = v.rpartition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{v!r}: use KEY=VALUE", param_hint=option)
        out[key] = value
    return out


def twin_command(
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Azure LLM 2023 CSV (.csv[.gz]) or ServeGen *_client_windows_10min.csv.xz; "
            "repeats when it ends (default: the bundled Azure conversation trace)."
        ),
    ] = None,
    scale: Annotated[float, typer.Option(help="Multiplies the trace's request rate.")] = 1.0,
    speed: Annotated[
        float, typer.Option(help="Simulated seconds per wall second (60: an hour a minute).")
    ] = 1.0,
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Watch these namespaces (default: all)."),
    ] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="Default: $KUBECONFIG, ~/.kube/config, in-cluster.")
    ] = None,
    load_profile: Annotated[
        str | None,
        typer.Option(
            help="Rate multiplier over trace time, linear between points, e.g. "
            "'0:1,30m:3,1h:0.5' (times from the trace's start)."
        ),
    ] = None,
    endpoint_scale: Annotated[
        list[str] | None,
        typer.Option(
            help="PATTERN=FACTOR over namespace/model-deployment/region, e.g. "
            "'*/bloom-176b/us-west=0.5' (repeatable)."
        ),
    ] = None,
    profile: Annotated[
        list[str] | None,
        typer.Option(
            help="MODEL_DEPLOYMENT=PERF_PROFILE (repeatable); else the ModelDeployment's "
            "sageserve.io/perf-profile annotation, else its name."
        ),
    ] = None,
    default_profile: Annotated[
        str | None, typer.Option(help="Perf profile for model deployments matching none.")
    ] = None,
    trace_start: Annotated[
        str | None,
        typer.Option(help="Trace time at start, e.g. 6h (default: the backfilled hours, or 0)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of every random draw.")] = 0,
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port (0: a free one, printed).")] = 0,
    targets_file: Annotated[
        Path | None,
        typer.Option(help="Write a Prometheus file_sd file with one target per serving pod."),
    ] = None,
    refresh_seconds: Annotated[float, typer.Option(help="Re-list pods this often.")] = 1.0,
    pod_listeners: Annotated[
        bool,
        typer.Option(
            help="Also answer at each serving pod's own address (podIP:containerPort: "
            "/metrics, /health, /v1/...), as its vLLM would, for clients that find pods by "
            "IP (an endpoint picker). Needs pod IPs this host can bind (the e2e kit gives "
            "KWOK pods loopback addresses)."
        ),
    ] = False,
    backfill_hours: Annotated[
        float, typer.Option(help="Simulate this many hours of history into Prometheus first.")
    ] = 0.0,
    backfill_step: Annotated[float, typer.Option(help="Seconds between history samples.")] = 15.0,
    backfill_histograms: Annotated[
        bool, typer.Option(help="Include the latency histograms in the history (larger).")
    ] = False,
    backfill_dir: Annotated[
        Path | None,
        typer.Option(help="Where the OpenMetrics file and blocks go (default: a temp dir)."),
    ] = None,
    prometheus_data: Annotated[
        Path | None,
        typer.Option(help="Move the blocks into this Prometheus data directory."),
    ] = None,
    scrape_job: Annotated[
        str,
        typer.Option(
            help="`job` label of the history: the job that scrapes --targets-file, so "
            "history and live samples are one series (the e2e Prometheus: sageserve-e2e)."
        ),
    ] = "sageserve-e2e",
    backfill_only: Annotated[
        bool, typer.Option(help="Exit after the backfill instead of serving.")
    ] = False,
    promtool: Annotated[str, typer.Option(help="The promtool binary.")] = "promtool",
    log_level: Annotated[str, typer.Option(help="debug, info or warning.")] = "info",
) -> None:
    """Serve vLLM metrics for the cluster's pod-set pods, simulated from a trace (the twin)."""
    from sageserve.perf.model import load_catalog
    from sageserve.sim.workload import parse_duration
    from sageserve.twin.backfill import backfill, install_blocks
    from sageserve.twin.clock import AcceleratedClock
    from sageserve.twin.load import LoadControl, LoadShape, PerfResolver, TraceSource, TwinSim
    from sageserve.twin.pods import ClusterPods
    from sageserve.twin.runner import Twin

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        factors = {k: float(v) for k, v in _pairs(endpoint_scale, "--endpoint-scale").items()}
        load = LoadControl(scale, LoadShape.parse(load_profile) if load_profile else None, factors)
        source = TraceSource(trace or DEFAULT_TRACE)
        history_s = backfill_hours * 3600.0
        start = parse_duration(trace_start) if trace_start is not None else history_s
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    resolver = PerfResolver(load_catalog(), _pairs(profile, "--profile"), default_profile)
    cluster = ClusterPods(namespace or [], kubeconfig)

    def read_annotations(namespaces: set[str]) -> None:
        for ns in namespaces:
            for md, name in cluster.perf_profiles(ns).items():
                resolver.annotations[(ns, md)] = name

    sim = TwinSim(source, resolver.resolve, load, start=start - history_s, seed=seed)
    twin = Twin(
        sim,
        AcceleratedClock(speed, start),  # from here on, trace time `start` is now
        cluster.list,
        host,
        port,
        targets_file,
        refresh_s=refresh_seconds,
        on_new_namespaces=read_annotations,
        pod_listeners=pod_listeners,
    )
    if history_s > 0:
        unix_end = time.time()
        serving = [p for p in cluster.list() if p.serving]
        read_annotations({p.namespace for p in serving})
        if not serving:
            typer.echo("backfill: no serving pod-set pods yet, nothing to backfill", err=True)
            sim.now = start
        else:
            work = backfill_dir or Path(tempfile.mkdtemp(prefix="sageserve-twin-"))
            labels = {"job": scrape_job, "instance": twin.address}
            result = backfill(
                sim,
                serving,
                history_s,
                backfill_step,
                unix_end,
                work,
                labels,
                backfill_histograms,
                promtool,
            )
            typer.echo(
                f"backfill: {backfill_hours:g} h of {len(serving)} pod(s): {result.series} series, "
                f"{result.samples} samples, {result.bytes / 1e6:.1f} MB OpenMetrics "
                f"(simulated in {result.simulate_s:.1f} s, promtool {result.promtool_s:.1f} s), "
                f"{len(result.blocks)} block(s)"
            )
            if prometheus_data is not None:
                install_blocks(result.blocks, prometheus_data)
                typer.echo(
                    f"backfill: blocks moved into {prometheus_data}; Prometheus loads them "
                    "within a minute"
                )
            else:
                typer.echo(
                    f"backfill: blocks in {work / 'blocks'}; move them into Prometheus's data "
                    "directory (or pass --prometheus-data)"
                )
    if backfill_only:
        twin.server.server_close()
        return
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    twin.start()
    typer.echo(
        f"twin: serving on http://{twin.address} (/metrics/<namespace>/<pod>, /metrics/pods, "
        f"/status, POST /load), speed {speed:g}x, trace time {start:g} s"
        + (f", targets in {targets_file}" if targets_file else "")
        + (", and at each serving pod's IP and port" if pod_listeners else ""),
    )
    try:
        while not stop.wait(1.0):
            pass
    finally:
        twin.stop()
        cluster.close()
