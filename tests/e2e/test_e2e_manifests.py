"""CRDs, example policies and invalid manifests against the real kube-apiserver.

Manifests go through kubectl because that is what users run in their GitOps
pipelines; kubectl's default ``--validate=strict`` also makes the server refuse
unknown fields.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from e2e_helpers import eventually, kubectl

REPO = Path(__file__).resolve().parents[2]
CRD_FILES = sorted((REPO / "crds").glob("*.yaml"))
POLICY_FILES = sorted(
    p for p in (REPO / "policies").rglob("*.yaml") if p.name != "kustomization.yaml"
)
OVERLAYS = sorted(p.parent for p in (REPO / "policies" / "overlays").glob("*/kustomization.yaml"))
INVALID_FILES = sorted((REPO / "tests" / "manifests" / "invalid").glob("*.yaml"))
NAMESPACE = "manifests-e2e"


def expectations(path: Path) -> list[str]:
    """The ``# expect: <substring>`` header lines of an invalid manifest."""
    found = []
    for line in path.read_text().splitlines():
        if line.startswith("# expect:"):
            found.append(line.split(":", 1)[1].strip())
    return found


def crd_names() -> list[str]:
    names = []
    for path in CRD_FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                names.append(doc["metadata"]["name"])
    return names


@pytest.fixture(scope="module")
def crds_installed(kubeconfig: Path) -> dict[str, str]:
    """Apply each CRD file from crds/ on its own; map file name -> API server error.

    One broken CRD must not hide what the others would show, so a refusal is recorded
    here and reported by the Established test instead of erroring every test.
    """
    assert CRD_FILES, "no CRD files in crds/"
    refused = {}
    for path in CRD_FILES:
        result = kubectl(
            kubeconfig,
            ["apply", "--server-side", "--force-conflicts", "-f", str(path)],
            check=False,
        )
        if result.returncode != 0:
            refused[path.name] = result.stderr
    kubectl(kubeconfig, ["create", "namespace", NAMESPACE])
    return refused


def test_every_crd_is_accepted_and_becomes_established(
    kubeconfig: Path, crds_installed: dict[str, str]
) -> None:
    assert not crds_installed, "the API server refused CRDs:\n" + "\n".join(
        f"{name}: {err}" for name, err in crds_installed.items()
    )
    names = crd_names()
    assert len(names) == len(CRD_FILES)

    def established() -> list[str] | None:
        out = json.loads(kubectl(kubeconfig, ["get", "crd", *names, "-o", "json"]).stdout)
        ok = [
            item["metadata"]["name"]
            for item in out["items"]
            if any(
                c["type"] == "Established" and c["status"] == "True"
                for c in item.get("status", {}).get("conditions", [])
            )
        ]
        return ok if sorted(ok) == sorted(names) else None

    eventually(established, 60, "CRDs to be Established")
    # Discovery serves the new group, so clients (and the operator) can find the kinds.
    resources = kubectl(kubeconfig, ["api-resources", "--api-group=sageserve.io", "-o", "name"])
    assert sorted(resources.stdout.split()) == sorted(names)


@pytest.mark.parametrize("path", POLICY_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_policy_manifest_passes_server_side_dry_run(
    kubeconfig: Path, crds_installed: dict[str, str], path: Path
) -> None:
    result = kubectl(
        kubeconfig, ["create", "--dry-run=server", "-n", NAMESPACE, "-f", str(path)], check=False
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert result.stdout.count("created (server dry run)") == len(docs), result.stdout


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_gitops_overlay_builds_and_passes_server_side_dry_run(
    kubeconfig: Path, crds_installed: dict[str, str], overlay: Path
) -> None:
    built = kubectl(kubeconfig, ["kustomize", str(overlay)])
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("ScalingPolicy") == 1 and kinds.count("ModelDeployment") == 4, kinds
    result = kubectl(
        kubeconfig,
        ["create", "--dry-run=server", "-n", NAMESPACE, "-f", "-"],
        stdin=built.stdout,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("created (server dry run)") == len(docs), result.stdout


def test_policies_and_invalid_manifests_exist() -> None:
    """Guard against the parametrised tests silently collecting nothing."""
    assert POLICY_FILES, "no manifests under policies/"
    assert len(OVERLAYS) >= 3, "policies/overlays/* should hold the kustomize overlays"
    assert INVALID_FILES, "no manifests under tests/manifests/invalid/"
    for path in INVALID_FILES:
        assert expectations(path), f"{path} has no '# expect: <message>' header"


@pytest.mark.parametrize("path", INVALID_FILES, ids=lambda p: p.stem)
def test_invalid_manifest_is_refused_with_its_message(
    kubeconfig: Path, crds_installed: dict[str, str], path: Path
) -> None:
    result = kubectl(
        kubeconfig, ["create", "--dry-run=server", "-n", NAMESPACE, "-f", str(path)], check=False
    )
    assert result.returncode != 0, f"the API server accepted {path.name}:\n{result.stdout}"
    for expected in expectations(path):
        assert expected in result.stderr, f"{expected!r} not in:\n{result.stderr}"
