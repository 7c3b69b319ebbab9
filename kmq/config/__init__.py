"""Configuration: one YAML file plus ``KMQ_...`` environment overrides.

Pure (reads the environment only when :meth:`Config.load` is called and only
from the mapping it is given). Durations are stored as float seconds and
accept ``250ms``, ``30s``, ``5m``, ``1h``, ``7d`` or a bare number of seconds.
Unknown keys and bad values raise :class:`~kmq.core.errors.ConfigError` naming the
key path, e.g. ``queues[0].lease: expected a duration like 30s, got 'soon'``.

Secrets (``kafka.sasl_password``, ``kafka.ssl_password``) come only from the
environment (``KMQ_KAFKA__SASL_PASSWORD``) or a file (``kafka.sasl_password_file``),
never from kmq.yaml, and are never shown in errors, logs or ``repr``.

Security settings are checked in two steps: :meth:`Config.from_dict` checks
what the keys say together (a SASL mechanism needs a SASL protocol, TLS files
need SSL); :meth:`KafkaConfig.check_security` (run by :meth:`Config.load`
and again before any client is built) checks what only the running process
can know: credentials present after the environment is applied. Files (TLS,
password, token) are only named here: the client builders check and read them
(:mod:`kmq.client.secrets`), so configuration does no I/O but reading kmq.yaml.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from kmq.config.client_settings import (
    CONFLUENT_REFUSED,
    KAFKA_PYTHON_REFUSED,
    ClientSettings,
    client_settings,
    is_secret,
)
from kmq.core.backoff import backoff_delay
from kmq.core.errors import ConfigError
# The name of a queue's default group (queues[].group unset): its topics keep the names
# <queue>__markers and <queue>__dlq, and its copies carry no kmq-group header.
from kmq.core.message import DEFAULT_GROUP

__all__ = [
    "Config",
    "KafkaConfig",
    "QueueConfig",
    "BackoffConfig",
    "ConsumerConfig",
    "TrackerConfig",
    "RedisConfig",
    "LoggingConfig",
    "TopicsConfig",
    "SparkConfig",
    "parse_duration",
    "ENV_PREFIX",
    "DURATION_PATTERN",
    "TOPIC_PATTERN",
    "PASSWORD_MECHANISMS",
    "COMPRESSION_CODECS",
    "DEFAULT_GROUP",
    "GROUP_PATTERN",
]

ENV_PREFIX = "KMQ_"
_VERBATIM_KAFKA_KEYS = {"bootstrap_servers", "client_id", "sasl_username", "sasl_password", "ssl_password",
                        "sasl_oauth_token_command"}
#: The SASL mechanisms that log in with a user name and a password.
PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
#: A duration as text: a number of seconds or a number with a unit of ``_UNIT`` (also the JSON Schema
#: pattern of kmq.config.schema, so it is written in the regular expressions both understand).
DURATION_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$"
_DURATION_RE = re.compile(DURATION_PATTERN)
#: A Kafka topic name ("." and ".." excepted).
TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
_TOPIC_RE = re.compile(TOPIC_PATTERN)
#: A queue's consumer group (``queues[].group``): letters, digits, ".", "_", "-", no "__" and no "_" at
#: either end, so ``<queue>__<group>__markers`` names one queue and one group only.
GROUP_PATTERN = r"^[A-Za-z0-9.-]+(_[A-Za-z0-9.-]+)*$"  # no look-ahead: the chart's schema is read by Go (RE2)
_GROUP_RE = re.compile(GROUP_PATTERN)
# The longest suffix kmq appends to ``<queue>__<group>``: the Spark job's metrics topic.
_LONGEST_SUFFIX = len("__kmq_metrics")
# Bounds that keep the tracker's arithmetic and the markers retention safe.
MARKERS_RETENTION_S = 7 * 24 * 3600.0  # = kmq.client.topics.MARKERS_RETENTION_MS
# One lower bound for topics.markers_retention and queues[].markers_retention: a tracker outage
# longer than the retention loses markers, so anything shorter than an hour is a typo.
MIN_MARKERS_RETENTION_S = 3600.0
MAX_DELIVERIES = 1000
#: Kafka's compression codecs (a producer's ``compression.type``), as ``queues[].compression`` takes them.
COMPRESSION_CODECS = ("NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD")
_MAX_U32_MS_S = 0xFFFFFFFF / 1000  # durations written into markers as u32 milliseconds


def parse_duration(value: Any, path: str = "") -> float:
    """Seconds from ``250ms``/``30s``/``5m``/``1h``/``7d`` or a number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(path, f"expected a duration like 30s, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    else:
        raise ConfigError(path, f"expected a duration like 30s, got {value!r}")
    if seconds < 0:
        raise ConfigError(path, f"expected a non-negative duration, got {value!r}")
    if not math.isfinite(seconds):  # .inf / .nan from YAML would overflow the wire's u32 ms
        raise ConfigError(path, f"expected a finite duration like 30s, got {value!r}")
    return seconds


def _duration_text(seconds: float) -> str:
    ms = round(seconds * 1000)
    if ms % 86_400_000 == 0 and ms:
        return f"{ms // 86_400_000}d"
    if ms % 3_600_000 == 0 and ms:
        return f"{ms // 3_600_000}h"
    if ms % 60000 == 0 and ms:
        return f"{ms // 60000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


# ---------------------------------------------------------------- sections
# Each field's metadata says how to read it (and is the one source of the JSON Schema of
# kmq.config.schema): "kind" is one of duration, optduration, int, optint, float, bool, str,
# optstr, choice, optchoice, topic; "min"/"max" bound numbers and durations (seconds);
# "choices" lists a choice's values (read case-insensitively, stored upper case, or lower
# case with "lower"); "secret" marks a value never read from kmq.yaml.


def _f(default: Any, kind: str, **meta: Any) -> Any:
    return field(default=default, metadata={"kind": kind, **meta})


#: librdkafka's debug contexts (its CONFIGURATION.md, ``debug``).
LIBRDKAFKA_DEBUG_CONTEXTS = ("generic", "broker", "topic", "metadata", "feature", "queue", "msg", "protocol", "cgrp",
                             "security", "fetch", "interceptor", "plugin", "consumer", "admin", "eos", "mock",
                             "assignor", "conf", "telemetry", "all")


def _comma_list_pattern(item: str) -> str:
    """A JSON Schema / Python pattern: ``item`` values separated by commas, blanks around them, empty allowed."""
    return rf"^[\s,]*(({item})\s*(,[\s,]*({item})\s*)*,?[\s,]*)?$"


def _comma_list(text: str | None) -> list[str]:
    """The items of a comma-separated setting, blanks and empty items dropped."""
    return [item.strip() for item in (text or "").split(",") if item.strip()]


#: ``kafka.librdkafka_debug`` and ``logging.debug`` as patterns (kmq and the chart's schema).
LIBRDKAFKA_DEBUG_PATTERN = _comma_list_pattern("|".join(LIBRDKAFKA_DEBUG_CONTEXTS))
LOGGER_NAMES_PATTERN = _comma_list_pattern(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str = _f("localhost:9092", "str")
    security_protocol: str = _f("PLAINTEXT", "choice", choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"))
    sasl_mechanism: str | None = _f(
        None, "optchoice", choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "AWS_MSK_IAM"))
    sasl_username: str | None = _f(None, "optstr")
    sasl_password: str | None = field(default=None, repr=False, metadata={"kind": "optstr", "secret": True})
    sasl_password_file: str | None = _f(None, "optstr")
    ssl_cafile: str | None = _f(None, "optstr")
    # Mutual TLS: client certificate (PEM; may also hold the key), its key, and
    # the key's password (a secret: environment or file only).
    ssl_certfile: str | None = _f(None, "optstr")
    ssl_keyfile: str | None = _f(None, "optstr")
    ssl_password: str | None = field(default=None, repr=False, metadata={"kind": "optstr", "secret": True})
    ssl_password_file: str | None = _f(None, "optstr")
    # Off only for brokers reached by a name their certificate does not carry.
    ssl_check_hostname: bool = _f(True, "bool")
    # OAUTHBEARER: where the token comes from (exactly one of the two).
    sasl_oauth_token_file: str | None = _f(None, "optstr")
    sasl_oauth_token_command: str | None = _f(None, "optstr")
    client_id: str = _f("kmq", "str")
    # Group timing for every kmq consumer group member (workers, tracker).
    session_timeout: float = _f(10.0, "duration", min=1.0)
    heartbeat_interval: float = _f(1.0, "duration", min=0.1)
    # How often workers and trackers refresh topic metadata: partitions added to a queue (and its
    # markers topic) are fetched and tracked within this (the clients' own default is 5 minutes).
    metadata_max_age: float = _f(30.0, "duration", min=0.1)
    # How long a component waits for the cluster before failing with a clear error.
    connect_timeout: float = _f(10.0, "duration", min=0.1)
    # Which Python Kafka client every component uses (kmq.client): kafka-python (base
    # install), confluent (librdkafka, the confluent extra) or aiokafka (kmq.aio's consumer only,
    # on its event loop; the aio extra).
    client: str = _f("kafka-python", "choice", choices=("KAFKA-PYTHON", "CONFLUENT", "AIOKAFKA"), lower=True)
    # librdkafka's own debug contexts (its `debug` property, e.g. eos,msg) for clients on
    # confluent-kafka; their lines go to the logger kmq.librdkafka at DEBUG.
    librdkafka_debug: str | None = _f(None, "optstr", pattern=LIBRDKAFKA_DEBUG_PATTERN)
    # The clients' own settings, passed through to every client kmq builds on that client
    # (kmq.config.client_settings says what is refused and why).
    kafka_python: ClientSettings = field(default_factory=ClientSettings, hash=False,
                                         metadata={"kind": "settings", "client": "kafka-python"})
    confluent: ClientSettings = field(default_factory=ClientSettings, hash=False,
                                      metadata={"kind": "settings", "client": "confluent"})

    def __post_init__(self) -> None:
        if not re.match(LIBRDKAFKA_DEBUG_PATTERN, self.librdkafka_debug or ""):
            unknown = [c for c in self.librdkafka_debug_contexts if c not in LIBRDKAFKA_DEBUG_CONTEXTS]
            raise ConfigError("kafka.librdkafka_debug", f"unknown librdkafka debug context(s) {', '.join(unknown)}; "
                                                        f"use some of {', '.join(LIBRDKAFKA_DEBUG_CONTEXTS)}")

    @property
    def librdkafka_debug_contexts(self) -> list[str]:
        """The contexts of ``librdkafka_debug``."""
        return _comma_list(self.librdkafka_debug)

    @property
    def servers(self) -> list[str]:
        """``bootstrap_servers`` as a list of ``host:port``."""
        return _comma_list(self.bootstrap_servers)

    def to_json(self) -> str:
        """Every field as JSON, secrets included: how a process hands its Kafka connection to
        another one of the same job (the Spark source's tasks). Never log it."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "KafkaConfig":
        """The KafkaConfig of :meth:`to_json`, checked as the ``kafka:`` section of kmq.yaml is."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError("kafka", f"expected a KafkaConfig as JSON: {exc}") from None
        return cls.from_mapping(data)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "KafkaConfig":
        """A KafkaConfig from a mapping of its keys, checked as the ``kafka:`` section of kmq.yaml is."""
        kafka = _build(cls, dict(data), "kafka")
        _check_security_keys(kafka)
        return kafka

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def check_security(self) -> None:
        """Fail with the key's path when credentials are missing.

        Needs the final values (environment applied), so it runs in :meth:`Config.load` and before
        clients are built, not in :meth:`Config.from_dict`. The files the keys name (TLS, password,
        token) are checked and read where a client is built (:mod:`kmq.client.secrets`): a rendered
        chart names files that exist only in the pod.
        """
        mech = self.sasl_mechanism
        if mech in PASSWORD_MECHANISMS:
            if not self.sasl_username:
                raise ConfigError("kafka.sasl_username", f"required with sasl_mechanism {mech} (or KMQ_KAFKA__SASL_USERNAME)")
            if self.sasl_password is None and not self.sasl_password_file:
                raise ConfigError(
                    "kafka.sasl_password",
                    f"required with sasl_mechanism {mech}: set KMQ_KAFKA__SASL_PASSWORD or kafka.sasl_password_file",
                )
        if mech == "AWS_MSK_IAM":
            import importlib.util

            if importlib.util.find_spec("botocore") is None:
                raise ConfigError("kafka.sasl_mechanism", "AWS_MSK_IAM signs with AWS credentials through botocore: pip install botocore")


@dataclass(frozen=True)
class BackoffConfig:
    initial: float = _f(1.0, "duration")
    max: float = _f(60.0, "duration")
    multiplier: float = _f(2.0, "float", min=1.0, max=100.0)

    def delay(self, attempt: int) -> float:
        """Backoff before redelivery number ``attempt`` (1 = first redelivery)."""
        return backoff_delay(attempt, self.initial, self.max, self.multiplier)


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


def _topic_prefix(name: str, group: str | None) -> str:
    """What the topics of queue ``name``'s ``group`` are named after (:attr:`QueueConfig.label`)."""
    return name if group is None else f"{name}__{group}"


def _check_group(path: str, value: Any) -> str | None:
    """A ``queues[].group`` value: None for the default group (unset or ``default``), else the name."""
    if value is None:
        return None
    if not isinstance(value, str) or not _GROUP_RE.match(value):
        raise ConfigError(path, f"expected a group name (letters, digits, '.', '_', '-'; no '__' and no '_' at "
                                f"either end, as it becomes part of topic names), got {value!r}")
    return None if value == DEFAULT_GROUP else value


def _fetch_wait_ms(seconds: float) -> int:
    """A fetch wait (``fetch.max.wait.ms``) in whole milliseconds, at least 1."""
    return max(1, round(seconds * 1000))


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


_SECTIONS: dict[str, type] = {
    "kafka": KafkaConfig,
    "consumer": ConsumerConfig,
    "tracker": TrackerConfig,
    "redis": RedisConfig,
    "logging": LoggingConfig,
    "topics": TopicsConfig,
    "spark": SparkConfig,
}


@dataclass(frozen=True)
class Config:
    """The whole kmq configuration. Build with :meth:`load` or :meth:`from_dict`."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    queues: tuple[QueueConfig, ...] = ()
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)

    # ------------------------------------------------------------ building
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> "Config":
        """Validate a plain mapping (as read from YAML). ``env`` overrides apply if given."""
        raw = _deep_copy(data or {})
        if not isinstance(raw, dict):
            raise ConfigError("", f"the configuration must be a mapping, got {type(raw).__name__}")
        if env:
            _apply_env(raw, env)
        return _build_config(raw)

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> "Config":
        """Read ``path`` (YAML; None = defaults only) and apply ``KMQ_*`` overrides from ``env``
        (default: the process environment)."""
        data: Any = {}
        if path is not None:
            p = Path(path)
            try:
                text = p.read_text()
            except FileNotFoundError:
                raise ConfigError("", f"config file {p} not found; pass --config PATH or create it (see docs/configuration.md)") from None
            except OSError as exc:
                raise ConfigError("", f"cannot read config file {p}: {exc.strerror}") from None
            try:
                data = yaml.safe_load(text) or {}
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f" at line {mark.line + 1}" if mark else ""
                raise ConfigError("", f"{p} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
            if isinstance(data, dict):
                _reject_file_secrets(data)
        cfg = cls.from_dict(data, os.environ if env is None else env)
        cfg.kafka.check_security()
        return cfg

    # ------------------------------------------------------------ lookup
    def queue(self, name: str, group: str | None = None) -> QueueConfig:
        """The configured queue ``name`` of consumer group ``group``, or one with defaults when it is
        not configured. ``group`` None: the queue's only configured group (the default group when
        none is configured); a queue configured for several groups needs one named (``default`` for
        the default group)."""
        try:
            _check_topic("queue", name)
        except ConfigError as exc:
            raise ConfigError("queue", exc.problem) from None
        entries = [q for q in self.queues if q.name == name]
        if group is None:
            if len(entries) > 1:
                raise ConfigError("group", (
                    f"queue {name!r} is configured for {len(entries)} groups "
                    f"({', '.join(q.group_name for q in entries)}): name one (--group, or group=...)"))
            if entries:
                return entries[0]
        else:
            wanted = _check_group("group", group)
            for q in entries:
                if q.group == wanted:
                    return q
            group = wanted
        return _build_queue({"name": name, "group": group}, "queue", self.topics)

    def queue_labelled(self, label: str) -> QueueConfig:
        """The configured entry whose :attr:`~QueueConfig.label` is ``label`` (``orders``,
        ``orders__billing``), else :meth:`queue` of that name (one configured group, or defaults)."""
        for q in self.queues:
            if q.label == label:
                return q
        return self.queue(label)

    def workers_group(self, queue: QueueConfig) -> str:
        """The Kafka consumer group of ``queue``'s workers: ``queues[].workers_group``, else ``consumer.group_id``."""
        return queue.workers_group or self.consumer.group_id

    def with_queue(self, name: str, group: str | None = None) -> "Config":
        """This config with ``name`` (of ``group``) among its queues (added with defaults if missing)."""
        q = self.queue(name, group)
        if q in self.queues:
            return self
        return dataclasses.replace(self, queues=self.queues + (q,))

    def replace(self, **sections: Any) -> "Config":
        return dataclasses.replace(self, **sections)

    def to_dict(self, redact: bool = True) -> dict[str, Any]:
        """Plain mapping (durations as text); secrets replaced by ``***``."""
        def conv(obj: Any) -> Any:
            if dataclasses.is_dataclass(obj):
                out: dict[str, Any] = {}
                for f in dataclasses.fields(obj):
                    v = getattr(obj, f.name)
                    if f.metadata.get("secret") and v is not None and redact:
                        out[f.name] = "***"
                    elif f.metadata.get("kind") in ("duration", "optduration") and v is not None:
                        out[f.name] = _duration_text(v)
                    elif f.metadata.get("kind") == "settings":
                        out[f.name] = v.redacted() if redact else dict(v)
                    else:
                        out[f.name] = conv(v)
                return out
            if isinstance(obj, tuple):
                return [conv(x) for x in obj]
            return obj

        return conv(self)


# ---------------------------------------------------------------- env
def _apply_env(raw: dict, env: Mapping[str, str]) -> None:
    """``KMQ_KAFKA__BOOTSTRAP_SERVERS=x`` sets raw['kafka']['bootstrap_servers'];
    ``KMQ_QUEUES__0__LEASE=5s`` sets the first queue's lease. Values are read
    as YAML scalars so ``true``/``5`` get their types."""
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        if len(parts) < 2 or parts[0] not in (*_SECTIONS, "queues"):
            continue  # e.g. KMQ_TEST_BOOTSTRAP belongs to the test suite, not to config
        if parts[:2] == ["kafka", "confluent"] and len(parts) == 3:
            # librdkafka's properties are dotted and none has an underscore, which env names allow
            parts[2] = parts[2].replace("_", ".")
        path_text = ".".join(parts)
        try:
            value = yaml.safe_load(env[name]) if env[name] != "" else None
        except yaml.YAMLError:
            value = env[name]
        if parts[0] == "kafka" and (parts[-1] in _VERBATIM_KAFKA_KEYS or (len(parts) == 3 and is_secret(parts[2]))):
            value = env[name]  # keep strings verbatim (a password may look like a number)
        node: Any = raw
        for _i, part in enumerate(parts[:-1]):
            if isinstance(node, list):
                if not part.isdigit():
                    raise ConfigError(name, f"expected a list index in {name} at {part!r}")
                idx = int(part)
                while len(node) <= idx:
                    node.append({})
                node = node[idx]
            else:
                nxt = node.get(part)
                if nxt is None:
                    nxt = [] if part == "queues" else {}
                    node[part] = nxt
                elif not isinstance(nxt, (dict, list)):
                    raise ConfigError(path_text, f"{name} sets a key below {part!r}, which is not a section")
                node = nxt
        last = parts[-1]
        if isinstance(node, list):
            if not last.isdigit():
                raise ConfigError(name, f"expected a list index in {name} at {last!r}")
            raise ConfigError(name, f"{name} replaces a whole list entry; set its keys instead (…__{last}__LEASE)")
        node[last] = value


def _reject_file_secrets(data: dict) -> None:
    kafka = data.get("kafka")
    for section in ("kafka_python", "confluent"):
        passed = kafka.get(section) if isinstance(kafka, dict) else None
        for key, value in (passed.items() if isinstance(passed, dict) else ()):
            if isinstance(key, str) and is_secret(key) and value not in (None, ""):
                env = f"KMQ_KAFKA__{section.upper()}__{key.upper().replace('.', '_')}"
                raise ConfigError(f"kafka.{section}.{key}", f"secrets are not read from the config file; set {env}")
    if isinstance(kafka, dict) and kafka.get("sasl_password") not in (None, ""):
        raise ConfigError(
            "kafka.sasl_password",
            "secrets are not read from the config file; set KMQ_KAFKA__SASL_PASSWORD or kafka.sasl_password_file",
        )
    if isinstance(kafka, dict) and kafka.get("ssl_password") not in (None, ""):
        raise ConfigError(
            "kafka.ssl_password",
            "secrets are not read from the config file; set KMQ_KAFKA__SSL_PASSWORD or kafka.ssl_password_file",
        )


# ---------------------------------------------------------------- validation
def _deep_copy(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {k: _deep_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_deep_copy(v) for v in obj]
    return obj


def _check_topic(path: str, value: Any) -> str:
    if not isinstance(value, str) or not _TOPIC_RE.match(value) or value in (".", ".."):
        raise ConfigError(path, f"expected a Kafka topic name (letters, digits, '.', '_', '-'), got {value!r}")
    return value


def _value(path: str, f: dataclasses.Field, value: Any) -> Any:
    kind = f.metadata.get("kind")
    shown = "***" if f.metadata.get("secret") else repr(value)
    if kind in ("optint", "optduration"):
        if value is None:
            return None
        kind = kind[3:]
    if kind == "duration":
        v = parse_duration(value, path)
        if "min" in f.metadata and v < f.metadata["min"]:
            raise ConfigError(path, f"expected at least {_duration_text(f.metadata['min'])}, got {value!r}")
        if "max" in f.metadata and v > f.metadata["max"]:
            raise ConfigError(path, f"expected at most {_duration_text(f.metadata['max'])}, got {value!r}")
        return v
    if kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "int" and not float(value).is_integer()):
            raise ConfigError(path, f"expected {'an integer' if kind == 'int' else 'a number'}, got {shown}")
        v = int(value) if kind == "int" else float(value)
        if not math.isfinite(v):
            raise ConfigError(path, f"expected a finite number, got {shown}")
        lo, hi = f.metadata.get("min"), f.metadata.get("max")
        if lo is not None and v < lo:
            raise ConfigError(path, f"expected at least {lo}, got {shown}")
        if hi is not None and v > hi:
            raise ConfigError(path, f"expected at most {hi}, got {shown}")
        return v
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {shown}")
        return value
    if kind in ("str", "optstr"):
        if value is None and kind == "optstr":
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or (kind == "str" and not value.strip()):
            raise ConfigError(path, f"expected a non-empty string, got {shown}")
        return value
    if kind in ("choice", "optchoice"):
        if value is None and kind == "optchoice":
            return None
        choices = f.metadata["choices"]
        if not isinstance(value, str) or value.upper() not in choices:
            raise ConfigError(path, f"expected one of {', '.join(choices)}, got {shown}")
        return value.lower() if f.metadata.get("lower") else value.upper()
    if kind == "topic":
        return _check_topic(path, value)
    if kind == "settings":
        return client_settings(path, value, CONFLUENT_REFUSED if f.metadata["client"] == "confluent"
                               else KAFKA_PYTHON_REFUSED)
    if kind == "optname":
        return _check_group(path, value)
    raise AssertionError(f"field {f.name} has no kind")  # pragma: no cover


def _build(cls: type, raw: Any, path: str, nested: Mapping[str, Any] | None = None) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(path, f"expected a mapping of keys, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            near = ", ".join(sorted(fields))
            raise ConfigError(f"{path}.{key}" if path else str(key), f"unknown key; known keys here: {near}")
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        sub = f"{path}.{name}" if path else name
        if nested and name in nested:
            kwargs[name] = nested[name](value, sub)
        else:
            kwargs[name] = _value(sub, fields[name], value)
    return cls(**kwargs)


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


def _build_config(raw: dict) -> Config:
    for key in raw:
        if key not in (*_SECTIONS, "queues"):
            raise ConfigError(str(key), f"unknown key; known top-level keys: {', '.join(sorted((*_SECTIONS, 'queues')))}")
    kwargs: dict[str, Any] = {name: _build(cls, raw.get(name), name) for name, cls in _SECTIONS.items()}
    queues_raw = raw.get("queues") or []
    if not isinstance(queues_raw, list):
        raise ConfigError("queues", f"expected a list of queues, got {type(queues_raw).__name__}")
    topics: TopicsConfig = kwargs["topics"]
    queues = tuple(_build_queue(q, f"queues[{i}]", topics) for i, q in enumerate(queues_raw))
    consumer: ConsumerConfig = kwargs["consumer"]
    _check_groups(queues, consumer)
    if consumer.hand_over == "started" and consumer.ordering == "key":
        raise ConfigError("consumer.hand_over", (
            "started cannot be combined with consumer.ordering: key: a batch handed over before its commit "
            "can be delivered to a second member while this one still holds its keys; use hand_over: committed"))
    hold = min([q.max_hold for q in queues] or [topics.markers_retention / 2])
    for key in ("max_lease", "handoff_lease"):  # both lengthen a lease with RENEWs
        value = getattr(consumer, key)
        if value > hold or value > _MAX_U32_MS_S:
            raise ConfigError(f"consumer.{key}", (
                f"{_duration_text(value)} must stay below half of the markers retention "
                f"({_duration_text(hold * 2)}): a lease renewed past it outlives its START marker"))
    _check_security_keys(kwargs["kafka"])
    if topics.replication_factor and topics.min_insync_replicas and topics.min_insync_replicas > topics.replication_factor:
        raise ConfigError("topics.min_insync_replicas", f"({topics.min_insync_replicas}) must not exceed "
                          f"topics.replication_factor ({topics.replication_factor}), or no write can succeed")
    return Config(queues=queues, **kwargs)


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


def _check_security_keys(kafka: KafkaConfig) -> None:
    """Keys that contradict each other (values only; files and credentials: KafkaConfig.check_security)."""
    if kafka.sasl_mechanism and not kafka.security_protocol.startswith("SASL"):
        raise ConfigError("kafka.sasl_mechanism", f"is set but kafka.security_protocol is {kafka.security_protocol}; use SASL_SSL or SASL_PLAINTEXT")
    if kafka.security_protocol.startswith("SASL") and not kafka.sasl_mechanism:
        raise ConfigError("kafka.sasl_mechanism", f"required when kafka.security_protocol is {kafka.security_protocol}")
    if not kafka.uses_tls:
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_password_file"):
            if getattr(kafka, key) is not None:
                raise ConfigError(f"kafka.{key}", f"is set but kafka.security_protocol is {kafka.security_protocol}; use SSL or SASL_SSL")
        if not kafka.ssl_check_hostname:
            raise ConfigError("kafka.ssl_check_hostname", f"is false but kafka.security_protocol is {kafka.security_protocol}; use SSL or SASL_SSL")
    if kafka.ssl_keyfile and not kafka.ssl_certfile:
        raise ConfigError("kafka.ssl_keyfile", "needs kafka.ssl_certfile (the client certificate that goes with the key)")
    if (kafka.ssl_password is not None or kafka.ssl_password_file) and not kafka.ssl_certfile:
        raise ConfigError("kafka.ssl_password" if kafka.ssl_password is not None else "kafka.ssl_password_file",
                          "protects a client key: set kafka.ssl_certfile (and kafka.ssl_keyfile)")
    if kafka.ssl_password is not None and kafka.ssl_password_file:
        raise ConfigError("kafka.ssl_password_file", "set either KMQ_KAFKA__SSL_PASSWORD or kafka.ssl_password_file, not both")
    mech = kafka.sasl_mechanism
    token_keys = [k for k in ("sasl_oauth_token_file", "sasl_oauth_token_command") if getattr(kafka, k)]
    oidc = str(kafka.confluent.get("sasl.oauthbearer.method", "")).lower() == "oidc"
    if oidc and (mech != "OAUTHBEARER" or kafka.client != "confluent"):
        raise ConfigError("kafka.confluent.sasl.oauthbearer.method", "oidc is librdkafka's own OAUTHBEARER login: it "
                          "needs kafka.sasl_mechanism: OAUTHBEARER and kafka.client: confluent")
    if mech == "OAUTHBEARER":
        # With librdkafka's OIDC login a token file or command is only for the clients still on
        # kafka-python (topic administration).
        if not token_keys and not oidc:
            raise ConfigError("kafka.sasl_oauth_token_file",
                              "OAUTHBEARER needs a token: set kafka.sasl_oauth_token_file or kafka.sasl_oauth_token_command")
        if len(token_keys) == 2:
            raise ConfigError("kafka.sasl_oauth_token_command", "set either kafka.sasl_oauth_token_file or kafka.sasl_oauth_token_command, not both")
    elif token_keys:
        raise ConfigError(f"kafka.{token_keys[0]}", f"only used with sasl_mechanism OAUTHBEARER (it is {mech})")
    if mech in ("OAUTHBEARER", "AWS_MSK_IAM"):
        for key in ("sasl_username", "sasl_password", "sasl_password_file"):
            if getattr(kafka, key) is not None:
                raise ConfigError(f"kafka.{key}", f"not used with sasl_mechanism {mech}; remove it")
