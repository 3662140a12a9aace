"""``python -m e2e.cluster build|up|down|env|status``: the one entry point of the test cluster.

Why one CLI: CI, ``scripts/setup``, developers and the pytest fixtures all drive the
same code paths, so what works by hand works in tests.

Providers:

- kwok (default): kwokctl --runtime binary on binaries built by ``build``; no Docker.
- kind: on machines with a Docker engine (``kind`` on PATH). The kwok controller is
  installed in-cluster and the GPU nodes come from the same inventory. Not run in CI.
  Use: ``python -m e2e.cluster up --provider kind``, then
  ``eval "$(python -m e2e.cluster env)"``.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Annotated

import typer

from e2e import gobuild, keda, lifecycle, versions
from e2e.kind_cluster import KindError
from e2e.kubectl import KubectlError
from e2e.kwok_cluster import ClusterError
from e2e.prometheus import PrometheusError
from e2e.state import load

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown")


@app.callback(help=__doc__)
def main() -> None:
    """Real Kubernetes control plane (kwokctl, binary runtime) + Prometheus for tests."""


@app.command()
def build(
    force: Annotated[bool, typer.Option(help="Rebuild even if the right version exists.")] = False,
    only: Annotated[
        list[str] | None, typer.Option(help="Only these: kubernetes, etcd, kwok, helm, keda.")
    ] = None,
) -> None:
    """Build (or reuse) kube-apiserver & co, etcd, kwok, kwokctl and helm into the cache."""
    start = time.monotonic()
    try:
        times = gobuild.build_all(force=force, only=only or ())
    except gobuild.BuildError as err:
        typer.echo(f"BUILD FAILED: {err}", err=True)
        raise typer.Exit(1) from err
    for name, secs in times.items():
        typer.echo(f"  {name:<12} {secs:7.0f}s")
    typer.echo(f"  {'total':<12} {time.monotonic() - start:7.0f}s  -> {versions.bin_dir()}")


@app.command()
def up(
    provider: Annotated[str, typer.Option(help="kwok (local binaries) or kind (Docker).")] = "kwok",
    inventory_name: Annotated[
        str, typer.Option("--inventory", help="Inventory file or name in e2e/inventory/.")
    ] = "small",
    node_image: Annotated[str, typer.Option(help="kind only: node image.")] = "",
    with_keda: Annotated[
        bool,
        typer.Option(
            "--keda",
            help="Also start KEDA's operator and metrics adapter (kwok only; built if missing).",
        ),
    ] = False,
) -> None:
    """Start the cluster, create the GPU nodes, start Prometheus; wait until all are ready."""
    if with_keda and provider != "kwok":
        typer.echo("UP FAILED: --keda runs KEDA as local processes: use --provider kwok", err=True)
        raise typer.Exit(2)
    try:
        if with_keda and "keda" in gobuild.missing_components():
            gobuild.build_all(only=["keda"])
        state = lifecycle.up(provider, inventory_name, node_image or None)
        if with_keda:
            started = keda.start(Path(state.kubeconfig))
            typer.echo(
                f"keda: operator {started.operator_grpc}, adapter {started.host_ip}:"
                f"{started.adapter_port}, logs {Path(started.operator_log).parent}"
            )
    except (
        gobuild.BuildError,
        keda.KedaError,
        lifecycle.EnvironmentNotReady,
        ClusterError,
        KindError,
        PrometheusError,
        KubectlError,
        TimeoutError,
        FileNotFoundError,
        ValueError,
    ) as err:
        typer.echo(f"UP FAILED: {err}", err=True)
        raise typer.Exit(1) from err
    typer.echo(f"up: KUBECONFIG={state.kubeconfig} prometheus={state.prometheus_url}")


@app.command()
def down() -> None:
    """Stop every process ``up`` started and remove its state."""
    lifecycle.down()


@app.command()
def env() -> None:
    """Print ``export`` lines for the running cluster (use with ``eval``)."""
    state = load()
    if state is None:
        typer.echo("# nothing is up: run `python -m e2e.cluster up`", err=True)
        raise typer.Exit(1)
    for key, value in state.env().items():
        typer.echo(f"export {key}={shlex.quote(value)}")
    typer.echo(f'export PATH={shlex.quote(state.bin_dir)}:"$PATH"')


@app.command()
def status() -> None:
    """Report what is up and whether it answers; exit 1 when something is not ready."""
    state, report = lifecycle.status()
    if state is not None:
        typer.echo(f"provider: {state.provider}   kubeconfig: {state.kubeconfig}")
    missing = gobuild.missing_components()
    have = "all present" if not missing else "missing " + ", ".join(missing)
    typer.echo(f"binaries ({versions.bin_dir()}): {have}")
    for key, value in report.items():
        typer.echo(f"{key}: {value}")
    if state is None or any("NOT" in v for v in report.values()):
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
