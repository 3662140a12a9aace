"""`sageserve router`: the command line of the request path.

Module-level imports are typer and the standard library only, so `sageserve --help` stays
instant; aiohttp, kubernetes and the router load when it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Annotated, Any

import typer

from sageserve.dispatch.instance_picker import DEFAULT_PICKER

log = logging.getLogger("sageserve.router")


def kube_clients(hub_kubeconfig: str | None) -> tuple[Any, Any]:
    """(catalogue client, pods client): the default credentials (in-cluster, else the
    kubeconfig) for both, or with `--hub-kubeconfig` the hub's for the catalogue and the
    default ones for this cluster's pods; (None, None) means the default for both."""
    from kubernetes import client
    from kubernetes import config as kube_config

    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()
    if not hub_kubeconfig:
        return None, None
    try:
        hub = kube_config.new_client_from_config(config_file=hub_kubeconfig)
    except (OSError, kube_config.ConfigException) as exc:
        raise typer.BadParameter(f"--hub-kubeconfig {hub_kubeconfig!r}: {exc}") from None
    return hub, client.ApiClient()


def router_command(
    namespace: Annotated[
        list[str],
        typer.Option("--namespace", "-n", help="Namespaces whose pod sets the router serves."),
    ],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8080,
    region: Annotated[
        str | None,
        typer.Option(help="The router's own region: the home of requests that name none."),
    ] = None,
    backend_url: Annotated[
        str,
        typer.Option(
            help="Where a pod's requests go; fields {pod_ip}, {port}, {namespace}, {pod}."
        ),
    ] = "http://{pod_ip}:{port}",
    max_body_bytes: Annotated[
        int, typer.Option(help="Larger request bodies are refused with 413.")
    ] = 8 * 1024 * 1024,
    hold_seconds: Annotated[
        float, typer.Option(help="How long a request waits for a model coming from zero.")
    ] = 120.0,
    max_held_requests: Annotated[
        int,
        typer.Option(
            min=0,
            help="Requests waiting for a model from zero, at most; past it 429 with Retry-After.",
        ),
    ] = 1000,
    max_inflight_bytes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Bytes of request bodies the router has at once (being read, held or "
            "forwarded, Batch API uploads included); past it 429 before the body is read.",
        ),
    ] = 128 * 1024 * 1024,
    max_output_tokens: Annotated[
        int,
        typer.Option(
            min=1,
            help="The most max_tokens / max_completion_tokens one request may ask for "
            "(400 past it).",
        ),
    ] = 131_072,
    load_refresh_seconds: Annotated[
        float, typer.Option(help="How often per-pod KV usage is read from Prometheus.")
    ] = 2.0,
    idle_timeout_seconds: Annotated[
        float,
        typer.Option(
            help="A connection with no request under way (or unfinished headers) "
            "is closed after this long."
        ),
    ] = 75.0,
    body_timeout_seconds: Annotated[
        float, typer.Option(help="A request body must arrive within this long (else 408).")
    ] = 30.0,
    stall_timeout_seconds: Annotated[
        float,
        typer.Option(
            help="A streamed answer's pod silent this long has failed (retried "
            "elsewhere before its first byte)."
        ),
    ] = 60.0,
    upstream_timeout_seconds: Annotated[
        float, typer.Option(help="No answer from a pod may take longer than this.")
    ] = 600.0,
    prometheus_url: Annotated[
        str | None, typer.Option(help="Prometheus (default: SAGESERVE_PROMETHEUS_URL).")
    ] = None,
    event_loop: Annotated[
        str, typer.Option(help="asyncio, or uvloop when it is installed.")
    ] = "asyncio",
    batch_db: Annotated[
        str,
        typer.Option(
            envvar="SAGESERVE_BATCH_DB_URL",
            help="The Batch API's queue: sqlite:///PATH (one replica) or "
            "postgresql+psycopg://... (several); 'off' disables /v1/files and /v1/batches.",
        ),
    ] = "sqlite:///sageserve-batch.db",
    max_upload_bytes: Annotated[
        int, typer.Option(help="Larger Batch API input files are refused with 413.")
    ] = 100 * 1024 * 1024,
    batch_retention_seconds: Annotated[
        float,
        typer.Option(
            help="How long Batch API files, and a finished batch's requests and results, are "
            "kept when the client sets no expires_after (OpenAI's bounds: 3600 to 2592000)."
        ),
    ] = 30 * 86400.0,
    batch_lease_seconds: Annotated[
        float,
        typer.Option(
            help="How long a released batch request stays this replica's; a replica that "
            "dies leaves it to another after this long."
        ),
    ] = 120.0,
    batch_request_tps: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Tokens/s one batch request is served at, for a model whose "
            "ModelDeployment names no perf profile (with one, its decode rate is used): "
            "a request is promoted when its deadline less its tokens ÷ this, less 30 min, "
            "has passed. 0: as the simulator counts such a model, promoted 30 min before "
            "its deadline.",
        ),
    ] = 0.0,
    replica: Annotated[
        str,
        typer.Option(envvar="POD_NAME", help="This replica's name: the owner of its queue leases."),
    ] = "",
    picker: Annotated[
        str,
        typer.Option(
            help="In-region pod choice, a picker of dispatch.instance_picker over each pod's "
            "load anticipator: token-jsq (fewest queued prompt + predicted output tokens, "
            "the simulator's default), round-robin, least-request, min-usage, preserve "
            "(PreServe §4.3.3); or remaining-tokens (fewest prompt + max_tokens in flight)."
        ),
    ] = DEFAULT_PICKER,
    auth: Annotated[
        str,
        typer.Option(
            help="Who must show an API key: required (every request; a namespace whose "
            "WorkloadTiers list no key is reachable by nobody) or per-namespace (a namespace "
            "that lists no key is open to anonymous requests). docs/security.md."
        ),
    ] = "required",
    key_resync_seconds: Annotated[
        float,
        typer.Option(
            help="How often the WorkloadTiers' key Secrets are read again: a key removed "
            "from its Secret stops working within this long."
        ),
    ] = 30.0,
    predictor: Annotated[
        str,
        typer.Option(
            help="Output-length predictor the anticipators read (dispatch.length_predictor), "
            "learning from the usage of the answers the router proxies."
        ),
    ] = "client-quantile",
    peer: Annotated[
        list[str] | None,
        typer.Option(
            envvar="SAGESERVE_ROUTER_PEERS",
            help="REGION=URL (repeatable, or comma-separated): the router or gateway of the "
            "cluster serving REGION. A model's region with no pod here is reached through "
            "it, within the plan's spill-over shares, with the caller's own key; what it "
            "forwards is served there, never sent on (docs/regions.md).",
        ),
    ] = None,
    hub_kubeconfig: Annotated[
        str | None,
        typer.Option(
            envvar="SAGESERVE_ROUTER_HUB_KUBECONFIG",
            help="A member cluster's router: read the models, tiers, their key Secrets and "
            "the plans from the hub cluster at this kubeconfig (the fleet's one source, so "
            "tenancy and spill-over shares are the hub's), and only the pods from this "
            "cluster (docs/regions.md).",
        ),
    ] = None,
) -> None:
    """Serve the OpenAI API in front of the pod sets: tiers, regions, scale from zero, and
    the Batch API on a durable queue released into the troughs."""

    from sageserve.batch.api import BatchApi
    from sageserve.batch.store import BatchStore
    from sageserve.dispatch.identity import AUTH_MODES
    from sageserve.dispatch.tiers import TierMatch
    from sageserve.metrics.prometheus import PrometheusReader
    from sageserve.router.anticipate import PodAnticipators
    from sageserve.router.app import Router, RouterConfig, run_loop, serve
    from sageserve.router.discovery import Discovery
    from sageserve.router.fleet import Fleet, fleet_picker
    from sageserve.router.load import refresh_load
    from sageserve.router.metrics import RouterMetrics
    from sageserve.router.peers import PeerConfigError, parse_peers
    from sageserve.router.pool_switcher import PoolSwitcher
    from sageserve.router.release import BatchReleaser, ReleaseConfig

    try:
        peers = parse_peers(peer or [])
    except PeerConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    hub_api, pods_api = kube_clients(hub_kubeconfig)
    url = prometheus_url or os.environ.get("SAGESERVE_PROMETHEUS_URL", "http://127.0.0.1:9090")
    config = RouterConfig(
        max_body_bytes=max_body_bytes,
        hold_seconds=hold_seconds,
        max_held_requests=max_held_requests,
        max_inflight_bytes=max_inflight_bytes,
        max_output_tokens=max_output_tokens,
        home_region=region,
        idle_timeout_seconds=idle_timeout_seconds,
        body_timeout_seconds=body_timeout_seconds,
        stall_timeout_seconds=stall_timeout_seconds,
        upstream_timeout_seconds=upstream_timeout_seconds,
        peers=peers,
    )

    if auth not in AUTH_MODES:
        raise typer.BadParameter(f"--auth {auth!r}: use one of {', '.join(AUTH_MODES)}")
    try:  # a bad name stops the router before it listens, naming the choices
        chosen_picker, anticipators = fleet_picker(picker), PodAnticipators(predictor)
    except (ValueError, KeyError) as exc:
        raise typer.BadParameter(str(exc)) from None
    if not 3600 <= batch_retention_seconds <= 30 * 86400:
        raise typer.BadParameter(
            f"--batch-retention-seconds {batch_retention_seconds:g}: use 3600 (1 hour) to "
            "2592000 (30 days), OpenAI's bounds on expires_after"
        )
    store = (
        None
        if batch_db == "off"
        else BatchStore.open(batch_db, retention_s=batch_retention_seconds)
    )
    owner = replica or f"{socket.gethostname()}-{os.getpid()}"

    async def main() -> None:
        fleet = Fleet(picker=chosen_picker, anticipators=anticipators, auth=auth)
        metrics = RouterMetrics()
        metrics.watch(fleet)
        pools = PoolSwitcher(metrics.registry, backend_url)
        discovery = Discovery(
            fleet,
            asyncio.get_running_loop(),
            namespace,
            backend_url,
            api=hub_api,
            pools=pools,
            key_resync_seconds=key_resync_seconds,
            pods_api=pods_api,
        )
        discovery.start()
        reader = PrometheusReader(url, timeout_s=max(1.0, load_refresh_seconds))
        tasks = [asyncio.create_task(refresh_load(fleet, reader, namespace, load_refresh_seconds))]
        router = Router(fleet, config, metrics)
        router.pools = pools
        tasks.append(asyncio.create_task(pools.run()))
        releaser = None
        if store is not None:
            release = ReleaseConfig(lease_s=batch_lease_seconds, request_tps=batch_request_tps)
            releaser = BatchReleaser(store, router, metrics, owner, release)
            router.extra_routes = BatchApi(
                store,
                fleet.batch_tier,
                deadlines=lambda tier: (fleet.batch_tiers().get(tier) or TierMatch("")).deadline_s,
                max_upload_bytes=max_upload_bytes,
                body_timeout_s=body_timeout_seconds,
                accepted=releaser.accepted,
                claim_bytes=router.claim_bytes,
            ).add_routes

        async def ready(bound: int) -> None:
            if releaser is not None:
                tasks.append(asyncio.create_task(releaser.run()))
            print(f"sageserve router listening on {host}:{bound}", flush=True)

        try:
            await serve(router, host, port, ready)
        finally:
            for task in tasks:
                task.cancel()
            discovery.stop()
            if store is not None:
                store.close()

    with contextlib.suppress(KeyboardInterrupt):
        run_loop(main(), event_loop)
