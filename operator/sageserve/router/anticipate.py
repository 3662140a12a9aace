"""The router's per-pod load anticipators (PreServe §4.3.1) fed by the requests it proxies.

The router is where requests pass, so it is where PreServe's anticipator can live without
touching the engine: for every pod it keeps a `dispatch.anticipator.LoadAnticipator`, fed by
what the router sees of each request it forwards there:

- **sent**: the request joins the pod's queue with its prompt tokens (the router's estimate,
  characters ÷ 4) and its *predicted* output tokens, from a `dispatch.length_predictor`
  predictor per served model (by name; `client-quantile` by default, the client being the
  API key, else the body's `user`);
- **first byte**: its prefill is done, it decodes from the pod's current iteration;
- **streamed tokens**: each token of a running request is one decode iteration of its pod,
  so the pod's iteration clock is the furthest any of its requests has streamed (a pod
  whose requests are not streamed advances when they finish);
- **answered**: the pod's `usage.completion_tokens` (else the streamed count) teaches the
  predictor; the request leaves the map (early finish frees its projected blocks at once).

The pickers (`dispatch.instance_picker`, by name) read the anticipators exactly as the
simulator's do: the same `InstanceLoad`, the same functions.

KV capacity per pod comes from the pod's metrics (`vllm:cache_config_info`'s blocks ×
block size, read with the load); until a pod reports one the anticipator uses
`DEFAULT_KV_TOKENS` and is resized when it does.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from sageserve.dispatch.anticipator import LoadAnticipator
from sageserve.dispatch.instance_picker import Arrival, InstanceLoad
from sageserve.dispatch.length_predictor import (
    DEFAULT_PREDICTOR,
    LengthPredictor,
    LengthQuery,
    make_predictor,
)

#: KV tokens assumed for a pod that has not reported its cache size yet.
DEFAULT_KV_TOKENS = 100_000


def client_id(key: str | None) -> int:
    """A stable integer for a client (API key or `user`): the predictors key on ints.

    A `user` is any JSON string, lone surrogates (`"\\ud800"`) included: encoded with
    `surrogatepass`, since a plain `encode()` refuses them."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) if key else 0


@dataclass(slots=True)
class Ticket:
    """One request the router sent to a pod, as the anticipator tracks it."""

    rid: int
    pod: str
    model: str
    client: int
    prompt_tokens: int
    predicted_output: int
    started_at: int | None = None
    streamed: int = 0
    released: bool = False


class PodAnticipators:
    """One load anticipator per pod and one output-length predictor per served model."""

    def __init__(self, predictor: str = DEFAULT_PREDICTOR) -> None:
        make_predictor(predictor)  # an unknown name fails at start-up, not per request
        self.predictor_name = predictor
        self._pods: dict[str, LoadAnticipator] = {}
        self._clock: dict[str, int] = {}
        #: by served model name: bounded by the models served (a request names a model
        #: discovery listed before it gets here); the clients within each predictor are
        #: bounded by the predictor (`client-quantile`: `DEFAULT_MAX_CLIENTS`)
        self._predictors: dict[str, LengthPredictor] = {}
        self._next = 0

    # ---- predictions -------------------------------------------------------------------

    def predictor(self, model: str) -> LengthPredictor:
        p = self._predictors.get(model)
        if p is None:
            p = self._predictors[model] = make_predictor(self.predictor_name)
        return p

    def arrival(self, model: str, client: int, prompt_tokens: float) -> Arrival:
        """The request as a picker sees it: prompt tokens and predicted output tokens."""
        prompt = max(1, round(prompt_tokens))
        predicted = self.predictor(model).predict(LengthQuery(client, prompt))
        return Arrival(prompt, max(1, predicted))

    # ---- pods --------------------------------------------------------------------------

    def anticipator(self, pod: str) -> LoadAnticipator:
        ant = self._pods.get(pod)
        if ant is None:
            ant = self._pods[pod] = LoadAnticipator(DEFAULT_KV_TOKENS)
        return ant

    def set_capacity(self, pod: str, kv_tokens: float | None) -> None:
        """The pod's KV capacity as its metrics report it (ignored when unknown)."""
        if kv_tokens and kv_tokens >= 1:
            self.anticipator(pod).capacity = int(kv_tokens)

    def iteration(self, pod: str) -> int:
        return self._clock.get(pod, 0)

    def load(self, pod: str, kv_usage: float = 0.0) -> InstanceLoad:
        """What a picker knows of `pod`: its look-ahead map, clock and measured KV use."""
        return InstanceLoad(self.anticipator(pod), self.iteration(pod), kv_usage)

    def projection(self, pod: str) -> list[float]:
        return self.anticipator(pod).projection(self.iteration(pod))

    def forget(self, pods: set[str]) -> None:
        """Drop the pods that are gone (their requests died with them)."""
        for pod in [p for p in self._pods if p not in pods]:
            del self._pods[pod]
            self._clock.pop(pod, None)

    # ---- one request's life --------------------------------------------------------------

    def sent(self, pod: str, model: str, client: int, arrival: Arrival) -> Ticket:
        self._next += 1
        t = Ticket(self._next, pod, model, client, arrival.prompt_tokens, arrival.predicted_output)
        self.anticipator(pod).enqueue(t.rid, t.prompt_tokens, t.predicted_output)
        return t

    def first_byte(self, t: Ticket) -> None:
        """Prefill done: the request decodes from its pod's current iteration (on the
        look-ahead map only while it is there: a batch request's answer is read after
        its handler released it)."""
        if t.started_at is not None:
            return
        now = self.iteration(t.pod)
        t.started_at = now
        if not t.released:
            self.anticipator(t.pod).start(t.rid, now, t.prompt_tokens, t.predicted_output)

    def streamed(self, t: Ticket, tokens: int) -> None:
        """`tokens` more output tokens of a running request: its pod is at least that many
        iterations on since the request started."""
        if t.released or tokens <= 0:
            return
        if t.started_at is None:
            self.first_byte(t)
        t.streamed += tokens
        self._advance(t)

    def answered(self, t: Ticket, output_tokens: int | None) -> None:
        """The answer is complete with `output_tokens` (None: unknown): the predictor
        learns it, the pod's clock moves past it, the request leaves the map."""
        if output_tokens is not None and output_tokens > 0:
            self.predictor(t.model).observe(t.client, t.prompt_tokens, output_tokens)
            if t.started_at is None:
                self.first_byte(t)
            t.streamed = max(t.streamed, output_tokens)
            self._advance(t)
        self.release(t)

    def release(self, t: Ticket) -> None:
        """The request left the pod (answered, failed or cancelled)."""
        if t.released:
            return
        t.released = True
        ant = self._pods.get(t.pod)
        if ant is not None:
            ant.finish(t.rid)

    def _advance(self, t: Ticket) -> None:
        assert t.started_at is not None
        at = t.started_at + t.streamed
        if at > self._clock.get(t.pod, 0):
            self._clock[t.pod] = at


__all__ = ["DEFAULT_KV_TOKENS", "PodAnticipators", "Ticket", "client_id"]
