"""The `sageserve` command line.

Commands import their heavy modules inside the function body so that `sageserve --help`
stays instant and a missing optional dependency only affects the command that needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sageserve import __version__

app = typer.Typer(
    name="sageserve",
    help="Forecast-aware autoscaling of LLM inference fleets on Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


@app.command()
def version() -> None:
    """Print the sageserve version."""
    console.print(f"sageserve {__version__}")


@app.command()
def crds(
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Write one file per CRD here instead of printing."),
    ] = None,
    check: Annotated[
        bool,
        typer.Option("--check", help="Exit 1 if the files in --output-dir are not up to date."),
    ] = False,
) -> None:
    """Print the CustomResourceDefinitions, or write them into a directory."""
    from sageserve.api.crd import render_all, write_all

    rendered = render_all()
    if output_dir is None:
        if check:
            err_console.print("--check needs --output-dir")
            raise typer.Exit(2)
        typer.echo("---\n".join(rendered.values()), nl=False)
        return
    if check:
        stale = [
            name
            for name, text in rendered.items()
            if not (output_dir / name).is_file()
            or (output_dir / name).read_text(encoding="utf-8") != text
        ]
        for name in stale:
            err_console.print(
                f"{output_dir / name}: out of date; run `sageserve crds -o {output_dir}`"
            )
        raise typer.Exit(1 if stale else 0)
    for path in write_all(output_dir):
        console.print(f"wrote {path}")


@app.command()
def validate(
    paths: Annotated[
        list[Path] | None, typer.Argument(help="Manifest files or directories.", show_default=False)
    ] = None,
    files: Annotated[
        list[Path] | None,
        typer.Option("--file", "-f", help="Manifest file or directory (repeatable)."),
    ] = None,
) -> None:
    """Check manifests offline against the CRD schemas and their CEL rules.

    Prints one line per problem (file, object, field path, fix) and exits 1 if any.
    """
    from sageserve.api.validate import validate_paths

    files = [*(paths or []), *(files or [])]
    if not files:
        err_console.print("give manifests to check: sageserve validate -f FILE|DIR")
        raise typer.Exit(2)
    missing = [p for p in files if not p.exists()]
    for path in missing:
        err_console.print(f"{path}: no such file or directory")
    if missing:
        raise typer.Exit(2)
    report = validate_paths(files)
    for problem in report.problems:
        err_console.print(str(problem), markup=False, highlight=False, soft_wrap=True)
    for warning in report.warnings:
        err_console.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
    summary = (
        f"{report.checked} sageserve object(s) in {report.files} file(s), "
        f"{report.skipped} other document(s) skipped: "
    )
    if report.ok:
        console.print(summary + "[green]valid[/green]")
        return
    console.print(summary + f"[red]{len(report.problems)} problem(s)[/red]")
    raise typer.Exit(1)


@app.command("operator")
def run_operator(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Watch only these namespaces (default: all)."),
    ] = None,
    standalone: Annotated[
        bool, typer.Option(help="Run without peering (a single replica).")
    ] = True,
    liveness: Annotated[
        str | None,
        typer.Option(help="Serve liveness probes here, e.g. http://0.0.0.0:8080/healthz."),
    ] = None,
) -> None:
    """Run the operator against the cluster of the current kubeconfig (or in-cluster)."""
    import kopf

    import sageserve.controller.handlers  # noqa: F401  (registers the handlers)

    kopf.run(
        standalone=standalone,
        clusterwide=not namespace,
        namespaces=namespace or [],
        liveness_endpoint=liveness,
    )


@app.command()
def simulate(
    scenario: Annotated[
        Path | None,
        typer.Option("--scenario", "-s", help="Scenario directory (default: scenarios/default)."),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option("--policy", "-p", help="Comma-separated strategies, e.g. reactive,siloed "
                     "(default: the scenario's list)."),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for summary.json, minutes.csv, report.")
    ] = Path("out/simulate"),
    seed: Annotated[
        int | None, typer.Option(help="Override the workload's seed.")
    ] = None,
    report: Annotated[bool, typer.Option(help="Write PNG plots and report.html.")] = True,
) -> None:
    """Replay a scenario's traces against simulated fleets, one run per policy, and compare."""
    from sageserve.sim.commands import simulate as run

    names = [p.strip() for p in policy.split(",") if p.strip()] if policy else None
    try:
        run(scenario, names, out, seed, report, console)
    except (FileNotFoundError, ValueError, KeyError) as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


bench_app = typer.Typer(
    help="Benchmarks (figures are printed, not asserted).", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")


@bench_app.command("sim")
def bench_sim(
    scenario: Annotated[
        Path | None, typer.Option("--scenario", "-s", help="Scenario (default: scenarios/default).")
    ] = None,
    policy: Annotated[str, typer.Option("--policy", "-p")] = "reactive",
    hours: Annotated[
        float | None, typer.Option(help="Override the window length (hours).")
    ] = None,
) -> None:
    """Simulated requests per wall-second, events per second and peak RSS of one run."""
    from sageserve.sim.commands import bench_sim as run

    run(scenario, policy, hours, console)


if __name__ == "__main__":
    app()
