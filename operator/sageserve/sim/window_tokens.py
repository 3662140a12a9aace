"""What PreServe's window plan reads, counted in the simulated cluster as the operator reads
it from a real one (PreServe §4.1, Alg. 2).

The operator's window loop (`controller.window_loop`) reads, per (model, *serving* region),
the prompt and the generated tokens/s per minute of every request (vLLM's counters do not
know tiers) and the batch tokens/s the router *served*, one total per minute; it takes batch
out of prompt and decode in each minute's prompt : generated proportion
(`plan.preserve.window_inputs`). The simulator counts the same three series per served
(model, region) as requests are dispatched, so both worlds plan a window from the same kind
of observation, through the same function. A request's tokens count in the minute it is
dispatched (a router counts them as they stream, at most a request's duration later), as the
hourly cycle's history does.
"""

from __future__ import annotations

from collections.abc import Iterable

Key = tuple[str, str]


class WindowTokens:
    """Prompt, generated and batch tokens/s per minute of each served (model, region), from
    the start of the run; one value per minute for every key seen so far."""

    __slots__ = ("_minute", "batch", "decode", "minutes", "prompt")

    def __init__(self) -> None:
        #: this minute's (prompt, generated, batch) tokens per key
        self._minute: dict[Key, list[int]] = {}
        self.prompt: dict[Key, list[float]] = {}
        self.decode: dict[Key, list[float]] = {}
        self.batch: dict[Key, list[float]] = {}
        #: whole minutes rolled so far
        self.minutes = 0

    def count(self, key: Key, prompt: int, output: int, batch: bool) -> None:
        got = self._minute.get(key)
        if got is None:
            got = self._minute[key] = [0, 0, 0]
        got[0] += prompt
        got[1] += output
        if batch:
            got[2] += prompt + output

    def roll(self, keys: Iterable[Key]) -> None:
        """Close the minute: tokens/s for each of `keys` and of every key counted (0 where
        nothing was dispatched); a key seen for the first time has zeros before."""
        minute, self._minute = self._minute, {}
        for key in set(keys) | set(minute) | set(self.prompt):
            p, d, b = minute.get(key, (0, 0, 0))
            for series, value in ((self.prompt, p), (self.decode, d), (self.batch, b)):
                values = series.get(key)
                if values is None:
                    values = series[key] = [0.0] * self.minutes
                values.append(value / 60.0)
        self.minutes += 1
