"""The `sageserve` command line.

Commands import their heavy modules inside the function body so that `sageserve --help`
stays instant and a missing optional dependency only affects the command that needs it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sageserve import __version__
from sageserve.api.model_pool import DEFAULT_AWAKE_PER_INSTANCE

#: `simulate`'s and `compare`'s --reference (`sim.reference`)
ReferenceOption = Annotated[
    bool,
    typer.Option(
        help="Also run the achievable reference: LT-UA with the realised future as its "
        "forecast (forecast.method=realised), printed next to the bounds."
    ),
]

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


@app.command("keda-stubs")
def keda_stubs(
    output_dir: Annotated[
        Path,
        typer.Option("--output-dir", "-o", help="Where the generated modules live."),
    ] = Path("operator/sageserve/keda"),
    check: Annotated[
        bool,
        typer.Option("--check", help="Exit 1 if the files in --output-dir are not up to date."),
    ] = False,
) -> None:
    """Generate the message classes of KEDA's external scaler .proto (needs grpcio-tools)."""
    from sageserve.keda import stubs

    if check:
        stale = stubs.stale(output_dir)
        for path in stale:
            err_console.print(f"{path}: out of date; run `sageserve keda-stubs -o {output_dir}`")
        raise typer.Exit(1 if stale else 0)
    for path in stubs.write(output_dir):
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
        bool,
        typer.Option(
            help="kopf without peering objects; the scaling loops elect a leader "
            "through a Lease when SAGESERVE_LEASE_NAMESPACE is set."
        ),
    ] = True,
    liveness: Annotated[
        str | None,
        typer.Option(help="Serve liveness probes here, e.g. http://0.0.0.0:8080/healthz."),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="debug, info or warning.", case_sensitive=False)
    ] = "info",
    scaler_listen: Annotated[
        str | None,
        typer.Option(
            envvar="SAGESERVE_SCALER_LISTEN",
            help="Serve KEDA's external scaler gRPC interface here (host:port, e.g. "
            "0.0.0.0:9100) for policies with actuation keda; unset: not served.",
        ),
    ] = None,
    scaler_address: Annotated[
        str | None,
        typer.Option(
            envvar="SAGESERVE_SCALER_ADDRESS",
            help="The host:port KEDA dials for that scaler, written into the ScaledObjects "
            "(e.g. sageserve-scaler.sageserve-system.svc:9100); a policy's "
            "spec.keda.scalerAddress overrides it.",
        ),
    ] = None,
    inference_pools: Annotated[
        bool,
        typer.Option(
            help="Own an InferencePool per ModelDeployment region (and an InferenceObjective "
            "per tier) when the cluster serves the Gateway API Inference Extension."
        ),
    ] = True,
    endpoint_picker: Annotated[
        str | None,
        typer.Option(
            help="Default endpoint picker of the InferencePools, SERVICE:PORT[:FailOpen|"
            "FailClose] (a ModelDeployment's spec.gateway.endpointPicker wins)."
        ),
    ] = None,
) -> None:
    """Run the operator against the cluster of the current kubeconfig (or in-cluster)."""
    import os
    import re

    import kopf

    import sageserve.controller.handlers  # noqa: F401  (registers the handlers)
    from sageserve.controller.inference_pool import (
        ENV_ENDPOINT_PICKER,
        ENV_POOLS,
        GatewayConfigError,
        gateway_config,
    )

    for flag, value in (("--scaler-listen", scaler_listen), ("--scaler-address", scaler_address)):
        if value and not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}", value):
            err_console.print(f"{flag}: {value!r} is not host:port (e.g. 0.0.0.0:9100)")
            raise typer.Exit(2)
    # The handlers read their settings from the environment; every flag is checked before
    # any of it is written, so a refused start leaves the process as it found it.
    settings = {
        "SAGESERVE_SCALER_LISTEN": scaler_listen or "",
        "SAGESERVE_SCALER_ADDRESS": scaler_address or "",
        "SAGESERVE_NAMESPACES": ",".join(namespace or []),
    }
    if not inference_pools:
        settings[ENV_POOLS] = "off"
    if endpoint_picker is not None:
        settings[ENV_ENDPOINT_PICKER] = endpoint_picker
    try:
        gateway_config({**os.environ, **settings})
    except GatewayConfigError as exc:
        err_console.print(f"--endpoint-picker / --inference-pools: {exc}", markup=False)
        raise typer.Exit(2) from exc
    level = log_level.lower()
    if level not in {"debug", "info", "warning"}:
        err_console.print(f"--log-level: {log_level!r} is not one of debug, info, warning")
        raise typer.Exit(2)
    os.environ.update(settings)
    kopf.configure(debug=level == "debug", verbose=level == "info", quiet=level == "warning")

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
        typer.Option(
            "--policy",
            "-p",
            help="Comma-separated strategies, e.g. reactive,siloed (default: the scenario's list).",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for summary.json, minutes.csv, report.")
    ] = Path("out/simulate"),
    seed: Annotated[int | None, typer.Option(help="Override the workload's seed.")] = None,
    report: Annotated[bool, typer.Option(help="Write PNG plots and report.html.")] = True,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="PATH=VALUE",
            help="Change a field of the scenario's ScalingPolicy spec, PATH=VALUE, e.g. "
            "thresholds.scaleOutEmu=0.6 or forecast.quantile=0.9 (repeatable; validated "
            "like a manifest).",
        ),
    ] = None,
    reference: ReferenceOption = False,
    picker: Annotated[
        str | None,
        typer.Option(
            help="The routers' in-region pod choice, as `sageserve router --picker` (e.g. "
            "preserve); default: the scenario's `picker`, else token-jsq."
        ),
    ] = None,
) -> None:
    """Replay a scenario's traces against simulated fleets, one run per policy, and compare."""
    from sageserve.commands.sim import simulate as run

    names = [p.strip() for p in policy.split(",") if p.strip()] if policy else None
    try:
        run(scenario, names, out, seed, report, console, settings, reference, picker)
    except (FileNotFoundError, ValueError, KeyError) as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


