"""The librdkafka fetch settings of the confluent log reader and consumers that keep consecutive fetches prompt."""

from __future__ import annotations

import pytest

pytest.importorskip("confluent_kafka", reason="the confluent-kafka extra is not installed")

from kmq.client.confluent import log_reader  # noqa: E402
from kmq.config import Config  # noqa: E402


def _conf(monkeypatch, **overrides) -> dict:
    seen: dict = {}

    class Captured:
        def __init__(self, conf: dict) -> None:
            seen.update(conf)

        def close(self) -> None:
            pass

    monkeypatch.setattr(log_reader.ck, "Consumer", Captured)
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:9", "client": "confluent"}, "queues": [{"name": "q"}]})
    log_reader.ConfluentLogReader(cfg.kafka, **overrides).close()
    return seen


def test_a_read_after_a_read_that_left_the_prefetch_queue_full_is_not_held_back(monkeypatch):
    # librdkafka's default fetch.queue.backoff.ms (1 s) outlived a read that stopped with its prefetch
    # queue over the limit: the tracker's next read of that partition waited 0.6-0.7 s for a fetch.
    conf = _conf(monkeypatch)
    assert conf["fetch.queue.backoff.ms"] <= 50
    assert conf["queued.max.messages.kbytes"] <= 64 * 1024  # the prefetch stays bounded


def test_the_caller_still_decides(monkeypatch):
    conf = _conf(monkeypatch, **{"fetch.queue.backoff.ms": 200, "queued.max.messages.kbytes": 4096})
    assert conf["fetch.queue.backoff.ms"] == 200 and conf["queued.max.messages.kbytes"] == 4096


def _consumer_conf(monkeypatch, **overrides) -> dict:
    from kmq.client.confluent import consumer as confluent_consumer

    seen: dict = {}

    class Captured:
        def __init__(self, conf: dict) -> None:
            seen.update(conf)

    monkeypatch.setattr(confluent_consumer.ck, "Consumer", Captured)
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:9", "client": "confluent"}, "queues": [{"name": "q"}]})
    confluent_consumer.consumer(cfg.kafka, group_id="g", **overrides)
    return seen


def test_group_consumers_do_not_wait_out_librdkafkas_fetch_backoff(monkeypatch):
    # With librdkafka's 1 s, a consumer that drained its prefetch waited out the rest of the second:
    # KmqConsumer read a 1,000,000-message backlog at 150,000 msg/s, CPU-bound at 290,000-365,000 without.
    conf = _consumer_conf(monkeypatch)
    assert conf["fetch.queue.backoff.ms"] <= 50
    assert _consumer_conf(monkeypatch, **{"fetch.queue.backoff.ms": 1000})["fetch.queue.backoff.ms"] == 1000
