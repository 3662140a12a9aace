"""The session's Prometheus is real: it scrapes, answers PromQL, and picks up scrape
targets dropped into its file_sd directory (how the twin registers itself)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from e2e_helpers import eventually


def query(url: str, promql: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_prometheus_listens_on_loopback_and_scrapes_itself(prometheus_url: str) -> None:
    assert prometheus_url.startswith("http://127.0.0.1:")
    result = eventually(
        lambda: query(prometheus_url, 'up{job="prometheus"} == 1'),
        60,
        "Prometheus to scrape itself",
    )
    assert result[0]["value"][1] == "1"


def test_file_sd_target_is_scraped(prometheus_url: str, prometheus_targets_dir: Path) -> None:
    host = prometheus_url.removeprefix("http://")
    target = [{"targets": [host], "labels": {"probe": "file-sd"}}]
    (prometheus_targets_dir / "probe.json").write_text(json.dumps(target))
    result = eventually(
        lambda: query(prometheus_url, 'up{job="sageserve-e2e", probe="file-sd"} == 1'),
        60,
        "the file_sd target to be scraped",
    )
    assert result[0]["metric"]["instance"] == host
