"""What each kmq component does on Kafka, as ACL grants (pure).

The ACL examples in docs/deploy.md are checked against this table by
tests/deploy/test_acls.py, and the table against the names the components
really use (their groups, topics and replay groups). Operations follow
Kafka's ACL names; Read and Write imply Describe on Kafka, but Describe is
listed where a component only looks (topic alignment checks, committed
offsets), so a least-privilege user can be built from the table.

===========  =========================================================================
component    what it does
===========  =========================================================================
worker       KmqConsumer / MarkerWriter: reads the queue in consumer.group_id, writes
             markers, checks the three topics are aligned; with consumer.ordering: key
             also reads markers (no group) and the tracker group's committed offsets
tracker      reads markers in tracker.group_id; reads originals from the queue (no
             group); re-produces to the queue or the DLQ; writes CLOSED markers
topic-init   ``kmq topics create``: creates the three topics, grows partitions
status       ``kmq status`` and the chart's ``helm test``: reads the three topics (no
             group) and the committed offsets of the workers and tracker groups
dlq-list     ``kmq dlq list``: reads the DLQ (no group)
dlq-replay   ``kmq dlq replay``: reads the DLQ in a replay group
             ``<tracker.group_id>-dlq-replay-<queue>[-<reason>]``, writes the queue
lag-job      ``kmq lag-job``: reads markers (no group), the tracker group's committed
             offsets, creates and writes ``<queue>__kmq_metrics`` (topic sink)
===========  =========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from kmq.config import Config

__all__ = ["Grant", "COMPONENTS", "required_grants", "replay_group_prefix"]

COMPONENTS = ("worker", "tracker", "topic-init", "status", "dlq-list", "dlq-replay", "lag-job")


@dataclass(frozen=True)
class Grant:
    """One ACL: ``operations`` on a ``resource`` ("topic" or "group") ``name`` (literal or prefix)."""

    resource: str
    name: str
    operations: frozenset[str]
    pattern: str = "literal"

    def covers(self, resource: str, name: str, operation: str) -> bool:
        if resource != self.resource or operation not in self.operations:
            return False
        return name.startswith(self.name) if self.pattern == "prefix" else name == self.name


def replay_group_prefix(cfg: Config, queue: str) -> str:
    """Every replay group of ``queue`` starts with this (one group per reason filter)."""
    return f"{cfg.tracker.group_id}-dlq-replay-{queue}"


def _g(resource: str, name: str, *ops: str, pattern: str = "literal") -> Grant:
    return Grant(resource, name, frozenset(ops), pattern)


def required_grants(cfg: Config, queue: str, component: str) -> list[Grant]:
    """The grants ``component`` needs for ``queue`` with this configuration."""
    q = cfg.queue(queue)
    topics = (q.name, q.markers_topic, q.dlq_topic)
    if component == "worker":
        if cfg.consumer.ordering == "key":  # a new partition owner reads what the earlier one left unsettled
            return [_g("topic", q.name, "Read", "Describe"), _g("topic", q.markers_topic, "Read", "Write", "Describe"),
                    _g("topic", q.dlq_topic, "Describe"), _g("group", cfg.workers_group(q), "Read"),
                    _g("group", cfg.tracker.group_id, "Describe")]
        return [_g("topic", q.name, "Read", "Describe"), _g("topic", q.markers_topic, "Write", "Describe"),
                _g("topic", q.dlq_topic, "Describe"), _g("group", cfg.workers_group(q), "Read")]
    if component == "tracker":
        return [_g("topic", q.name, "Read", "Write", "Describe"),
                _g("topic", q.markers_topic, "Read", "Write", "Describe"),
                _g("topic", q.dlq_topic, "Write", "Describe"), _g("group", cfg.tracker.group_id, "Read")]
    if component == "topic-init":
        return [_g("topic", t, "Create", "Alter", "Describe") for t in topics]
    if component == "status":
        return [*(_g("topic", t, "Read", "Describe") for t in topics),
                _g("group", cfg.workers_group(q), "Describe"), _g("group", cfg.tracker.group_id, "Describe")]
    if component == "dlq-list":
        return [_g("topic", q.dlq_topic, "Read", "Describe")]
    if component == "dlq-replay":
        return [_g("topic", q.dlq_topic, "Read", "Describe"), _g("topic", q.name, "Write", "Describe"),
                _g("group", replay_group_prefix(cfg, queue), "Read", pattern="prefix")]
    if component == "lag-job":
        return [_g("topic", q.markers_topic, "Read", "Describe"), _g("group", cfg.tracker.group_id, "Describe"),
                _g("topic", q.metrics_topic, "Create", "Write", "Describe")]
    raise ValueError(f"unknown component {component!r}; one of {', '.join(COMPONENTS)}")
