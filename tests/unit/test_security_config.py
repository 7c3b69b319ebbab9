"""Security settings: what the keys say together, token parsing, and how failures are named."""

from __future__ import annotations

import base64
import json
import ssl

import pytest
from kafka.errors import GroupAuthorizationFailedError, SaslAuthenticationFailedError, TopicAuthorizationFailedError

from kmq.client import secrets
from kmq.client.kafka_python.clients import broker_errors
from kmq.client.kafka_python.settings import client_kwargs
from kmq.config import Config
from kmq.client.diagnose import broker_certificate_error, tls_alert_error
from kmq.core.errors import (
    AuthenticationFailed,
    AuthorizationFailed,
    BrokerUnavailable,
    CertificateRejected,
    ConfigError,
    TlsHandshakeFailed,
)
from kmq.client.oauth import REFRESH_FRACTION, UNKNOWN_LIFETIME_S, parse_token

SCRAM = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512"}
OAUTH = {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}


@pytest.mark.parametrize(
    "kafka, message",
    [
        ({"ssl_cafile": "/ca.pem"}, "kafka.ssl_cafile: is set but kafka.security_protocol is PLAINTEXT; use SSL or SASL_SSL"),
        ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "ssl_certfile": "/c.pem"},
         "kafka.ssl_certfile: is set but kafka.security_protocol is SASL_PLAINTEXT"),
        ({"ssl_check_hostname": False}, "kafka.ssl_check_hostname: is false but"),
        ({"security_protocol": "SSL", "ssl_keyfile": "/k.pem"}, "kafka.ssl_keyfile: needs kafka.ssl_certfile"),
        ({"security_protocol": "SSL", "ssl_password_file": "/pw"}, "kafka.ssl_password_file: protects a client key"),
        ({"security_protocol": "SSL", "ssl_certfile": "/c", "ssl_password": "x", "ssl_password_file": "/pw"},
         "kafka.ssl_password_file: set either"),
        (OAUTH, "kafka.sasl_oauth_token_file: OAUTHBEARER needs a token"),
        ({**OAUTH, "sasl_oauth_token_file": "/t", "sasl_oauth_token_command": "get-token"}, "kafka.sasl_oauth_token_command: set either"),
        ({**SCRAM, "sasl_oauth_token_file": "/t"}, "kafka.sasl_oauth_token_file: only used with sasl_mechanism OAUTHBEARER"),
        ({**OAUTH, "sasl_oauth_token_file": "/t", "sasl_username": "u"}, "kafka.sasl_username: not used with sasl_mechanism OAUTHBEARER"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "AWS_MSK_IAM", "sasl_password_file": "/pw"},
         "kafka.sasl_password_file: not used with sasl_mechanism AWS_MSK_IAM"),
        ({"security_protocol": "SSL", "sasl_mechanism": "GSSAPI"}, "kafka.sasl_mechanism: expected one of"),
    ],
)
def test_contradicting_security_keys_name_the_key(kafka, message):
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"kafka": kafka})
    assert message in str(info.value)


