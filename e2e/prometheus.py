"""A real Prometheus (the Debian package's binary) on loopback with a generated config.

Why file_sd: the twin and the operator under test come and go during a session;
they register scrape targets by writing JSON files into ``targets/`` and Prometheus
picks them up without a restart.
"""

from __future__ import annotations

import shutil
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
