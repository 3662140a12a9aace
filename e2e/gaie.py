"""The Gateway API Inference Extension's CRDs (and the Gateway API's), from their Go modules.

The module zip the Go proxy serves holds `config/crd/bases/`; `go mod download` puts it in
the shared GOMODCACHE (`e2e/gobuild.go_env()`), read-only, and prints where. The e2e tests
install the InferencePool CRD of the pinned release and the InferenceObjective CRD of the
last release that ships one (`versions.GAIE_OBJECTIVE_VERSION`).
"""

from __future__ import annotations

import json
from pathlib import Path

from e2e import gobuild, versions

POOL_CRD = "inference.networking.k8s.io_inferencepools.yaml"
OBJECTIVE_CRD = "inference.networking.x-k8s.io_inferenceobjectives.yaml"
IMPORT_CRD = "inference.networking.x-k8s.io_inferencepoolimports.yaml"


def module_dir(version: str, module: str = versions.GAIE_MODULE) -> Path:
    """The extracted module at `version` (downloaded through the Go proxy when missing)."""
    cwd = versions.go_env_dir()
    cwd.mkdir(parents=True, exist_ok=True)
    out = gobuild.run_go(["mod", "download", "-json", f"{module}@v{version}"], cwd)
    info = json.loads(out)
    if info.get("Error"):
        raise gobuild.BuildError(f"{module}@v{version}: {info['Error']}")
    return Path(info["Dir"])


def _crd(version: str, name: str, module: str = versions.GAIE_MODULE, under: str = "bases") -> Path:
    path = module_dir(version, module) / "config" / "crd" / under / name
    if not path.is_file():
        raise gobuild.BuildError(f"{module}@v{version} has no config/crd/{under}/{name}")
    return path


def pool_crd() -> Path:
    """InferencePool (inference.networking.k8s.io/v1) of the pinned release."""
    return _crd(versions.GAIE_VERSION, POOL_CRD)


def objective_crd() -> Path:
    """InferenceObjective (inference.networking.x-k8s.io/v1alpha2)."""
    return _crd(versions.GAIE_OBJECTIVE_VERSION, OBJECTIVE_CRD)


def import_crd() -> Path:
    """InferencePoolImport (inference.networking.x-k8s.io/v1alpha1, multi-cluster)."""
    return _crd(versions.GAIE_VERSION, IMPORT_CRD)


def gateway_api_crds() -> list[Path]:
    """GatewayClass, Gateway and HTTPRoute of the Gateway API's standard channel."""
    return [
        _crd(
            versions.GATEWAY_API_VERSION,
            f"gateway.networking.k8s.io_{plural}.yaml",
            versions.GATEWAY_API_MODULE,
            "standard",
        )
        for plural in ("gatewayclasses", "gateways", "httproutes")
    ]


def crd_paths() -> list[Path]:
    """The CRD files to install: InferencePool, then InferenceObjective."""
    return [pool_crd(), objective_crd()]


if __name__ == "__main__":
    for p in crd_paths():
        print(p)
