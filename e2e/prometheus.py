"""A real Prometheus (the Debian package's binary) on loopback with a generated config.

Why file_sd: the twin and the operator under test come and go during a session;
they register scrape targets by writing JSON files into ``targets/`` and Prometheus
picks them up without a restart.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from e2e import procs

SCRAPE_INTERVAL = "5s"


class PrometheusError(RuntimeError):
    """Prometheus is not installed or did not become ready."""


@dataclass(frozen=True)
class PrometheusPaths:
    """Where one Prometheus instance keeps its config, data, log and pid."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "prometheus.yml"

    @property
    def targets(self) -> Path:
        return self.root / "targets"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "prometheus.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "prometheus.pid"


def find_binary() -> str:
    """Path of the ``prometheus`` binary; explain how to get it when missing."""
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )
    if not found:
        raise PrometheusError(
            "prometheus is not installed: run `apt-get update && apt-get install -y prometheus`"
            " (or scripts/setup)"
        )
    return found


def render_config(port: int, targets_dir: Path) -> dict[str, object]:
    """Scrape itself plus every ``targets/*.json`` file_sd file."""
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
            {
                "job_name": "sageserve-e2e",
                "file_sd_configs": [
                    {"files": [str(targets_dir / "*.json")], "refresh_interval": "5s"}
                ],
            },
        ],
    }


def start(root: Path, timeout: float = 60.0) -> tuple[int, str]:
    """Start Prometheus under ``root``; return (pid, base URL) once /-/ready is 200."""
    binary = find_binary()
    paths = PrometheusPaths(root)
    paths.targets.mkdir(parents=True, exist_ok=True)
    paths.data.mkdir(parents=True, exist_ok=True)
    port = procs.free_port()
    paths.config.write_text(yaml.safe_dump(render_config(port, paths.targets), sort_keys=False))
    url = f"http://127.0.0.1:{port}"
    pid = procs.start_daemon(
        [
            binary,
            f"--config.file={paths.config}",
            f"--storage.tsdb.path={paths.data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            "--web.enable-admin-api",
            "--storage.tsdb.retention.time=30d",
        ],
        log=paths.log,
        pid_file=paths.pid_file,
    )
    try:
        procs.wait_until(
            lambda: procs.is_alive(pid) and procs.http_ok(f"{url}/-/ready"),
            timeout,
            "Prometheus /-/ready",
        )
    except TimeoutError as err:
        tail = paths.log.read_text(errors="replace")[-2000:] if paths.log.exists() else ""
        procs.stop_pid(pid)
        raise PrometheusError(f"{err}\n--- {paths.log} ---\n{tail}") from err
    return pid, url


def stop(root: Path) -> None:
    """Stop the Prometheus recorded under ``root`` (if any)."""
    pid = procs.read_pid(PrometheusPaths(root).pid_file)
    if pid is not None:
        procs.stop_pid(pid)


def restart(root: Path, down_s: float, timeout: float = 60.0) -> float:
    """Stop the Prometheus recorded under ``root``, leave it down ``down_s`` (its port held,
    connections refused), start it again with the same command line (same port, config and
    data); the seconds it was unavailable, until /-/ready is 200 again."""
    from e2e.kwok_cluster import _held_port

    paths = PrometheusPaths(root)
    pid = procs.read_pid(paths.pid_file)
    if pid is None or not procs.is_alive(pid):
        raise PrometheusError(f"no Prometheus running under {root}")
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")
    address = next(a.split("=", 1)[1] for a in argv if a.startswith("--web.listen-address="))
    port = int(address.rsplit(":", 1)[1])
    stopped = time.monotonic()
    procs.stop_pid(pid)
    with _held_port(port):
        time.sleep(down_s)
    pid = procs.start_daemon(argv, log=paths.log, pid_file=paths.pid_file)
    url = f"http://{address}"
    procs.wait_until(
        lambda: procs.is_alive(pid) and procs.http_ok(f"{url}/-/ready"), timeout, "Prometheus back"
    )
    return time.monotonic() - stopped