def test_credentials_are_checked_at_load_and_files_where_a_client_is_built(tmp_path):
    path = tmp_path / "kmq.yaml"

    def load(kafka: dict, env: dict | None = None) -> Config:
        import yaml

        path.write_text(yaml.safe_dump({"kafka": kafka}))
        return Config.load(path, env=env or {})

    with pytest.raises(ConfigError, match=r"^kafka.sasl_username: required with sasl_mechanism SCRAM-SHA-512"):
        load(SCRAM)
    with pytest.raises(ConfigError, match=r"^kafka.sasl_password: required with sasl_mechanism SCRAM-SHA-512: set KMQ_KAFKA__SASL_PASSWORD"):
        load({**SCRAM, "sasl_username": "kmq"})
    cfg = load({**SCRAM}, env={"KMQ_KAFKA__SASL_USERNAME": "kmq", "KMQ_KAFKA__SASL_PASSWORD": "007"})
    assert secrets.sasl_password(cfg.kafka) == "007" and client_kwargs(cfg.kafka)["sasl_plain_username"] == "kmq"
    # Loading the configuration reads no file it names: the client builders do.
    missing_ca = load({"security_protocol": "SSL", "ssl_cafile": str(tmp_path / "nope.pem")})
    with pytest.raises(ConfigError, match=r"^kafka.ssl_cafile: file .*nope.pem does not exist$"):
        client_kwargs(missing_ca.kafka)
    with pytest.raises(ConfigError, match=r"^kafka.ssl_certfile: .* is not a file$"):
        client_kwargs(load({"security_protocol": "SSL", "ssl_certfile": str(tmp_path)}).kafka)
    with pytest.raises(ConfigError, match=r"^kafka.sasl_oauth_token_file: file .* does not exist"):
        client_kwargs(load({**OAUTH, "sasl_oauth_token_file": str(tmp_path / "token")}).kafka)
    with pytest.raises(ConfigError) as info:
        load({"security_protocol": "SSL", "ssl_certfile": "/c", "ssl_password": "hunter2"})
    assert str(info.value).startswith("kafka.ssl_password: secrets are not read from the config file") and "hunter2" not in str(info.value)
    # The key password from the environment: kept verbatim, never shown.
    (tmp_path / "c.pem").write_text("x")
    cfg = load({"security_protocol": "SSL", "ssl_certfile": str(tmp_path / "c.pem")}, env={"KMQ_KAFKA__SSL_PASSWORD": "0123"})
    assert secrets.key_password(cfg.kafka) == "0123"  # the TLS context loads the key with it (tests/integration/tls)
    assert "0123" not in repr(cfg) and "0123" not in str(cfg.to_dict())


def test_rendered_chart_configs_stay_loadable_without_the_pod_files():
    # from_dict checks only what the keys say; files mounted in the pod are checked by load() there.
    cfg = Config.from_dict({"kafka": {**SCRAM, "sasl_password_file": "/var/run/secrets/kmq/kafka-credentials/pw",
                                      "ssl_cafile": "/var/run/secrets/kmq/kafka-ca/ca.crt"}})
    assert cfg.kafka.ssl_cafile.endswith("ca.crt")


def _jwt(claims: dict) -> str:
    def b64(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'none'})}.{b64(claims)}.sig"


def test_tokens_say_when_to_refresh():
    bare = parse_token("opaque-token\n", now=100.0, source="s")
    assert bare.value == "opaque-token" and bare.expires_at is None and bare.refresh_at == 100.0 + UNKNOWN_LIFETIME_S
    jwt = parse_token(_jwt({"sub": "kmq", "exp": 1100}), now=100.0, source="s")
    assert jwt.expires_at == 1100 and jwt.refresh_at == 100.0 + REFRESH_FRACTION * 1000
    oauth = parse_token(json.dumps({"access_token": "abc", "expires_in": 3600}), now=10.0, source="s")
    assert (oauth.value, oauth.expires_at) == ("abc", 3610.0)
    at = parse_token(json.dumps({"token": "t", "expires_at": 500}), now=0.0, source="s")
    assert (at.value, at.expires_at) == ("t", 500.0)
    assert "abc" not in repr(oauth)


@pytest.mark.parametrize("text, message", [
    ("", "gave an empty OAUTHBEARER token"),
    ("{not json", "starts like JSON but is not JSON"),
    (json.dumps({"expires_in": 5}), "JSON without an access_token"),
    ("Bearer abc", "more than one word"),
])
def test_bad_token_text_is_an_authentication_error(text, message):
    with pytest.raises(AuthenticationFailed, match=message):
        parse_token(text, now=0.0, source="kafka.sasl_oauth_token_command")


def test_sasl_and_acl_failures_from_the_client_are_named():
    cfg = Config.from_dict({"kafka": {**SCRAM, "bootstrap_servers": "k:9093", "sasl_username": "kmq"}})
    with pytest.raises(AuthenticationFailed) as info, broker_errors(cfg.kafka):
        raise SaslAuthenticationFailedError("SaslAuthenticationFailedError: Authentication failed during authentication"
                                            " due to invalid credentials with SASL mechanism SCRAM-SHA-512")
    text = str(info.value)
    assert "refused SASL SCRAM-SHA-512 authentication as 'kmq'" in text and "KMQ_KAFKA__SASL_PASSWORD" in text
    assert not info.value.retriable and isinstance(info.value, BrokerUnavailable)
    with pytest.raises(AuthorizationFailed, match=r"denied user 'kmq' a topic operation .*docs/deploy.md"), broker_errors(cfg.kafka):
        raise TopicAuthorizationFailedError("orders__markers")
    with pytest.raises(AuthorizationFailed, match="a group operation"), broker_errors(cfg.kafka):
        raise GroupAuthorizationFailedError("kmq-tracker")


