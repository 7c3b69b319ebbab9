"""The Grafana dashboard and the alert rules only use metrics kmq really exports
(kmq/telemetry/metrics.py), every alert has a promtool test and a runbook entry, and the
chart's new values render what they promise (probes, Strimzi topics, digest,
Redis URL from a Secret, OpenShift security context)."""

from __future__ import annotations

import json

import pytest
import yaml

from kmq.telemetry.metrics import exported_metric_names
from tests.deploy.conftest import find, render, vd


def test_dashboard_queries_use_only_exported_metrics():
    assert vd.check_dashboard() == []
    dash = json.loads(vd.DASHBOARD.read_text())
    used = set().union(*(vd.promql_metric_names(q) for _, q in vd.dashboard_queries(dash)))
    # The dashboard covers the tracker, the workers, the lag job and the process metrics.
    for prefix in ("kmq_tracker_", "kmq_consumer_", "kmq_lag_", "process_", "kmq_build_info"):
        assert any(m.startswith(prefix) for m in used), prefix


def test_the_metric_check_catches_a_metric_kmq_does_not_export(tmp_path):
    dash = json.loads(vd.DASHBOARD.read_text())
    dash["panels"][1]["targets"][0]["expr"] = 'sum by (queue) (rate(kmq_tracker_redeliveries_total[5m]))'
    bad = tmp_path / "kmq.json"
    bad.write_text(json.dumps(dash))
    assert vd.check_dashboard(bad) == [
        "kmq.json panel 'Trackers ready': uses kmq_tracker_redeliveries_total, which kmq does not export (kmq/telemetry/metrics.py)"]


@pytest.mark.parametrize("expr, names", [
    ('histogram_quantile(0.99, sum by (le) (rate(kmq_lag_ack_latency_seconds_bucket{queue=~"$queue"}[$__rate_interval])))',
     {"kmq_lag_ack_latency_seconds_bucket"}),
    ('(sum by (queue) (kmq_tracker_marker_lag) > 1000) and (sum by (queue) (deriv(kmq_tracker_marker_lag[10m])) > 0)',
     {"kmq_tracker_marker_lag"}),
    ('absent(up{job="kmq-tracker"} == 1)', {"up"}),
    ("max by (queue) (kmq_tracker_oldest_in_flight_seconds) > 0.5 * 604800", {"kmq_tracker_oldest_in_flight_seconds"}),
])
def test_promql_metric_names(expr, names):
    assert vd.promql_metric_names(expr) == names


def test_exported_metric_names_expand_counters_and_histograms():
    names = exported_metric_names()
    assert {"kmq_tracker_redelivered_total", "kmq_tracker_redelivery_delay_seconds_bucket",
            "kmq_lag_ack_latency_seconds_count", "kmq_lag_acked_total", "kmq_lag_in_flight",
            "process_cpu_seconds_total", "kmq_build_info", "kmq_tracker_ready"} <= names
    assert "kmq_lag_acked" not in names  # per-window gauges are gone: counters only


def test_every_alert_has_a_promtool_test_a_runbook_entry_and_known_metrics():
    assert vd.check_alerts() == []
    alerts = {r["alert"] for r in vd._alert_rules()}
    assert {"KmqRedeliveryFailing", "KmqOffsetsMissingFromQueueLog", "KmqBadMarkers",
            "KmqOpenStartNearRetention", "KmqTrackerNotReady", "KmqDeadLettersGrowing",
            "KmqMarkersLostToRetention", "KmqDeadLetterTopicUnavailable", "KmqUndeliverableMessages"} <= alerts
    # One alert per fact: the retention one reads the tracker's ratio (per queue retention), one failing-redelivery alert.
    assert "KmqInFlightNearMarkersRetention" not in alerts
    assert sum(r["alert"] == "KmqRedeliveryFailing" for r in vd._alert_rules()) == 1


def test_dead_letter_alert_is_a_rate_with_a_for():
    (rule,) = [r for r in vd._alert_rules() if r["alert"] == "KmqDeadLettersGrowing"]
    assert "rate(kmq_tracker_dead_lettered_total" in rule["expr"] and rule["for"] != "0m"