@app.command()
def compare(
    scenario: Annotated[
        Path | None,
        typer.Option("--scenario", "-s", help="Scenario directory (default: scenarios/default)."),
    ] = None,
    policy: Annotated[
        str, typer.Option("--policy", "-p", help="Comma-separated strategies to compare.")
    ] = "reactive,lt-i,lt-u,lt-ua",
    target: Annotated[
        float, typer.Option(help="IW-F SLO attainment at which GPU-hours are compared.")
    ] = 0.95,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for summary.json and the report.")
    ] = Path("out/compare"),
    workers: Annotated[
        int | None, typer.Option(help="Local processes (default: every core).")
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(help="Run on this Dask scheduler instead (the cluster extra: Dask)."),
    ] = None,
    grid: Annotated[
        list[str] | None,
        typer.Option(
            "--grid",
            metavar="POLICY:PATH=V1,V2",
            help="Replace a policy's sweep, e.g. reactive:thresholds.scaleOutEmu=0.5,0.6,0.7 "
            "(repeatable; several for one policy make a product).",
        ),
    ] = None,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="PATH=VALUE", help="Change a policy field for every run."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Override the workload's seed.")] = None,
    tier: Annotated[
        str | None, typer.Option(help="Tier compared (default: the tightest interactive).")
    ] = None,
    bounds: Annotated[
        bool, typer.Option(help="Compute the floor, the lower bound and the θ-sized estimate.")
    ] = True,
    report: Annotated[bool, typer.Option(help="Write frontier.png and report.html.")] = True,
    reference: ReferenceOption = False,
    from_summary: Annotated[
        Path | None,
        typer.Option("--from", help="Read a finished comparison's summary.json at --target."),
    ] = None,
) -> None:
    """Sweep each policy's knobs and compare GPU-hours at equal SLO on its frontier."""
    from sageserve.commands.compare import compare as run
    from sageserve.commands.compare import reread

    names = [p.strip() for p in policy.split(",") if p.strip()]
    try:
        if from_summary is not None:
            reread(from_summary, target, out, console, report)
            return
        doc = run(
            scenario,
            names,
            target,
            out,
            console,
            workers=workers,
            address=address,
            grids=grid or [],
            settings=settings or [],
            seed=seed,
            tier=tier,
            bounds=bounds,
            report=report,
            reference=reference,
        )
    except (FileNotFoundError, ValueError, KeyError) as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    if doc["runs"]["failed"]:
        raise typer.Exit(1)


def hour_list(value: str, option: str) -> tuple[int, ...]:
    """Comma-separated hours of a scenario's day (`--hours 0,1,2`), refused naming the
    option."""
    try:
        return tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{option}: comma-separated hours, got {value!r}") from None


