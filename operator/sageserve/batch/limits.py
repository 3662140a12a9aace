"""Bounds on what a client may hand the Batch API: lines, nesting, filenames.

Why pure functions over bytes: they run on input nobody has vetted yet, so none of them
recurses, builds a tree, or keeps more than a counter per call. ``LineCounter`` counts a
file's request lines chunk by chunk while it is uploaded (the upload is refused at the
first line past the cap, before the rest arrives); ``too_deep`` finds a line nested past
``MAX_DEPTH`` before ``json.loads`` would recurse into it; ``safe_filename`` makes a
client's filename one that always fits in a ``Content-Disposition`` header.
"""

from __future__ import annotations

import json
import re
import unicodedata
from itertools import accumulate
from typing import Any
from urllib.parse import quote

#: Arrays and objects nested deeper than this make a line an error (a chat request nests
#: about 5 deep; Python's JSON decoder recurses once per level).
MAX_DEPTH = 64
#: A stored filename is cut to this many characters (the column's width).
MAX_FILENAME = 255
DEFAULT_FILENAME = "upload.jsonl"

#: A JSON string, escapes included (unrolled so the regex engine does not backtrack).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
#: the rest of a line from its first non-blank byte (``bytes.strip``'s whitespace)
_CONTENT = re.compile(rb"[^ \t\n\r\x0b\x0c][^\n]*")


def nesting_depth(raw: bytes) -> int:
    """How deep arrays and objects nest in the JSON text ``raw`` (brackets inside strings
    do not count); computed by counting, never by recursion."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return max(0, max(accumulate(_STEP[b] for b in brackets)))


class BadJson(ValueError):
    """JSON a client sent that cannot be taken: the message says why, for a 400 or a line
    of the errors file."""


#: a JSON escape of a UTF-16 surrogate (a lone one cannot be stored or encoded)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def load_json(raw: bytes, limit: int = MAX_DEPTH) -> Any:
    """``raw`` parsed, or ``BadJson`` naming why not: not UTF-8, not JSON, nested past
    ``limit`` (checked before the parser recurses), an integer past Python's 4,300
    digits, or a string holding a lone surrogate (``"\\ud800"``: valid JSON text that no
    database or UTF-8 encoder takes). One reader for every body and line a client sends,
    so each of these is a 400 (or that line's error), never a 500."""
    if too_deep(raw, limit):
        raise BadJson(f"arrays and objects nest deeper than {limit} levels")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BadJson(f"arrays and objects nest deeper than {limit} levels") from None
    except json.JSONDecodeError as exc:
        raise BadJson(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except UnicodeDecodeError:
        raise BadJson("the text is not UTF-8") from None
    except ValueError as exc:  # an integer of more digits than int() converts
        raise BadJson(str(exc)) from None
    if _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise BadJson("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
    return value


def too_deep(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether ``raw`` nests deeper than ``limit`` (cheap when it opens few brackets)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    return nesting_depth(raw) > limit


class LineCounter:
    """Counts the non-blank lines of a stream fed in chunks of any size, as
    ``jsonl.parse_input`` counts requests (a line of whitespace is not one)."""

    def __init__(self) -> None:
        self.lines = 0
        #: the last chunk ended inside a line that already has content
        self._open = False

    def feed(self, chunk: bytes) -> int:
        """Count ``chunk``; returns the lines seen so far."""
        if not chunk:
            return self.lines
        newline = chunk.find(b"\n")
        first = chunk if newline < 0 else chunk[:newline]
        found = len(_CONTENT.findall(chunk))
        if self._open and _CONTENT.search(first):
            found -= 1  # the line begun in the last chunk, counted there
        self.lines += found
        if newline < 0:
            self._open = self._open or bool(found)
        else:
            self._open = _CONTENT.search(chunk, chunk.rfind(b"\n") + 1) is not None
        return self.lines


def safe_filename(name: str | None) -> str:
    """A client's filename without control characters (CR, LF, NUL, ...), quotes,
    backslashes or a directory part, cut to ``MAX_FILENAME`` characters; the default name
    when nothing is left."""
    if not name:
        return DEFAULT_FILENAME
    base = re.split(r"[/\\]", name)[-1]
    kept = "".join(
        c for c in base if c not in "\"'" and not unicodedata.category(c).startswith("C")
    )
    kept = kept.strip(" .")[:MAX_FILENAME]
    return kept or DEFAULT_FILENAME


def content_disposition(name: str) -> str:
    """``attachment`` with the filename: an ASCII fallback and, for any other name, the
    UTF-8 form of RFC 6266 (``filename*=UTF-8''...``)."""
    clean = safe_filename(name)
    ascii_name = "".join(c if " " <= c < "\x7f" else "_" for c in clean)
    header = f'attachment; filename="{ascii_name}"'
    if ascii_name != clean:
        header += f"; filename*=UTF-8''{quote(clean, safe='')}"
    return header
