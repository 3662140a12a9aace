"""Builds the control-plane binaries from published Go modules.

Why wrappers: ``k8s.io/kubernetes`` requires its staging modules at ``v0.0.0`` and
maps them with local ``replace`` lines that Go ignores in dependencies, so
``go install k8s.io/kubernetes/cmd/...@vX`` cannot work. A tiny consumer module that
requires ``k8s.io/kubernetes`` and replaces every staging module with its published
``v0.Y.Z`` tag builds the real commands. The replace lines are generated from the
upstream go.mod, so a version bump never needs a hand-edited list. etcd has the
same problem (its server go.mod replaces siblings), but all its requirements are
published at matching tags, so its wrapper needs no replace lines at all. KEDA pins
k8s.io, controller-runtime and Prometheus modules with version-to-version ``replace``
lines, which Go also ignores outside the main module: its wrapper copies them from the
upstream go.mod (read with ``go mod edit -json``), so it builds exactly the versions
KEDA releases with.

Each component writes a stamp file next to its binaries; a present binary with a
matching stamp is reused, so running ``build`` again is cheap.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from e2e import versions


class BuildError(RuntimeError):
    """A binary could not be built; the message says which and why."""


@dataclass(frozen=True)
class Component:
    """A group of binaries built together and stamped with one version."""

    name: str
    version: str
    binaries: tuple[str, ...]
    build: Callable[[Path], None]
    # other paths under the bin dir the build leaves (e.g. KEDA's CRDs)
    files: tuple[str, ...] = ()

    def stamp(self, bin_dir: Path) -> Path:
        return bin_dir / f".{self.name}.version"

    def is_current(self, bin_dir: Path) -> bool:
        """True when every binary exists and was built for this exact version."""
        stamp = self.stamp(bin_dir)
        if not stamp.is_file() or stamp.read_text().strip() != self.version:
            return False
        if not all((bin_dir / f).exists() for f in self.files):
            return False
        return all(os.access(bin_dir / b, os.X_OK) for b in self.binaries)


def go_env() -> dict[str, str]:
    """Environment for every go command: own caches, no cgo, no toolchain download."""
    root = versions.go_env_dir()
    env = dict(os.environ)
    env.update(
        GOPATH=str(root / "path"),
        GOMODCACHE=str(root / "mod"),
        GOCACHE=str(root / "build"),
        GOTOOLCHAIN="local",
        CGO_ENABLED="0",
        GOFLAGS="-trimpath -buildvcs=false -mod=mod",
    )
    return env


def run_go(args: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``go <args>``; on failure raise with the tail of its output."""
    if shutil.which("go") is None:
        raise BuildError("the `go` command is not on PATH; install Go >= 1.26 to build")
    proc = subprocess.run(
        ["go", *args], cwd=cwd, env=env or go_env(), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise BuildError(f"`go {' '.join(args)}` failed in {cwd}:\n{tail}")
    return proc.stdout


def fresh_wrapper(name: str, module: str) -> Path:
    """An empty wrapper module directory with just ``go.mod`` (regenerated each build)."""
    wdir = versions.wrappers_dir() / name
    if wdir.exists():
        shutil.rmtree(wdir)
    wdir.mkdir(parents=True)
    run_go(["mod", "init", module], cwd=wdir)
    return wdir


def staging_modules(kube_version: str, cwd: Path) -> list[str]:
    """Modules that ``k8s.io/kubernetes`` requires at the placeholder version v0.0.0."""
    module = f"k8s.io/kubernetes@v{kube_version}"
    info = json.loads(run_go(["mod", "download", "-json", module], cwd))
    gomod = Path(info["GoMod"]).read_text()
    mods: list[str] = []
    for line in gomod.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].startswith("k8s.io/") and fields[1] == "v0.0.0":
            mods.append(fields[0])
    if not mods:
        raise BuildError(f"no staging modules found in k8s.io/kubernetes@v{kube_version} go.mod")
    return sorted(set(mods))


