"""A small scenario with a ModelPool, built in a test's directory."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

TINY = Path(__file__).parent / "fixtures" / "tiny"

POOL = """apiVersion: sageserve.io/v1alpha1
kind: ModelPool
metadata:
  name: tail
  annotations: {sageserve.io/perf-profile: llama-2-70b}
spec:
  models: [%(models)s]
  engine: {image: vllm/vllm-openai:v0.11.0, port: 8000}
  variant: {name: h100, gpuType: NVIDIA-H100-80GB-HBM3, gpusPerInstance: 4}
  regions: [{name: us-east, minInstances: 1, maxInstances: 4, initialInstances: 1}]
  awakePerInstance: 2
  idleSleepSeconds: 60
  tiers: [iw-f, iw-n]
  policyRef: {name: fleet}
"""

WORKLOAD = """seed: 5
window: {start: %(start)s, duration: %(duration)s}
regionOrder: [us-east, us-west]
sources:
- name: dedicated
  type: jsonl
  path: dedicated.jsonl
  models: llama-2-70b
  regions: {us-east: 0.6, us-west: 0.4}
  tiers: {iw-f: 0.5, iw-n: 0.5}
- name: pooled
  type: jsonl
  path: pooled.jsonl
  models: {%(shares)s}
  regions: {us-east: 0.7, us-west: 0.3}
  tiers: {iw-f: 0.5, iw-n: 0.5}
"""


def _trace(path: Path, phases: list[tuple[float, float]], seed: int) -> None:
    """Poisson arrivals: (until second, requests/s) per phase, in order; a first request at
    0 s keeps the times absolute (a trace is replayed from its first request)."""
    rng = random.Random(seed)
    lines = [json.dumps({"timestamp": 0, "input_length": 100, "output_length": 10})]
    t, since = 0.0, 0.0
    for until, rate in phases:
        t = since
        while True:
            t += rng.expovariate(rate)
            if t >= until:
                break
            doc = {"timestamp": round(t * 1000), "input_length": rng.randint(200, 1500)}
            doc["output_length"] = rng.randint(30, 250)
            lines.append(json.dumps(doc))
        since = until
    path.write_text("\n".join(lines) + "\n")


def pool_scenario(
    root: Path,
    models: int = 8,
    quiet_rps: float = 0.004,
    busy_rps: float = 0.4,
    quiet_s: float = 3 * 3600.0,
    window_s: float = 2 * 3600.0,
) -> Path:
    """TINY's fleet plus a pool of `models` fine-tunes: quiet (`quiet_rps` over all of
    them) for `quiet_s` before the window, busy (`busy_rps`) in the window of `window_s`."""
    shutil.copytree(TINY, root)
    names = [f"ft-{i}" for i in range(models)]
    (root / "pool.yaml").write_text(
        POOL % {"models": ", ".join(f"{{name: {n}, model: acme/{n}}}" for n in names)}
    )
    index = root / "scenario.yaml"
    index.write_text(index.read_text().replace("policy.yaml]", "policy.yaml, pool.yaml]"))
    end = quiet_s + window_s
    _trace(root / "dedicated.jsonl", [(end + 60, 0.5)], 1)
    _trace(root / "pooled.jsonl", [(quiet_s, quiet_rps), (end + 60, busy_rps)], 2)
    (root / "workload.yaml").write_text(
        WORKLOAD
        % {
            "start": f"{int(quiet_s)}s",
            "duration": f"{int(window_s)}s",
            "shares": ", ".join(f"{n}: 1" for n in names),
        }
    )
    return root
