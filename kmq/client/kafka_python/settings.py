"""kafka-python settings from :class:`~kmq.config.KafkaConfig`: the one place that turns the
``kafka:`` section into kafka-python keyword arguments (servers, client id, TLS, SASL,
OAUTHBEARER), for every kmq client on kafka-python: consumers, producers, admin, the
Spark source's driver and tasks (:mod:`kmq.client.confluent.settings` is its librdkafka twin).
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from kmq.client import secrets
from kmq.client.oauth import token_provider
from kmq.client.tls import ssl_context
from kmq.config import PASSWORD_MECHANISMS, ConfigError, KafkaConfig

__all__ = ["client_kwargs", "passthrough"]


def client_kwargs(kafka: KafkaConfig) -> dict[str, Any]:
    """kafka-python keyword arguments for ``kafka``: servers, client id and the security settings.

    Checks credentials and files first (:func:`kmq.client.secrets.check`) and builds the
    TLS context here (CA, client certificate and key, host name check), so a missing file
    or a wrong key password fails now with the key's path rather than as endless reconnects.
    OAUTHBEARER gets kmq's token provider; AWS_MSK_IAM signs with the AWS credentials of the
    process (kafka-python's own signer)."""
    secrets.check(kafka)
    kw: dict[str, Any] = {
        "bootstrap_servers": kafka.servers,
        "security_protocol": kafka.security_protocol,
        "client_id": kafka.client_id,
    }
    mech = kafka.sasl_mechanism
    if mech:
        kw["sasl_mechanism"] = mech
    if mech in PASSWORD_MECHANISMS:
        kw["sasl_plain_username"] = kafka.sasl_username
        kw["sasl_plain_password"] = secrets.sasl_password(kafka)
    elif mech == "OAUTHBEARER":
        if not (kafka.sasl_oauth_token_file or kafka.sasl_oauth_token_command):
            raise ConfigError("kafka.sasl_oauth_token_file", (
                "kafka-python has no OIDC login: set kafka.sasl_oauth_token_file or kafka.sasl_oauth_token_command, "
                "or use kafka.client: confluent with librdkafka's own OIDC login (kafka.confluent)"))
        kw["sasl_oauth_token_provider"] = token_provider(kafka)
    if kafka.uses_tls:
        kw["ssl_context"] = ssl_context(kafka)
    return kw


_CLIENTS = (KafkaConsumer, KafkaProducer, KafkaAdminClient)


def passthrough(kafka: KafkaConfig, client: type[Any]) -> dict[str, Any]:
    """The keys of ``kafka.kafka_python`` that ``client`` (``KafkaConsumer``, ``KafkaProducer`` or
    ``KafkaAdminClient``) takes, applied over kmq's own, last. A name no kafka-python client takes
    (its ``DEFAULT_CONFIG``), or one that takes a Python object, raises :class:`ConfigError` naming it;
    a consumer's key is left out of a producer and the reverse."""
    out: dict[str, Any] = {}
    for key, value in kafka.kafka_python.items():
        path = f"kafka.kafka_python.{key}"
        defaults = [c.DEFAULT_CONFIG[key] for c in _CLIENTS if key in c.DEFAULT_CONFIG]
        if not defaults:
            raise ConfigError(path, "kafka-python has no such setting (the keyword arguments of KafkaConsumer, "
                                    "KafkaProducer and KafkaAdminClient; librdkafka's go under kafka.confluent)")
        if any(d is not None and not isinstance(d, (str, int, float, bool)) for d in defaults):
            # a partitioner, selector, socket options...: objects, not scalars
            raise ConfigError(path, "takes a Python object, which kmq.yaml cannot give")
        if key in client.DEFAULT_CONFIG:
            out[key] = value
    return out
