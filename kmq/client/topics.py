"""Queue, markers and DLQ topics: names, creation, alignment checks.

The markers topic must have at least as many partitions as the queue topic:
the marker for queue partition p goes to markers partition p, so one tracker
owns both the START and the END of a message. Every component calls
:func:`require_aligned` at start and refuses to run otherwise.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kmq.client.admin import TopicAdmin, TopicState
from kmq.client.factory import open_admin
from kmq.config import KafkaConfig, QueueConfig, TopicsConfig
from kmq.core.errors import KmqError, TopicError, TopicMisaligned, TopicMissing, UnsupportedByBroker

__all__ = ["TopicLayout", "describe", "ensure_topics", "require_aligned", "MARKERS_RETENTION_MS",
           "choose_replication_factor", "topic_configs", "max_message_bytes"]

log = logging.getLogger(__name__)

# Must exceed the longest lease plus backoff; 7 days by default (docs/protocol.md,
# topics.markers_retention).
MARKERS_RETENTION_MS = 7 * 24 * 3600 * 1000
_DEFAULT_REPLICATION = 3


def choose_replication_factor(requested: int | None, brokers: int) -> int:
    """``requested``, or 3 when the cluster has at least 3 brokers, else the broker count.

    A requested factor above the broker count is refused here with the fix,
    rather than by the broker with INVALID_REPLICATION_FACTOR.
    """
    if requested is not None:
        if brokers and requested > brokers:
            raise TopicError(f"replication factor {requested} is above the {brokers} broker(s) of this cluster; "
                             f"use --replication-factor {brokers} (or topics.replication_factor)")
        return requested
    if brokers <= 0:
        return _DEFAULT_REPLICATION
    return min(_DEFAULT_REPLICATION, brokers)


def topic_configs(settings: TopicsConfig, queue: QueueConfig | None = None) -> dict[str, dict[str, str]]:
    """Topic-level configs by role (queue, markers, dlq) from ``topics:`` in kmq.yaml.

    The markers retention is ``queue.markers_retention`` when a queue is given (it defaults to
    ``topics.markers_retention``): the value the bounds and the tracker's retention ratio assume.
    """
    common = {}
    if settings.min_insync_replicas is not None:
        common["min.insync.replicas"] = str(settings.min_insync_replicas)
    retention = queue.markers_retention if queue is not None else settings.markers_retention
    markers = {**common, "retention.ms": str(round(retention * 1000))}
    dlq = dict(common)
    if settings.dlq_retention is not None:
        dlq["retention.ms"] = str(round(settings.dlq_retention * 1000))
    return {"queue": common, "markers": markers, "dlq": dlq}


@dataclass(frozen=True)
class TopicLayout:
    """Partition counts of a queue's three topics (None = topic missing)."""

    queue: QueueConfig
    queue_partitions: int | None
    markers_partitions: int | None
    dlq_partitions: int | None

    @property
    def aligned(self) -> bool:
        return (
            self.queue_partitions is not None
            and self.markers_partitions is not None
            and self.dlq_partitions is not None
            and self.markers_partitions >= self.queue_partitions
        )

    def problems(self) -> list[str]:
        q = self.queue
        out = []
        fix = f"run `kmq topics create {q.name}`"
        if self.queue_partitions is None:
            out.append(f"queue topic {q.name!r} does not exist; {fix} --partitions N")
        if self.markers_partitions is None:
            out.append(f"markers topic {q.markers_topic!r} does not exist; {fix}")
        if self.dlq_partitions is None:
            out.append(f"DLQ topic {q.dlq_topic!r} does not exist; {fix}")
        if (
            self.queue_partitions is not None
            and self.markers_partitions is not None
            and self.markers_partitions < self.queue_partitions
        ):
            out.append(
                f"markers topic {q.markers_topic!r} has {self.markers_partitions} partitions but queue "
                f"{q.name!r} has {self.queue_partitions}; {fix} to grow it to {self.queue_partitions} "
                f"(or recreate {q.markers_topic!r} with {self.queue_partitions} partitions)"
            )
        return out


def _counts(states: dict[str, TopicState | None]) -> dict[str, int | None]:
    return {name: None if state is None else state.partitions for name, state in states.items()}


def _wait_led(admin: TopicAdmin, names: list[str], timeout_s: float) -> dict[str, int | None]:
    """Partition counts once every partition of ``names`` has a leader (at most ``timeout_s``).

    A topic just created or grown is in the metadata before its partitions have leaders; a
    consumer group whose leader assigns from such metadata hands out none of them, and its
    members sit idle until the next metadata refresh (Apache Kafka; tansu answers at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = admin.describe(names)
        # A topic just created may also be answered as unknown for a moment, by a broker whose
        # metadata cache has not caught up with the controller yet.
        leaderless = [name for name, state in states.items() if state is None or state.leaderless]
        if not leaderless or time.monotonic() > deadline:
            if leaderless:
                log.warning("partitions of %s have no leader yet after %.0f s", ", ".join(leaderless), timeout_s)
            return _counts(states)
        time.sleep(0.1)


def describe(kafka: KafkaConfig, queue: QueueConfig) -> TopicLayout:
    """Read the partition counts of the queue's topics."""
    admin = open_admin(kafka)
    try:
        counts = _counts(admin.describe([queue.name, queue.markers_topic, queue.dlq_topic]))
    finally:
        admin.close()
    return TopicLayout(queue, counts.get(queue.name), counts.get(queue.markers_topic), counts.get(queue.dlq_topic))


