"""A confluent-style share-consumer configuration dict read into kmq's configuration.

Pure apart from :class:`~kmq.config.Config` validation: no Kafka, no I/O.
``kmq.share.ShareConsumer`` takes the dict ``confluent_kafka.ShareConsumer``
takes (``bootstrap.servers``, ``group.id``, ``share.acknowledgement.mode``,
``max.poll.records``, the usual security keys) plus a few ``kmq.*`` keys for
what a share group keeps on the broker (the lock duration, the group's session
timing) and kmq keeps in its own configuration (docs/share-consumer.md lists
them). Keys the native share consumer refuses with a ``ValueError`` are refused
the same way (:data:`REFUSED_KEYS`): ``session.timeout.ms`` and
``heartbeat.interval.ms`` (a share group's timing is the broker's; on kmq they
are ``kmq.session.timeout.ms`` and ``kmq.heartbeat.interval.ms``),
``group.protocol``, ``fetch.error.backoff.ms`` and ``auto.offset.reset``.
``error_cb`` is kept (:attr:`ShareSettings.error_cb`) and must be callable, as natively.

Keys that tune librdkafka's network behaviour and have no meaning for kmq
(``socket.timeout.ms``, ``fetch.*``, ...) are accepted and ignored, so code
written for the native consumer runs unchanged; any other key is refused with
a :class:`~kmq.core.errors.ConfigError` naming it (a misspelt key must not pass
silently).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping

from kmq.config import Config
from kmq.config.librdkafka import KMQ_KEY_OF
from kmq.core.errors import ConfigError

__all__ = ["AckMode", "ShareSettings", "read_settings", "KAFKA_KEYS", "KMQ_KEYS", "IGNORED_KEYS", "REFUSED_KEYS"]


class AckMode(str, Enum):
    """``share.acknowledgement.mode``."""

    IMPLICIT = "implicit"
    EXPLICIT = "explicit"


def _ms(value: Any) -> str:
    """A ``*.ms`` value (int, float or numeric text) as a kmq duration text."""
    try:
        ms = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected milliseconds, got {value!r}") from None
    return f"{ms:g}ms"


def _text(value: Any) -> str:
    return str(value)


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected an integer, got {value!r}") from None


#: The kmq.yaml keys a share-consumer dict may give as librdkafka properties, with their converters.
#: Natively, a member not polled for max.poll.interval.ms leaves its group; on kmq the consumer gives
#: its partitions up the same way (consumer.max_poll_interval, docs/protocol.md).
_FROM_PROPERTIES: dict[str, Callable[[Any], Any]] = {
    "kafka.bootstrap_servers": _text, "kafka.client_id": _text, "kafka.security_protocol": lambda v: str(v).upper(),
    "kafka.sasl_mechanism": lambda v: str(v).upper(), "kafka.sasl_username": _text, "kafka.sasl_password": _text,
    "kafka.ssl_cafile": _text, "kafka.ssl_certfile": _text, "kafka.ssl_keyfile": _text, "kafka.ssl_password": _text,
    "consumer.max_poll_interval": _ms,
}

#: confluent key -> (kmq section, kmq key, converter); the property names from the one table
#: (:data:`kmq.config.librdkafka.KMQ_KEY_OF`).
KAFKA_KEYS: dict[str, tuple[str, str, Callable[[Any], Any]]] = {
    prop: (*key.split("."), _FROM_PROPERTIES[key])  # type: ignore[misc]
    for prop, key in KMQ_KEY_OF.items() if key in _FROM_PROPERTIES and prop != "metadata.broker.list"
}

#: kmq's own keys -> (kmq section, kmq key, converter); section "queue" is the subscribed queue.
#: The delivery limit, the backoff and the DLQ are the tracker's settings (its ``queues[]``), as
#: ``group.share.delivery.count.limit`` is the broker's: a consumer key could not change them.
KMQ_KEYS: dict[str, tuple[str, str, Callable[[Any], Any]]] = {
    "kmq.kafka.client": ("kafka", "client", _text),
    "kmq.lease.ms": ("queue", "lease", _ms),
    "kmq.markers.topic": ("queue", "markers_topic", _text),
    "kmq.dlq.topic": ("queue", "dlq_topic", _text),
    "kmq.ack.flush.interval.ms": ("consumer", "ack_flush_interval", _ms),
    "kmq.session.timeout.ms": ("kafka", "session_timeout", _ms),
    "kmq.heartbeat.interval.ms": ("kafka", "heartbeat_interval", _ms),
    "kmq.auto.renew": ("consumer", "auto_renew", _flag),
}

#: Keys the native share consumer refuses with a ValueError, refused the same way (with why), so a
#: dict that runs on kmq runs natively. A share group's member timing is the broker's
#: (``group.share.session.timeout.ms``, ``group.share.heartbeat.interval.ms``); kmq's members are
#: consumer-group members whose timing is client-side: the ``kmq.*`` keys named.
REFUSED_KEYS: dict[str, str] = {
    "session.timeout.ms": "is not supported for the share consumer: it is defined broker side "
                          "(group.share.session.timeout.ms); on kmq set the group timing with kmq.session.timeout.ms",
    "heartbeat.interval.ms": "is not supported for the share consumer: it is defined broker side "
                             "(group.share.heartbeat.interval.ms); on kmq set it with kmq.heartbeat.interval.ms",
    "group.protocol": "is not applicable for the share consumer",
    "auto.offset.reset": "is not applicable for the share consumer: a new share group starts where the group config "
                         "share.auto.offset.reset says; kmq starts a new group at the earliest offset "
                         "(docs/share-consumer.md)",
    "fetch.error.backoff.ms": "is not applicable for the share consumer",
}

#: librdkafka keys a native share consumer may carry that mean nothing to kmq: accepted, ignored.
IGNORED_KEYS = frozenset({
    "socket.timeout.ms", "socket.keepalive.enable", "fetch.min.bytes",
    "fetch.max.bytes", "fetch.wait.max.ms", "max.partition.fetch.bytes",
    "reconnect.backoff.ms", "reconnect.backoff.max.ms", "retry.backoff.ms", "metadata.max.age.ms",
    "topic.metadata.refresh.interval.ms", "statistics.interval.ms", "debug", "log_level", "log.connection.close",
    "api.version.request", "broker.address.family", "client.rack", "logger", "stats_cb",
    "throttle_cb", "enable.sasl.oauthbearer.unsecure.jwt",
})


@dataclass(frozen=True)
class ShareSettings:
    """What a share-consumer dict says, ready to build the kmq configuration of a topic."""

    group_id: str
    mode: AckMode = AckMode.IMPLICIT
    max_poll_records: int = 500
    #: kmq configuration sections from the dict (``kafka``, ``consumer``), over ``base``.
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The subscribed queue's settings from ``kmq.*`` keys (``lease``, ``markers_topic``, ``dlq_topic``).
    queue: dict[str, Any] = field(default_factory=dict)
    #: ``kmq.config``: a :class:`~kmq.config.Config` the dict's keys override (default: kmq's defaults).
    base: Config | None = None
    #: ``error_cb``: called with a ``KafkaError`` from ``poll`` while no broker answers.
    error_cb: Callable[[Any], None] | None = None

    def config_for(self, topic: str) -> Config:
        """The kmq configuration of a consumer of ``topic`` (its queue settings from ``base``
        unless a ``kmq.*`` key overrides them). Raises :class:`ConfigError` for a bad value."""
        data = self.base.to_dict(redact=False) if self.base is not None else {}
        # A share group's lock is not extended while a record is held (lock renewal, KIP-1222, is
        # not in the Python client): no automatic renewal unless kmq.auto.renew or kmq.config asks.
        data.setdefault("consumer", {}).setdefault("auto_renew", False)
        for section, values in self.sections.items():
            data.setdefault(section, {}).update(values)
        data.setdefault("consumer", {})["group_id"] = self.group_id
        queues = [q for q in data.get("queues", []) if q.get("name") != topic]
        existing = next((q for q in data.get("queues", []) if q.get("name") == topic), {"name": topic})
        data["queues"] = [*queues, {**existing, **self.queue}]
        return Config.from_dict(data)


def read_settings(conf: Mapping[str, Any]) -> ShareSettings:
    """Read a share-consumer dict. Raises :class:`ValueError` without ``group.id`` or with a key
    the native consumer refuses (:data:`REFUSED_KEYS`), as the native consumer does, and :class:`ConfigError` naming an unknown key or a bad value."""
    if not isinstance(conf, Mapping):
        raise TypeError(f"expected configuration dict, got {type(conf).__name__}")
    group = conf.get("group.id")
    if not group:
        raise ValueError("group.id must be set")
    for key, why in REFUSED_KEYS.items():
        if key in conf:
            raise ValueError(f"`{key}` {why}")
    if "on_commit" in conf:
        raise ValueError("on_commit is not supported by the share consumer: use set_acknowledgement_commit_callback")
    error_cb = conf.get("error_cb")
    if error_cb is not None and not callable(error_cb):
        raise TypeError("expected error_cb property as a callable function")
    mode_text = str(conf.get("share.acknowledgement.mode", "implicit")).lower()
    try:
        mode = AckMode(mode_text)
    except ValueError:
        raise ConfigError("share.acknowledgement.mode", f"expected implicit or explicit, got {mode_text!r}") from None
    try:
        max_records = _int(conf.get("max.poll.records", 500))
    except ValueError as exc:
        raise ConfigError("max.poll.records", str(exc)) from None
    if max_records < 1:
        raise ConfigError("max.poll.records", f"must be at least 1, got {max_records}")
    base = conf.get("kmq.config")
    if base is not None and not isinstance(base, Config):
        raise ConfigError("kmq.config", f"expected a kmq.Config (e.g. kmq.Config.load('kmq.yaml')), got {type(base).__name__}")
    sections: dict[str, dict[str, Any]] = {}
    queue: dict[str, Any] = {}
    for key, value in conf.items():
        if key in ("group.id", "share.acknowledgement.mode", "max.poll.records", "kmq.config", "error_cb") \
                or key in IGNORED_KEYS:
            continue
        mapped = KAFKA_KEYS.get(key) or KMQ_KEYS.get(key)
        if mapped is None:
            hint = " (kmq keys: " + ", ".join(sorted(KMQ_KEYS)) + ")" if key.startswith("kmq.") else ""
            raise ConfigError(key, f"not a share-consumer setting kmq knows{hint}; see docs/share-consumer.md")
        section, name, convert = mapped
        try:
            converted = convert(value)
        except ValueError as exc:
            raise ConfigError(key, str(exc)) from None
        if section == "queue":
            queue[name] = converted
        else:
            sections.setdefault(section, {})[name] = converted
    return ShareSettings(str(group), mode, max_records, sections, queue, base, error_cb)

