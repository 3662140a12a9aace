"""``python -m e2e.bench_operator``: the operator bench (``e2e/operator_bench.py``).

Why here and not in the package: the bench and starting a cluster are the test harness's
job, and the installed package never imports ``e2e/``. This entry starts a cluster whose
inventory is the bench's own N GPU nodes (in a private state dir unless ``--keep``), runs
the bench on it, and takes it down again. With ``--running`` it runs on a cluster that is
already up (``eval "$(python -m e2e.cluster env)"`` sets where it is; the bench adds the
nodes it needs).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from e2e import gobuild, lifecycle
from e2e.kind_cluster import KindError
from e2e.kubectl import KubectlError
from e2e.kwok_cluster import ClusterError
from e2e.operator_bench import (
    BenchConfig,
    BenchError,
    ClusterTarget,
    bench_operator_command,
    inventory_nodes,
    write_inventory,
)
from e2e.prometheus import PrometheusError

app = typer.Typer(add_completion=False)
console = Console()
err_console = Console(stderr=True)

UP_ERRORS = (
    lifecycle.EnvironmentNotReady,
    ClusterError,
    KindError,
    PrometheusError,
    KubectlError,
    TimeoutError,
    FileNotFoundError,
    ValueError,
)


@app.command()
def main(
    models: Annotated[int, typer.Option(help="ModelDeployments.")] = 200,
    regions: Annotated[int, typer.Option(help="Regions per ModelDeployment (1-3).")] = 3,
    variants: Annotated[int, typer.Option(help="GPU-type variants per model (1-2).")] = 2,
    nodes: Annotated[int, typer.Option(help="KWOK GPU nodes (3 regions x 2 GPU types).")] = 2000,
    changes: Annotated[
        int, typer.Option(help="Spec edits timed until the pod sets show them.")
    ] = 100,
    keep: Annotated[
        bool,
        typer.Option(
            help="Start the cluster in the session's state dir and leave it running "
            "(`python -m e2e.cluster down` stops it)."
        ),
    ] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write JSON here.")] = None,
    running: Annotated[
        bool,
        typer.Option(
            help="Run on the cluster that is up (KUBECONFIG, SAGESERVE_PROMETHEUS_URL, "
            'SAGESERVE_PROMETHEUS_TARGETS_DIR: `eval "$(python -m e2e.cluster env)"`) '
            "instead of starting one."
        ),
    ] = False,
    kubeconfig: Annotated[
        str | None, typer.Option(help="With --running: the cluster.", show_default=False)
    ] = None,
    prometheus_url: Annotated[
        str | None, typer.Option(help="With --running: its Prometheus.", show_default=False)
    ] = None,
    targets_dir: Annotated[
        Path | None,
        typer.Option(
            help="With --running: a file_sd directory that Prometheus reads.", show_default=False
        ),
    ] = None,
) -> None:
    """Start a KWOK cluster with the bench's nodes and run the operator bench on it (or, with
    --running, on the cluster that is up)."""
    config = BenchConfig(models, regions, nodes, variants, changes)
    if running:
        try:
            target = ClusterTarget.from_env(kubeconfig, prometheus_url, targets_dir)
            bench_operator_command(config, target, output, console)
        except BenchError as e:
            err_console.print(f"error: {e}", markup=False, highlight=False)
            raise typer.Exit(2) from None
        return
    missing = [c for c in gobuild.missing_components() if c in lifecycle.REQUIRED_FOR_KWOK]
    if missing:
        err_console.print(
            f"e2e binaries missing: {', '.join(missing)}; run `python -m e2e.cluster build` "
            "(about 20 minutes on 2 cores, once)"
        )
        raise typer.Exit(2)
    with tempfile.TemporaryDirectory(prefix="sageserve-bench-cluster-") as tmp:
        workdir = Path(tmp)
        inventory = write_inventory(inventory_nodes(nodes), workdir / "inventory.yaml")
        private = not keep and "SAGESERVE_E2E_STATE" not in os.environ
        if private:  # never the session's cluster, whose 12-node inventory tests count on
            os.environ["SAGESERVE_E2E_STATE"] = str(workdir / "cluster")
        console.print(f"starting a KWOK cluster with {nodes} GPU nodes")
        started = time.monotonic()
        try:
            try:
                state = lifecycle.up("kwok", inventory)
            except UP_ERRORS as e:
                err_console.print(f"UP FAILED: {e}", markup=False, highlight=False)
                raise typer.Exit(1) from None
            up_s = time.monotonic() - started
            target = ClusterTarget(
                state.kubeconfig, state.prometheus_url, Path(state.prometheus_dir) / "targets"
            )
            bench_operator_command(config, target, output, console, cluster_up_s=up_s)
        except BenchError as e:
            err_console.print(f"error: {e}", markup=False, highlight=False)
            raise typer.Exit(2) from None
        finally:
            if not keep:
                lifecycle.down()
            if private:
                os.environ.pop("SAGESERVE_E2E_STATE", None)


if __name__ == "__main__":
    app()
