"""The pure bounds on client input: nesting depth, streamed line counts, filenames, and
OpenAI's ``expires_after``; each as a table of inputs and what a client gets."""

from __future__ import annotations

import json

import pytest

from sageserve.batch import InvalidInput
from sageserve.batch.jsonl import parse_input
from sageserve.batch.limits import (
    MAX_DEPTH,
    LineCounter,
    content_disposition,
    nesting_depth,
    safe_filename,
    too_deep,
)
from sageserve.batch.retention import expires_after_object, parse_expires_after


@pytest.mark.parametrize(
    ("raw", "depth"),
    [
        (b"", 0),
        (b"42", 0),
        (b"{}", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'{"a": "[[[[[[[[[[[["}', 1),  # brackets in a string do not nest
        (b'{"a": "\\"[[[[", "b": [[]]}', 3),  # nor after an escaped quote
        (b"[" * 1000 + b"]" * 1000, 1000),
        (b"[]" * 5000, 1),  # many brackets, shallow
        (b"]]]]", 0),  # invalid JSON, never negative
    ],
)
def test_nesting_depth_counts_brackets_outside_strings(raw: bytes, depth: int) -> None:
    assert nesting_depth(raw) == depth


def test_too_deep_is_past_the_limit_not_at_it() -> None:
    at = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert not too_deep(at)
    assert too_deep(b"[" + at + b"]")
    assert not too_deep(b"[]" * 10_000)  # long and shallow is fine
    assert too_deep(b"[" * 200_000)  # what would make json.loads recurse past the stack


CONTENTS = [
    b"",
    b"\n\n",
    b"a",
    b"a\nb\n",
    b"a\n\n  \n\tb\r\nc",
    b"  x  \n   \n y",
    b'{"custom_id": "a"}\n{"custom_id": "b"}\n\n',
]


@pytest.mark.parametrize("content", CONTENTS)
def test_streamed_line_count_is_the_parsers_whatever_the_chunks(content: bytes) -> None:
    expected = parse_input(content, "/v1/chat/completions", lambda _: None).total
    for size in range(1, len(content) + 2):
        counter = LineCounter()
        for start in range(0, len(content), size):
            counter.feed(content[start : start + size])
        assert counter.lines == expected, (content, size)


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("requests.jsonl", "requests.jsonl"),
        ('evil\r\nSet-Cookie: x=1".jsonl', "evilSet-Cookie: x=1.jsonl"),
        ("a\x00b\x7fc\u202ed.jsonl", "abcd.jsonl"),  # NUL, DEL, a bidi override
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\me\\in.jsonl", "in.jsonl"),
        ("'quoted'", "quoted"),
        ("\r\n", "upload.jsonl"),
        (None, "upload.jsonl"),
        ("résumé.jsonl", "résumé.jsonl"),
        ("x" * 1000, "x" * 255),
    ],
)
def test_filenames_lose_what_breaks_a_header(given: str | None, stored: str) -> None:
    assert safe_filename(given) == stored


@pytest.mark.parametrize(
    ("name", "header"),
    [
        ("in.jsonl", 'attachment; filename="in.jsonl"'),
        ("a\r\nb.jsonl", 'attachment; filename="ab.jsonl"'),
        (
            "résumé.jsonl",
            "attachment; filename=\"r_sum_.jsonl\"; filename*=UTF-8''r%C3%A9sum%C3%A9.jsonl",
        ),
    ],
)
def test_content_disposition_is_one_header_line(name: str, header: str) -> None:
    assert content_disposition(name) == header


@pytest.mark.parametrize(
    ("anchor", "seconds", "form", "result", "param"),
    [
        ("created_at", 3600, False, 3600.0, None),
        ("created_at", 2592000, False, 2592000.0, None),
        ("created_at", "86400", True, 86400.0, None),
        ("created_at", 3599, False, None, "expires_after.seconds"),
        ("created_at", 2592001, False, None, "expires_after.seconds"),
        ("created_at", "86400", False, None, "expires_after.seconds"),  # JSON wants a number
        ("created_at", True, False, None, "expires_after.seconds"),
        ("created_at", 3600.5, False, None, "expires_after.seconds"),
        ("created_at", "soon", True, None, "expires_after[seconds]"),
        ("created_at", None, True, None, "expires_after[seconds]"),
        ("last_active_at", 3600, False, None, "expires_after.anchor"),
        (None, "3600", True, None, "expires_after[anchor]"),
    ],
)
def test_expires_after_takes_openais_bounds(
    anchor: object, seconds: object, form: bool, result: float | None, param: str | None
) -> None:
    if result is not None:
        assert parse_expires_after(anchor, seconds, "expires_after", form) == result
        return
    with pytest.raises(InvalidInput) as refused:
        parse_expires_after(anchor, seconds, "expires_after", form)
    assert refused.value.param == param
    assert param in str(refused.value)


def test_output_expires_after_must_be_an_object() -> None:
    assert expires_after_object(None, "output_expires_after") is None
    ok = json.loads('{"anchor": "created_at", "seconds": 7200}')
    assert expires_after_object(ok, "output_expires_after") == 7200.0
    with pytest.raises(InvalidInput) as refused:
        expires_after_object(7200, "output_expires_after")
    assert refused.value.param == "output_expires_after"
