"""The metrics twin: simulated vLLM load on the real pods of a cluster, served to Prometheus.

`sageserve twin` watches the pods of sageserve pod sets, replays a trace on exactly the
pods that run (the simulator's instance model: continuous batching, KV cache, queues), and
serves each pod's vLLM metrics for Prometheus to scrape. It can backfill hours of history
into Prometheus so the forecaster starts with data. See docs/twin.md.
"""