@app.command()
def calibrate(
    scenario: Annotated[
        Path | None,
        typer.Option("--scenario", "-s", help="Scenario directory (default: scenarios/default)."),
    ] = None,
    kv_target: Annotated[
        float | None,
        typer.Option(help="Mean KV use to stay under (default: the policy's scaleOutEmu)."),
    ] = None,
    minutes: Annotated[float, typer.Option(help="Simulated minutes per probe.")] = 30.0,
    preserve: Annotated[
        bool,
        typer.Option(
            "--preserve",
            help="Also measure PreServe's μ_p / μ_d (prefillTokensPerSecond, "
            "decodeTokensPerSecond) on the prompt- and decode-heavy quarters of the mix.",
        ),
    ] = False,
    by_type: Annotated[
        bool,
        typer.Option(
            "--by-type",
            help="Instead: n (req/s) per parallelism layout and request type at an SLO, for "
            "`bench oserve --capacity-file` (default scenario: scenarios/oserve-mixed).",
        ),
    ] = False,
    model: Annotated[str, typer.Option(help="--by-type: perf profile.")] = "llama-2-70b",
    gpu_type: Annotated[
        str, typer.Option("--gpu-type", help="--by-type: GPU type.")
    ] = "NVIDIA-H100-80GB-HBM3",
    gpus: Annotated[int, typer.Option(help="--by-type: GPU budget (layouts up to it).")] = 16,
    node_gpus: Annotated[int, typer.Option("--node-gpus", help="--by-type: GPUs per node.")] = 8,
    types: Annotated[int, typer.Option(help="--by-type: request types (k-means).")] = 4,
    hours: Annotated[
        str, typer.Option(help="--by-type: hours whose requests define the types.")
    ] = "0,1,2,3",
    span: Annotated[float, typer.Option(help="--by-type: seconds of each hour.")] = 3600.0,
    ttft_slo: Annotated[float, typer.Option("--ttft-slo", help="--by-type: TTFT SLO (s).")] = 5.0,
    tpot_slo: Annotated[
        float, typer.Option("--tpot-slo", help="--by-type: time per output token SLO (s).")
    ] = 0.2,
    slo_attainment: Annotated[
        float, typer.Option("--slo-attainment", help="--by-type: share meeting the SLO.")
    ] = 0.9,
    requests: Annotated[int, typer.Option(help="--by-type: arrivals per probe.")] = 2000,
    steps: Annotated[int, typer.Option(help="--by-type: bisection steps.")] = 7,
    strategies: Annotated[
        str, typer.Option(help="--by-type: only these layouts, comma-separated.")
    ] = "",
    seed: Annotated[int, typer.Option(help="--by-type: seed of k-means and arrivals.")] = 0,
    out: Annotated[
        Path | None, typer.Option("--out", help="--by-type: write n to this JSON/YAML file.")
    ] = None,
) -> None:
    """Measure θ (capacityTokensPerSecond) of each variant on the scenario's request mix;
    with --by-type, n per (layout, request type) at a latency SLO."""
    from sageserve.commands.sim import calibrate_command

    if by_type:
        from sageserve.commands.calibrate_types import ByTypeCalibration, calibrate_by_type_command
        from sageserve.sim.scenario import default_scenario_dir
        from sageserve.sim.type_capacity import ProbeSettings, SloSpec

        try:
            cfg = ByTypeCalibration(
                scenario=scenario or default_scenario_dir().parent / "oserve-mixed",
                model=model,
                gpu_type=gpu_type,
                gpus=gpus,
                node_gpus=node_gpus,
                types=types,
                hours=hour_list(hours, "--hours"),
                span_s=span,
                slo=SloSpec(ttft_slo, tpot_slo, slo_attainment),
                settings=ProbeSettings(requests=requests, steps=steps, seed=seed),
                strategies=tuple(x.strip() for x in strategies.split(",") if x.strip()),
            )
            calibrate_by_type_command(cfg, out, console)
        except (FileNotFoundError, ValueError, KeyError) as e:
            err_console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from None
        return
    try:
        calibrate_command(scenario, kv_target, minutes, console, preserve)
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
    hours: Annotated[float | None, typer.Option(help="Override the window length (hours).")] = None,
    sim_only: Annotated[
        bool, typer.Option(help="Also time a run over requests held in memory (RSS grows).")
    ] = True,
) -> None:
    """Simulated requests per wall-second, events per second and peak RSS of one run."""
    from sageserve.commands.sim import bench_sim as run

    run(scenario, policy, hours, console, sim_only)


