"""librdkafka settings from :class:`~kmq.config.KafkaConfig`: the one place that turns the
``kafka:`` section into confluent-kafka configuration (servers, client id, TLS files, SASL,
OAUTHBEARER through ``oauth_cb``), for every kmq client on confluent-kafka: consumers,
producers, the log reader, the Spark source's tasks (:mod:`kmq.client.kafka_python.settings`
is its kafka-python twin).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, TypeVar

from kmq.client import secrets
from kmq.client.confluent.log_bridge import LibrdkafkaLogBridge
from kmq.config import PASSWORD_MECHANISMS, ConfigError, KafkaConfig
from kmq.config.client_settings import is_secret

__all__ = ["settings", "passthrough", "construct", "FETCH_QUEUE_BACKOFF_MS"]

#: ``fetch.queue.backoff.ms`` of every kmq consumer on confluent-kafka (librdkafka's default: 1 s).
#: Once a partition's prefetch passes ``queued.min.messages`` (or ``queued.max.messages.kbytes``),
#: librdkafka stops fetching it for this long. A consumer that drains the prefetch sooner waits out
#: the rest: a plain loop with a commit per poll spent 6.2 of 6.9 s of a 1,000,000-message backlog
#: in such waits (144,000 msg/s; 1,155,000 with 10 ms), and the tracker's next read of a partition
#: waited 0.6-0.7 s for its first fetch. The prefetch stays bounded by the same thresholds.
FETCH_QUEUE_BACKOFF_MS = 10


def settings(kafka: KafkaConfig) -> dict[str, Any]:
    """librdkafka settings for ``kafka``: servers, client id and the security settings
    (checked first, as for kafka-python: a missing file fails now with its key's path)."""
    secrets.check(kafka)
    conf: dict[str, Any] = {
        "bootstrap.servers": ",".join(kafka.servers),
        "client.id": kafka.client_id,
        "security.protocol": kafka.security_protocol,
        "socket.connection.setup.timeout.ms": max(1000, int(kafka.connect_timeout * 1000)),
        # librdkafka logs through its own thread to stderr by default; route to logging
        # ("kmq.librdkafka"), one bridge per handle: it demotes and collapses reconnect storms.
        "logger": LibrdkafkaLogBridge(),
    }
    if kafka.librdkafka_debug_contexts:
        conf["debug"] = ",".join(kafka.librdkafka_debug_contexts)
    if kafka.uses_tls:
        if kafka.ssl_cafile:
            conf["ssl.ca.location"] = kafka.ssl_cafile
        if kafka.ssl_certfile:
            conf["ssl.certificate.location"] = kafka.ssl_certfile
            # kmq allows the key inside the certificate file (as Python's ssl does).
            conf["ssl.key.location"] = kafka.ssl_keyfile or kafka.ssl_certfile
            if (pw := secrets.key_password(kafka)) is not None:
                conf["ssl.key.password"] = pw
        conf["ssl.endpoint.identification.algorithm"] = "https" if kafka.ssl_check_hostname else "none"
    mech = kafka.sasl_mechanism
    if mech == "AWS_MSK_IAM":
        raise ConfigError("kafka.client", "confluent-kafka has no AWS_MSK_IAM signer; use kafka.client: kafka-python "
                                          "for AWS_MSK_IAM (or OAUTHBEARER with an MSK token command)")
    if mech:
        conf["sasl.mechanism"] = mech
    if mech in PASSWORD_MECHANISMS:
        conf["sasl.username"] = kafka.sasl_username
        conf["sasl.password"] = secrets.sasl_password(kafka)
    elif mech == "OAUTHBEARER" and str(kafka.confluent.get("sasl.oauthbearer.method", "")).lower() != "oidc":
        # With librdkafka's own OIDC login (kafka.confluent) librdkafka fetches the token; a
        # callback beside it would leave the client waiting for a token the callback never sets.
        # Imported here: its provider's base class is kafka-python's, not loaded otherwise on confluent.
        from kmq.client.oauth import token_provider

        provider = token_provider(kafka)
        conf["oauth_cb"] = lambda _config_str: provider.token_and_expiry()
    return conf


def passthrough(kafka: KafkaConfig) -> dict[str, Any]:
    """``kafka.confluent``: librdkafka properties applied over kmq's own, last, to every kmq client on
    confluent-kafka (the keys kmq must set itself are refused when the config is read)."""
    return dict(kafka.confluent)


_PROPERTY = re.compile(r'configuration property:? "?([^"\s]+)"?')
T = TypeVar("T")


def construct(make: Callable[[dict[str, Any]], T], conf: Mapping[str, Any], kafka: KafkaConfig) -> T:
    """``make(conf)`` (a confluent-kafka constructor), with librdkafka's refusal of a property from
    ``kafka.confluent`` (unknown name, bad value) raised as :class:`~kmq.core.errors.ConfigError` naming the key."""
    try:
        return make(dict(conf))
    except Exception as exc:
        err: Any = exc.args[0] if exc.args else None
        text = err.str() if hasattr(err, "str") else str(exc)
        m = _PROPERTY.search(text)
        if m and m.group(1) in kafka.confluent:
            key = m.group(1)
            shown = "***" if is_secret(key) else repr(kafka.confluent[key])
            if text.startswith("No such configuration property"):
                problem = "librdkafka has no such property (see librdkafka's CONFIGURATION.md for the names)"
            else:
                problem = f"librdkafka refused the value {shown}: {text}"
            raise ConfigError(f"kafka.confluent.{key}", problem) from None
        raise
