"""The ACL examples of docs/deploy.md give each Kafka user exactly what its kmq
components do (kmq/ops/access.py), and kmq/ops/access.py names the groups and topics
the components really use (their own functions and the chart's rendering)."""

from __future__ import annotations

import re

import pytest
import yaml

from kmq.ops.access import COMPONENTS, Grant, replay_group_prefix, required_grants
from kmq.config import Config
from tests.deploy.conftest import ROOT, find, render

QUEUE = "orders"
CFG = Config.from_dict({"queues": [{"name": QUEUE}], "consumer": {"group_id": "orders-workers"}})
# Which components run as which user in docs/deploy.md.
USERS = {
    "kmq": ("tracker", "topic-init", "status"),  # the chart: tracker, topic-init hook, helm test
    "orders-workers": ("worker",),
    "kmq-ops": ("status", "dlq-list", "dlq-replay"),
    "kmq-lag-job": ("lag-job",),
}


def documented_users() -> dict[str, list[Grant]]:
    text = (ROOT / "docs" / "deploy.md").read_text()
    users = {}
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and doc.get("kind") == "KafkaUser":
                acls = doc["spec"]["authorization"]["acls"]
                users[doc["metadata"]["name"]] = [
                    Grant(a["resource"]["type"], a["resource"]["name"], frozenset(a["operations"]),
                          a["resource"].get("patternType", "literal")) for a in acls]
    return users


def needs(components) -> set[tuple[str, str, str]]:
    return {(g.resource, g.name, op) for c in components for g in required_grants(CFG, QUEUE, c) for op in g.operations}


def test_every_documented_user_is_checked():
    assert set(documented_users()) == set(USERS)
    assert {c for cs in USERS.values() for c in cs} == set(COMPONENTS)


@pytest.mark.parametrize("user", sorted(USERS))
def test_documented_acls_cover_what_the_components_do_and_no_more(user):
    grants = documented_users()[user]
    needed = needs(USERS[user])
    missing = sorted(n for n in needed if not any(g.covers(*n) for g in grants))
    assert missing == [], f"{user} lacks {missing}"
    # Least privilege: every documented operation is needed (Describe may ride along with Read/Write).
    for g in grants:
        for op in g.operations - {"Describe"}:
            assert any(r == g.resource and (n.startswith(g.name) if g.pattern == "prefix" else n == g.name) and o == op
                       for r, n, o in needed), f"{user}: {op} on {g.resource} {g.name} is not needed"


def test_replay_groups_are_covered_by_the_documented_prefix():
    from kmq.ops.dlq import REASONS, replay_group

    prefix = replay_group_prefix(CFG, QUEUE)
    for reason in (None, *REASONS):
        group = replay_group(CFG, QUEUE, reason)
        assert group.startswith(prefix)
        assert any(g.covers("group", group, "Read") for g in documented_users()["kmq-ops"])


def test_access_table_uses_the_components_names():
    q = CFG.queue(QUEUE)
    groups = {g.name for c in COMPONENTS for g in required_grants(CFG, QUEUE, c) if g.resource == "group"}
    assert groups == {CFG.consumer.group_id, CFG.tracker.group_id, replay_group_prefix(CFG, QUEUE)}
    topics = {g.name for c in COMPONENTS for g in required_grants(CFG, QUEUE, c) if g.resource == "topic"}
    assert topics == {q.name, q.markers_topic, q.dlq_topic, q.metrics_topic}


def test_the_charts_pods_run_as_the_kmq_user_with_the_groups_it_is_granted():
    """The chart's kmq.yaml (tracker, hook, helm test) uses exactly the groups the kmq user has."""
    docs = render({"queues": [{"name": QUEUE}], "extraConfig": {"consumer": {"group_id": "orders-workers"}}})
    cfg = Config.from_dict(yaml.safe_load(find(docs, "ConfigMap", "kmq")["data"]["kmq.yaml"]))
    test_pod = find(docs, "Pod", "-test-status")
    assert f"kmq status {QUEUE} " in test_pod["spec"]["containers"][0]["args"][0]
    grants = documented_users()["kmq"]
    for component in USERS["kmq"]:
        for g in required_grants(cfg, QUEUE, component):
            for op in g.operations:
                assert any(d.covers(g.resource, g.name, op) for d in grants), (component, g, op)


def test_workers_with_key_ordering_may_read_markers_and_the_tracker_groups_offsets():
    cfg = Config.from_dict({"queues": [{"name": QUEUE}], "consumer": {"group_id": "orders-workers", "ordering": "key"}})
    grants = required_grants(cfg, QUEUE, "worker")
    assert any(g.covers("topic", f"{QUEUE}__markers", "Read") for g in grants)
    assert any(g.covers("group", cfg.tracker.group_id, "Describe") for g in grants)
    assert not any(g.covers("topic", f"{QUEUE}__markers", "Read") for g in required_grants(CFG, QUEUE, "worker"))
