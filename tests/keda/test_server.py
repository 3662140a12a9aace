"""KEDA's external scaler over real gRPC on a loopback port, called as KEDA calls it."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from sageserve.keda import externalscaler_pb2 as pb
from sageserve.keda.scaler import METRIC_NAME, DecisionBoard, Desired
from sageserve.keda.server import ExternalScaler, method_path, serve

META = {
    "scalerAddress": "127.0.0.1:0",
    "namespace": "llm",
    "modelDeployment": "llama",
    "region": "us-east",
    "variant": "h100",
    "podSet": "llama-us-east-h100",
}
CURRENT = {"llama-us-east-h100": 4, "llama-us-east-a100": 0}


class Client:
    """A plain grpcio client of the four RPCs, paths from the .proto's descriptor."""

    def __init__(self, channel: grpc.Channel) -> None:
        ref = pb.ScaledObjectRef.SerializeToString
        self.is_active = channel.unary_unary(
            method_path("IsActive"), ref, pb.IsActiveResponse.FromString
        )
        self.stream_is_active = channel.unary_stream(
            method_path("StreamIsActive"), ref, pb.IsActiveResponse.FromString
        )
        self.get_metric_spec = channel.unary_unary(
            method_path("GetMetricSpec"), ref, pb.GetMetricSpecResponse.FromString
        )
        self.get_metrics = channel.unary_unary(
            method_path("GetMetrics"),
            pb.GetMetricsRequest.SerializeToString,
            pb.GetMetricsResponse.FromString,
        )


@pytest.fixture
def served() -> Iterator[tuple[Client, DecisionBoard]]:
    board = DecisionBoard()

    def lookup(namespace: str, pod_set: str) -> int | None:
        if pod_set == "boom-us-east-h100":
            raise RuntimeError("API server away")
        return CURRENT.get(pod_set) if namespace == "llm" else None

    server, port = serve("127.0.0.1:0", ExternalScaler(lookup, board, stream_seconds=0.05))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Client(channel), board
    finally:
        channel.close()
        server.stop(grace=None)


def ref(**change: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(
        name="llama-us-east-h100", namespace="llm", scalerMetadata={**META, **change}
    )


def metric(client: Client, r: pb.ScaledObjectRef) -> float:
    got = client.get_metrics(
        pb.GetMetricsRequest(scaledObjectRef=r, metricName=METRIC_NAME), timeout=5
    )
    [value] = got.metricValues
    assert value.metricName == METRIC_NAME and value.metricValue == value.metricValueFloat
    return value.metricValueFloat


def test_one_metric_per_scaled_object_with_a_target_of_one_replica(
    served: tuple[Client, DecisionBoard],
) -> None:
    client, _ = served
    [spec] = client.get_metric_spec(ref(), timeout=5).metricSpecs
    assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == (METRIC_NAME, 1, 1.0)


def test_the_metric_is_the_current_size_until_a_decision_then_the_decision(
    served: tuple[Client, DecisionBoard],
) -> None:
    client, board = served
    assert metric(client, ref()) == 4.0  # no decision yet: no jump
    assert client.is_active(ref(), timeout=5).result is True
    board.record("llm", {"llama-us-east-h100": Desired(6)})
    assert metric(client, ref()) == 6.0
    board.record("llm", {"llama-us-east-h100": Desired(0)})
    assert metric(client, ref()) == 0.0
    assert client.is_active(ref(), timeout=5).result is False
    board.record("llm", {"llama-us-east-h100": Desired(0, held_requests=3, wakes_endpoint=True)})
    assert client.is_active(ref(), timeout=5).result is True
    first = next(iter(client.stream_is_active(ref(), timeout=5)))
    assert first.result is True


@pytest.mark.parametrize(
    ("call", "r", "code", "says"),
    [
        (
            "get_metric_spec",
            ref(podSet=""),
            grpc.StatusCode.INVALID_ARGUMENT,
            "scalerMetadata.podSet: missing",
        ),
        (
            "is_active",
            ref(region="US East"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "scalerMetadata.region",
        ),
        (
            "get_metrics",
            ref(namespace="other"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "scalerMetadata.namespace",
        ),
        (
            "get_metrics",
            ref(variant="a100", podSet="llama-us-east-a100", modelDeployment="llama"),
            None,
            "",
        ),
        (
            "get_metrics",
            ref(modelDeployment="gone", podSet="gone-us-east-h100"),
            grpc.StatusCode.NOT_FOUND,
            "scalerMetadata.podSet: no pod set 'gone-us-east-h100'",
        ),
        (
            "is_active",
            ref(modelDeployment="gone", podSet="gone-us-east-h100"),
            grpc.StatusCode.NOT_FOUND,
            "scalerMetadata.podSet",
        ),
    ],
)
def test_a_request_it_cannot_answer_gets_a_status_naming_the_field(
    served: tuple[Client, DecisionBoard],
    call: str,
    r: pb.ScaledObjectRef,
    code: grpc.StatusCode | None,
    says: str,
) -> None:
    client, _ = served
    request = (
        r
        if call != "get_metrics"
        else pb.GetMetricsRequest(scaledObjectRef=r, metricName=METRIC_NAME)
    )
    if code is None:  # a known pod set at 0: answered
        assert getattr(client, call)(request, timeout=5).metricValues[0].metricValue == 0
        return
    with pytest.raises(grpc.RpcError) as caught:
        getattr(client, call)(request, timeout=5)
    assert caught.value.code() == code
    assert says in (caught.value.details() or "")


def test_another_metric_name_is_refused_and_a_failure_inside_is_internal_not_fatal(
    served: tuple[Client, DecisionBoard],
) -> None:
    client, _ = served
    with pytest.raises(grpc.RpcError) as caught:
        client.get_metrics(pb.GetMetricsRequest(scaledObjectRef=ref(), metricName="cpu"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith("metricName: 'cpu' is not served")
    # the lookup failing (the API server away) is INTERNAL, and the server keeps serving
    with pytest.raises(grpc.RpcError) as caught:
        client.is_active(ref(modelDeployment="boom", podSet="boom-us-east-h100"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == "sageserve scaler: RuntimeError"
    assert metric(client, ref()) == 4.0
