"""Signals in (vLLM metrics through Prometheus) and the operator's own metrics out."""
