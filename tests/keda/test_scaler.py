"""What the scaler answers for a pod set: the rules for the metric and for IsActive, and
the metadata every call is checked against."""

from __future__ import annotations

import pytest

from sageserve.keda.scaler import (
    BadRequest,
    DecisionBoard,
    Desired,
    PodSetRef,
    UnknownPodSet,
    is_active,
    metric_value,
    parse_ref,
)

META = {
    "scalerAddress": "sageserve-scaler.ops.svc:9100",
    "namespace": "llm",
    "modelDeployment": "llama",
    "region": "us-east",
    "variant": "h100",
    "podSet": "llama-us-east-h100",
}


@pytest.mark.parametrize(
    ("desired", "active", "value"),
    [
        (Desired(3), True, 3),  # the plan sizes it: active, the metric is the replicas
        (Desired(0), False, 0),  # the plan says 0 and nothing waits: KEDA may go to zero
        (Desired(0, held_requests=4), False, 0),  # held, but another variant wakes the model
        (Desired(0, held_requests=4, wakes_endpoint=True), True, 0),  # held: wake it
        (Desired(0, deadline_pressure=True, wakes_endpoint=True), True, 0),  # batch waits
        (Desired(0, held_requests=0, wakes_endpoint=True), False, 0),  # nothing waits
        (Desired(2, held_requests=9, wakes_endpoint=False), True, 2),
        (Desired(-1), False, 0),  # never a negative metric
    ],
)
def test_the_metric_is_the_decided_replicas_and_activity_follows_the_plan_or_demand(
    desired: Desired, active: bool, value: int
) -> None:
    assert (is_active(desired), metric_value(desired)) == (active, value)


def test_metadata_names_the_pod_set() -> None:
    assert parse_ref(META, "llm") == PodSetRef(
        "llm", "llama", "us-east", "h100", "llama-us-east-h100"
    )


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"podSet": None}, "scalerMetadata.podSet", "missing"),
        ({"region": ""}, "scalerMetadata.region", "missing"),
        ({"variant": "H100!"}, "scalerMetadata.variant", "not a Kubernetes name"),
        ({"modelDeployment": "x" * 300}, "scalerMetadata.modelDeployment", "not a Kubernetes"),
        ({"namespace": "other"}, "scalerMetadata.namespace", "is not the ScaledObject's"),
        ({"podSet": "llama-us-west-h100"}, "scalerMetadata.podSet", "is not the pod set of"),
    ],
)
def test_bad_metadata_is_refused_naming_the_field(
    change: dict[str, str | None], field: str, says: str
) -> None:
    meta = {k: v for k, v in {**META, **change}.items() if v is not None}
    with pytest.raises(BadRequest) as caught:
        parse_ref(meta, "llm")
    assert str(caught.value).startswith(field) and says in str(caught.value)


def test_the_board_answers_the_decision_else_the_lookup_else_unknown() -> None:
    board = DecisionBoard()
    ref = parse_ref(META, "llm")
    looked: list[tuple[str, str]] = []

    def lookup(namespace: str, pod_set: str) -> int | None:
        looked.append((namespace, pod_set))
        return 5 if pod_set == "llama-us-east-h100" else None

    assert board.answer(ref, lookup) == Desired(5)  # before any decision: where it is
    board.record("llm", {"llama-us-east-h100": Desired(7, held_requests=1)})
    assert board.answer(ref, lookup) == Desired(7, held_requests=1)
    assert looked == [("llm", "llama-us-east-h100")]
    board.forget("llm", {"llama-us-east-h100"})
    assert board.get("llm", "llama-us-east-h100") is None
    other = parse_ref({**META, "variant": "a100", "podSet": "llama-us-east-a100"}, "llm")
    with pytest.raises(
        UnknownPodSet, match=r"scalerMetadata.podSet: no pod set 'llama-us-east-a100'"
    ):
        board.answer(other, lookup)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--scaler-listen", "9100"),
        ("--scaler-address", "http://x:9100"),
        ("--scaler-listen", "a b:1"),
    ],
)
def test_the_operator_refuses_a_scaler_address_that_is_not_host_port(flag: str, value: str) -> None:
    from typer.testing import CliRunner

    from sageserve.cli import app

    result = CliRunner().invoke(app, ["operator", flag, value])
    assert result.exit_code == 2
    assert f"{flag}: {value!r} is not host:port" in result.output
