"""Sleep mode of a pooled pod's engines, with vLLM's HTTP surface and simulated timing.

A pooled pod (`core.pooled_engines`) runs one vLLM engine per pooled model. vLLM with
`--enable-sleep-mode` (and `VLLM_SERVER_DEV_MODE=1`) answers:

- `POST /sleep?level=1`: the weights go to host memory, the KV cache is dropped; the call
  returns once they are off the GPUs;
- `POST /wake_up`: the weights come back; the call returns once the engine can serve;
- `GET /is_sleeping`: `{"is_sleeping": true|false}`;
- `/v1/completions` and `/v1/chat/completions` of a sleeping engine: HTTP 503 (vLLM's
  documented behaviour for the endpoints that need the weights); a request that arrives
  while its engine wakes waits for it and is then served.

Timing (`perf.switch`): a level-1 sleep or wake moves the model's weights over each GPU's
host link, the per-GPU shard at the link's rate (β = 1: no Aegaeon component reuse), e.g.
Llama-2-70B on 4×H100 0.54 s, Llama-3.1-8B on 4×A100 0.125 s. Times are simulated seconds
(÷ the twin's speed in wall time). An engine holds GPU memory while awake or switching;
waking one more than the pod's `awakePerInstance` allows fails as vLLM would run out of
memory (HTTP 500), so a router that loses count is caught.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from sageserve.core.pooled_engines import PooledEngine
from sageserve.perf.switch import sleep_mode_switch_seconds


class EngineMode(Enum):
    ASLEEP = "asleep"
    WAKING = "waking"
    AWAKE = "awake"
    FALLING_ASLEEP = "falling-asleep"


@dataclass
class EngineSleep:
    """One engine's sleep state: its mode, and when the switch under way ends."""

    engine: PooledEngine
    mode: EngineMode = EngineMode.ASLEEP
    until: float = 0.0
    wakes: int = 0
    sleeps: int = 0


class OutOfMemory(RuntimeError):
    """Waking one more engine than the pod's GPU memory holds."""


def transfer_seconds(profile: str, gpu_type: str, gpus: int) -> float:
    """Seconds one engine's weights take over the host links (level-1 sleep or wake)."""
    return sleep_mode_switch_seconds(profile, gpu_type, gpus)


@dataclass
class PodEngines:
    """The engines of one pooled pod; every engine starts asleep (the pod's launcher puts
    each to sleep once it is up)."""

    engines: dict[str, EngineSleep]
    quota: int
    switch_s: float
    by_port: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, engines: list[PooledEngine], quota: int, switch_s: float) -> PodEngines:
        return cls(
            {e.served_name: EngineSleep(e) for e in engines},
            max(1, quota),
            switch_s,
            {e.port: e.served_name for e in engines},
        )

    def settle(self, now: float) -> None:
        """Finish the switches whose time has come."""
        for e in self.engines.values():
            if e.mode is EngineMode.WAKING and now >= e.until:
                e.mode = EngineMode.AWAKE
            elif e.mode is EngineMode.FALLING_ASLEEP and now >= e.until:
                e.mode = EngineMode.ASLEEP

    def holding(self) -> int:
        return sum(1 for e in self.engines.values() if e.mode is not EngineMode.ASLEEP)

    def model_at(self, port: int | None, body_model: str | None) -> str | None:
        """The engine a request is for: by its port, else by the model the body names."""
        if port is not None:
            return self.by_port.get(port)
        return body_model if body_model in self.engines else None

    def wake(self, model: str, now: float) -> float:
        """Start waking `model`; returns when it will serve (now if awake already)."""
        self.settle(now)
        e = self.engines[model]
        if e.mode is EngineMode.AWAKE:
            return now
        if e.mode is EngineMode.WAKING:
            return e.until
        if e.mode is EngineMode.ASLEEP and self.holding() >= self.quota:
            awake = sorted(n for n, x in self.engines.items() if x.mode is not EngineMode.ASLEEP)
            raise OutOfMemory(
                f"CUDA out of memory: {len(awake)} engine(s) hold the GPUs "
                f"({', '.join(awake)}) and the pod holds {self.quota}; put one to sleep first"
            )
        start = max(now, e.until)  # a wake after a sleep under way waits for it to end
        e.mode, e.until, e.wakes = EngineMode.WAKING, start + self.switch_s, e.wakes + 1
        return e.until

    def sleep(self, model: str, now: float) -> float:
        """Start putting `model` to sleep; returns when its memory is free."""
        self.settle(now)
        e = self.engines[model]
        if e.mode is EngineMode.ASLEEP:
            return now
        if e.mode is EngineMode.FALLING_ASLEEP:
            return e.until
        start = max(now, e.until)
        e.mode, e.until, e.sleeps = EngineMode.FALLING_ASLEEP, start + self.switch_s, e.sleeps + 1
        return e.until

    def is_sleeping(self, model: str, now: float) -> bool:
        """vLLM's `/is_sleeping`: true unless awake (a switch under way is not awake yet)."""
        self.settle(now)
        return self.engines[model].mode is not EngineMode.AWAKE

    def state(self, now: float) -> dict[str, str]:
        self.settle(now)
        return {n: e.mode.value for n, e in sorted(self.engines.items())}