@bench_app.command("route")
def bench_route(
    trace: Annotated[
        Path, typer.Option("--trace", help="Request trace: Azure 2023 CSV or JSON lines.")
    ],
    instances: Annotated[int, typer.Option(help="Fixed fleet size.")] = 4,
    rates: Annotated[
        str | None,
        typer.Option(help="Requests/s, comma-separated (default: 1-6× the trace's own rate)."),
    ] = None,
    routers: Annotated[
        str, typer.Option(help="picker or picker@predictor, comma-separated.")
    ] = "round-robin,least-request,min-usage,token-jsq,preserve,token-jsq@oracle,preserve@oracle",
    predictor: Annotated[
        str, typer.Option(help="Length predictor of pickers named without one.")
    ] = "input-regression",
    fit_minutes: Annotated[
        float, typer.Option(help="Minutes at the trace's start that fit the predictors.")
    ] = 20.0,
    model: Annotated[str, typer.Option(help="Perf profile of the instances.")] = "llama-2-70b",
    gpu_type: Annotated[str, typer.Option("--gpu-type")] = "NVIDIA-H100-80GB-HBM3",
    gpus: Annotated[int, typer.Option(help="GPUs per instance.")] = 4,
    kv_tokens: Annotated[
        int | None,
        typer.Option(
            help="KV-cache tokens per instance instead of the profile's (e.g. 60000: a "
            "memory-bound fleet, where PreServe's memory penalty can act)."
        ),
    ] = None,
) -> None:
    """PreServe's routing benchmark: instance pickers on a fixed fleet over a request trace."""
    from sageserve.commands.bench_route import bench_route_command

    try:
        bench_route_command(
            trace,
            instances,
            [float(x) for x in rates.split(",")] if rates else None,
            [r.strip() for r in routers.split(",") if r.strip()],
            predictor,
            fit_minutes,
            model,
            gpu_type,
            gpus,
            console,
            kv_tokens,
        )
    except (ValueError, KeyError, FileNotFoundError) as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


@bench_app.command("tiers")
def bench_tiers(
    trace: Annotated[
        Path, typer.Option("--trace", help="Request trace: Azure 2023 CSV or JSON lines.")
    ] = Path("data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"),
    instances: Annotated[int, typer.Option(help="Fixed fleet size.")] = 2,
    rate: Annotated[
        float | None,
        typer.Option(help="Requests/s the window is compressed to (default: as recorded)."),
    ] = None,
    minutes: Annotated[float, typer.Option(help="Minutes replayed per seed.")] = 10.0,
    fast_share: Annotated[float, typer.Option(help="Share of requests that are IW-F.")] = 0.5,
    normal_slo: Annotated[
        float, typer.Option("--normal-slo", help="IW-N's TTFT SLO in seconds.")
    ] = 60.0,
    policies: Annotated[
        str, typer.Option(help="Instance orders, comma-separated: fcfs, edf, pf, dpa.")
    ] = ",".join(("fcfs", "edf", "pf", "dpa")),
    seeds: Annotated[str, typer.Option(help="Seeds, comma-separated.")] = "1,2,3",
    expired_after: Annotated[
        float, typer.Option("--expired-after", help="DPA's τ_n in seconds.")
    ] = 10.0,
    urgent_within: Annotated[
        float, typer.Option("--urgent-within", help="DPA's τ_p in seconds.")
    ] = 2.0,
    model: Annotated[str, typer.Option(help="Perf profile of the instances.")] = "llama-2-70b",
    gpu_type: Annotated[str, typer.Option("--gpu-type")] = "NVIDIA-H100-80GB-HBM3",
    gpus: Annotated[int, typer.Option(help="GPUs per instance.")] = 4,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures.")] = None,
) -> None:
    """SageServe's multi-tier instance orders (FCFS, EDF, PF, DPA) on a fixed fleet: Q3 TTFT
    and SLO violations of IW-F and IW-N per policy, over several seeds (v3 Fig. 15)."""
    from sageserve.commands.bench_tiers import bench_tiers_command

    try:
        bench_tiers_command(
            trace,
            instances,
            rate,
            minutes,
            fast_share,
            normal_slo,
            [p.strip() for p in policies.split(",") if p.strip()],
            [int(x) for x in seeds.split(",") if x.strip()],
            expired_after,
            urgent_within,
            model,
            gpu_type,
            gpus,
            console,
            json_out,
        )
    except (ValueError, KeyError, FileNotFoundError) as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


