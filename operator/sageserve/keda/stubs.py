"""Generate the Python message classes of `externalscaler.proto` (grpcio-tools' protoc).

Why checked in rather than generated at import: the operator image then needs no
compiler, and a change of the generated code shows in review. `sageserve keda-stubs
--check` (run by the tests) says when the checked-in files differ from what the .proto
gives, as `sageserve crds --check` does for the CRDs.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

PROTO = Path(__file__).with_name("externalscaler.proto")
#: the files protoc writes for PROTO, in the package next to it
GENERATED = ("externalscaler_pb2.py", "externalscaler_pb2.pyi")


def render() -> dict[str, str]:
    """{file name: text} protoc generates from PROTO (grpcio-tools must be installed:
    `pip install grpcio-tools`, a test dependency)."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    with tempfile.TemporaryDirectory() as out:
        args = [
            "protoc",
            f"-I{PROTO.parent}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            str(PROTO),
        ]
        code = protoc.main(args)
        if code != 0:
            raise RuntimeError(f"protoc failed ({code}) on {PROTO}")
        return {name: (Path(out) / name).read_text(encoding="utf-8") for name in GENERATED}


def stale(directory: Path) -> list[Path]:
    """The generated files in `directory` that differ from what PROTO gives."""
    return [
        directory / name
        for name, text in render().items()
        if not (directory / name).is_file()
        or (directory / name).read_text(encoding="utf-8") != text
    ]


def write(directory: Path) -> list[Path]:
    """Write the generated files into `directory`."""
    out = []
    for name, text in render().items():
        (directory / name).write_text(text, encoding="utf-8")
        out.append(directory / name)
    return out
