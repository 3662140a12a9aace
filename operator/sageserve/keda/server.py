"""KEDA's external scaler gRPC service, served by the operator (`externalscaler.proto`).

Why an external gRPC scaler rather than KEDA's `metrics-api` trigger polling a JSON
endpoint: activity (`IsActive`, which alone brings a pod set from zero) is answered apart
from the metric, so a held request wakes a model without faking a replica count; each
ScaledObject's trigger carries its own metadata (which pod set it sizes), checked on every
call; and KEDA keeps one gRPC connection per scaler address instead of each HPA query
fetching and parsing a document.

Every call is answered from the board (`keda.scaler`); a request the server cannot answer
gets a gRPC error status naming the field (INVALID_ARGUMENT, NOT_FOUND), never an
exception out of the server, and an unexpected failure answers INTERNAL and is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from sageserve.keda import externalscaler_pb2 as pb
from sageserve.keda.scaler import (
    BOARD,
    METRIC_NAME,
    METRIC_TARGET,
    BadRequest,
    DecisionBoard,
    Desired,
    Lookup,
    UnknownPodSet,
    is_active,
    metric_value,
    parse_ref,
)

log = logging.getLogger("sageserve.keda")
SERVICE = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
#: How often StreamIsActive sends the activity while its stream is open.
STREAM_SECONDS = 5.0
Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp")


def method_path(name: str) -> str:
    """`/externalscaler.ExternalScaler/<name>`, the path KEDA's client calls."""
    return f"/{SERVICE.full_name}/{SERVICE.methods_by_name[name].name}"


class ExternalScaler:
    """The four RPCs over a `DecisionBoard`; `lookup` answers for a pod set with no
    recorded decision (`keda.scaler.Lookup`)."""

    def __init__(
        self,
        lookup: Lookup,
        board: DecisionBoard = BOARD,
        stream_seconds: float = STREAM_SECONDS,
    ) -> None:
        self.lookup = lookup
        self.board = board
        self.stream_seconds = stream_seconds

    def desired(self, ref: pb.ScaledObjectRef) -> Desired:
        return self.board.answer(parse_ref(dict(ref.scalerMetadata), ref.namespace), self.lookup)

    def is_active(self, ref: pb.ScaledObjectRef, _: grpc.ServicerContext) -> pb.IsActiveResponse:
        return pb.IsActiveResponse(result=is_active(self.desired(ref)))

    def stream_is_active(
        self, ref: pb.ScaledObjectRef, context: grpc.ServicerContext
    ) -> Iterator[pb.IsActiveResponse]:
        while context.is_active():
            yield pb.IsActiveResponse(result=is_active(self.desired(ref)))
            time.sleep(self.stream_seconds)

    def get_metric_spec(
        self, ref: pb.ScaledObjectRef, _: grpc.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        parse_ref(dict(ref.scalerMetadata), ref.namespace)  # a bad trigger fails here first
        spec = pb.MetricSpec(
            metricName=METRIC_NAME, targetSize=METRIC_TARGET, targetSizeFloat=METRIC_TARGET
        )
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    def get_metrics(
        self, request: pb.GetMetricsRequest, _: grpc.ServicerContext
    ) -> pb.GetMetricsResponse:
        if request.metricName and request.metricName != METRIC_NAME:
            raise BadRequest(
                f"metricName: {request.metricName[:80]!r} is not served; the scaler serves "
                f"{METRIC_NAME!r} (from GetMetricSpec)"
            )
        value = metric_value(self.desired(request.scaledObjectRef))
        return pb.GetMetricsResponse(
            metricValues=[
                pb.MetricValue(metricName=METRIC_NAME, metricValue=value, metricValueFloat=value)
            ]
        )


def _guarded(fn: Callable[[Req, grpc.ServicerContext], Resp]) -> Callable[..., Resp]:
    """`fn` with the scaler's errors as gRPC statuses (the message names the field)."""

    def call(request: Req, context: grpc.ServicerContext) -> Resp:
        try:
            return fn(request, context)
        except BadRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except UnknownPodSet as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except Exception as exc:  # never out of the server: KEDA counts it as a failure
            log.exception("external scaler call failed")
            context.abort(grpc.StatusCode.INTERNAL, f"sageserve scaler: {type(exc).__name__}")

    return call


def _guarded_stream(
    fn: Callable[[Req, grpc.ServicerContext], Iterator[Resp]],
) -> Callable[..., Iterator[Resp]]:
    def call(request: Req, context: grpc.ServicerContext) -> Iterator[Resp]:
        try:
            yield from fn(request, context)
        except BadRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except UnknownPodSet as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except Exception as exc:
            log.exception("external scaler stream failed")
            context.abort(grpc.StatusCode.INTERNAL, f"sageserve scaler: {type(exc).__name__}")

    return call


def handler(scaler: ExternalScaler) -> grpc.GenericRpcHandler:
    """The service's method handlers, each method named from the .proto's descriptor."""
    ref = pb.ScaledObjectRef
    methods: dict[str, Any] = {
        "IsActive": grpc.unary_unary_rpc_method_handler(
            _guarded(scaler.is_active),
            request_deserializer=ref.FromString,
            response_serializer=pb.IsActiveResponse.SerializeToString,
        ),
        "StreamIsActive": grpc.unary_stream_rpc_method_handler(
            _guarded_stream(scaler.stream_is_active),
            request_deserializer=ref.FromString,
            response_serializer=pb.IsActiveResponse.SerializeToString,
        ),
        "GetMetricSpec": grpc.unary_unary_rpc_method_handler(
            _guarded(scaler.get_metric_spec),
            request_deserializer=ref.FromString,
            response_serializer=pb.GetMetricSpecResponse.SerializeToString,
        ),
        "GetMetrics": grpc.unary_unary_rpc_method_handler(
            _guarded(scaler.get_metrics),
            request_deserializer=pb.GetMetricsRequest.FromString,
            response_serializer=pb.GetMetricsResponse.SerializeToString,
        ),
    }
    assert set(methods) == set(SERVICE.methods_by_name), "every RPC of the .proto is served"
    return grpc.method_handlers_generic_handler(SERVICE.full_name, methods)


def serve(address: str, scaler: ExternalScaler, workers: int = 8) -> tuple[grpc.Server, int]:
    """Start serving `scaler` on `address` (host:port; port 0 picks one), plaintext (KEDA's
    `external` trigger without enableTLS); returns the server and the port bound."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    server.add_generic_rpc_handlers((handler(scaler),))
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"--scaler-listen: cannot listen on {address}")
    server.start()
    return server, port
