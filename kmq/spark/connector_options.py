"""``kafka:`` of kmq.yaml as the options of Spark's own Kafka connector (``kafka.``-prefixed
Java client properties). Pure apart from reading the TLS files and password files it names.

Spark's connector runs the Java Kafka client, the one client kmq does not build, so this
is the one place kmq's security settings are rendered for it. What the Java client cannot
be told from kmq's settings alone is refused with the fix, never passed on half-done:

* ``sasl_mechanism: OAUTHBEARER`` (kmq's token file or command) and ``AWS_MSK_IAM`` (kmq's
  signer): the Java client needs a login callback handler class on the classpath;
* a client key that is not PKCS#8 PEM (``BEGIN PRIVATE KEY`` or ``BEGIN ENCRYPTED PRIVATE KEY``):
  the Java client's PEM key store reads no other form.
"""

from __future__ import annotations

import re
from pathlib import Path

from kmq.client.secrets import key_password, sasl_password
from kmq.config import KafkaConfig
from kmq.core.errors import KmqError

__all__ = ["kafka_options", "UnsupportedSecurity"]

_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----.*?-----END \1-----", re.S)
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class UnsupportedSecurity(KmqError):
    """A security setting of kmq.yaml that Spark's Kafka connector cannot be given."""


def _jaas_quoted(text: str) -> str:
    # The JAAS parser reads a quoted value with backslash escapes.
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pem_blocks(path: str, key: str) -> list[tuple[str, str]]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UnsupportedSecurity(f"kafka.{key}: cannot read {path}: {exc.strerror}") from None
    return [(m.group(1), m.group(0)) for m in _BLOCK.finditer(text)]


def _keystore(k: KafkaConfig) -> dict[str, str]:
    """Mutual TLS as a PEM key store: the certificate chain and the PKCS#8 key, as text."""
    assert k.ssl_certfile
    cert_blocks = _pem_blocks(k.ssl_certfile, "ssl_certfile")
    key_blocks = _pem_blocks(k.ssl_keyfile, "ssl_keyfile") if k.ssl_keyfile else cert_blocks
    key_path = "kafka.ssl_keyfile" if k.ssl_keyfile else "kafka.ssl_certfile"
    chain = [text for kind, text in cert_blocks if kind == "CERTIFICATE"]
    if not chain:
        raise UnsupportedSecurity(f"kafka.ssl_certfile: {k.ssl_certfile} holds no PEM certificate")
    keys = [(kind, text) for kind, text in key_blocks if kind.endswith("PRIVATE KEY")]
    if not keys:
        raise UnsupportedSecurity(f"{key_path}: no PEM private key found")
    kind, text = keys[0]
    if kind not in ("PRIVATE KEY", "ENCRYPTED PRIVATE KEY"):
        raise UnsupportedSecurity(
            f"{key_path}: a {kind} (PKCS#1/SEC1) cannot be given to Spark's Kafka connector, whose Java client "
            "reads PKCS#8 keys only: convert it (openssl pkcs8 -topk8 -in KEY -out KEY8, add -nocrypt for no "
            "password) or set spark.source: python")
    out = {"kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.certificate.chain": "\n".join(chain),
           "kafka.ssl.keystore.key": text}
    password = key_password(k)
    if kind == "ENCRYPTED PRIVATE KEY":
        if password is None:
            raise UnsupportedSecurity(f"{key_path}: the key is encrypted: set KMQ_KAFKA__SSL_PASSWORD or "
                                      "kafka.ssl_password_file")
        out["kafka.ssl.key.password"] = password
    return out


def kafka_options(k: KafkaConfig) -> dict[str, str]:
    """The connector's ``kafka.*`` options for ``k``; passwords are read here (on the driver)."""
    out = {"kafka.bootstrap.servers": k.bootstrap_servers, "kafka.security.protocol": k.security_protocol}
    mech = k.sasl_mechanism
    if mech in ("OAUTHBEARER", "AWS_MSK_IAM"):
        raise UnsupportedSecurity(
            f"spark.source kafka cannot use sasl_mechanism {mech}: Spark's Kafka connector (the Java client) "
            f"needs a login callback handler class for it, which kmq cannot configure; set spark.source: python "
            "(kmq's token provider / AWS signer in the tasks)")
    if mech:
        user, password = k.sasl_username or "", sasl_password(k) or ""
        out["kafka.sasl.mechanism"] = mech
        out["kafka.sasl.jaas.config"] = (f"{_LOGIN_MODULES[mech]} required username={_jaas_quoted(user)} "
                                         f"password={_jaas_quoted(password)};")
    if k.uses_tls:
        if k.ssl_cafile:
            out["kafka.ssl.truststore.type"] = "PEM"
            out["kafka.ssl.truststore.location"] = k.ssl_cafile
        if not k.ssl_check_hostname:
            out["kafka.ssl.endpoint.identification.algorithm"] = ""
        if k.ssl_certfile:
            out.update(_keystore(k))
    return out