def _ssl_error(cls, reason: str, **attrs):
    exc = cls(1, reason)
    exc.reason = reason
    for k, v in attrs.items():
        setattr(exc, k, v)
    return exc


def test_tls_failures_are_told_apart():
    expired = _ssl_error(ssl.SSLCertVerificationError, "CERTIFICATE_VERIFY_FAILED", verify_message="certificate has expired")
    assert "renewed" in str(broker_certificate_error("k:9093", expired))
    untrusted = _ssl_error(ssl.SSLCertVerificationError, "CERTIFICATE_VERIFY_FAILED",
                           verify_message="unable to get local issuer certificate")
    assert "kafka.ssl_cafile" in str(broker_certificate_error("k:9093", untrusted))
    host = _ssl_error(ssl.SSLCertVerificationError, "CERTIFICATE_VERIFY_FAILED",
                      verify_message="Hostname mismatch, certificate is not valid for 'k'.")
    assert "kafka.ssl_check_hostname" in str(broker_certificate_error("k:9093", host))
    refused = tls_alert_error("k:9093", _ssl_error(ssl.SSLError, "SSLV3_ALERT_CERTIFICATE_EXPIRED"), "client.crt")
    assert isinstance(refused, CertificateRejected) and "certificate expired" in str(refused)
    needed = tls_alert_error("k:9093", _ssl_error(ssl.SSLError, "TLSV13_ALERT_CERTIFICATE_REQUIRED"))
    assert "requires a client certificate" in str(needed)
    # A Java broker answers a missing client certificate with "bad certificate".
    unsent = tls_alert_error("k:9093", _ssl_error(ssl.SSLError, "SSLV3_ALERT_BAD_CERTIFICATE"), None)
    assert "requires a client certificate" in str(unsent)
    other = tls_alert_error("k:9093", _ssl_error(ssl.SSLError, "TLSV1_ALERT_PROTOCOL_VERSION"))
    assert isinstance(other, TlsHandshakeFailed)
    assert tls_alert_error("k:9093", _ssl_error(ssl.SSLError, "WRONG_VERSION_NUMBER")) is None


def test_a_refused_client_certificate_outside_its_validity_says_so(tmp_path):
    """A Java broker answers an expired client certificate with "certificate unknown", as it
    answers an untrusted one: kmq reads the dates of the certificate it sent."""
    from tests.helpers.tls import TestPki

    pki = TestPki.create(tmp_path)
    unknown = _ssl_error(ssl.SSLError, "SSLV3_ALERT_CERTIFICATE_UNKNOWN")
    expired = str(tls_alert_error("k:9093", unknown, str(pki.expired_cert)))
    assert "the certificate expired on" in expired and "renew kafka.ssl_certfile" in expired, expired
    valid = str(tls_alert_error("k:9093", unknown, str(pki.client_cert)))
    assert "expired" not in valid and "signed by a CA the broker trusts" in valid, valid


def test_every_security_example_in_the_docs_is_a_valid_config():
    import re
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    blocks = [b for doc in ("docs/configuration.md", "docs/deploy.md")
              for kind, b in re.findall(r"```(\w*)\n(.*?)```", (root / doc).read_text(), re.S)
              if kind == "yaml" and "security_protocol:" in b]
    assert len(blocks) >= 6
    for block in blocks:
        cfg = Config.from_dict(yaml.safe_load(block))
        assert cfg.kafka.security_protocol in ("SSL", "SASL_SSL"), block


