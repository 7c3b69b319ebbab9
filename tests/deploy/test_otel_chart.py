"""The chart's otel values: rendered as the standard OTEL_* environment of the tracker pods (what
``kmq tracker run`` sets its OpenTelemetry SDK up from, kmq.telemetry.otel_sdk), nothing when off,
an egress to the collector's port under the NetworkPolicy, and a clear refusal without an endpoint."""

from __future__ import annotations

import pytest

from kmq.telemetry.otel_sdk import destination, exporters_of
from tests.deploy.conftest import find, render, vd

ON = {"otel": {"enabled": True, "endpoint": "http://otel-collector.observability:4318", "serviceName": "orders-kmq"}}


def _tracker_env(docs: list[dict]) -> list[dict]:
    return find(docs, "Deployment", "-tracker")["spec"]["template"]["spec"]["containers"][0]["env"]


def test_otel_enabled_sets_the_trackers_otel_environment_which_kmq_reads_as_otlp_to_the_collector():
    env = _tracker_env(render(ON))
    otel = {e["name"]: e.get("value") for e in env if e["name"].startswith("OTEL_")}
    assert otel == {
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4318", "OTEL_SERVICE_NAME": "orders-kmq",
        "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=$(K8S_POD_NAME),k8s.namespace.name=kmq"}
    names = [e["name"] for e in env]
    # Kubernetes expands $(K8S_POD_NAME) only from a variable defined before it.
    assert names.index("K8S_POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    assert next(e for e in env if e["name"] == "K8S_POD_NAME")["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}}
    # What the tracker makes of it: spans by OTLP/HTTP to the collector.
    assert exporters_of(otel) == ("otlp_proto_http",)
    assert destination("otlp_proto_http", otel) == "OTLP/HTTP http://otel-collector.observability:4318/v1/traces"


@pytest.mark.parametrize("values", [{}, {"otel": {"endpoint": "http://otel-collector:4318"}}])
def test_no_otel_environment_while_otel_is_off(values):
    docs = render(values)
    for _, pod in (p for d in docs for p in vd.pod_specs(d)):
        for c in pod.get("containers", []):
            assert not [e for e in c.get("env", []) if e["name"].startswith("OTEL_")], c["name"]


@pytest.mark.parametrize("endpoint, port", [("http://otel-collector.observability:4318", 4318),
                                            ("https://otlp.example.com", 443), ("http://collector", 80)])
def test_the_network_policy_lets_the_tracker_reach_the_collector(endpoint, port):
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]
    docs = render({"otel": {"enabled": True, "endpoint": endpoint},
                   "networkPolicy": {"enabled": True, "otel": {"to": peers}}})
    egress = find(docs, "NetworkPolicy")["spec"]["egress"]
    assert {"ports": [{"port": port, "protocol": "TCP"}], "to": peers} in egress
    off = find(render({"networkPolicy": {"enabled": True, "otel": {"to": peers}}}), "NetworkPolicy")["spec"]["egress"]
    assert not [rule for rule in off if rule.get("to") == peers]


@pytest.mark.parametrize("name", ["otel-without-endpoint", "otel-endpoint-not-a-url"])
def test_otel_values_that_cannot_work_are_refused(name):
    assert vd.check_bad_values_file(vd.CHART, vd.BAD_VALUES_DIR / f"{name}.yaml") == []
