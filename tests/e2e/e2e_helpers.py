"""Helpers shared by the e2e tests: kubectl against the test cluster, polling."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from e2e.kubectl import kubectl_env

from e2e import versions

T = TypeVar("T")


def kubectl(
    kubeconfig: Path, args: Sequence[str], stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Our kubectl against the test cluster; with check, a failure raises with stderr."""
    proc = subprocess.run(
        [str(versions.bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=kubectl_env(),
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return proc


def eventually(
    probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5
) -> T:
    """Poll until ``probe`` returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


#: how the API server's refusal shows in an operator's log: the client's `(403)` and
#: `Reason: Forbidden`, or an HTTP status line; never a log timestamp's milliseconds
_REFUSED = re.compile(r"Forbidden|\(403\)|\b(?:HTTP|status:?) 403\b")


def refused(log: str) -> bool:
    """Whether an operator's log shows the API server refusing it (a 403)."""
    return _REFUSED.search(log) is not None