def test_errors_raised_mid_run_are_classified_too():
    from kmq.client.kafka_python.clients import classify

    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "k:9092"}})
    assert isinstance(classify(cfg.kafka, TopicAuthorizationFailedError("orders")), AuthorizationFailed)
    assert isinstance(classify(cfg.kafka, SaslAuthenticationFailedError("bad")), AuthenticationFailed)
    assert classify(cfg.kafka, ValueError("x")) is None


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_settings_reach_kafka_pythons_mechanisms(mechanism):
    # SASL cannot be exercised against the embedded broker (tansu gap, docs/configuration.md):
    # check that what kmq hands kafka-python is what its SASL mechanisms read.
    from kafka.net.sasl import get_sasl_mechanism

    cfg = Config.from_dict({"kafka": {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                                      "sasl_username": "kmq", "sasl_password": "pw"}})
    kw = client_kwargs(cfg.kafka)
    assert (kw["security_protocol"], kw["sasl_mechanism"]) == ("SASL_PLAINTEXT", mechanism)
    first = get_sasl_mechanism(mechanism)(host="k", **kw).auth_bytes()
    if mechanism == "PLAIN":
        assert first == b"kmq\0kmq\0pw"  # authzid, authcid, password
    else:
        assert first.startswith(b"n,,n=kmq,r=")


CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
KEY8 = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----"


def test_lag_job_hands_the_security_settings_to_either_source(tmp_path):
    import dataclasses

    from kmq.spark.connector_options import kafka_options
    from kmq.spark.job import source_options
    from kmq.spark.source import kafka_config_from_options

    (tmp_path / "c.pem").write_text(f"{CERT}\n{CERT}\n")
    (tmp_path / "k.pem").write_text(f"junk\n{KEY8}\n")
    (tmp_path / "pw").write_text("pw\n")
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "k:9093", "security_protocol": "SSL", "ssl_cafile": "/ca.pem",
                                      "ssl_certfile": str(tmp_path / "c.pem"), "ssl_keyfile": str(tmp_path / "k.pem"),
                                      "ssl_password_file": str(tmp_path / "pw"), "ssl_check_hostname": False}})
    java = kafka_options(cfg.kafka)
    assert java == {"kafka.bootstrap.servers": "k:9093", "kafka.security.protocol": "SSL",
                    "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": "/ca.pem",
                    "kafka.ssl.endpoint.identification.algorithm": "",
                    "kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.certificate.chain": f"{CERT}\n{CERT}",
                    "kafka.ssl.keystore.key": KEY8}  # an unencrypted PKCS#8 key takes no password
    # The Python source gets the KafkaConfig itself, the key password read on the driver.
    opts = {k.lower(): v for k, v in source_options(cfg).items()}  # as Spark hands them over
    assert kafka_config_from_options(opts) == dataclasses.replace(
        cfg.kafka, client_id="kmq-lag-job", ssl_password="pw", ssl_password_file=None)
    oauth = Config.from_dict({"kafka": {**OAUTH, "sasl_oauth_token_command": "get-token"}})
    got = kafka_config_from_options({k.lower(): v for k, v in source_options(oauth).items()})
    assert (got.sasl_mechanism, got.sasl_oauth_token_command, got.sasl_password) == ("OAUTHBEARER", "get-token", None)


def test_spark_connector_options_map_sasl_and_encrypted_keys(tmp_path):
    from kmq.spark.connector_options import kafka_options

    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "k:9094", "security_protocol": "SASL_SSL",
                                      "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": 'u"1',
                                      "sasl_password": 'p\\w"d'}})
    java = kafka_options(cfg.kafka)
    assert java["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert java["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                              'username="u\\"1" password="p\\\\w\\"d";')
    assert "kafka.ssl.truststore.location" not in java  # the JVM's own trust store
    enc = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIE\n-----END ENCRYPTED PRIVATE KEY-----"
    (tmp_path / "both.pem").write_text(f"{CERT}\n{enc}\n")
    (tmp_path / "pw").write_text("kpw\n")
    tls = {"bootstrap_servers": "k:9093", "security_protocol": "SSL", "ssl_certfile": str(tmp_path / "both.pem")}
    java = kafka_options(Config.from_dict({"kafka": {**tls, "ssl_password_file": str(tmp_path / "pw")}}).kafka)
    assert (java["kafka.ssl.keystore.certificate.chain"], java["kafka.ssl.keystore.key"],
            java["kafka.ssl.key.password"]) == (CERT, enc, "kpw")


