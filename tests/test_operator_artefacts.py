"""deploy/grafana-dashboard.json and deploy/prometheus-alerts.yml use only series the server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.local_cluster import LocalCluster
from bench.servers import ROOT
from client.segment_client import SegmentClient

# A series name in PromQL: ours and the process collector's (``up`` is Prometheus' own, per target).
_SERIES = re.compile(r"\b((?:segstore|process)_[a-z0-9_]+)\b")


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [var["definition"] for var in dashboard["templating"]["list"] if "definition" in var]
    return exprs


def alert_rules() -> list[dict]:
    doc = yaml.safe_load((ROOT / "deploy" / "prometheus-alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_alerts_cover_what_operators_are_paged_for() -> None:
    rules = alert_rules()
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"], rule
    exprs = " ".join(rule["expr"] for rule in rules)
    paged_for = (  # Tier 1 backlog, throttling, a container not running, lease losses, a full disk
        "segstore_writer_lag_bytes",
        "segstore_throttled_requests_total",
        'segstore_container_state{state!~"running|degraded"}',
        "segstore_cluster_lease_losses_total",
        'state="read_only"',
    )
    for series in paged_for:
        assert series in exprs, f"no alert on {series}"


def test_every_panel_has_a_query_and_a_unit() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        assert panel["targets"] and panel["fieldConfig"]["defaults"]["unit"], panel["title"]


@pytest.mark.slow
@pytest.mark.process
def test_every_series_the_dashboard_and_alerts_use_is_exported(tmp_path: Path) -> None:
    """A cluster node (on moto) exports the data path's series and the cluster's."""
    with LocalCluster(tmp_path, nodes=1, settings={"SEGSTORE_LEASE_S": "3"}) as cluster:
        url = cluster.nodes["a"].url
        # As any client of a cluster: a container the node has not claimed yet answers 503 + Retry-After.
        with SegmentClient(url, retries=20) as client:
            client.create("series/0")
        text = requests.get(f"{url}/metrics", timeout=30).text
    exported = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    used = {name for expr in dashboard_exprs() + [r["expr"] for r in alert_rules()]
            for name in _SERIES.findall(expr)}
    assert used, "no series found in the artefacts"
    assert sorted(used - exported) == []
