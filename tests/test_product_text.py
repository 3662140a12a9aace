"""The product speaks of the product: code, CRDs, chart, docs, scenarios and policies
never talk about how the project was built (tracker numbers, work sessions, "the main
job"). Such words go stale the day they are written and mean nothing to a user reading
`kubectl explain` or the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: what a user reads: the package, generated CRDs, the chart, docs, scenarios, policies
SHIPPED = ("operator/sageserve", "crds", "charts", "docs", "scenarios", "policies", "README.md")
TEXT = {".py", ".md", ".yaml", ".yml", ".json", ".txt", ".tpl", ".html", ".toml", ""}
WORK_TALK = re.compile(
    r"\bissues? ?#?\d+|\bmain job\b|\bsession \d+|\bmilestone\b|\bfollow-up ticket\b",
    re.IGNORECASE,
)


def shipped_files() -> list[Path]:
    out: list[Path] = []
    for name in SHIPPED:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        out += [p for p in candidates if p.is_file() and p.suffix in TEXT]
    return out


def test_shipped_text_names_no_tracker_numbers_or_work_sessions() -> None:
    files = shipped_files()
    assert len(files) > 100  # the walk found the tree, not an empty directory
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for p in files
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if WORK_TALK.search(line)
    ]
    assert not hits, "talk of how the project was built:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    ("line", "flagged"),
    [
        ("Issue 15's goals on the reported days.", True),
        ("see issue #26 for the details", True),
        ("the README's main job", True),
        ("written in session 11", True),
        ("a GitHub issue of vLLM describes the bug", False),
        ("with requests.Session() as session:", False),
    ],
)
def test_the_rule_flags_work_talk_and_not_ordinary_words(line: str, flagged: bool) -> None:
    assert bool(WORK_TALK.search(line)) is flagged
