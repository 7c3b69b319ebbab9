"""Every codec Kafka has, without a broker: kafka-python has a library for each (they are kmq's
dependencies), a missing one is one clear error at start, and ``queues[].compression`` names them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from kafka import codec
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from kmq.client.kafka_python import clients
from kmq.config import Config, ConfigError
from kmq.core.errors import ClientNotInstalled

ROOT = Path(__file__).resolve().parents[2]
# Kafka's codec numbers in a record batch's attributes.
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.mark.parametrize("name", CODECS)
def test_kafka_python_writes_and_reads_a_batch_of_every_codec(name):
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=CODECS[name], is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(20):
        builder.append(i, timestamp=1000 + i, key=b"k%d" % i, value=b"payload " * 20, headers=[("h", b"v")])
    batch = MemoryRecords(bytes(builder.build())).next_batch()
    assert batch.compression_type == CODECS[name]  # compressed, not sent plain for want of a library
    assert [(r.key, r.value) for r in batch] == [(b"k%d" % i, b"payload " * 20) for i in range(20)]


def test_the_codec_libraries_are_core_dependencies_so_every_install_reads_every_codec():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=\[; ]", d, maxsplit=1)[0].lower() for d in deps}
    assert {package for _, _, package in clients._CODEC_LIBRARIES} <= names
    clients.require_codecs()  # this install has them


def test_a_kafka_python_client_without_a_codec_library_is_refused_at_start_naming_the_packages(monkeypatch):
    monkeypatch.setattr(codec, "snappy", None)
    monkeypatch.setattr(codec, "zstd", None)
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "queues": [{"name": "q"}]})
    for build in (lambda: clients.consumer(cfg.kafka), lambda: clients.producer(cfg.kafka)):
        with pytest.raises(ClientNotInstalled) as err:
            build()  # before any connection is tried
        text = str(err.value)
        assert "\n" not in text and "compressed with snappy, zstd" in text
        assert "pip install python-snappy zstandard" in text and "kafka.client: confluent" in text


def test_queue_compression_is_none_by_default_any_case_of_kafkas_codecs_and_anything_else_is_named():
    def compression(value=None, env=None):
        queue = {"name": "q"} if value is None else {"name": "q", "compression": value}
        return Config.from_dict({"queues": [queue]}, env=env).queues[0].compression

    assert compression() == "none" and Config().queue("other").compression == "none"
    assert [compression(c) for c in ("GZIP", "snappy", "Lz4", "zstd", "none")] == [
        "gzip", "snappy", "lz4", "zstd", "none"]
    assert compression(env={"KMQ_QUEUES__0__COMPRESSION": "zstd"}) == "zstd"
    with pytest.raises(ConfigError, match=r"queues\[0\]\.compression: expected one of NONE, GZIP, SNAPPY, LZ4, ZSTD"):
        compression("brotli")
