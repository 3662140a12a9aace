"""Pinned versions and cache locations of every binary the test cluster uses.

One place to bump: the builder, the cluster starter and the stamp files all read
these constants, so a version change rebuilds exactly what changed.
"""

from __future__ import annotations

import os
from pathlib import Path

# k8s 1.36 is built upstream with Go 1.26 (its go.mod says `go 1.26.0`), the toolchain
# we have; kwok v0.8.0 also defaults to a 1.36 control plane.
KUBERNETES_VERSION = "1.36.3"
# kwok maps k8s 1.34-1.36 to etcd 3.6; take the newest 3.6 patch release.
ETCD_VERSION = "3.6.16"
KWOK_VERSION = "0.8.0"
HELM_VERSION = "3.21.4"
# Gateway API Inference Extension: InferencePool (inference.networking.k8s.io/v1) from the
# pinned release. Its InferenceObjective moved to llm-d-router (llm-d.ai/v1alpha2) after
# v1.5.0, and llm-d-router is not served by the Go module proxy, so the e2e tests install
# the last release that ships one (inference.networking.x-k8s.io/v1alpha2, same spec).
GAIE_MODULE = "sigs.k8s.io/gateway-api-inference-extension"
GAIE_VERSION = "1.6.0"
GAIE_OBJECTIVE_VERSION = "1.5.0"
# Gateway API (Gateway, HTTPRoute): the documented gateway examples are checked against it.
GATEWAY_API_MODULE = "sigs.k8s.io/gateway-api"
GATEWAY_API_VERSION = "1.5.1"
# KEDA's operator and metrics adapter (webhooks are not built). Its go.mod pins k8s.io to
# v0.35.x with `replace` lines, so it is built through a wrapper module (e2e/gobuild.py);
# a 0.35 client talks to a 1.36 API server within the supported skew.
KEDA_VERSION = "2.20.2"
KEDA_MODULE = "github.com/kedacore/keda/v2"

KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# `{binary name: package in KEDA_MODULE}`; the binary name is also the field manager KEDA's
# writes carry (client-go's default user agent starts with it).
KEDA_BINARIES = {"keda-operator": "cmd/operator", "keda-adapter": "cmd/adapter"}
# KEDA's own CRDs (ScaledObject, ScaledJob, TriggerAuthentication, ...), copied from the
# module's config/crd/bases next to the binaries by the build.
KEDA_CRD_DIR = "keda-crds"


def cache_root() -> Path:
    """Root of everything built or started; outside the repo so nothing is committed."""
    override = os.environ.get("SAGESERVE_CACHE")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "sageserve"


def bin_dir() -> Path:
    """Directory holding all binaries for the pinned Kubernetes version."""
    return cache_root() / "k8s" / f"v{KUBERNETES_VERSION}" / "bin"


def wrappers_dir() -> Path:
    """Wrapper Go modules (generated go.mod files) live here, one per upstream module."""
    return cache_root() / "wrappers"


def go_env_dir() -> Path:
    """Dedicated GOMODCACHE/GOCACHE/GOPATH so builds are reproducible and easy to wipe."""
    return cache_root() / "go"


def state_dir() -> Path:
    """Runtime state of a started cluster (KWOK_WORKDIR, Prometheus data, pid files).

    ``SAGESERVE_E2E_STATE`` moves it, so that a pytest session can run its own private
    cluster next to one a developer started by hand.
    """
    override = os.environ.get("SAGESERVE_E2E_STATE")
    if override:
        return Path(override).expanduser()
    return cache_root() / "run"
