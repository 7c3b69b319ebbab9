"""Durations the chart's schema takes because kmq takes them (values.schema.json is generated from
kmq.config: days, bare seconds, spaces) reach the chart's own arithmetic as kmq reads them: the
topics' retention.ms and the stuck-message alert agree with the kmq.yaml the chart writes."""

from __future__ import annotations

import yaml

from kmq.config import Config
from tests.deploy.conftest import find, render


def test_durations_in_every_spelling_kmq_reads_reach_retention_ms_and_alerts_unchanged():
    values = {
        "topicInit": {"mode": "strimzi", "strimzi": {"clusterName": "c"}, "markersRetention": " 2 d ",
                      "dlqRetention": 86400},
        "queues": [{"name": "orders", "lease": " 45 s"}, {"name": "payments", "markers_retention": 259200}],
        "prometheusRule": {"enabled": True, "runbookBaseUrl": "https://docs.example.com/kmq/docs/operations.md"},
    }
    docs = render(values)
    cfg = Config.from_dict(yaml.safe_load(find(docs, "ConfigMap")["data"]["kmq.yaml"]))
    retention = {d["spec"]["topicName"]: d["spec"].get("config", {}).get("retention.ms")
                 for d in docs if d["kind"] == "KafkaTopic"}
    assert retention["orders__markers"] == cfg.queue("orders").markers_retention * 1000 == 2 * 86_400_000
    assert retention["payments__markers"] == cfg.queue("payments").markers_retention * 1000 == 3 * 86_400_000
    assert retention["orders__dlq"] == cfg.topics.dlq_retention * 1000 == 86_400_000
    rules = [r for g in find(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    stuck = [r["expr"] for r in rules if 'queue="orders"' in r.get("expr", "") and "oldest_in_flight" in r["expr"]]
    assert stuck and all(e.rstrip().endswith(f"* {cfg.queue('orders').lease:g}") for e in stuck), stuck
