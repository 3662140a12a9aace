"""`sageserve validate`: what passes, what is refused, and how the refusal reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sageserve.api.crd import render_all
from sageserve.api.validate import validate_paths
from sageserve.cli import app

ROOT = Path(__file__).resolve().parents[2]
INVALID = sorted((ROOT / "tests" / "manifests" / "invalid").glob("*.yaml"))


def _headers(path: Path) -> dict[str, str]:
    found = re.findall(r"^# (\w+): (.*)$", path.read_text(encoding="utf-8"), flags=re.M)
    return dict(found)


def test_example_policies_are_valid() -> None:
    report = validate_paths([ROOT / "policies"])
    assert report.ok, [str(p) for p in report.problems]
    assert report.checked >= 8  # 3 tiers, 4 models, the policies


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_manifest_is_refused_naming_the_field(path: Path) -> None:
    headers = _headers(path)
    report = validate_paths([path])
    assert len(report.problems) == 1, [str(p) for p in report.problems]
    problem = report.problems[0]
    assert problem.field == headers["field"]
    assert headers["expect"] in str(problem)
    assert problem.file == str(path)
    assert "/" in problem.obj  # Kind/name


def _cel_messages() -> list[str]:
    def walk(node: object) -> list[str]:
        if isinstance(node, dict):
            found = [r["message"] for r in node.get("x-kubernetes-validations", [])]
            return found + [m for v in node.values() for m in walk(v)]
        if isinstance(node, list):
            return [m for v in node for m in walk(v)]
        return []

    return [m for text in render_all().values() for m in walk(yaml.safe_load(text))]


def test_every_cel_rule_has_an_invalid_example() -> None:
    expects = [_headers(p)["expect"] for p in INVALID]
    messages = _cel_messages()
    assert len(messages) >= 20
    for message in messages:
        assert any(e in message for e in expects), f"no test for: {message}"


def test_every_enum_has_an_invalid_example() -> None:
    fields = {_headers(p)["field"] for p in INVALID}
    for field in (
        "spec.type",
        "spec.strategy",
        "spec.forecast.method",
        "spec.forecast.fallback",
        "spec.optimizer.solver",
        "spec.engine.kind",
        "spec.signals.endpointPicker",
    ):
        assert field in fields, f"no invalid example for enum {field}"


def test_quoted_numbers_are_refused_as_the_api_server_does(tmp_path: Path) -> None:
    manifest = tmp_path / "p.yaml"
    manifest.write_text(
        "apiVersion: sageserve.io/v1alpha1\nkind: ScalingPolicy\nmetadata: {name: p}\n"
        'spec:\n  thresholds: {scaleOutEmu: "0.8"}\n'
    )
    [problem] = validate_paths([manifest]).problems
    assert problem.field == "spec.thresholds.scaleOutEmu"


def test_other_kinds_are_skipped_and_bad_yaml_is_reported(tmp_path: Path) -> None:
    (tmp_path / "ns.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    (tmp_path / "broken.yaml").write_text("kind: [unclosed\n")
    report = validate_paths([tmp_path])
    assert report.skipped == 1
    [problem] = report.problems
    assert problem.file.endswith("broken.yaml") and "not valid YAML" in problem.message


def test_unknown_version_and_kind_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    docs = [
        {"apiVersion": "sageserve.io/v1", "kind": "ScalingPolicy", "metadata": {"name": "a"}},
        {"apiVersion": "sageserve.io/v1alpha1", "kind": "Fleet", "metadata": {"name": "b"}},
    ]
    path.write_text(yaml.safe_dump_all(docs))
    fields = [(p.field, p.fix) for p in validate_paths([path]).problems]
    assert fields[0] == ("apiVersion", "use sageserve.io/v1alpha1")
    assert fields[1][0] == "kind" and "ModelDeployment" in fields[1][1]


def test_cli_exit_codes_and_one_line_per_problem() -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(ROOT / "policies")])
    assert ok.exit_code == 0, ok.output
    assert "valid" in ok.output
    bad = runner.invoke(app, ["validate", "-f", str(INVALID[0]), "-f", str(INVALID[1])])
    assert bad.exit_code == 1
    lines = [ln for ln in bad.output.splitlines() if ln.startswith(str(ROOT))]
    assert len(lines) == 2
    missing = runner.invoke(app, ["validate", "-f", "no/such/dir"])
    assert missing.exit_code == 2


def test_cli_crds_check_detects_a_stale_file(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["crds", "-o", str(tmp_path)]).exit_code == 0
    assert runner.invoke(app, ["crds", "-o", str(tmp_path), "--check"]).exit_code == 0
    stale = next(tmp_path.glob("*.yaml"))
    stale.write_text(stale.read_text().replace("maximum: 1000", "maximum: 999"))
    assert runner.invoke(app, ["crds", "-o", str(tmp_path), "--check"]).exit_code == 1
    printed = runner.invoke(app, ["crds"])
    assert printed.exit_code == 0
    assert len(list(yaml.safe_load_all(printed.output))) == 4


def test_references_to_objects_outside_the_files_are_warnings_not_errors() -> None:
    alone = validate_paths([ROOT / "policies" / "base" / "models.yaml"])
    assert alone.ok
    fields = {(w.obj, w.field) for w in alone.warnings}
    assert ("ModelDeployment/llama-2-70b", "spec.policyRef.name") in fields
    assert ("ModelDeployment/llama-2-70b", "spec.tiers[2]") in fields
    together = validate_paths(
        [ROOT / "policies" / "base", ROOT / "policies" / "overlays" / "lt-ua"]
    )
    assert together.ok and not together.warnings
