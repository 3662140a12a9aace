"""`sageserve.core` exports exactly what the rest of the project uses from it: a name other
packages import is exported, and an export nobody uses is not kept for show."""

from __future__ import annotations

import ast
from pathlib import Path

import sageserve
import sageserve.core

PACKAGE = Path(sageserve.__file__).parent
E2E = PACKAGE.parent.parent / "e2e"


def _imported_from_core() -> dict[str, set[str]]:
    """Each name imported from `sageserve.core` or one of its modules, outside the core,
    with the files that import it."""
    found: dict[str, set[str]] = {}
    files = [*PACKAGE.rglob("*.py"), *E2E.rglob("*.py")]
    for f in files:
        if f.parent == PACKAGE / "core":
            continue
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "sageserve.core"
            ):
                for alias in node.names:
                    found.setdefault(alias.name, set()).add(f.name)
    return found


def test_every_name_the_other_packages_use_is_exported() -> None:
    missing = sorted(set(_imported_from_core()) - set(sageserve.core.__all__))
    assert missing == [], f"add to sageserve.core.__all__: {missing}"


def test_no_export_is_kept_that_no_other_package_uses() -> None:
    unused = sorted(set(sageserve.core.__all__) - set(_imported_from_core()))
    assert unused == [], f"drop from sageserve.core.__all__ (nothing outside core uses): {unused}"