@bench_app.command("pool")
def bench_pool(
    scenario: Annotated[
        Path, typer.Option("--scenario", "-s", help="A long-tail scenario directory.")
    ] = Path("scenarios/long-tail"),
    hours: Annotated[float | None, typer.Option(help="Cut the window to this many hours.")] = None,
    goodput_gpus: Annotated[int, typer.Option(help="GPUs for the goodput runs.")] = 48,
    goodput_minutes: Annotated[float, typer.Option(help="Length of each goodput run.")] = 30.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures.")] = None,
    router_awake: Annotated[
        int,
        typer.Option(
            min=1,
            help="Models awake per pod in the router's rule (a ModelPool's awakePerInstance; "
            "above 1 the simulation is optimistic: each awake engine gets the pod's compute).",
        ),
    ] = DEFAULT_AWAKE_PER_INSTANCE,
    sized: Annotated[
        bool,
        typer.Option(
            "--sized",
            help="The pool as plan.pool_sizing sizes it against the baselines, one run each "
            "(dedicated with floors and start-up, dedicated scale-to-zero, request-level on "
            "the pool's GPUs and at its fewest instances reaching the target, mux2); no pool "
            "search and no router rule, so much faster.",
        ),
    ] = False,
    seed: Annotated[
        str | None,
        typer.Option(
            "--seed",
            help="Seeds of the workload, comma-separated (e.g. 0,1,2): one report per seed, "
            "then the spread. Default: the scenario's seed.",
        ),
    ] = None,
) -> None:
    """Aegaeon: GPUs for a long tail of models, pooled vs dedicated, request-level, mux2,
    and the router's rule on vLLM sleep mode."""
    from sageserve.commands.bench_pool import bench_pool_command
    from sageserve.commands.seeds import seed_list

    try:
        seeds: tuple[int | None, ...] = (None,) if seed is None else seed_list(seed, "--seed")
        bench_pool_command(
            scenario,
            hours,
            goodput_gpus,
            goodput_minutes,
            json_out,
            console,
            router_awake,
            seeds=seeds,
            sized=sized,
        )
    except (ValueError, KeyError, FileNotFoundError) as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


@bench_app.command("layout")
def bench_layout(
    model: Annotated[str, typer.Option(help="Perf profile of the model.")] = "llama-2-70b",
    gpu_type: Annotated[str, typer.Option("--gpu-type")] = "NVIDIA-H100-80GB-HBM3",
    gpus: Annotated[int, typer.Option(help="GPU budget of the search.")] = 16,
    types: Annotated[int, typer.Option(help="Request types (k-means clusters).")] = 5,
    trace: Annotated[
        list[Path] | None,
        typer.Option("--trace", help="Request traces (default: Azure 2023 code + conversation)."),
    ] = None,
    load: Annotated[
        float,
        typer.Option(help="Offered load as a multiple of the best homogeneous layout's capacity."),
    ] = 1.2,
    seed: Annotated[int, typer.Option(help="Seed of k-means and of the search.")] = 0,
    node_gpus: Annotated[int, typer.Option("--node-gpus", help="GPUs per node.")] = 8,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures.")] = None,
) -> None:
    """OServe: the layout search (Algorithm 1) against the best homogeneous layout."""
    from sageserve.commands.bench_layout import DEFAULT_TRACES, bench_layout_command

    try:
        bench_layout_command(
            model,
            gpu_type,
            gpus,
            types,
            trace or list(DEFAULT_TRACES),
            load,
            seed,
            node_gpus,
            json_out,
            console,
        )
    except (ValueError, KeyError, FileNotFoundError) as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


