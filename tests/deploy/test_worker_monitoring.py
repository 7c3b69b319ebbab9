"""Workers are scraped: the chart's worker PodMonitor selects the worker pods and port the values name,
in the namespaces they name, and what the workers' alert and the dashboard's Workers row read is what a
worker process exports (kmq/telemetry/metrics.py ConsumerMetrics), not the tracker's metrics."""

from __future__ import annotations

import json

from kmq.telemetry.metrics import ConsumerMetrics, exported_metric_names
from tests.deploy.conftest import find, render, vd

WORKER_METRICS = exported_metric_names((ConsumerMetrics,))
RULES = {"prometheusRule": {"enabled": True, "runbookBaseUrl": "https://docs.example.com/kmq/docs/operations.md"}}


def worker_monitors(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("-workers")]


def test_no_worker_monitor_unless_enabled():
    assert worker_monitors(render({"podMonitor": {"enabled": True}})) == []


def test_worker_pod_monitor_defaults_select_labelled_workers_in_the_release_namespace():
    mon = find(render({"workerPodMonitor": {"enabled": True}}), "PodMonitor", "-workers")
    assert mon["metadata"]["name"] == "kmq-workers"
    assert mon["spec"]["selector"] == {"matchLabels": {"kmq-worker": "true"}}
    assert mon["spec"]["namespaceSelector"] == {"matchNames": ["kmq"]}
    (endpoint,) = mon["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics" and endpoint["interval"] == "30s"
    assert endpoint["relabelings"] == [{"targetLabel": "job", "replacement": "kmq-workers"}]
    assert vd.validate_object(mon, "worker-podmonitor.yaml") == []


def test_worker_pod_monitor_takes_selector_port_and_namespaces_from_values():
    values = {"workerPodMonitor": {
        "enabled": True, "port": "prom", "path": "/internal/metrics", "interval": "15s", "namespaces": ["orders", "billing"],
        "labels": {"release": "prometheus"},
        "selector": {"matchLabels": {"app": "orders-worker"},
                     "matchExpressions": [{"key": "tier", "operator": "In", "values": ["queue"]}]}}}
    mon = find(render(values), "PodMonitor", "-workers")
    assert mon["spec"]["selector"] == values["workerPodMonitor"]["selector"]
    assert mon["spec"]["namespaceSelector"] == {"matchNames": ["orders", "billing"]}
    (endpoint,) = mon["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("prom", "/internal/metrics", "15s")
    assert mon["metadata"]["labels"]["release"] == "prometheus"
    assert vd.validate_object(mon, "worker-podmonitor.yaml") == []
    # An empty matchLabels is the default selector, never one that selects every pod of the namespace.
    empty = find(render({"workerPodMonitor": {"enabled": True, "selector": {"matchLabels": {}}}}), "PodMonitor", "-workers")
    assert empty["spec"]["selector"] == {"matchLabels": {"kmq-worker": "true"}}
    # The tracker's PodMonitor is another object, still selecting only the tracker.
    docs = render({**values, "podMonitor": {"enabled": True}})
    tracker = find(docs, "PodMonitor", "kmq")
    assert tracker["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "tracker"


def test_workers_alert_reads_only_metrics_workers_export_and_no_tracker_job():
    rules = [r for g in find(render(RULES), "PrometheusRule")["spec"]["groups"] for r in g["rules"] if "alert" in r]
    worker_alerts = {r["alert"]: r for r in rules if any(m.startswith("kmq_consumer_") for m in vd.promql_metric_names(r["expr"]))}
    assert "KmqConsumerMarkersGivenUp" in worker_alerts
    for name, rule in worker_alerts.items():
        assert vd.promql_metric_names(rule["expr"]) <= WORKER_METRICS, name
        # Workers are scraped as job <release>-kmq-workers: a tracker job matcher would never match them.
        assert "job=" not in rule["expr"] or 'job="kmq-workers"' in rule["expr"], name


def test_dashboard_workers_row_reads_only_metrics_workers_export():
    panels = json.loads(vd.DASHBOARD.read_text())["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Workers")
    row = []
    for panel in panels[start + 1:]:
        if panel["type"] == "row":
            break
        row.append(panel)
    queries = [t["expr"] for p in row for t in p.get("targets", [])]
    assert queries
    for expr in queries:
        assert vd.promql_metric_names(expr) <= WORKER_METRICS, expr
        assert "$job" not in expr, f"{expr}: $job lists tracker jobs only"
