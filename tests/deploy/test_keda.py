"""keda.enabled: KEDA ScaledObjects scale the user's worker Deployments on the queue's backlog.
kubernetes-validate has no schema for KEDA's CRD, so the rendered objects are checked against
the ScaledObject fields in scripts/validate-deploy.py (CRD_SCHEMAS) and their Prometheus
queries with promtool."""

from __future__ import annotations

import pytest

from tests.deploy.conftest import find, render, vd

PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
ORDERS = {"queue": "orders", "name": "orders-workers"}


def _keda(**keda) -> dict:
    return {"keda": {"enabled": True, "prometheus": {"serverAddress": PROMETHEUS}, "workers": [ORDERS], **keda}}


def _scaled_objects(values: dict) -> list[dict]:
    return [d for d in render(values) if d["kind"] == "ScaledObject"]


def test_off_by_default():
    assert _scaled_objects({}) == []


def test_prometheus_trigger_scales_on_in_flight_plus_queue_lag():
    (so,) = _scaled_objects({**_keda(), "extraConfig": {"consumer": {"group_id": "orders-workers"}}})
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "orders-workers"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 6)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    meta = trigger["metadata"]
    assert meta["serverAddress"] == PROMETHEUS and meta["threshold"] == "1000"
    # kmq's in-flight gauge plus kafka-exporter's lag of the workers group (from extraConfig) on the queue topic.
    assert meta["query"] == ('(sum(kmq_tracker_in_flight{queue="orders"}) or vector(0)) + '
                             '(sum(kafka_consumergroup_lag{consumergroup="orders-workers",topic="orders"} >= 0) or vector(0))')
    assert vd.validate_object(so, "x") == []
    assert vd.check_scaled_object_queries([("x", so)]) == []


def test_queue_lag_metric_can_be_left_out():
    (so,) = _scaled_objects(_keda(prometheus={"serverAddress": PROMETHEUS, "queueLagMetric": ""}))
    assert so["spec"]["triggers"][0]["metadata"]["query"] == '(sum(kmq_tracker_in_flight{queue="orders"}) or vector(0))'


def test_kafka_trigger_reads_the_workers_group_lag_on_the_queue_topic():
    values = {**_keda(trigger="kafka", kafka={"lagThreshold": 200, "authenticationRef": "keda-kafka"}),
              "kafka": {"bootstrapServers": "kafka.kafka.svc:9092"}}
    (so,) = _scaled_objects(values)
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "kafka" and trigger["authenticationRef"] == {"name": "keda-kafka"}
    assert trigger["metadata"] == {
        "bootstrapServers": "kafka.kafka.svc:9092", "consumerGroup": "kmq-workers",  # kmq's default workers group
        "topic": "orders", "lagThreshold": "200", "activationLagThreshold": "0", "offsetResetPolicy": "earliest"}
    assert vd.validate_object(so, "x") == []


def test_one_scaled_object_per_workers_entry_with_its_own_bounds_and_group():
    values = {**_keda(workers=[ORDERS, {"queue": "payments", "name": "payments-workers", "kind": "StatefulSet",
                                         "groupId": "payments-workers", "minReplicas": 0, "maxReplicas": 3}]),
              "queues": [{"name": "orders"}, {"name": "payments"}]}
    objects = _scaled_objects(values)
    assert [o["metadata"]["name"] for o in objects] == ["kmq-orders-workers", "kmq-payments-workers"]
    payments = find(objects, "ScaledObject", "payments-workers")
    assert payments["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    assert (payments["spec"]["minReplicaCount"], payments["spec"]["maxReplicaCount"]) == (0, 3)
    assert 'consumergroup="payments-workers",topic="payments"' in payments["spec"]["triggers"][0]["metadata"]["query"]
    for o in objects:
        assert vd.validate_object(o, "x") == []


@pytest.mark.parametrize("breakage,expect", [
    (lambda so: so["spec"].update(maxReplicas=6), "maxReplicas"),  # the HPA's name, not KEDA's
    (lambda so: so["spec"]["triggers"][0]["metadata"].update(treshold="5"), "treshold"),
    (lambda so: so["spec"]["triggers"][0]["metadata"].update(threshold=5), "5"),  # metadata values are strings
    (lambda so: so["spec"]["triggers"][0]["metadata"].pop("query"), "query"),
    (lambda so: so["spec"].pop("scaleTargetRef"), "scaleTargetRef"),
])
def test_the_structural_check_catches_wrong_scaled_objects(breakage, expect):
    (so,) = _scaled_objects(_keda())
    breakage(so)
    problems = vd.validate_object(so, "x")
    assert any(expect in p for p in problems), problems


def test_a_query_naming_a_metric_kmq_does_not_export_is_refused():
    (so,) = _scaled_objects(_keda())
    meta = so["spec"]["triggers"][0]["metadata"]
    meta["query"] = meta["query"].replace("kmq_tracker_in_flight", "kmq_tracker_inflight")
    assert any("kmq_tracker_inflight" in p for p in vd.check_scaled_object_queries([("x", so)]))
    meta["query"] = "sum(kmq_tracker_in_flight{queue=\"orders\"}"
    assert any("promtool" in p for p in vd.check_scaled_object_queries([("x", so)]))

