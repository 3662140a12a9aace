"""Test infrastructure for sageserve: a real Kubernetes control plane (built from
published Go modules, KWOK fake GPU nodes) and a real Prometheus.

Nothing here is imported by the operator package; tests and the CLI
``python -m e2e.cluster`` use it.
"""
