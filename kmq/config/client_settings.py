"""The pass-through of Kafka client settings: ``kafka.kafka_python`` and ``kafka.confluent``.

Each is a mapping of the client's own setting names (kafka-python's keyword arguments,
librdkafka's dotted properties) to scalar values, applied to every client kmq builds on
that client, over kmq's own defaults. Pure: what may pass, decided from the key alone.

Refused here, with what kmq sets instead: what another ``kafka.*``, ``consumer.*``,
``tracker.*`` or ``queues[].*`` key decides (one fact, one source), and what kmq's
at-least-once guarantees rest on (offset commits only on proof, idempotent acks=all
producers, the reading isolation level, the groups' protocol and assignors, raw bytes in
and out, bounded delivery timeouts). Names the client does not know are refused where the
client is at hand (:mod:`kmq.client.kafka_python.settings`, and librdkafka itself at
construction: :mod:`kmq.client.confluent.settings`).

Keys that name a secret (a password, a client secret, a private key) are read only from
the environment, like ``kafka.sasl_password``, and shown as ``***``.
"""

from __future__ import annotations

from typing import Any, Mapping

from kmq.config.librdkafka import KMQ_KEY_OF
from kmq.core.errors import ConfigError

__all__ = ["ClientSettings", "KAFKA_PYTHON_REFUSED", "CONFLUENT_REFUSED", "is_secret", "client_settings"]

_COMMITS = "kmq commits offsets itself, only for messages proven done (off)"
_RESET = "earliest: a partition without a committed offset is read from its start, so no message is skipped"
_ISOLATION = "each reader's isolation level (docs/protocol.md: a reader sees every record a worker could)"
_ACKS = "all: a marker, copy or dead letter counts as written only when every in-sync replica has it"
_IDEMPOTENCE = "on: a retried marker or copy is written once"
_NOT_TRANSACTIONAL = "nothing: kmq's producers are idempotent, not transactional"
_DELIVERY = ("each producer's delivery timeout (a START fails promptly and definitely; copies settle within "
             "the tracker's wait)")
_GROUP = "consumer.group_id / tracker.group_id"
_ASSIGNOR = "consumer.assignor (the tracker uses the classic range assignors)"
_BYTES = "nothing: kmq reads and writes keys and values as raw bytes"
_TIMEOUT = "kafka.connect_timeout"
_FETCH_WAIT = "consumer.fetch_wait / tracker.fetch_wait (the log readers' look-ups wait 50 ms)"
_POLL_INTERVAL = "its own value per component (the tracker's poll loop relies on it)"
_CALLABLE = "nothing: it takes a Python object, which kmq.yaml cannot give"

#: kafka-python keyword arguments the pass-through refuses, with what kmq sets instead.
KAFKA_PYTHON_REFUSED: dict[str, str] = {
    "bootstrap_servers": "kafka.bootstrap_servers",
    "client_id": "kafka.client_id",
    "security_protocol": "kafka.security_protocol",
    "sasl_mechanism": "kafka.sasl_mechanism",
    "sasl_plain_username": "kafka.sasl_username",
    "sasl_plain_password": "kafka.sasl_password (environment) or kafka.sasl_password_file",
    "sasl_oauth_token_provider": "kafka.sasl_oauth_token_file or kafka.sasl_oauth_token_command",
    "ssl_context": "the TLS context kmq builds from the kafka.ssl_* keys",
    "ssl_cafile": "kafka.ssl_cafile",
    "ssl_certfile": "kafka.ssl_certfile",
    "ssl_keyfile": "kafka.ssl_keyfile",
    "ssl_password": "kafka.ssl_password (environment) or kafka.ssl_password_file",
    "ssl_check_hostname": "kafka.ssl_check_hostname",
    "ssl_crlfile": "the TLS context kmq builds from the kafka.ssl_* keys",
    "ssl_ciphers": "the TLS context kmq builds from the kafka.ssl_* keys",
    "session_timeout_ms": "kafka.session_timeout",
    "heartbeat_interval_ms": "kafka.heartbeat_interval",
    "metadata_max_age_ms": "kafka.metadata_max_age",
    "request_timeout_ms": _TIMEOUT,
    "bootstrap_timeout_ms": _TIMEOUT,
    "max_block_ms": _TIMEOUT,
    "enable_auto_commit": _COMMITS,
    "auto_offset_reset": _RESET,
    "isolation_level": _ISOLATION,
    "group_id": _GROUP,
    "group_instance_id": "tracker.instance_id",
    "partition_assignment_strategy": _ASSIGNOR,
    "max_poll_records": "the batch size of each poll (KmqConsumer's batch_size)",
    "max_poll_interval_ms": _POLL_INTERVAL,
    "fetch_max_wait_ms": _FETCH_WAIT,
    "key_deserializer": _BYTES,
    "value_deserializer": _BYTES,
    "key_serializer": _BYTES,
    "value_serializer": _BYTES,
    "acks": _ACKS,
    "enable_idempotence": _IDEMPOTENCE,
    "retries": "its idempotent producers' retries (5)",
    "max_in_flight_requests_per_connection": "the idempotent producers' default (at most 5 keeps their order)",
    "transactional_id": _NOT_TRANSACTIONAL,
    "transaction_timeout_ms": _NOT_TRANSACTIONAL,
    "delivery_timeout_ms": _DELIVERY,
    "compression_type": "queues[].compression",
    "max_request_size": "tracker.max_request_size",
}