def test_strimzi_mode_renders_kafka_topics_instead_of_the_hook_job():
    assert vd.check_strimzi() == []


def test_tracker_probes_digest_redis_secret_and_openshift_context():
    values = yaml.safe_load((vd.VALUES_DIR / "openshift-strimzi.yaml").read_text())
    docs = render(values)
    sts = find(docs, "StatefulSet", "-tracker")
    pod = sts["spec"]["template"]["spec"]
    tracker = pod["containers"][0]
    assert tracker["image"].endswith("/kmq@sha256:" + "0123456789abcdef" * 4)
    assert tracker["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert "runAsUser" not in pod["securityContext"] and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["priorityClassName"] == "kmq-critical"
    env = {e["name"]: e for e in tracker["env"]}
    assert env["KMQ_REDIS__URL"]["valueFrom"]["secretKeyRef"] == {"name": "kmq-redis", "key": "url"}
    assert env["KMQ_TRACKER__INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert [c["name"] for c in pod["containers"]] == ["tracker", "log-forwarder"]
    config = yaml.safe_load(find(docs, "ConfigMap", "kmq")["data"]["kmq.yaml"])
    assert "redis" not in config  # the URL with its password stays in the Secret
    assert config["logging"] == {"level": "INFO", "format": "json"}
    assert config["tracker"]["liveness_timeout"] == "90s"
    assert config["topics"] == {"replication_factor": 3, "min_insync_replicas": 2, "markers_retention": "14d",
                                "dlq_retention": "30d"}
    # The generated kmq.yaml is valid for kmq itself.
    from kmq.config import Config

    cfg = Config.from_dict(config)
    assert cfg.topics.markers_retention == 14 * 86400
    # One retention setting: queues inherit topicInit.markersRetention unless they set their own.
    assert cfg.queue("orders").markers_retention == 14 * 86400 and cfg.queue("payments").markers_retention == 30 * 86400
    assert not [d for d in docs if d["kind"] == "Job"]
    assert find(docs, "PodMonitor", "kmq")["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["replacement"] == "kmq-tracker"
    dash = find(docs, "ConfigMap", "-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dash["data"]["kmq.json"]) == json.loads(vd.DASHBOARD.read_text())


def test_rendered_runbook_urls_are_absolute_and_name_a_runbook_heading():
    base = "https://git.example.com/platform/kmq/-/blob/v0.1.0/docs/operations.md"
    docs = render({"prometheusRule": {"enabled": True, "runbookBaseUrl": base},
                   "queues": [{"name": "orders"}, {"name": "payments", "lease": "2m"}]})
    rules = [r for g in find(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"] if "alert" in r]
    urls = {r["annotations"]["runbook_url"] for r in rules}
    assert {r["alert"] for r in rules} == {r["alert"] for r in vd._alert_rules()}  # every alert, every one linked
    anchors = vd.runbook_anchors()
    for url in urls:
        head, _, anchor = url.partition("#")
        assert head == base and anchor in anchors, url
    assert vd.check_rendered_runbook_urls([("prometheusrule.yaml", d) for d in docs]) == []


def test_the_runbook_url_check_catches_relative_and_dangling_links():
    base = "https://git.example.com/kmq/docs/operations.md"
    rule = find(render({"prometheusRule": {"enabled": True, "runbookBaseUrl": base}}), "PrometheusRule")
    notes = rule["spec"]["groups"][0]["rules"][0]["annotations"]
    notes["runbook_url"] = "docs/operations.md#kmqtrackerdown"
    notes2 = rule["spec"]["groups"][0]["rules"][1]["annotations"]
    notes2["runbook_url"] = base + "#no-such-heading"
    assert vd.check_rendered_runbook_urls([("x", rule)]) == [
        "x: alert KmqTrackerDown: runbook_url 'docs/operations.md#kmqtrackerdown' is not an absolute http(s) URL",
        f"x: alert KmqTrackerNotReady: runbook_url '{base}#no-such-heading': docs/operations.md has no heading #no-such-heading"]
