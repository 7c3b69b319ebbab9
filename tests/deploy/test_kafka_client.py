"""The chart runs confluent-kafka by default (kafka.client, passed as KMQ_KAFKA__CLIENT to every kmq
container: tracker, topic init, helm test, console, the lag job's pods), kafka-python when told, and
leaves kafka.client out of the kmq.yaml ConfigMap that workers may mount."""

from __future__ import annotations

import pytest
import yaml

from kmq.config import Config
from tests.deploy.conftest import find, render, vd

VALUES_SETS = vd.values_sets()


def client_envs(docs: list[dict]) -> dict[str, list[dict]]:
    """KMQ_KAFKA__CLIENT entries of every kmq container (and SparkApplication pod) by object/container."""
    out = {}
    for doc in docs:
        if doc["kind"] == "SparkApplication":
            containers = [(role, doc["spec"][role]) for role in ("driver", "executor")]
        else:
            containers = [(c["name"], c) for _, pod in vd.pod_specs(doc) for c in pod.get("containers", [])
                          if "kmq" in str(c.get("image", ""))]
        for name, c in containers:
            out[f"{doc['kind']}/{doc['metadata']['name']}/{name}"] = [
                e for e in c.get("env", []) if e["name"] == "KMQ_KAFKA__CLIENT"]
    return out


@pytest.mark.parametrize("set_name", ["defaults", "all-on-local", "all-on-operator"])
def test_every_kmq_container_runs_confluent_by_default(set_name):
    envs = client_envs(render(VALUES_SETS[set_name]))
    assert any(k.startswith("Deployment/") and k.endswith("/tracker") for k in envs), envs
    if set_name == "all-on-local":
        assert {"Job/kmq-topic-init/topic-init", "Pod/kmq-test-status/status"} <= set(envs), sorted(envs)
        assert any("lag-job" in k for k in envs) and any("ui" in k for k in envs), sorted(envs)
    if set_name == "all-on-operator":
        assert {k.rsplit("/", 1)[1] for k in envs if k.startswith("SparkApplication/")} == {"driver", "executor"}
    for where, entries in envs.items():
        assert entries == [{"name": "KMQ_KAFKA__CLIENT", "value": "confluent"}], where


def test_kafka_python_when_asked_and_the_tracker_config_follows():
    docs = render({"kafka": {"client": "kafka-python"}})
    for where, entries in client_envs(docs).items():
        assert entries == [{"name": "KMQ_KAFKA__CLIENT", "value": "kafka-python"}], where
    # What the tracker runs with: its kmq.yaml plus its environment (the environment beats the file).
    for client in ("confluent", "kafka-python"):
        docs = render({"kafka": {"client": client}})
        kmq_yaml = yaml.safe_load(find(docs, "ConfigMap", "kmq")["data"]["kmq.yaml"])
        assert "client" not in kmq_yaml["kafka"]  # workers mounting the ConfigMap keep their own client
        tracker = find(docs, "Deployment", "-tracker")["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in tracker["env"] if "value" in e and e["name"].startswith("KMQ_")}
        assert Config.from_dict(kmq_yaml, env).kafka.client == client


@pytest.mark.parametrize("name", ["msk-iam-confluent", "extra-config-client", "kafka-client-unknown"])
def test_client_values_that_cannot_work_are_refused(name):
    assert vd.check_bad_values_file(vd.CHART, vd.BAD_VALUES_DIR / f"{name}.yaml") == []


def test_msk_iam_renders_with_kafka_python():
    docs = render({"kafka": {"securityProtocol": "SASL_SSL", "saslMechanism": "AWS_MSK_IAM", "client": "kafka-python"}})
    assert set(map(str, client_envs(docs).values())) == {str([{"name": "KMQ_KAFKA__CLIENT", "value": "kafka-python"}])}