def _set_from(key: str) -> str:
    """What kmq sets a property from: its kmq.yaml key (a secret: from the environment or a file)."""
    return f"{key} (environment) or {key}_file" if key in ("kafka.sasl_password", "kafka.ssl_password") else key


#: librdkafka properties (and confluent-kafka's Python keys) the pass-through refuses, with what kmq sets instead:
#: those a kmq.yaml key stands for (:data:`kmq.config.librdkafka.KMQ_KEY_OF`), and these.
CONFLUENT_REFUSED: dict[str, str] = {
    **{prop: _set_from(key) for prop, key in KMQ_KEY_OF.items()},
    "enable.auto.commit": _COMMITS,
    "enable.auto.offset.store": _COMMITS,
    "auto.offset.reset": _RESET,
    "isolation.level": _ISOLATION,
    "enable.partition.eof": "its own value per reader (the log reader ends a read at a partition's EOF event)",
    "group.id": _GROUP,
    "partition.assignment.strategy": _ASSIGNOR,
    "group.protocol": "the classic group protocol (the tracker's commit before a revoke relies on it)",
    "group.protocol.type": "the classic group protocol (the tracker's commit before a revoke relies on it)",
    "group.remote.assignor": _ASSIGNOR,
    "fetch.wait.max.ms": _FETCH_WAIT,
    "max.poll.interval.ms": _POLL_INTERVAL,
    "acks": _ACKS,
    "request.required.acks": _ACKS,
    "enable.idempotence": _IDEMPOTENCE,
    "max.in.flight.requests.per.connection": "the idempotent producers' default (at most 5 keeps their order)",
    "max.in.flight": "the idempotent producers' default (at most 5 keeps their order)",
    "retries": "librdkafka's retries within each producer's delivery timeout",
    "message.send.max.retries": "librdkafka's retries within each producer's delivery timeout",
    "transactional.id": _NOT_TRANSACTIONAL,
    "transaction.timeout.ms": _NOT_TRANSACTIONAL,
    "delivery.timeout.ms": _DELIVERY,
    "message.timeout.ms": _DELIVERY,
    "delivery.report.only.error": "its own value per producer (the tracker's producers settle on flush)",
    "logger": "kmq's bridge to the logger kmq.librdkafka",
    "oauth_cb": "kafka.sasl_oauth_token_file / kafka.sasl_oauth_token_command, or librdkafka's "
                "sasl.oauthbearer.method: oidc",
    "on_delivery": _CALLABLE,
    "on_commit": _CALLABLE,
}

_SECRET_WORDS = ("password", "passphrase", "secret", "key.pem")


def is_secret(key: str) -> bool:
    """Whether a pass-through key names a secret: read only from the environment, shown as ``***``."""
    name = key.lower().replace("_", ".")
    return any(word in name for word in _SECRET_WORDS)


class ClientSettings(dict[str, Any]):
    """A pass-through mapping: a plain dict (JSON and ``dataclasses.asdict`` treat it so) whose
    ``repr`` hides secrets."""

    def __repr__(self) -> str:
        return repr({k: "***" if is_secret(k) else v for k, v in self.items()})

    def redacted(self) -> dict[str, Any]:
        return {k: "***" if is_secret(k) else v for k, v in self.items()}


_SCALARS = (str, int, float, bool)


def client_settings(path: str, value: Any, refused: Mapping[str, str]) -> ClientSettings:
    """The pass-through mapping at ``path`` (``kafka.kafka_python`` or ``kafka.confluent``): string keys,
    scalar values, none of ``refused``; a key in the form of the other client is named as such."""
    if value is None:
        return ClientSettings()
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"expected a mapping of client settings, got {type(value).__name__}")
    confluent = refused is CONFLUENT_REFUSED
    out = ClientSettings()
    for key, v in value.items():
        where = f"{path}.{key}"
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(path, f"expected setting names as text, got {key!r}")
        if key in refused:
            raise ConfigError(where, f"kmq sets this itself and it cannot be overridden; kmq sets: {refused[key]}")
        if confluent and key.endswith("_cb"):
            raise ConfigError(where, f"kmq sets this itself and it cannot be overridden; kmq sets: {_CALLABLE}")
        if not confluent and "." in key:
            raise ConfigError(where, "kafka-python takes its keyword argument names (snake_case, e.g. client_rack); "
                                     "librdkafka's dotted properties go under kafka.confluent")
        if v is None:  # unset (an empty KMQ_KAFKA__... variable): the client's default
            continue
        if not isinstance(v, _SCALARS):
            shown = "***" if is_secret(key) else repr(v)
            raise ConfigError(where, f"expected a string, number or true/false, got {shown}")
        out[key] = v
    return out
