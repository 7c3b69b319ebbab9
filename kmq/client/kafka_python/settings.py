"""kafka-python settings from :class:`~kmq.config.KafkaConfig`: the one place that turns the
``kafka:`` section into kafka-python keyword arguments (servers, client id, TLS, SASL,
OAUTHBEARER), for every kmq client on kafka-python: consumers, producers, admin, the
Spark source's driver and tasks (:mod:`kmq.client.confluent.settings` is its librdkafka twin).
"""

from __future__ import annotations

from typing import Any

from kmq.client.oauth import token_provider
from kmq.client.tls import ssl_context
from kmq.config import PASSWORD_MECHANISMS, KafkaConfig

__all__ = ["client_kwargs"]


def client_kwargs(kafka: KafkaConfig) -> dict[str, Any]:
    """kafka-python keyword arguments for ``kafka``: servers, client id and the security settings.

    Checks credentials and files first (:meth:`KafkaConfig.check_security`) and builds the
    TLS context here (CA, client certificate and key, host name check), so a missing file
    or a wrong key password fails now with the key's path rather than as endless reconnects.
    OAUTHBEARER gets kmq's token provider; AWS_MSK_IAM signs with the AWS credentials of the
    process (kafka-python's own signer)."""
    kafka.check_security()
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
        kw["sasl_plain_password"] = kafka.password()
    elif mech == "OAUTHBEARER":
        kw["sasl_oauth_token_provider"] = token_provider(kafka)
    if kafka.uses_tls:
        kw["ssl_context"] = ssl_context(kafka)
    return kw
