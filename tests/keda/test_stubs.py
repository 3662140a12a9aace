"""The scaler's .proto is KEDA's wire shape, and its generated classes are up to date."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from sageserve.keda import externalscaler_pb2 as pb
from sageserve.keda import stubs

ROOT = Path(__file__).resolve().parents[2]
T = FieldDescriptor


def test_the_checked_in_message_classes_are_what_the_proto_gives() -> None:
    assert stubs.stale(ROOT / "operator/sageserve/keda") == []
    done = subprocess.run(
        [sys.executable, "-m", "sageserve.cli", "keda-stubs", "--check"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "operator"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_a_stale_file_is_named_with_the_command_that_fixes_it(tmp_path: Path) -> None:
    (tmp_path / "externalscaler_pb2.py").write_text("# edited by hand\n")
    assert stubs.stale(tmp_path) == [
        tmp_path / "externalscaler_pb2.py",
        tmp_path / "externalscaler_pb2.pyi",
    ]


def test_the_service_is_keda_v2_20_2s_external_scaler() -> None:
    service = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert pb.DESCRIPTOR.package == "externalscaler"
    assert service.full_name == "externalscaler.ExternalScaler"
    got = {
        m.name: (m.input_type.full_name, m.output_type.full_name, m.server_streaming)
        for m in service.methods
    }
    assert got == {
        "IsActive": ("externalscaler.ScaledObjectRef", "externalscaler.IsActiveResponse", False),
        "StreamIsActive": (
            "externalscaler.ScaledObjectRef",
            "externalscaler.IsActiveResponse",
            True,
        ),
        "GetMetricSpec": (
            "externalscaler.ScaledObjectRef",
            "externalscaler.GetMetricSpecResponse",
            False,
        ),
        "GetMetrics": (
            "externalscaler.GetMetricsRequest",
            "externalscaler.GetMetricsResponse",
            False,
        ),
    }


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        (
            "ScaledObjectRef",
            {
                "name": (1, T.TYPE_STRING),
                "namespace": (2, T.TYPE_STRING),
                "scalerMetadata": (3, T.TYPE_MESSAGE),
            },
        ),
        ("IsActiveResponse", {"result": (1, T.TYPE_BOOL)}),
        ("GetMetricSpecResponse", {"metricSpecs": (1, T.TYPE_MESSAGE)}),
        (
            "MetricSpec",
            {
                "metricName": (1, T.TYPE_STRING),
                "targetSize": (2, T.TYPE_INT64),
                "targetSizeFloat": (3, T.TYPE_DOUBLE),
            },
        ),
        (
            "GetMetricsRequest",
            {"scaledObjectRef": (1, T.TYPE_MESSAGE), "metricName": (2, T.TYPE_STRING)},
        ),
        ("GetMetricsResponse", {"metricValues": (1, T.TYPE_MESSAGE)}),
        (
            "MetricValue",
            {
                "metricName": (1, T.TYPE_STRING),
                "metricValue": (2, T.TYPE_INT64),
                "metricValueFloat": (3, T.TYPE_DOUBLE),
            },
        ),
    ],
)
def test_every_message_has_keda_s_field_names_numbers_and_types(
    message: str, fields: dict[str, tuple[int, int]]
) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: (f.number, f.type) for f in descriptor.fields} == fields


def test_the_descriptor_is_the_one_keda_v2_20_2_compiles_into_its_client() -> None:
    """KEDA's own descriptor bytes (tests/keda/data/README.md) against ours: the same
    package, service, methods, messages, fields, numbers, types and options."""
    from google.protobuf import descriptor_pb2

    raw = (Path(__file__).parent / "data" / "keda-v2.20.2-externalscaler.binpb").read_bytes()
    keda = descriptor_pb2.FileDescriptorProto.FromString(raw)
    for message in keda.message_type:
        for m in [message, *message.nested_type]:
            for f in m.field:
                f.ClearField("json_name")  # protoc-gen-go records it, the Python generator not
    ours = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    assert keda == ours