def kube_ldflags(kube_version: str) -> str:
    """Version stamping; without it /version reports v0.0.0-master."""
    minor = kube_version.split(".")[1]
    pkg = "k8s.io/component-base/version"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return " ".join(
        [
            "-s -w",
            f"-X {pkg}.gitVersion=v{kube_version}",
            f"-X {pkg}.gitMajor=1",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={now}",
        ]
    )


def build_kubernetes(bin_dir: Path) -> None:
    """kube-apiserver, kube-controller-manager, kube-scheduler, kubectl via a wrapper."""
    kv = versions.KUBERNETES_VERSION
    staging_tag = "v0." + kv.split(".", 1)[1]
    wdir = fresh_wrapper(f"k8s-v{kv}", "sageserve.local/k8sbin")
    edits = [f"-require=k8s.io/kubernetes@v{kv}"]
    edits += [f"-replace={m}={m}@{staging_tag}" for m in staging_modules(kv, wdir)]
    edits += [f"-tool=k8s.io/kubernetes/cmd/{b}" for b in versions.KUBE_BINARIES]
    run_go(["mod", "edit", *edits], cwd=wdir)
    run_go(["mod", "tidy"], cwd=wdir)
    for binary in versions.KUBE_BINARIES:
        start = time.monotonic()
        run_go(
            [
                "build",
                "-ldflags",
                kube_ldflags(kv),
                "-o",
                str(bin_dir / binary),
                f"k8s.io/kubernetes/cmd/{binary}",
            ],
            cwd=wdir,
        )
        print(f"    {binary}: {time.monotonic() - start:.0f}s", flush=True)


def build_etcd(bin_dir: Path) -> None:
    """etcd server through its own wrapper (kept apart so MVS does not mix its deps with k8s's)."""
    ev = versions.ETCD_VERSION
    wdir = fresh_wrapper(f"etcd-v{ev}", "sageserve.local/etcdbin")
    run_go(
        [
            "mod",
            "edit",
            f"-require=go.etcd.io/etcd/server/v3@v{ev}",
            "-tool=go.etcd.io/etcd/server/v3",
        ],
        cwd=wdir,
    )
    run_go(["mod", "tidy"], cwd=wdir)
    run_go(
        ["build", "-ldflags", "-s -w", "-o", str(bin_dir / "etcd"), "go.etcd.io/etcd/server/v3"],
        cwd=wdir,
    )


def go_install(bin_dir: Path, args: Sequence[str]) -> None:
    """``go install`` into our bin dir; the module is run from a neutral directory."""
    env = go_env()
    env["GOBIN"] = str(bin_dir)
    env["GOFLAGS"] = "-trimpath -buildvcs=false"
    cwd = versions.go_env_dir()
    cwd.mkdir(parents=True, exist_ok=True)
    run_go(["install", *args], cwd=cwd, env=env)


def build_kwok(bin_dir: Path) -> None:
    """kwok and kwokctl have no replace lines, so plain ``go install`` works."""
    v = versions.KWOK_VERSION
    go_install(bin_dir, [f"sigs.k8s.io/kwok/cmd/kwok@v{v}", f"sigs.k8s.io/kwok/cmd/kwokctl@v{v}"])


def build_helm(bin_dir: Path) -> None:
    """Helm v3; the -X sets the full version that `helm version` reports."""
    v = versions.HELM_VERSION
    go_install(
        bin_dir,
        [
            "-ldflags",
            f"-s -w -X helm.sh/helm/v3/internal/version.version=v{v}",
            f"helm.sh/helm/v3/cmd/helm@v{v}",
        ],
    )


def module_replaces(gomod: Path, cwd: Path) -> list[str]:
    """``go mod edit -replace`` arguments reproducing the ``replace`` lines of ``gomod``.

    Only module-to-module replacements can be carried into a wrapper; a replacement by a
    local directory names files that are not in the module zip, so it is an error."""
    parsed = json.loads(run_go(["mod", "edit", "-json", str(gomod)], cwd))
    edits = []
    for rep in parsed.get("Replace") or []:
        old, new = rep["Old"], rep["New"]
        if not new.get("Version"):
            raise BuildError(
                f"{gomod} replaces {old['Path']} by the local directory {new['Path']}; "
                "a wrapper module cannot reproduce that"
            )
        old_ref = old["Path"] + (f"@{old['Version']}" if old.get("Version") else "")
        edits.append(f"-replace={old_ref}={new['Path']}@{new['Version']}")
    return edits


