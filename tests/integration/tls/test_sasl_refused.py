"""A SASL login that Apache Kafka refuses (wrong password, unknown user) is named in one line
for PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, over SASL_PLAINTEXT and SASL_SSL, though
kafka-python itself only times out ("Unable to bootstrap"). The tests start their own Kafka
with both SASL listeners."""

from __future__ import annotations

import os
import shutil

import pytest

from kmq.client.diagnose import diagnose
from kmq.config import Config
from kmq.core.errors import AuthenticationFailed, BrokerUnavailable
from tests.helpers import tls as tls_helpers
from tests.helpers.cli import FAST, describe_topic, one_line_error

pytestmark = pytest.mark.integration

USER, PASSWORD = "kmq-sasl", "the-right-password"
WRONG = "certainly-wrong"
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory):
    if shutil.which("java") is None:
        if os.environ.get("CI"):
            pytest.fail("no java: Apache Kafka needs Java 17 (apt-get install openjdk-17-jre-headless)")
        pytest.skip("java is not installed: Apache Kafka, which serves the SASL listener here, needs it")
    from kmq.dev.kafka import KafkaCluster, TlsListener

    workdir = tmp_path_factory.mktemp("sasl-kafka")
    pki = tls_helpers.TestPki.create(workdir / "pki")
    cluster = KafkaCluster(workdir=str(workdir / "kafka"), tls=TlsListener(pki.server_cert, pki.server_key, pki.ca),
                           scram_users={USER: PASSWORD})
    cluster.start()
    cluster.pki = pki
    try:
        yield cluster
    finally:
        cluster.stop()


def _sasl(cluster, mechanism: str, user: str, protocol: str = "SASL_PLAINTEXT", bootstrap: str | None = None) -> dict:
    if protocol == "SASL_SSL":
        return {"bootstrap_servers": bootstrap or cluster.sasl_ssl_bootstrap, "security_protocol": "SASL_SSL",
                "ssl_cafile": str(cluster.pki.ca), "sasl_mechanism": mechanism, "sasl_username": user, **FAST}
    return {"bootstrap_servers": bootstrap or cluster.sasl_bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism, "sasl_username": user, **FAST}


def _config(kafka: dict):
    return Config.from_dict({"kafka": kafka}, env={"KMQ_KAFKA__SASL_PASSWORD": PASSWORD}).kafka


REFUSALS = [(m, "SASL_PLAINTEXT") for m in MECHANISMS] + [("SCRAM-SHA-512", "SASL_SSL")]


@pytest.mark.parametrize("mechanism, protocol", REFUSALS)
@pytest.mark.parametrize("who", ["wrong password", "unknown user"])
def test_a_refused_sasl_login_is_one_line_naming_user_and_password_keys(sasl_kafka, tmp_path, mechanism, protocol, who):
    user = USER if who == "wrong password" else "nobody-here"
    line = one_line_error(describe_topic(tmp_path, _sasl(sasl_kafka, mechanism, user, protocol), {"KMQ_KAFKA__SASL_PASSWORD": WRONG}))
    assert f"refused SASL {mechanism} authentication as {user!r}" in line, line
    assert "KMQ_KAFKA__SASL_PASSWORD" in line and "kafka.sasl_username" in line, line
    assert WRONG not in line and PASSWORD not in line


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_diagnosis_logs_in_with_the_right_password(sasl_kafka, mechanism, protocol):
    """The login the diagnosis performs is accepted with the right password (SCRAM: the broker's
    signature checks out), so what remains is the generic "answers, but" without a SASL hint."""
    err = diagnose(_config(_sasl(sasl_kafka, mechanism, USER, protocol)), 2.0)
    assert type(err) is BrokerUnavailable, err
    assert "answers, but" in str(err) and "SASL" not in str(err), err


def test_a_sasl_login_to_a_plaintext_listener_is_named(sasl_kafka):
    err = diagnose(_config(_sasl(sasl_kafka, "SCRAM-SHA-512", USER, bootstrap=sasl_kafka.bootstrap)), 2.0)
    assert isinstance(err, AuthenticationFailed), err
    assert "not a SASL listener" in str(err) and "kafka.security_protocol" in str(err), err
