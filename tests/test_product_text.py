"""The product speaks of the product: code, CRDs, chart, docs, scenarios and policies, and
the tests, test harness, scripts and CI that check them, never talk about how the project
was built (tracker numbers, work sessions, "the main job"). Such words go stale the day they
are written and mean nothing to a user reading `kubectl explain` or the docs, nor to someone
reading a test to learn what it checks."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: what a user reads: the package, generated CRDs, the chart, docs, scenarios, policies
SHIPPED = ("operator/sageserve", "crds", "charts", "docs", "scenarios", "policies", "README.md")
#: what checks it: the tests, the e2e harness, the scripts and the CI job
CHECKS = ("tests", "e2e", "scripts", ".ci")
#: this file holds, on purpose, example lines the rule must flag (the table below), so the
#: walk leaves it out; every other file under CHECKS is held to the rule
SELF = Path(__file__).resolve()
#: caches, virtual environments, downloaded binaries and build output: not written by anyone
SKIP_DIRS = {
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "build",
    "dist",
    "out",
    ".k8sbin",
    ".kwok",
}
TEXT = {".py", ".md", ".yaml", ".yml", ".json", ".txt", ".tpl", ".html", ".toml", ""}
WORK_TALK = re.compile(
    r"\bissues? ?#?\d+|\bmain job\b|\bsession \d+|\bmilestone\b|\bfollow-up ticket\b",
    re.IGNORECASE,
)


def skipped(directory: str) -> bool:
    return directory in SKIP_DIRS or directory.endswith(".egg-info")


def text_files() -> list[Path]:
    out: list[Path] = []
    for name in SHIPPED + CHECKS:
        path = ROOT / name
        if path.is_file():
            out.append(path)
            continue
        for here, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not skipped(d))  # never descend into them
            out += [Path(here) / n for n in sorted(names) if Path(n).suffix in TEXT]
    return [p for p in out if p.resolve() != SELF]


def test_walk_covers_the_checks_and_leaves_out_only_this_file() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in text_files()}
    assert "tests/test_product_text.py" not in files
    for name in CHECKS:
        assert any(f.startswith(name + "/") for f in files), name


def test_text_names_no_tracker_numbers_or_work_sessions() -> None:
    files = text_files()
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
