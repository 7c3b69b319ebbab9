"""kmq.dev.kafka without starting a JVM: the cache, the tools it needs, the settings it writes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kmq.core.errors import DevBrokerError
from kmq.dev.kafka import KafkaCluster, kafka_classpath


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_resolved_cache_is_used_offline_without_maven(tmp_path, monkeypatch):
    root = tmp_path / "cache" / "4.2.0"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "kafka_2.13-4.2.0.jar").write_bytes(b"")
    (root / ".resolved").write_text("4.2.0\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no mvn, no java
    assert kafka_classpath("4.2.0", tmp_path / "cache") == [root / "lib" / "kafka_2.13-4.2.0.jar"]


def test_an_empty_cache_without_maven_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(DevBrokerError, match=r"needs 'mvn'.*apt-get install maven"):
        kafka_classpath("4.2.0", tmp_path / "cache")


def test_a_failed_resolution_names_maven_central_and_leaves_no_half_cache(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir, "mvn", 'echo "[ERROR] Could not transfer artifact: Network is unreachable"; exit 1\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(DevBrokerError, match=r"Network is unreachable.*Maven Central is reachable"):
        kafka_classpath("4.2.0", tmp_path / "cache")
    assert not (tmp_path / "cache" / "4.2.0" / ".resolved").exists()
    assert not (tmp_path / "cache" / "4.2.0" / "lib").exists()


def test_starting_without_java_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(DevBrokerError, match=r"needs 'java'.*openjdk-17"):
        KafkaCluster(workdir=str(tmp_path / "k")).start()


def test_one_broker_is_one_combined_node_and_three_brokers_stand_beside_a_controller(tmp_path):
    one = KafkaCluster(brokers=1, workdir=str(tmp_path / "one"))
    assert [n.roles for n in one.nodes] == ["broker,controller"]
    assert one.settings["min.insync.replicas"] == "1"
    three = KafkaCluster(brokers=3, workdir=str(tmp_path / "three"))
    assert [n.roles for n in three.nodes] == ["controller", "broker", "broker", "broker"]
    assert three.bootstrap.count(",") == 2
    props = dict(line.split("=", 1) for line in three._properties(three.brokers[0]).splitlines())
    assert props["default.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["controller.quorum.voters"] == f"1@127.0.0.1:{three.nodes[0].controller_port}"
    assert props["listeners"] == f"PLAINTEXT://127.0.0.1:{three.brokers[0].port}"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    # With eligible leader replicas the controller's value is the cluster's: without it, 1.
    controller = dict(line.split("=", 1) for line in three._properties(three.nodes[0]).splitlines())
    assert controller["min.insync.replicas"] == "2"


def test_settings_given_override_the_test_defaults(tmp_path):
    c = KafkaCluster(workdir=str(tmp_path), settings={"auto.create.topics.enable": "false", "num.partitions": "4"})
    props = dict(line.split("=", 1) for line in c._properties(c.nodes[0]).splitlines())
    assert props["auto.create.topics.enable"] == "false"
    assert props["num.partitions"] == "4"


def test_a_cluster_needs_a_broker(tmp_path):
    with pytest.raises(DevBrokerError, match="at least one broker"):
        KafkaCluster(brokers=0, workdir=str(tmp_path))


def test_sasl_users_are_served_by_scram_and_plain_and_over_tls_by_sasl_ssl(tmp_path):
    from kmq.dev.kafka import TlsListener

    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("PEM\n")
    tls = TlsListener(tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem")
    c = KafkaCluster(workdir=str(tmp_path / "k"), tls=tls, scram_users={"kmq-test": "pw"})
    n = c.nodes[0]
    props = dict(line.split("=", 1) for line in c._properties(n).splitlines())
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"
    assert f"SASL_SSL://127.0.0.1:{n.sasl_ssl_port}" in props["listeners"] and c.sasl_ssl_bootstrap
    for listener in ("sasl_plaintext", "sasl_ssl"):
        assert props[f"listener.name.{listener}.plain.sasl.jaas.config"] == \
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_kmq-test="pw";'
        assert "ScramLoginModule" in props[f"listener.name.{listener}.scram-sha-512.sasl.jaas.config"]
    assert props["listener.name.ssl.ssl.client.auth"] == "required"
    assert props["listener.name.sasl_ssl.ssl.client.auth"] == "none"
    assert KafkaCluster(workdir=str(tmp_path / "p"), scram_users={"u": "pw"}).sasl_ssl_bootstrap == ""


def test_a_plain_user_the_jaas_line_cannot_hold_is_refused(tmp_path):
    c = KafkaCluster(workdir=str(tmp_path), scram_users={"kmq": 'say "hi"'})
    with pytest.raises(DevBrokerError, match="PLAIN needs"):
        c._properties(c.nodes[0])


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch):
    import uuid

    from kmq.dev import kafka

    ids = iter([uuid.UUID(bytes=b"\xf8" + b"\0" * 15), uuid.UUID(bytes=b"\x01" * 16)])  # the first encodes as "-A..."
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(ids))
    assert kafka._cluster_id() == "AQEBAQEBAQEBAQEBAQEBAQ"