def max_message_bytes(kafka: KafkaConfig, topics: list[str]) -> dict[str, int | None]:
    """``max.message.bytes`` of each topic as the broker reports it (the largest record batch the
    topic accepts); None where the broker does not say (some return no topic configs) or the
    look-up fails: the caller falls back to its configured size."""
    out: dict[str, int | None] = dict.fromkeys(topics)
    if not topics:
        return out
    try:
        admin = open_admin(kafka)
        try:
            found = admin.configs(topics)
        finally:
            admin.close()
    except (KmqError, OSError) as exc:
        log.info("max.message.bytes of %s not read (%s)", ", ".join(topics), exc)
        return out
    for topic in out:
        value = found.get(topic, {}).get("max.message.bytes")
        if value is not None and str(value).isdigit():
            out[topic] = int(value)
    return out


def require_aligned(kafka: KafkaConfig, queue: QueueConfig) -> TopicLayout:
    """The layout, or :class:`TopicMissing` / :class:`TopicMisaligned` naming the fix."""
    layout = describe(kafka, queue)
    problems = layout.problems()
    if problems:
        missing = any("does not exist" in p for p in problems)
        raise (TopicMissing if missing else TopicMisaligned)("; ".join(problems))
    return layout


def ensure_topics(
    kafka: KafkaConfig, queue: QueueConfig, partitions: int | None = None, replication_factor: int | None = None,
    dlq_partitions: int | None = None, settings: TopicsConfig | None = None,
) -> TopicLayout:
    """Create the missing topics and grow the markers topic to match the queue.

    Idempotent. ``partitions`` is used when the queue topic does not exist
    yet; an existing queue topic keeps its count (a larger ``partitions`` grows
    it, where the broker supports CreatePartitions). New topics get
    ``settings`` (``topics:`` in kmq.yaml: replication factor, min.insync.replicas,
    markers and DLQ retention); existing topics are not altered.
    ``replication_factor`` overrides ``settings.replication_factor``.
    """
    if partitions is not None and partitions < 1:
        raise TopicError(f"--partitions must be at least 1, got {partitions}")
    settings = settings or TopicsConfig()
    configs = topic_configs(settings, queue)
    admin = open_admin(kafka)
    try:
        counts = _counts(admin.describe([queue.name, queue.markers_topic, queue.dlq_topic]))
        rf = 1
        if None in counts.values():
            brokers = _broker_count(admin)
            rf = choose_replication_factor(
                replication_factor if replication_factor is not None else settings.replication_factor, brokers)
        qp = counts[queue.name]
        mp = counts[queue.markers_topic]
        grow_queue = qp is not None and partitions is not None and partitions > qp
        if grow_queue and mp is not None and mp < partitions:
            # The markers topic first: a worker handed a new queue partition writes its STARTs to the
            # markers partition of the same number, which must exist by then.
            _grow(admin, queue.markers_topic, partitions)
            mp = partitions
        if qp is None:
            qp = partitions or 1
            _create(admin, queue.name, qp, rf, configs["queue"])
        elif grow_queue:
            _grow(admin, queue.name, partitions)
            qp = partitions
        if mp is None:
            _create(admin, queue.markers_topic, qp, rf, configs["markers"])
        elif mp < qp:
            _grow(admin, queue.markers_topic, qp)
        if counts[queue.dlq_topic] is None:
            _create(admin, queue.dlq_topic, dlq_partitions or qp, rf, configs["dlq"])
        counts = _wait_led(admin, [queue.name, queue.markers_topic, queue.dlq_topic], kafka.connect_timeout * 3)
    finally:
        admin.close()
    return TopicLayout(queue, counts[queue.name], counts[queue.markers_topic], counts[queue.dlq_topic])


def _broker_count(admin: TopicAdmin) -> int:
    """Brokers in the cluster; 0 when the cluster does not tell (then the default factor 3 is tried)."""
    try:
        return len(admin.brokers())
    except TopicError as exc:
        log.warning("cannot count the brokers (%s); new topics get replication factor %d unless "
                    "topics.replication_factor or --replication-factor says otherwise", exc, _DEFAULT_REPLICATION)
        return 0


def _create(admin: TopicAdmin, name: str, partitions: int, rf: int, configs: dict[str, str]) -> None:
    if admin.create(name, partitions, rf, configs):
        log.info("created topic %s with %d partitions, replication factor %d%s", name, partitions, rf,
                 "".join(f", {k}={v}" for k, v in sorted(configs.items())))
    else:
        log.info("topic %s already exists", name)  # another process won the race


def _grow(admin: TopicAdmin, name: str, partitions: int) -> None:
    try:
        admin.grow(name, partitions)
    except UnsupportedByBroker as exc:
        raise UnsupportedByBroker(
            f"cannot grow {name!r} to {partitions} partitions: this broker does not support CreatePartitions; "
            f"grow it with your cluster's tooling (kafka-topics.sh --alter --partitions {partitions}) "
            f"or recreate it with {partitions} partitions"
        ) from exc
    except TopicError as exc:
        if type(exc) is not TopicError:
            raise
        raise TopicError(f"cannot grow {name!r} to {partitions} partitions: {exc}") from exc
    log.info("grew topic %s to %d partitions", name, partitions)
