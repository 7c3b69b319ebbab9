"""Strimzi 1.0 serves only kafka.strimzi.io/v1: the chart's KafkaTopics use it by default,
v1beta2 stays selectable for operators before 0.49, and the KafkaUser examples of
docs/deploy.md use v1."""

from __future__ import annotations

import re

import yaml

from tests.deploy.conftest import ROOT, render, vd

STRIMZI = {"topicInit": {"mode": "strimzi", "strimzi": {"clusterName": "my-cluster"}},
           "queues": [{"name": "orders", "partitions": 6}]}


def _topics(values: dict) -> list[dict]:
    return [d for d in render(values) if d["kind"] == "KafkaTopic"]


def test_kafka_topics_default_to_strimzi_v1():
    topics = _topics(STRIMZI)
    assert len(topics) == 3
    assert {t["apiVersion"] for t in topics} == {"kafka.strimzi.io/v1"}
    for t in topics:
        assert vd.validate_object(t, "KafkaTopic") == []


def test_v1beta2_is_selectable_for_older_operators():
    values = {**STRIMZI, "topicInit": {**STRIMZI["topicInit"],
                                       "strimzi": {"clusterName": "my-cluster", "apiVersion": "kafka.strimzi.io/v1beta2"}}}
    topics = _topics(values)
    assert {t["apiVersion"] for t in topics} == {"kafka.strimzi.io/v1beta2"}
    # Same spec either way: only the apiVersion moves.
    assert [t["spec"] for t in topics] == [t["spec"] for t in _topics(STRIMZI)]
    for t in topics:
        assert vd.validate_object(t, "KafkaTopic") == []


def test_kafka_topic_structure_is_checked_per_api_version():
    (topic, *_) = _topics(STRIMZI)
    topic["spec"]["partitons"] = 6
    assert any("partitons" in p for p in vd.validate_object(topic, "x"))
    topic = _topics(STRIMZI)[0]
    topic["apiVersion"] = "kafka.strimzi.io/v1beta1"  # not a known CRD: kubernetes-validate has no schema for it
    assert vd.validate_object(topic, "x") != []


def test_docs_kafka_user_examples_use_strimzi_v1():
    text = (ROOT / "docs" / "deploy.md").read_text()
    docs = [d for block in re.findall(r"```yaml\n(.*?)```", text, re.S) for d in yaml.safe_load_all(block)
            if isinstance(d, dict) and str(d.get("apiVersion", "")).startswith("kafka.strimzi.io/")]
    assert len(docs) >= 4
    assert {d["apiVersion"] for d in docs} == {"kafka.strimzi.io/v1"}, "Strimzi 1.0 serves only kafka.strimzi.io/v1"