@bench_app.command("oserve")
def bench_oserve(
    scenario: Annotated[
        Path | None,
        typer.Option("--scenario", "-s", help="Scenario (default: scenarios/oserve-mixed)."),
    ] = None,
    model: Annotated[str, typer.Option(help="Perf profile of the model.")] = "llama-2-70b",
    gpu_type: Annotated[str, typer.Option("--gpu-type")] = "NVIDIA-H100-80GB-HBM3",
    gpus: Annotated[int, typer.Option(help="GPU budget.")] = 16,
    node_gpus: Annotated[int, typer.Option("--node-gpus", help="GPUs per node.")] = 8,
    types: Annotated[int, typer.Option(help="Request types (k-means clusters).")] = 4,
    tuning_hours: Annotated[
        str, typer.Option("--tuning-hours", help="Hours of the day that choose, comma-separated.")
    ] = "0,1,2,3",
    held_out_hours: Annotated[
        str, typer.Option("--held-out-hours", help="Hours reported on, comma-separated.")
    ] = "4,5,6,7",
    span: Annotated[
        float, typer.Option("--span", help="Seconds replayed of each hour (3600: all).")
    ] = 3600.0,
    replan: Annotated[
        float, typer.Option(help="Re-plan interval (s) of the heterogeneous plan.")
    ] = 600.0,
    startup: Annotated[float, typer.Option(help="Start-up time of a new replica (s).")] = 600.0,
    ttft_slo: Annotated[float, typer.Option("--ttft-slo", help="TTFT SLO (s).")] = 5.0,
    tpot_slo: Annotated[
        float, typer.Option("--tpot-slo", help="Time per output token SLO (s).")
    ] = 0.2,
    predictor: Annotated[
        str, typer.Option(help="Output-length predictor for the request type.")
    ] = "client-quantile",
    strategies: Annotated[
        str, typer.Option(help="Only these layouts, comma-separated (e.g. TP4,TP8); default all.")
    ] = "",
    seed: Annotated[
        str | None,
        typer.Option(
            "--seed",
            help="Seeds, comma-separated (e.g. 0,1,2): each seed draws the workload (which "
            "requests a rateScale below 1 keeps) and seeds k-means, the search and the "
            "probes; one comparison per seed, then the spread. Default: the scenario's "
            "workload seed, and 0.",
        ),
    ] = None,
    capacity: Annotated[
        str,
        typer.Option(
            help="Per-type capacity n of the search and the assignment: measured (the "
            "simulator at the SLO), analytical (max throughput, no SLO), or auto (the one "
            "whose plan scores best on the tuning hours)."
        ),
    ] = "auto",
    capacity_file: Annotated[
        Path | None,
        typer.Option(
            "--capacity-file",
            help="With --capacity measured: read n from `sageserve calibrate --by-type --out`.",
        ),
    ] = None,
    slo_attainment: Annotated[
        float,
        typer.Option("--slo-attainment", help="Share of requests meeting the SLO, measured n."),
    ] = 0.9,
    dispatch: Annotated[
        str,
        typer.Option(
            help="Heterogeneous dispatch: weighted-overflow (the LP's weights as a preference, "
            "overflow from a swamped replica) or weighted (the weights strictly)."
        ),
    ] = "weighted-overflow",
    start: Annotated[
        str,
        typer.Option(
            help="Heterogeneous start layout: simulated (the search's candidates and the best "
            "homogeneous run on the tuning hours, the best kept) or search (the search's "
            "layout unchecked)."
        ),
    ] = "simulated",
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures.")] = None,
) -> None:
    """OServe: static vs per-hour reload vs heterogeneous layouts on the mixed workload."""
    from sageserve.commands.bench_oserve import OServeBench, bench_oserve_seeds
    from sageserve.commands.seeds import seed_list
    from sageserve.sim.scenario import default_scenario_dir

    try:
        seeds: tuple[int | None, ...] = (None,) if seed is None else seed_list(seed, "--seed")
        cfg = OServeBench(
            scenario=scenario or default_scenario_dir().parent / "oserve-mixed",
            model=model,
            gpu_type=gpu_type,
            gpus=gpus,
            node_gpus=node_gpus,
            types=types,
            tuning_hours=hour_list(tuning_hours, "--tuning-hours"),
            held_out_hours=hour_list(held_out_hours, "--held-out-hours"),
            span_s=span,
            replan_s=replan,
            startup_s=startup,
            ttft_slo_s=ttft_slo,
            tpot_slo_s=tpot_slo,
            predictor=predictor,
            strategies=tuple(x.strip() for x in strategies.split(",") if x.strip()),
            capacity=capacity,
            capacity_file=capacity_file,
            slo_attainment=slo_attainment,
            dispatch=dispatch,
            start=start,
        )
        cfgs = [
            cfg if x is None else dataclasses.replace(cfg, seed=x, workload_seed=x) for x in seeds
        ]
        bench_oserve_seeds(cfgs, json_out, console)
    except (ValueError, KeyError, FileNotFoundError) as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


@bench_app.command("router")
def bench_router(
    rate: Annotated[
        str, typer.Option(help="Request rates to measure, comma-separated (requests/s).")
    ] = "500,2000",
    seconds: Annotated[float, typer.Option(help="Seconds of load per rate and path.")] = 5.0,
    pods: Annotated[int, typer.Option(help="Stand-in vLLM pods behind the router.")] = 4,
) -> None:
    """Latency the router adds (P50/P99, streamed) and its peak memory, on one core."""
    from sageserve.commands.bench_router import bench_router_command

    rates = [float(r) for r in rate.split(",") if r.strip()]
    bench_router_command(rates, seconds, pods, console)


@bench_app.command("batch")
def bench_batch(
    requests: Annotated[
        int, typer.Option(help="Requests per batch (one run per worker count).")
    ] = 10_000,
    workers: Annotated[
        str, typer.Option(help="Release worker threads per run, comma-separated.")
    ] = "1,4",
    claim_size: Annotated[
        int, typer.Option(help="Requests per claim (the Queue Manager releases 1 or 2).")
    ] = 2,
    postgres_url: Annotated[
        str | None,
        typer.Option(
            help="Also measure on this PostgreSQL database, e.g. "
            "postgresql+psycopg://user@host/db (tables are created if missing).",
            show_default=False,
        ),
    ] = None,
    release_compare: Annotated[
        bool,
        typer.Option(
            help="Only the release path: answers recorded one transaction each (complete) "
            "against complete_many, in the same run, --repeats times."
        ),
    ] = False,
    flush_size: Annotated[
        int, typer.Option(help="--release-compare: answers per complete_many.")
    ] = 64,
    repeats: Annotated[int, typer.Option(help="--release-compare: repetitions.")] = 5,
) -> None:
    """The batch queue: requests accepted into it and released from it per second.

    SQLite on a temporary file, and PostgreSQL with --postgres-url;
    `python -m e2e.bench_batch` starts a throwaway PostgreSQL and runs both.
    """
    from sageserve.commands.bench_batch import bench_batch_command, bench_release_command

    if release_compare:
        bench_release_command(requests, claim_size, flush_size, repeats, postgres_url, console)
        return
    counts = [int(w) for w in workers.split(",") if w.strip()]
    bench_batch_command(requests, counts, claim_size, postgres_url, console)


