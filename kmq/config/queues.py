"""A queue entry of kmq.yaml (``queues[]``): its settings, the topics of its group, and the
bounds that keep an open START alive until it is redelivered."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kmq.config.fields import (
    _LONGEST_SUFFIX,
    _MAX_U32_MS_S,
    COMPRESSION_CODECS,
    DEFAULT_GROUP,
    GROUP_PATTERN,
    MARKERS_RETENTION_S,
    MAX_DELIVERIES,
    MIN_MARKERS_RETENTION_S,
    _build,
    _check_group,
    _check_topic,
    _duration_text,
    _f,
    _topic_prefix,
)
from kmq.config.sections import BackoffConfig, ConsumerConfig, TopicsConfig
from kmq.core.errors import ConfigError


@dataclass(frozen=True)
class QueueConfig:
    name: str = _f("", "topic")
    # The consumer group this entry is for (fan-out: every group gets every message once). None: the
    # default group, whose topics are <name>__markers and <name>__dlq; a named group's are
    # <name>__<group>__markers and <name>__<group>__dlq, and its copies carry kmq-group: <group>.
    group: str | None = _f(None, "optname", pattern=GROUP_PATTERN)
    # The Kafka consumer group of this group's workers; None: consumer.group_id.
    workers_group: str | None = _f(None, "optstr")
    markers_topic: str = _f("", "topic")
    dlq_topic: str = _f("", "topic")
    lease: float = _f(30.0, "duration", min=0.001)
    max_deliveries: int = _f(5, "int", min=1, max=MAX_DELIVERIES)
    backoff: BackoffConfig = field(default_factory=BackoffConfig)
    # What `kmq topics create` sets (tansu and some managed services do not report topic configs, so it
    # is configured, not read): lease, backoff, NACK delays and renewals are kept below half of it.
    # Unset in kmq.yaml: topics.markers_retention (filled in by Config), so one fact has one source.
    markers_retention: float = _f(MARKERS_RETENTION_S, "duration", min=MIN_MARKERS_RETENTION_S)
    # Codec of what kmq writes for this queue (copies, dead letters, replays, markers). Configured, not
    # read: some brokers report no topic configs, and a topic's "producer" names no codec.
    compression: str = _f("none", "choice", choices=COMPRESSION_CODECS, lower=True)

    @property
    def max_hold(self) -> float:
        """Longest time (s) the tracker holds an open START before acting: half the markers retention."""
        return self.markers_retention / 2

    @classmethod
    def named(cls, name: str, group: str | None = None, **kw: Any) -> "QueueConfig":
        """A queue with default settings and the default topic names of ``group`` (None: the default group)."""
        prefix = _topic_prefix(name, group)
        return cls(name=name, group=group, markers_topic=f"{prefix}__markers", dlq_topic=f"{prefix}__dlq", **kw)

    @property
    def label(self) -> str:
        """``<name>`` for the default group, ``<name>__<group>`` for a named one (``orders``,
        ``orders__billing``): what the group's topics are named after, and the ``queue`` label of its
        metrics."""
        return _topic_prefix(self.name, self.group)

    @property
    def group_name(self) -> str:
        """The group as users name it: ``group``, or ``default``."""
        return self.group or DEFAULT_GROUP

    @property
    def metrics_topic(self) -> str:
        return f"{self.label}__kmq_metrics"


def _build_queue(raw: Any, path: str, topics: TopicsConfig) -> QueueConfig:
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict):
        raise ConfigError(path, f"expected a queue mapping with at least a name, got {type(raw).__name__}")
    if "name" not in raw:
        raise ConfigError(f"{path}.name", "missing: every queue needs a name")
    name = _check_topic(f"{path}.name", raw["name"])
    group = _check_group(f"{path}.group", raw.get("group"))
    prefix = _topic_prefix(name, group)
    if len(prefix) + _LONGEST_SUFFIX > 249:
        raise ConfigError(f"{path}.group", (
            f"queue {name!r} with group {group!r} makes topic names longer than Kafka's 249 characters "
            f"({prefix}__kmq_metrics): use a shorter group name"))
    filled = {"markers_topic": f"{prefix}__markers", "dlq_topic": f"{prefix}__dlq", **raw}
    q = _build(QueueConfig, filled, path, {"backoff": lambda v, p: _build(BackoffConfig, v, p)})
    retention_key = f"{path}.markers_retention"
    if "markers_retention" not in raw:
        q = dataclasses.replace(q, markers_retention=topics.markers_retention)
        retention_key = "topics.markers_retention"
    if q.backoff.max < q.backoff.initial:
        raise ConfigError(f"{path}.backoff.max", f"must be at least backoff.initial ({_duration_text(q.backoff.initial)})")
    hold = q.lease + q.backoff.max
    if hold > q.max_hold or q.lease > _MAX_U32_MS_S:
        raise ConfigError(f"{path}.lease", (
            f"lease ({_duration_text(q.lease)}) plus backoff.max ({_duration_text(q.backoff.max)}) must stay below "
            f"half of the markers retention ({retention_key}: {_duration_text(q.markers_retention)}), or an open "
            f"START can be deleted by retention before it is redelivered: shorten them or raise the markers "
            f"topic's retention.ms and {retention_key} together"))
    if len({q.name, q.markers_topic, q.dlq_topic}) != 3:
        raise ConfigError(path, "queue, markers_topic and dlq_topic must be three different topics")
    return q



def _check_groups(queues: tuple[QueueConfig, ...], consumer: ConsumerConfig) -> None:
    """No two entries share a group's state: each (queue, group) once, each markers and DLQ topic
    belongs to one entry only, and two groups of one queue have different workers groups (one Kafka
    consumer group would split the queue's partitions between them)."""
    seen: dict[tuple[str, str | None], int] = {}
    owner: dict[str, tuple[int, str]] = {q.name: (-1, "queue") for q in queues}
    workers: dict[tuple[str, str], int] = {}
    for i, q in enumerate(queues):
        other = seen.setdefault((q.name, q.group), i)
        if other != i:
            what = f"queue {q.name!r}" if q.group is None else f"group {q.group!r} of queue {q.name!r}"
            raise ConfigError(f"queues[{i}].name", f"{what} is configured twice (also queues[{other}])")
        for key in ("markers_topic", "dlq_topic"):
            topic = getattr(q, key)
            j, role = owner.setdefault(topic, (i, key))
            if j != i:
                where = f"the queue topic {topic!r}" if j < 0 else f"queues[{j}].{role}"
                raise ConfigError(f"queues[{i}].{key}", (
                    f"{topic!r} is also {where}: each group of a queue needs its own markers and DLQ topics, or "
                    f"their leases and dead letters mix (leave {key} unset to get <queue>__<group>__...)"))
        wg = q.workers_group or consumer.group_id
        j = workers.setdefault((q.name, wg), i)
        if j != i:
            raise ConfigError(f"queues[{i}].workers_group", (
                f"groups {queues[j].group_name!r} and {q.group_name!r} of queue {q.name!r} would both use the "
                f"workers consumer group {wg!r}, which splits the queue's partitions between them so neither "
                f"gets every message: set queues[].workers_group to a consumer group of its own for each"))

