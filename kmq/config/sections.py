"""The sections of kmq.yaml other than ``kafka`` and ``queues``: consumer, tracker, redis,
logging, topics, spark (and a queue's ``backoff``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kmq.config.fields import (
    LOGGER_NAMES_PATTERN,
    MARKERS_RETENTION_S,
    MIN_MARKERS_RETENTION_S,
    _comma_list,
    _f,
    _fetch_wait_ms,
)
from kmq.core.backoff import backoff_delay
from kmq.core.errors import ConfigError


@dataclass(frozen=True)
class BackoffConfig:
    initial: float = _f(1.0, "duration")
    max: float = _f(60.0, "duration")
    multiplier: float = _f(2.0, "float", min=1.0, max=100.0)

    def delay(self, attempt: int) -> float:
        """Backoff before redelivery number ``attempt`` (1 = first redelivery)."""
        return backoff_delay(attempt, self.initial, self.max, self.multiplier)


@dataclass(frozen=True)
class ConsumerConfig:
    group_id: str = _f("kmq-workers", "str")
    max_in_flight_per_partition: int = _f(10_000, "int", min=1)
    ack_flush_interval: float = _f(0.1, "duration")
    # On by default (the Pub/Sub clients' lease management): a handler slower than the lease is
    # renewed, up to max_lease in all, instead of having its message redelivered while it works.
    auto_renew: bool = _f(True, "bool")
    max_lease: float = _f(600.0, "duration")
    # How long an END/RENEW/NACK/REJECT that Kafka did not acknowledge is retried
    # (from its first failure): at least a broker restart or leader move.
    marker_retry_budget: float = _f(120.0, "duration")
    # Flow control (kmq/consumer/flow.py): bounds on fetched-but-unsettled messages of one consumer.
    max_outstanding_messages: int = _f(10_000, "int", min=1)
    max_outstanding_bytes: int = _f(100 * 1024 * 1024, "int", min=1)
    # cooperative-sticky: a rebalance revokes only the partitions that move (KIP-429).
    assignor: str = _f("COOPERATIVE-STICKY", "choice", choices=("COOPERATIVE-STICKY", "RANGE"))
    # A fetcher whose Kafka poll has not returned for this long is stalled: the consumer fails loudly.
    fetch_stall_timeout: float = _f(10.0, "duration", min=1.0)
    # Kafka's max.poll.interval.ms for the application: messages ready and none taken by it for this
    # long, the consumer gives its partitions up (leaves the group) until the application takes again.
    max_poll_interval: float = _f(300.0, "duration", min=1.0)
    # none: handlers get messages in any order; key: one message per (partition, key) at a time, in
    # offset order, through failures (docs/protocol.md, "Per-key ordering").
    ordering: str = _f("none", "choice", choices=("NONE", "KEY"), lower=True)
    # Messages given back to the group (a revocation, close) get a RENEW of this length (at least the
    # queue's lease) before their offsets are committed back, so their old START does not time out
    # while the group takes the partition to its next owner, whose START supersedes it.
    handoff_lease: float = _f(300.0, "duration", min=1.0)
    # How long the broker may hold the queue consumer's fetch while no record is there (Kafka's
    # fetch.max.wait.ms). null: the client's default (500 ms). Kafka answers as soon as a record
    # arrives, so this bounds only how often an idle consumer fetches.
    fetch_wait: float | None = _f(None, "optduration", min=0.001, max=10.0)
    # When a fetched batch reaches user code. committed: once Kafka acknowledged its START and its
    # offsets were committed (a rebalance or a failed commit never costs a delivery). started: once
    # the START is acknowledged, with the commit still in flight: one broker round trip less
    # latency; a commit that then fails, or a partition that moves before it lands, lets the group
    # deliver the batch again (at-least-once either way: its START is written).
    hand_over: str = _f("committed", "choice", choices=("COMMITTED", "STARTED"), lower=True)

    @property
    def fetch_wait_ms(self) -> int | None:
        """``fetch_wait`` in milliseconds, at least 1 (None: the client's default)."""
        return None if self.fetch_wait is None else _fetch_wait_ms(self.fetch_wait)


@dataclass(frozen=True)
class TrackerConfig:
    group_id: str = _f("kmq-tracker", "str")
    tick: float = _f(0.05, "duration", min=0.001)
    # How long the broker may hold the markers consumer's fetch when no marker is there (Kafka's
    # fetch.max.wait.ms). null: the tick, at least 10 ms and at most 500 ms. A broker answers as soon as
    # a marker arrives, so a longer wait costs no latency there and fewer idle fetches of every owned
    # partition: what a tracker owning thousands of partitions costs when idle.
    fetch_wait: float | None = _f(None, "optduration", min=0.001, max=10.0)
    # After the markers' ends could not be read for a while (a broker outage), leases that ran out
    # meanwhile wait this long once they can be read again, for the ENDs and RENEWs their consumers
    # retry (a consumer retries a failed marker every second; its client reconnects within a few).
    # Longer: fewer copies of messages whose END was late; each abandoned message comes that much later.
    outage_grace: float = _f(10.0, "duration", min=0.0, max=3600.0)
    http_port: int = _f(9108, "int", min=0, max=65535)
    # /healthz fails when the main loop has not completed a step for this long
    # (a hung loop redelivers nothing; the liveness probe then restarts the pod).
    liveness_timeout: float = _f(60.0, "duration", min=1.0)
    # Static membership (group.instance.id): a restarted pod with the same id
    # gets its partitions back without a rebalance within session_timeout.
    # Empty: dynamic membership. The chart sets it from the pod name.
    instance_id: str | None = _f(None, "optstr")
    # The tracker producer's max_request_size: a copy larger than this is dead-lettered if it fits, else
    # closed as undeliverable (docs/protocol.md).
    max_request_size: int = _f(1_048_576, "int", min=1024, max=1_073_741_824)

    def markers_fetch_wait_ms(self) -> int:
        """The markers consumer's fetch wait in milliseconds: ``fetch_wait``, else the tick (10-500 ms)."""
        if self.fetch_wait is not None:
            return _fetch_wait_ms(self.fetch_wait)
        return max(10, min(500, int(self.tick * 1000)))


@dataclass(frozen=True)
class RedisConfig:
    url: str | None = _f(None, "optstr")


@dataclass(frozen=True)
class TopicsConfig:
    """Settings of the topics ``kmq topics create`` makes (existing topics are not altered)."""

    # null: 3 when the cluster has at least 3 brokers, else the broker count.
    replication_factor: int | None = _f(None, "optint", min=1)
    # null: the broker's default. Set it (e.g. 2 with replication 3) so acks=all means what it says.
    min_insync_replicas: int | None = _f(None, "optint", min=1)
    # Must exceed the longest lease plus backoff: a START marker deleted while its
    # message is open is invisible to a restarted tracker. The default of every
    # queues[].markers_retention (the bounds and the tracker use the queue's value).
    markers_retention: float = _f(MARKERS_RETENTION_S, "duration", min=MIN_MARKERS_RETENTION_S)
    # null: the broker's default (usually 7 days).
    dlq_retention: float | None = _f(None, "optduration", min=60.0)


@dataclass(frozen=True)
class LoggingConfig:
    """How the ``kmq`` command logs (applied by the CLI entry; a library user keeps their own)."""

    level: str = _f("WARNING", "choice", choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    format: str = _f("text", "choice", choices=("TEXT", "JSON"), lower=True)
    # Loggers shown at DEBUG whatever the level, comma-separated (e.g. kafka.producer.sender):
    # one component's detail without every library's (DEBUG everywhere logs each record sent).
    debug: str | None = _f(None, "optstr", pattern=LOGGER_NAMES_PATTERN, numbers=True)  # "42" names a logger

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", self.format.lower())
        if not re.match(LOGGER_NAMES_PATTERN, self.debug or ""):
            raise ConfigError("logging.debug", f"expected logger names separated by commas "
                                               f"(like kafka.producer.sender,tracker.redeliver), got {self.debug!r}")

    @property
    def debug_loggers(self) -> list[str]:
        """The logger names of ``debug``."""
        return _comma_list(self.debug)


#: Where Spark's Kafka connector comes from unless ``spark.maven_repository`` says otherwise.
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"


@dataclass(frozen=True)
class SparkConfig:
    """The lag job's Spark side (``kmq lag-job``, docs/spark.md)."""

    # kafka: Spark's own Kafka connector (its jars fetched once by the job's launcher, see
    # kmq.spark.connector); python: the kmq-kafka Python data source (no jars, kafka-python or
    # confluent-kafka in the tasks).
    source: str = _f("kafka", "choice", choices=("KAFKA", "PYTHON"), lower=True)
    # Where the launcher keeps the connector's jars (one folder per Spark version); null:
    # ~/.cache/kmq/spark-jars. Filled once from maven_repository, then used offline.
    jars_cache: str | None = _f(None, "optstr")
    # The Maven repository the connector is fetched from (a mirror or proxy of Maven Central).
    maven_repository: str = _f(MAVEN_CENTRAL, "str")