# --- forecasting and planning ------------------------------------------------------------

forecast_app = typer.Typer(help="Forecasts of tokens/s per (model, region).", no_args_is_help=True)
app.add_typer(forecast_app, name="forecast")


@forecast_app.command("backtest")
def forecast_backtest(
    trace: Annotated[
        list[Path] | None,
        typer.Option(
            "--trace",
            "-t",
            help="ServeGen *_aggregate_10min.csv (repeatable; --leave-one-out defaults to the "
            "bundled ones).",
        ),
    ] = None,
    method: Annotated[
        str | None,
        typer.Option(
            "--method", "-m", help="Comma-separated methods (default: all but arima-classic)."
        ),
    ] = None,
    signal: Annotated[str, typer.Option(help="tokens (tokens/s) or requests (req/s).")] = "tokens",
    quantile: Annotated[float, typer.Option(help="Provisioned upper quantile.")] = 0.85,
    lead_minutes: Annotated[float, typer.Option(help="Window start after now.")] = 0.0,
    horizon_minutes: Annotated[float, typer.Option(help="Window end after now.")] = 60.0,
    start_hours: Annotated[float, typer.Option(help="First decision (hours into trace).")] = 24.0,
    choose_days: Annotated[
        str | None,
        typer.Option(
            help="Out of sample: choose method, ensemble weights and quantile on these days "
            "only (e.g. 1-7; --method gives the candidates) and report them on --report-days "
            "and on the other traces (docs/forecast.md)."
        ),
    ] = None,
    report_days: Annotated[
        str | None, typer.Option(help="Days the out-of-sample choice is reported on (8-14).")
    ] = None,
    leave_one_out: Annotated[
        bool,
        typer.Option(
            "--leave-one-out",
            help="For each trace, choose the gap detector, the method and the conformal rule "
            "on the other traces and report on it (docs/results/forecast-backtests.md).",
        ),
    ] = False,
    csv: Annotated[
        list[Path] | None,
        typer.Option(
            "--csv",
            help="With --leave-one-out: a user's series (one row per step, a header), held "
            "out from all the traces (repeatable).",
        ),
    ] = None,
    csv_column: Annotated[
        str | None, typer.Option(help="The --csv value column (default: the last).")
    ] = None,
    step_seconds: Annotated[
        float,
        typer.Option(
            help="Seconds per row of the --csv series; rows are averaged to the traces' 10 "
            "minutes (600 must be a multiple of it)."
        ),
    ] = 600.0,
    inject_gaps: Annotated[
        int,
        typer.Option(
            help="With --leave-one-out: drop this many partial gaps (0-30 %% of the level, 10 "
            "min to 2 h) into each held-out series, and show the figures with detection off."
        ),
    ] = 0,
) -> None:
    """Rolling hourly backtest: MAPE of the next-hour peak, coverage, mean over-forecast."""
    from sageserve.commands.forecast import (
        DEFAULT_METHODS,
        backtest_command,
        loto_command,
        protocol_command,
    )
    from sageserve.forecast.protocol import parse_days
    from sageserve.forecast.types import ForecastSpec

    methods = [m.strip() for m in method.split(",")] if method else DEFAULT_METHODS
    spec = ForecastSpec(
        quantile=quantile,
        lead_seconds=lead_minutes * 60,
        horizon_seconds=horizon_minutes * 60,
    )
    try:
        if leave_one_out or csv:
            loto_command(
                trace or [], csv or [], csv_column, step_seconds, signal, spec, inject_gaps, console
            )
        elif not trace:
            raise ValueError("--trace: give at least one trace (or --leave-one-out)")
        elif choose_days is not None or report_days is not None:
            pick, rep = parse_days(choose_days or "1-7"), parse_days(report_days or "8-14")
            protocol_command(trace, methods if method else None, signal, spec, pick, rep, console)
        else:
            backtest_command(trace, methods, signal, spec, start_hours, console)
    except (OSError, ValueError, KeyError) as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


