"""Each kind of wrong credential, fed to a real CLI command against a real endpoint,
gives its own one-line error naming the cause and the key to fix, and exit code 1."""

from __future__ import annotations

import os
import shlex
import sys

import pytest
import yaml
from click.testing import CliRunner

from kmq.cli import cli
from kmq.config import Config
from kmq.client.diagnose import diagnose
from kmq.core.errors import TlsHandshakeFailed
from tests.helpers.cli import FAST, describe_topic, one_line_error
from tests.helpers.tls import KEY_PASSWORD, SCRAM_USER, TlsBroker

pytestmark = pytest.mark.integration

def _pki_cases(tb) -> dict[str, tuple[dict, dict, list[str]]]:
    """name -> (kafka overrides, environment, what the one line must say)."""
    pki = tb.pki
    plain_key = {"ssl_password_file": None}
    return {
        "untrusted broker (bad CA)": ({"ssl_cafile": str(pki.rogue_ca)}, {},
                                      ["TLS certificate", "not accepted", "kafka.ssl_cafile"]),
        "expired client certificate": ({"ssl_certfile": str(pki.expired_cert), "ssl_keyfile": str(pki.expired_key), **plain_key}, {},
                                       ["refused kmq's client certificate", "certificate expired", "kafka.ssl_certfile"]),
        # stunnel (OpenSSL) alerts "unknown ca"; a Java broker "certificate unknown", as for an expired one.
        "untrusted client certificate": ({"ssl_certfile": str(pki.rogue_cert), "ssl_keyfile": str(pki.rogue_key), **plain_key}, {},
                                         ["refused kmq's client certificate", "kafka.ssl_certfile",
                                          "unknown ca" if isinstance(tb, TlsBroker) else "signed by a CA the broker trusts"]),
        "no client certificate": ({"ssl_certfile": None, "ssl_keyfile": None, **plain_key}, {},
                                  ["requires a client certificate", "kafka.ssl_certfile"]),
        "host name not in the certificate": ({"bootstrap_servers": f"localhost:{tb.tls_port}"}, {},
                                             ["Hostname mismatch", "kafka.ssl_check_hostname"]),
        "plaintext to the TLS port": ({"security_protocol": "PLAINTEXT", "ssl_cafile": None, "ssl_certfile": None,
                                       "ssl_keyfile": None, **plain_key}, {},
                                      ["expects TLS", "kafka.security_protocol"]),
        "wrong key password": ({**plain_key}, {"KMQ_KAFKA__SSL_PASSWORD": "not-the-password"},
                               ["kafka.ssl_password:", "wrong key password"]),
        "encrypted key without a password": ({**plain_key}, {},
                                             ["kafka.ssl_keyfile:", "encrypted"]),
        "missing CA file": ({"ssl_cafile": str(tb.workdir / "nope.pem")}, {},
                            ["kafka.ssl_cafile:", "does not exist"]),
    }


CASES = ["untrusted broker (bad CA)", "expired client certificate", "untrusted client certificate", "no client certificate",
         "host name not in the certificate", "plaintext to the TLS port", "wrong key password",
         "encrypted key without a password", "missing CA file"]


@pytest.mark.parametrize("case", CASES)
def test_wrong_tls_credentials_give_one_clear_line(case, tls_broker, tmp_path):
    overrides, env, expected = _pki_cases(tls_broker)[case]
    line = one_line_error(describe_topic(tmp_path, {**tls_broker.kafka_settings(), **FAST, **overrides}, env))
    for text in expected:
        assert text in line, line
    assert KEY_PASSWORD not in line and "not-the-password" not in line


def test_right_credentials_and_hostname_check_off_work(tls_broker, tmp_path):
    ok = CliRunner().invoke(cli, ["topics", "describe", "orders", "--config", str(_write(tmp_path, {
        **tls_broker.kafka_settings(), "bootstrap_servers": f"localhost:{tls_broker.tls_port}", "ssl_check_hostname": False}))])
    # The broker answered over TLS: the only complaint is that the topics do not exist yet.
    assert "queue   orders" in ok.output and "run `kmq topics create orders`" in ok.output, ok.output


def _write(tmp_path, kafka: dict):
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump({"kafka": kafka}))
    return path


def test_tls_to_a_plaintext_port_is_named(tls_broker):
    """The diagnosis itself, against tansu's plaintext port. Through a client the CLI never
    gets there on tansu: tansu keeps a TLS ClientHello's connection open waiting for a
    369 MB request (Kafka closes it), and kafka-python 3.0.12's TLS handshake has no timeout."""
    cfg = Config.from_dict({"kafka": {**tls_broker.kafka_settings(), "bootstrap_servers": tls_broker.plaintext_bootstrap}})
    err = diagnose(cfg.kafka, 2.0)
    assert isinstance(err, TlsHandshakeFailed)
    assert "does not speak TLS" in str(err) and "kafka.security_protocol" in str(err)


def test_oauthbearer_token_command_failure_is_named(bootstrap, tmp_path):
    fail = f"{shlex.quote(sys.executable)} -c \"import sys; sys.stderr.write('no credentials for the IdP'); sys.exit(3)\""
    line = one_line_error(describe_topic(tmp_path, {"bootstrap_servers": bootstrap, "security_protocol": "SASL_PLAINTEXT",
                                           "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_command": fail, **FAST}))
    assert "kafka.sasl_oauth_token_command failed with exit code 3: no credentials for the IdP" in line, line


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_sasl_password_is_named(kafka_broker, tmp_path, request, mech):
    """On a SASL listener: the suite's Apache Kafka's own (KMQ_TEST_BROKER=kafka), or
    KMQ_TEST_SASL_BOOTSTRAP=host:port (SASL_PLAINTEXT) with KMQ_TEST_SASL_MECHANISM (default
    SCRAM-SHA-512) and KMQ_TEST_SASL_USERNAME, a user that exists there."""
    sasl = os.environ.get("KMQ_TEST_SASL_BOOTSTRAP")
    user = os.environ.get("KMQ_TEST_SASL_USERNAME")
    if sasl:
        if mech != os.environ.get("KMQ_TEST_SASL_MECHANISM", "SCRAM-SHA-512"):
            pytest.skip(f"KMQ_TEST_SASL_BOOTSTRAP's listener is tested with KMQ_TEST_SASL_MECHANISM, not {mech}")
    elif kafka_broker.kind == "kafka":
        sasl, user = request.getfixturevalue("tls_broker").sasl_bootstrap, SCRAM_USER
    else:
        if kafka_broker.is_tansu:
            pytest.skip(
                "tansu gap: SASL does not work in tansu 0.6.0: `tansu user create` stores no user and a broker "
                "started with --authentication answers every SCRAM login with e=unknown-user (and refuses user "
                "creation: NotAuthenticated); set KMQ_TEST_SASL_BOOTSTRAP to a SASL listener to run this"
            )
        pytest.skip("set KMQ_TEST_SASL_BOOTSTRAP, KMQ_TEST_SASL_USERNAME (and KMQ_TEST_SASL_MECHANISM) to run this")
    line = one_line_error(describe_topic(tmp_path, {"bootstrap_servers": sasl, "security_protocol": "SASL_PLAINTEXT",
                                           "sasl_mechanism": mech, "sasl_username": user, **FAST},
                                {"KMQ_KAFKA__SASL_PASSWORD": "certainly-wrong"}))
    assert f"refused SASL {mech} authentication as {user!r}" in line and "KMQ_KAFKA__SASL_PASSWORD" in line, line
    assert "certainly-wrong" not in line
