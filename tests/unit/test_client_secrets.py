"""Secret files are read where a client is built (kmq.client.secrets), never by the configuration."""

from __future__ import annotations

import os

import pytest
import yaml

from kmq.client import secrets
from kmq.client.kafka_python.settings import client_kwargs
from kmq.config import Config
from kmq.core.errors import ConfigError

SCRAM = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "kmq"}


def _load(tmp_path, kafka: dict) -> Config:
    path = tmp_path / "kmq.yaml"
    path.write_text(yaml.safe_dump({"kafka": kafka}))
    return Config.load(path, env={})


def test_loading_the_configuration_reads_no_secret_file(tmp_path):
    pw = tmp_path / "pw"
    cfg = _load(tmp_path, {**SCRAM, "sasl_password_file": str(pw)})  # not there yet: only named
    pw.write_text("s3cret\n")
    assert secrets.sasl_password(cfg.kafka) == "s3cret"  # read when a client needs it
    pw.write_text("rotated\n")
    assert client_kwargs(cfg.kafka)["sasl_plain_password"] == "rotated"  # each client build reads it again


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_missing_secret_file_names_the_key_and_the_file_when_a_client_is_built(tmp_path, client):
    if client == "confluent":
        pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
        from kmq.client.confluent.settings import settings as build
    else:
        build = client_kwargs
    pw = tmp_path / "missing-pw"
    cfg = _load(tmp_path, {**SCRAM, "sasl_password_file": str(pw), "client": client})
    with pytest.raises(ConfigError, match=rf"^kafka.sasl_password_file: file {pw} does not exist$"):
        build(cfg.kafka)


def test_a_secret_file_that_cannot_be_read_names_the_key_and_the_file(tmp_path):
    folder = tmp_path / "pw.d"
    folder.mkdir()
    kafka = Config.from_dict({"kafka": {**SCRAM, "sasl_password_file": str(folder)}}).kafka
    with pytest.raises(ConfigError, match=rf"^kafka.sasl_password_file: cannot read the password file {folder}: "):
        secrets.sasl_password(kafka)
    with pytest.raises(ConfigError, match=rf"^kafka.sasl_password_file: {folder} is not a file$"):
        client_kwargs(kafka)
    if os.getuid() != 0:  # root reads any file
        pw = tmp_path / "pw"
        pw.write_text("x")
        pw.chmod(0)
        with pytest.raises(ConfigError, match=rf"^kafka.sasl_password_file: file {pw} is not readable by this process"):
            client_kwargs(Config.from_dict({"kafka": {**SCRAM, "sasl_password_file": str(pw)}}).kafka)


def test_the_key_password_file_is_read_by_the_client_builder(tmp_path):
    (tmp_path / "c.pem").write_text("x")
    (tmp_path / "kpw").write_text("0123\n")
    kafka = Config.from_dict({"kafka": {"security_protocol": "SSL", "ssl_certfile": str(tmp_path / "c.pem"),
                                        "ssl_password_file": str(tmp_path / "kpw")}}).kafka
    assert secrets.key_password(kafka) == "0123"
    (tmp_path / "kpw").unlink()
    with pytest.raises(ConfigError, match=r"^kafka.ssl_password_file: cannot read the key password file .*kpw: "):
        secrets.key_password(kafka)
