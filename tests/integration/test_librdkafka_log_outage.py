"""librdkafka's log lines during a real broker outage stay bounded and still name the broker.

Before the bridge (kmq.client.confluent.log_bridge), one confluent consumer and one producer
logged about 200 "Connect to ipv4#...: Connection refused" ERROR lines in 10 s
of outage (the consumer reconnects about 20 times a second). Here the broker
is SIGKILLed for a few seconds under a polling consumer and a producer with a
record in flight, started again (durable storage on a local moto server, as
in test_writer_outage), and the records on ``kmq.librdkafka`` are
counted from the kill to the clients' close.
"""

from __future__ import annotations

import logging
import time

import pytest

from kmq.config import Config
from tests.helpers.kafka import own_broker
from kmq.client.topics import ensure_topics
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import wait_until

pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(120)]

OUTAGE_S = 10.0
MAX_LINES = 20


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_reconnect_storm_is_a_few_warnings_naming_the_broker(tmp_path):
    from kmq.client.confluent import consumer as client_confluent

    broker = own_broker(tmp_path).start()  # durable: the restart keeps the log
    logger = logging.getLogger("kmq.librdkafka")
    kept, old_level = Keep(), logger.level
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)  # librdkafka's INFO lines (disconnects) count too
    consumer = producer = None
    try:
        cfg = Config.from_dict({
            "kafka": {"bootstrap_servers": broker.bootstrap, **TEST_GROUP_TIMING, "client": "confluent"},
            "queues": [{"name": unique("q")}],
        })
        queue = cfg.queues[0].name
        ensure_topics(cfg.kafka, cfg.queues[0], 1)
        producer = client_confluent.producer(cfg.kafka)
        consumer = client_confluent.consumer(cfg.kafka, queue, group_id=unique("g"))
        producer.send(queue, value=b"before").get(20)
        wait_until(lambda: consumer.poll(0.2, 10), 30, what="the consumer joined and fetching")

        kept.records.clear()
        broker.kill()
        outage_ends = time.monotonic() + OUTAGE_S
        in_flight = producer.send(queue, value=b"during")  # the producer reconnects too
        while time.monotonic() < outage_ends:  # the outage itself: its length is what the test is about
            consumer.poll(0.2, 10)  # librdkafka's log lines are served by poll
        broker.start()
        wait_until(lambda: in_flight.is_done, 30, what="the in-flight record settled after the restart")
        producer.send(queue, value=b"after").get(20)  # the client recovered on its own
        consumer.poll(0.5, 10)
    finally:
        for client in (consumer, producer):
            if client is not None:
                client.close()  # the bridges log the counts they still hold
        logger.removeHandler(kept)
        logger.setLevel(old_level)
        broker.stop()

    lines = [(r.levelname, r.getMessage()) for r in kept.records]
    refused = [(lvl, m) for lvl, m in lines if "Connection refused" in m]
    collapsed = sum(int(m.split(" repeated ")[1].split()[0]) for _, m in lines if " repeated " in m)
    print("\n".join(f"{lvl} {m}" for lvl, m in lines))
    print(f"{len(lines)} lines on kmq.librdkafka for a {OUTAGE_S:.0f} s outage; {collapsed} repeats collapsed")
    assert len(lines) <= MAX_LINES, "\n".join(m for _, m in lines)
    assert any(broker.bootstrap in m for lvl, m in refused), lines  # still a clear signal, naming the broker
    assert {lvl for lvl, _ in refused} == {"WARNING"}, refused  # the client recovers: not an ERROR
    assert collapsed > 0, lines  # repeats happened and were counted, not lost silently