@app.command("plan")
def plan_cmd(
    input_path: Annotated[Path, typer.Option("--input", "-i", help="problem.json")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write plan.json here (else stdout).")
    ] = None,
    solver: Annotated[str, typer.Option(help="highs (default) or cbc.")] = "highs",
    time_limit: Annotated[
        float, typer.Option(help="Safety stop in seconds per solve (the budget is nodes).")
    ] = 600.0,
    node_limit: Annotated[
        int, typer.Option(help="Branch-and-bound nodes per solve: the deterministic budget.")
    ] = 100,
    gap: Annotated[float, typer.Option(help="Relative MIP gap counted as optimal.")] = 1e-4,
) -> None:
    """Solve one provisioning problem (JSON contract: docs/plan-json.md)."""
    from sageserve.commands.plan import PlanInputError, plan_command
    from sageserve.plan.ilp import PlanOptions

    try:
        options = PlanOptions(solver, time_limit, gap, node_limit=node_limit)
        text = plan_command(input_path, output, options)
    except PlanInputError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    if output is None:
        typer.echo(text, nl=False)


@bench_app.command("forecast")
def bench_forecast(
    series: Annotated[int, typer.Option(help="Series fitted per method.")] = 200,
    method: Annotated[
        str, typer.Option(help="Comma-separated methods.")
    ] = "ensemble,arima,peak-regression,arima-classic,persistence",
) -> None:
    """Series fitted per second on one core, per forecasting method."""
    from sageserve.commands.forecast import bench_forecast_command

    bench_forecast_command(series, [m.strip() for m in method.split(",")], console)


@bench_app.command("plan")
def bench_plan_cmd(
    size: Annotated[
        list[str] | None,
        typer.Option(
            help="models x regions x gpu types, e.g. 20x20x5 "
            "(repeatable; default 20x20x5 and 100x30x6)."
        ),
    ] = None,
    seeds: Annotated[int, typer.Option(help="Instances per size.")] = 3,
    solver: Annotated[str, typer.Option(help="highs or cbc.")] = "highs",
    time_limit: Annotated[
        float, typer.Option(help="Safety stop in seconds per solve (the budget is nodes).")
    ] = 600.0,
    node_limit: Annotated[
        int, typer.Option(help="Branch-and-bound nodes per solve: the deterministic budget.")
    ] = 100,
    gap: Annotated[float, typer.Option(help="Relative MIP gap counted as optimal.")] = 1e-4,
    inventory: Annotated[
        bool, typer.Option(help="Include GPU inventory rows (the paper's ILP has none).")
    ] = True,
) -> None:
    """Solve synthetic fleets of the given sizes and print the solve times."""
    from sageserve.commands.plan import bench_plan_command
    from sageserve.plan.ilp import PlanOptions

    sizes = [tuple(int(v) for v in s.lower().split("x")) for s in (size or ["20x20x5", "100x30x6"])]
    if any(len(s) != 3 for s in sizes):
        err_console.print("--size must look like 20x20x5")
        raise typer.Exit(2)
    bench_plan_command(
        [(s[0], s[1], s[2]) for s in sizes],
        seeds,
        PlanOptions(solver, time_limit, gap, node_limit=node_limit),
        console,
        inventory,
    )


# Options only at import time; the twin's and the router's modules load when they run.
from sageserve.commands.twin import twin_command  # noqa: E402

app.command("twin")(twin_command)


@app.command("load")
def load(
    url: Annotated[str, typer.Option(help="The router, on this machine (loopback only).")],
    model: Annotated[str, typer.Option(help="The served model name to request.")],
    trace: Annotated[
        Path, typer.Option(help="An Azure LLM inference trace (2023 CSV format).")
    ] = Path("data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"),
    tier: Annotated[str | None, typer.Option(help="x-sageserve-tier of every request.")] = None,
    region: Annotated[str | None, typer.Option(help="x-sageserve-region of every request.")] = None,
    speed: Annotated[float, typer.Option(help="Trace seconds per wall second.")] = 1.0,
    rate: Annotated[
        float | None, typer.Option(help="Requests/s instead of the trace's own times.")
    ] = None,
    max_requests: Annotated[int, typer.Option(help="Stop after this many requests.")] = 1000,
    seconds: Annotated[float, typer.Option(help="Stop after this many seconds.")] = 60.0,
    max_output: Annotated[int, typer.Option(help="Cap on each request's max_tokens.")] = 512,
) -> None:
    """Replay a trace over HTTP against a router on this machine, bounded in count and time."""
    from sageserve.commands.load import NotLocal, load_command

    headers = {k: v for k, v in (("x-sageserve-tier", tier), ("x-sageserve-region", region)) if v}
    try:
        load_command(
            url, trace, model, headers, speed, rate, max_requests, seconds, max_output, console
        )
    except NotLocal as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None


from sageserve.commands.router import router_command  # noqa: E402

app.command("router")(router_command)


if __name__ == "__main__":
    app()
