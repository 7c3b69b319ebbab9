"""What the rendered chart and the plain manifests hand to kmq is something kmq accepts:
the generated kmq.yaml loads with kmq.config, the command lines use real CLI options,
probes and ports agree with the config, hooks run before the tracker."""

from __future__ import annotations

import shlex

import click
import pytest
import yaml

from kmq.cli import cli
from kmq.config import Config
from tests.deploy.conftest import ROOT, find, render, vd

VALUES_SETS = vd.values_sets()


def all_chart_docs() -> list[tuple[str, dict]]:
    return [(f"{name}:{doc['kind']}/{doc['metadata']['name']}", doc)
            for name, values in VALUES_SETS.items() for doc in render(values)]


def plain_docs() -> list[tuple[str, dict]]:
    out = []
    for path in sorted((ROOT / "deploy" / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                out.append((f"{path.relative_to(ROOT)}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


# ------------------------------------------------------------------ kmq.yaml
@pytest.mark.parametrize("set_name", sorted(VALUES_SETS))
def test_generated_kmq_yaml_loads_with_kmq_config(set_name):
    docs = render(VALUES_SETS[set_name])
    for cm in (d for d in docs if d["kind"] == "ConfigMap" and "kmq.yaml" in d["data"]):
        cfg = Config.from_dict(yaml.safe_load(cm["data"]["kmq.yaml"]))
        values = VALUES_SETS[set_name]
        expected_queues = [q["name"] for q in values.get("queues", [{"name": "orders"}])]
        assert [q.name for q in cfg.queues] == expected_queues
        assert cfg.kafka.sasl_password is None, "no secret may be rendered into a ConfigMap"
        if values.get("kafka", {}).get("existingSecret"):
            assert cfg.kafka.sasl_password_file.startswith("/var/run/secrets/kmq/kafka-credentials/")


def test_plain_configmap_loads_with_kmq_config():
    cm = yaml.safe_load((ROOT / "deploy" / "k8s" / "configmap.yaml").read_text())
    cfg = Config.from_dict(yaml.safe_load(cm["data"]["kmq.yaml"]))
    assert cfg.tracker.http_port == 9108 and [q.name for q in cfg.queues] == ["orders"]


def test_values_map_onto_kmq_yaml():
    docs = render({"kafka": {"bootstrapServers": "a:1,b:2", "clientId": "c"},
                   "queues": [{"name": "q1", "lease": "250ms", "max_deliveries": 2}],
                   "tracker": {"groupId": "g", "tick": "20ms", "httpPort": 9200},
                   "redis": {"url": "redis://r:6379/0"}, "extraConfig": {"kafka": {"session_timeout": "12s"}}})
    cfg = Config.from_dict(yaml.safe_load(find(docs, "ConfigMap", "kmq")["data"]["kmq.yaml"]))
    assert cfg.kafka.bootstrap_servers == "a:1,b:2" and cfg.kafka.client_id == "c"
    assert cfg.kafka.session_timeout == 12.0
    assert cfg.queues[0].lease == 0.25 and cfg.queues[0].max_deliveries == 2
    assert (cfg.tracker.group_id, cfg.tracker.tick, cfg.tracker.http_port) == ("g", 0.02, 9200)
    assert cfg.tracker.fetch_wait == 0.5  # the chart's default: it runs next to a real Kafka
    assert cfg.redis.url == "redis://r:6379/0"


# ------------------------------------------------------------------ tracker pods
def tracker_container(docs: list[dict]) -> dict:
    dep = find(docs, "Deployment", "-tracker")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return container


def probe_target(container: dict, probe: str) -> tuple[str, int]:
    get = container[probe]["httpGet"]
    port = get["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == port)
    return get["path"], port


@pytest.mark.parametrize("port", [9108, 9200])
def test_probes_hit_the_port_the_tracker_is_configured_to_serve(port):
    docs = render({"tracker": {"httpPort": port}})
    cfg = Config.from_dict(yaml.safe_load(find(docs, "ConfigMap", "kmq")["data"]["kmq.yaml"]))
    c = tracker_container(docs)
    assert probe_target(c, "readinessProbe") == ("/readyz", cfg.tracker.http_port)
    assert probe_target(c, "livenessProbe") == ("/healthz", cfg.tracker.http_port)
    svc = find(docs, "Service", "-tracker")
    assert svc["spec"]["ports"][0]["port"] == port


def test_tracker_pods_are_hardened_and_replicated():
    docs = render({})
    dep = find(docs, "Deployment", "-tracker")
    pod = dep["spec"]["template"]["spec"]
    c = tracker_container(docs)
    assert dep["spec"]["replicas"] >= 2
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/etc/kmq", "/tmp"}


def test_hpa_owns_replicas_when_enabled():
    docs = render({"hpa": {"enabled": True, "minReplicas": 3, "maxReplicas": 9}})
    assert "replicas" not in find(docs, "Deployment", "-tracker")["spec"]
    hpa = find(docs, "HorizontalPodAutoscaler", "-tracker")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 9)


def test_sasl_secret_is_mounted_as_file_and_username_as_env():
    docs = render(VALUES_SETS["all-on-operator"])
    c = tracker_container(docs)
    env = {e["name"]: e for e in c["env"]}
    assert env["KMQ_KAFKA__SASL_USERNAME"]["valueFrom"]["secretKeyRef"] == {"name": "kmq-kafka", "key": "client-user"}
    pod = find(docs, "Deployment", "-tracker")["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "kafka-credentials")
    assert vol["secret"] == {"secretName": "kmq-kafka", "items": [{"key": "client-password", "path": "client-password"}]}
    cfg = Config.from_dict(yaml.safe_load(find(docs, "ConfigMap", "kmq")["data"]["kmq.yaml"]))
    mount = next(m for m in c["volumeMounts"] if m["name"] == "kafka-credentials")
    assert cfg.kafka.sasl_password_file == f"{mount['mountPath']}/client-password"


# ------------------------------------------------------------------ hooks and helm test
def test_topic_init_runs_as_pre_install_and_pre_upgrade_hook_with_its_own_config():
    docs = render(VALUES_SETS["all-on-local"])
    job = find(docs, "Job", "-topic-init")
    cm = find(docs, "ConfigMap", "-topic-init")
    for doc in (job, cm):
        assert doc["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(cm["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    pod = job["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if v["name"] == "config")["configMap"]["name"] == cm["metadata"]["name"]
    assert "serviceAccountName" not in pod, "hooks run before the chart's ServiceAccount exists"
    script = pod["containers"][0]["args"][0]
    assert "kmq topics create orders --partitions 12 --config /etc/kmq/kmq.yaml" in script
    # Replication, min.insync.replicas and retention come from the hook's own kmq.yaml (topics:).
    topics = yaml.safe_load(cm["data"]["kmq.yaml"])["topics"]
    assert topics["replication_factor"] == 3 and topics["markers_retention"] == "7d"
    assert "kmq topics create payments --partitions 3" in script
    assert not any(d["kind"] == "Job" for d in render({"topicInit": {"enabled": False}}))


def test_helm_test_pod_runs_kmq_status_for_every_queue():
    docs = render({"queues": [{"name": "a"}, {"name": "b"}]})
    pod = find(docs, "Pod", "-test-status")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    assert "kmq status a --config /etc/kmq/kmq.yaml" in script and "kmq status b --config" in script


def test_toggles_off_render_only_the_core():
    kinds = sorted(d["kind"] for d in render({"topicInit": {"enabled": False}, "tests": {"enabled": False}, "pdb": {"enabled": False}}))
    assert kinds == ["ConfigMap", "Deployment", "Service", "ServiceAccount"]


# ------------------------------------------------------------------ command lines
def command_lines(doc: dict) -> list[list[str]]:
    """kmq command lines of a workload or SparkApplication (sh -c scripts split by line)."""
    if doc["kind"] == "SparkApplication":
        return [["lag-job", *doc["spec"]["arguments"]]]
    lines = []
    for _, pod in vd.pod_specs(doc):
        for c in pod["containers"]:
            if "kmq" not in c.get("image", ""):
                continue  # a user's sidecar (tracker.extraContainers)
            if c.get("command") == ["/bin/sh", "-c"]:
                for line in c["args"][0].splitlines():
                    words = shlex.split(line)
                    if words and words[0] == "kmq":
                        lines.append(words[1:])
            else:
                lines.append(list(c.get("args", [])))
    return lines


def resolve(words: list[str]) -> tuple[click.Command | None, list[str], str]:
    cmd: click.Command = cli
    ctx = click.Context(cli)
    path = []
    while isinstance(cmd, click.Group):
        name, words = words[0], words[1:]
        sub = cmd.get_command(ctx, name)
        path.append(name)
        if sub is None:
            return None, words, " ".join(path)
        cmd = sub
    return cmd, words, " ".join(path)


COMMAND_CASES = [(f"{src} `{' '.join(w[:2])}`", w) for src, doc in all_chart_docs() + plain_docs() for w in command_lines(doc)]


@pytest.mark.parametrize("words", [w for _, w in COMMAND_CASES], ids=[i for i, _ in COMMAND_CASES])
def test_manifest_command_lines_use_real_cli_options(words):
    cmd, rest, path = resolve(words)
    if cmd is None:
        pytest.skip(f"`kmq {path}` is not in kmq.cli yet (being built by another engineer)")
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    used = [w for w in rest if w.startswith("-")]
    unknown = [w for w in used if w.split("=")[0] not in known]
    assert not unknown, f"`kmq {path}` has no option(s) {unknown}; it has {sorted(known)}"
    # click parses and type-checks the line (choices, integers) without running the command.
    try:
        ctx = cmd.make_context(f"kmq {path}", list(rest))
    except click.UsageError as exc:
        pytest.fail(f"`kmq {path} {' '.join(rest)}` is not a valid command line: {exc.format_message()}")
    assert ctx.params["config_path"] == "/etc/kmq/kmq.yaml"


# ------------------------------------------------------------------ network policy
def rule_ports(rules: list[dict]) -> set[tuple[str, int]]:
    return {(p.get("protocol", "TCP"), p["port"]) for r in rules for p in r.get("ports", [])}


def test_network_policy_allows_kafka_redis_dns_the_collector_out_and_metrics_in():
    docs = render(VALUES_SETS["all-on-local"])
    np = find(docs, "NetworkPolicy", "kmq")["spec"]
    assert np["policyTypes"] == ["Ingress", "Egress"]
    assert np["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kmq", "app.kubernetes.io/instance": "kmq"}
    assert rule_ports(np["egress"]) == {("TCP", 9092), ("TCP", 9093), ("TCP", 6379), ("UDP", 53), ("TCP", 53),
                                        ("TCP", 4318)}  # otel.endpoint's port
    assert all(r.get("to") for r in np["egress"]), "every egress rule names its peers in this values set"
    assert rule_ports(np["ingress"]) == {("TCP", 9108), ("TCP", 9109)}
    assert all(r.get("from") for r in np["ingress"])


def test_network_policy_has_no_redis_rule_without_redis():
    docs = render({"networkPolicy": {"enabled": True}})
    np = find(docs, "NetworkPolicy", "kmq")["spec"]
    assert rule_ports(np["egress"]) == {("TCP", 9092), ("TCP", 9093), ("UDP", 53), ("TCP", 53)}
    assert rule_ports(np["ingress"]) == {("TCP", 9108)}


def test_client_certificate_secret_is_mounted_and_named_in_kmq_yaml():
    docs = render(VALUES_SETS["mtls-strimzi"])
    cfg = Config.from_dict(yaml.safe_load(find(docs, "ConfigMap", "kmq")["data"]["kmq.yaml"]))
    assert cfg.kafka.security_protocol == "SSL" and cfg.kafka.ssl_check_hostname is False
    assert cfg.kafka.ssl_certfile == "/var/run/secrets/kmq/kafka-client/user.crt"
    assert cfg.kafka.ssl_keyfile == "/var/run/secrets/kmq/kafka-client/user.key"
    pod = find(docs, "Deployment", "-tracker")["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "kafka-client")
    assert vol["secret"]["secretName"] == "kmq"
    assert {i["key"] for i in vol["secret"]["items"]} == {"user.crt", "user.key"}
    mount = next(m for m in tracker_container(docs)["volumeMounts"] if m["name"] == "kafka-client")
    assert mount["mountPath"] == "/var/run/secrets/kmq/kafka-client" and mount["readOnly"]
    # OAUTHBEARER and AWS_MSK_IAM need no password Secret (AWS_MSK_IAM signs on kafka-python only).
    render({"kafka": {"securityProtocol": "SASL_SSL", "saslMechanism": "OAUTHBEARER"}})
    render({"kafka": {"securityProtocol": "SASL_SSL", "saslMechanism": "AWS_MSK_IAM", "client": "kafka-python"}})


def test_consumer_groups_of_one_queue_get_their_own_topics_alerts_and_init_commands():
    groups = [{"name": "orders", "partitions": 4}, {"name": "orders", "group": "billing", "workers_group": "billing-w"}]
    rule = {"enabled": True, "runbookBaseUrl": "https://docs.example.com/kmq/docs/operations.md"}
    docs = render({"queues": groups, "prometheusRule": rule,
                   "topicInit": {"mode": "strimzi", "strimzi": {"clusterName": "c"}}})
    cfg = Config.from_dict(yaml.safe_load(find(docs, "ConfigMap", "kmq")["data"]["kmq.yaml"]))
    assert [(q.group, q.markers_topic, cfg.workers_group(q)) for q in cfg.queues] == [
        (None, "orders__markers", cfg.consumer.group_id), ("billing", "orders__billing__markers", "billing-w")]
    # One KafkaTopic for the shared queue topic, one markers and one DLQ topic per group.
    topics = sorted(d["spec"]["topicName"] for d in docs if d["kind"] == "KafkaTopic")
    assert topics == ["orders", "orders__billing__dlq", "orders__billing__markers", "orders__dlq", "orders__markers"]
    exprs = [r.get("expr", "") for g in find(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert any('queue="orders__billing"' in e for e in exprs) and any('queue="orders"' in e for e in exprs)
    script = find(render({"queues": groups}), "Job", "-topic-init")["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "kmq topics create orders --partitions 4 --config /etc/kmq/kmq.yaml --group default" in script
    assert "kmq topics create orders --config /etc/kmq/kmq.yaml --group billing" in script