@pytest.mark.parametrize("kafka, error", [
    ({**OAUTH, "sasl_oauth_token_command": "get-token"}, "cannot use sasl_mechanism OAUTHBEARER.*spark.source: python"),
    ({"bootstrap_servers": "k:9098", "security_protocol": "SASL_SSL", "sasl_mechanism": "AWS_MSK_IAM"},
     "cannot use sasl_mechanism AWS_MSK_IAM.*spark.source: python"),
    ({"security_protocol": "SSL", "ssl_certfile": "{tmp}/c.pem", "ssl_keyfile": "{tmp}/rsa.pem"},
     r"kafka.ssl_keyfile: a RSA PRIVATE KEY \(PKCS#1/SEC1\).*openssl pkcs8 -topk8.*spark.source: python"),
    ({"security_protocol": "SSL", "ssl_certfile": "{tmp}/c.pem", "ssl_keyfile": "{tmp}/enc.pem"},
     "kafka.ssl_keyfile: the key is encrypted: set KMQ_KAFKA__SSL_PASSWORD"),
    ({"security_protocol": "SSL", "ssl_certfile": "{tmp}/rsa.pem"}, "kafka.ssl_certfile: .* holds no PEM certificate"),
])
def test_spark_connector_refuses_what_its_java_client_cannot_be_given(tmp_path, kafka, error):
    from kmq.spark.connector_options import UnsupportedSecurity, kafka_options

    (tmp_path / "c.pem").write_text(CERT)
    (tmp_path / "rsa.pem").write_text("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n")
    (tmp_path / "enc.pem").write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nM\n-----END ENCRYPTED PRIVATE KEY-----\n")
    kafka = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in kafka.items()}
    with pytest.raises(UnsupportedSecurity, match=error):
        kafka_options(Config.from_dict({"kafka": kafka}).kafka)


def test_the_spark_sources_consumers_get_kmqs_client_settings(tmp_path):
    # Driver and tasks rebuild the job's KafkaConfig and render it as every other kmq client does.
    from kmq.client.kafka_python.settings import client_kwargs
    from kmq.spark import source
    from kmq.spark.job import source_options

    (tmp_path / "pw").write_text("s3cret\n")
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "a:9092,b:9092", "security_protocol": "SASL_PLAINTEXT",
                                      "sasl_mechanism": "SCRAM-SHA-256", "sasl_username": "kmq",
                                      "sasl_password_file": str(tmp_path / "pw"), "client": "confluent"}})
    opts = {k.lower(): v for k, v in source_options(cfg).items()}
    (tmp_path / "pw").unlink()  # the executors have no password file: the password travels in the options
    kafka = source.kafka_config_from_options(opts)
    assert kafka.client == "confluent" and secrets.sasl_password(kafka) == "s3cret"
    # The tasks open their readers with open_log_reader(kafka): kmq's own client settings.
    assert client_kwargs(kafka) == {
        "bootstrap_servers": ["a:9092", "b:9092"], "security_protocol": "SASL_PLAINTEXT", "client_id": "kmq-lag-job",
        "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "kmq", "sasl_plain_password": "s3cret"}


@pytest.mark.parametrize("options, error", [
    ({"subscribe": "t"}, "needs the option kmq.kafka"),
    ({"kmq.kafka": "{}", "kafka.bootstrap.servers": "k:9092"}, "from kmq.kafka alone"),
    ({"kmq.kafka": "not json"}, "expected a KafkaConfig as JSON"),
    ({"kmq.kafka": '{"security_protocol": "SSL", "sasl_mechanism": "PLAIN"}'}, "kafka.sasl_mechanism: is set but"),
    ({"kafka.bootstrap.servers": "k:9092", "kafka.client": "aiokafka"}, "must be kafka-python or confluent"),
])
def test_the_spark_source_refuses_a_connection_it_cannot_build(options, error):
    from kmq.spark.source import SourceError, kafka_config_from_options

    with pytest.raises(SourceError, match=error):
        kafka_config_from_options(options)