def build_keda(bin_dir: Path) -> None:
    """KEDA's operator and metrics adapter through a wrapper that copies KEDA's replace lines,
    plus its CRDs (config/crd/bases of the module) next to the binaries."""
    kv = versions.KEDA_VERSION
    module = versions.KEDA_MODULE
    wdir = fresh_wrapper(f"keda-v{kv}", "sageserve.local/kedabin")
    info = json.loads(run_go(["mod", "download", "-json", f"{module}@v{kv}"], wdir))
    edits = [f"-require={module}@v{kv}", *module_replaces(Path(info["GoMod"]), wdir)]
    edits += [f"-tool={module}/{pkg}" for pkg in versions.KEDA_BINARIES.values()]
    run_go(["mod", "edit", *edits], cwd=wdir)
    run_go(["mod", "tidy"], cwd=wdir)
    ldflags = " ".join(
        [
            "-s -w",
            f"-X {module}/version.Version={kv}",
            f"-X {module}/version.GitCommit=v{kv}",
        ]
    )
    for binary, pkg in versions.KEDA_BINARIES.items():
        start = time.monotonic()
        run_go(
            ["build", "-ldflags", ldflags, "-o", str(bin_dir / binary), f"{module}/{pkg}"],
            cwd=wdir,
        )
        print(f"    {binary}: {time.monotonic() - start:.0f}s", flush=True)
    crds = Path(info["Dir"]) / "config" / "crd" / "bases"
    found = sorted(crds.glob("*.yaml"))
    if not found:
        raise BuildError(f"no CRDs in {crds} ({module}@v{kv})")
    target = bin_dir / versions.KEDA_CRD_DIR
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    for crd in found:
        shutil.copyfile(crd, target / crd.name)


COMPONENTS: tuple[Component, ...] = (
    Component("kubernetes", versions.KUBERNETES_VERSION, versions.KUBE_BINARIES, build_kubernetes),
    Component("etcd", versions.ETCD_VERSION, ("etcd",), build_etcd),
    Component("kwok", versions.KWOK_VERSION, ("kwok", "kwokctl"), build_kwok),
    Component("helm", versions.HELM_VERSION, ("helm",), build_helm),
    Component(
        "keda",
        versions.KEDA_VERSION,
        tuple(versions.KEDA_BINARIES),
        build_keda,
        files=(versions.KEDA_CRD_DIR,),
    ),
)


def missing_components(bin_dir: Path | None = None) -> list[str]:
    """Names of components whose binaries are absent or of another version."""
    bdir = bin_dir or versions.bin_dir()
    return [c.name for c in COMPONENTS if not c.is_current(bdir)]


def build_all(force: bool = False, only: Sequence[str] = ()) -> dict[str, float]:
    """Build what is missing; return seconds spent per component (0 when reused).

    Holds a lock file: two pytest sessions or a setup run next to a test run must not
    regenerate the same wrapper module at once (and two Go builds would starve 2 cores).
    """
    bdir = versions.bin_dir()
    bdir.mkdir(parents=True, exist_ok=True)
    with (versions.cache_root() / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(bdir, force, only)


def _build_locked(bdir: Path, force: bool, only: Sequence[str]) -> dict[str, float]:
    times: dict[str, float] = {}
    for comp in COMPONENTS:
        if only and comp.name not in only:
            continue
        if not force and comp.is_current(bdir):
            print(f"==> {comp.name} v{comp.version}: present, reused", flush=True)
            times[comp.name] = 0.0
            continue
        print(f"==> {comp.name} v{comp.version}: building", flush=True)
        comp.stamp(bdir).unlink(missing_ok=True)
        start = time.monotonic()
        comp.build(bdir)
        times[comp.name] = time.monotonic() - start
        comp.stamp(bdir).write_text(comp.version + "\n")
        print(f"==> {comp.name} v{comp.version}: built in {times[comp.name]:.0f}s", flush=True)
    return times
