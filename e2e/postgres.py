"""A throwaway PostgreSQL server (Debian's package) on loopback, for tests and benchmarks.

Why a real server: the batch queue's guarantees on PostgreSQL (two router replicas never
hold the same request, ``FOR UPDATE SKIP LOCKED``) are the database's, so they are tested
against the database, not a stand-in. ``initdb`` writes a cluster into a fresh temporary
directory, the server listens on 127.0.0.1 at a free port with its unix socket in that
directory (never the system's ``/var/run/postgresql``), trusts loopback connections, and
``stop()`` removes everything. The package's own service is never used.

PostgreSQL refuses to run as root. When we are root, the server runs as the unprivileged
system user ``sageserve-pg`` (created once if missing) and owns only its temporary
directory.

``python -m e2e.postgres`` starts one, prints its URL and stops it on Ctrl-C.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from e2e import procs

#: The unprivileged system user the server runs as when we are root.
SERVICE_USER = "sageserve-pg"
SUPERUSER = "postgres"
#: Settings for tests: durability off (a throwaway server), quicker start and commits.
FAST = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresError(RuntimeError):
    """PostgreSQL is not installed, or the server did not start."""


def bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` (Debian's layout)."""
    found = []
    for candidate in Path("/usr/lib/postgresql").glob("*/bin"):
        version = candidate.parent.name
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            found.append((int(version) if version.isdigit() else 0, candidate))
    if not found:
        raise PostgresError(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run "
            "`apt-get install -y postgresql` (or scripts/setup)"
        )
    return max(found)[1]


def service_account() -> tuple[int, int] | None:
    """(uid, gid) to run the server as: ``SERVICE_USER`` when we are root, else None
    (the server runs as we do)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                SERVICE_USER,
            ],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(SERVICE_USER)
    return entry.pw_uid, entry.pw_gid


@dataclass
class PostgresServer:
    """One running server; ``url(db)`` connects as the superuser over TCP loopback."""

    root: Path
    port: int
    bin: Path
    account: tuple[int, int] | None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database and return its URL."""
        self._admin(f"CREATE DATABASE {_checked(name)}")
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {_checked(name)} WITH (FORCE)")

    def _admin(self, statement: str) -> None:
        import psycopg

        dsn = f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(statement.encode())

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server (fast shutdown, then by pid) and remove its directory."""
        if self.data.exists():
            try:
                _run(
                    self,
                    [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
                    timeout=30,
                )
            except (PostgresError, subprocess.TimeoutExpired):
                pid = _postmaster_pid(self.data)
                if pid is not None:
                    procs.stop_pid(pid)
        shutil.rmtree(self.root, ignore_errors=True)


def start(durable: bool = True, timeout: float = 60.0) -> PostgresServer:
    """initdb into a new temporary directory and start a server on a free port.

    ``durable=False`` turns fsync off: for tests, whose server lives only as long as they
    do. Benchmarks keep the default (every commit reaches the disk, as in production).
    """
    binaries = bin_dir()
    account = service_account()
    root = Path(tempfile.mkdtemp(prefix="sageserve-pg-"))
    if account is not None:
        os.chown(root, *account)
    server = PostgresServer(root, procs.free_port(), binaries, account)
    try:
        _run(
            server,
            [
                str(binaries / "initdb"),
                "-D",
                str(server.data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            ],
            timeout=timeout,
        )
        settings = [f"-c {s}" for s in ("listen_addresses=127.0.0.1", *([] if durable else FAST))]
        options = " ".join([f"-p {server.port}", f"-k {root}", *settings])
        _run(
            server,
            [
                str(binaries / "pg_ctl"),
                "-D",
                str(server.data),
                "-l",
                str(server.log),
                "-o",
                options,
                "-w",
                "-t",
                str(int(timeout)),
                "start",
            ],
            timeout=timeout + 10,
        )
    except (PostgresError, subprocess.TimeoutExpired, OSError) as err:
        tail = server.log_tail()
        server.stop()
        raise PostgresError(f"PostgreSQL did not start: {err}\n--- server log ---\n{tail}") from err
    return server


@contextmanager
def running(durable: bool = True) -> Iterator[PostgresServer]:
    """A server for the duration of a ``with`` block."""
    server = start(durable=durable)
    try:
        yield server
    finally:
        server.stop()


def _run(server: PostgresServer, argv: Sequence[str], timeout: float) -> None:
    uid, gid = server.account if server.account is not None else (None, None)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": str(server.root)}
    done = subprocess.run(
        list(argv),
        cwd=server.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        user=uid,
        group=gid,
        extra_groups=None if uid is None else [],
    )
    if done.returncode != 0:
        raise PostgresError(
            f"{Path(argv[0]).name} exited {done.returncode}: {done.stderr.strip() or done.stdout}"
        )


def _postmaster_pid(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _checked(name: str) -> str:
    if not _DB_NAME.match(name):
        raise ValueError(f"database name {name!r}: use lowercase letters, digits and _")
    return name


def main() -> None:
    server = start()
    print(server.url(), flush=True)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stop:
            time.sleep(0.5)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
