"""Partitions added to a queue while its workers and tracker run (CreatePartitions), under load.

``kmq topics create QUEUE --partitions N`` grows the markers topic first, then the queue; workers
and trackers find the new partitions within ``kafka.metadata_max_age``. Nothing produced before,
during or after the change may be lost, dead-lettered or copied."""

from __future__ import annotations

import threading
import time

import pytest
from click.testing import CliRunner

from kmq.cli import cli
from kmq.client.topics import describe
from tests.helpers.kafka import wait_until
from tests.helpers.settling_worker import SettlingWorker
from tests.integration.tracker_util import metric, running_tracker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUEUE = {"lease": "5s", "max_deliveries": 3}


class Acks:
    """Acks every message; ``acked`` maps (partition, offset) -> times acked."""

    def __init__(self) -> None:
        self.acked: dict[tuple[int, int], int] = {}

    def settle(self, msg) -> None:
        key = (msg.partition, msg.offset)
        self.acked[key] = self.acked.get(key, 0) + 1
        msg.ack()


def test_partitions_added_while_workers_run_lose_nothing(queue_topics, bootstrap, kafka_client, skip_on_tansu):
    skip_on_tansu("CreatePartitions is not supported, so a topic cannot grow")
    from kafka import KafkaProducer

    cfg, q = queue_topics(2, queue=QUEUE, kafka={"client": kafka_client, "metadata_max_age": "500ms"},
                          tracker={"tick": "50ms"}, consumer={"ack_flush_interval": "50ms"})
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", metadata_max_age_ms=500)
    produced: list[tuple[int, int]] = []
    stop = threading.Event()

    def produce() -> None:  # keyed, as most queues are: keys move to other partitions when the topic grows
        i = 0
        while not stop.is_set():
            meta = producer.send(q.name, key=b"k%d" % (i % 40), value=b"v%d" % i).get(10)
            produced.append((meta.partition, meta.offset))
            i += 1
            time.sleep(0.005)

    thread = threading.Thread(target=produce, daemon=True)
    try:
        with running_tracker(cfg) as t:
            apps = [Acks(), Acks()]
            workers = [SettlingWorker(cfg, q.name, a.settle, batch_size=100) for a in apps]
            try:
                thread.start()
                wait_until(lambda: len(produced) >= 200, 30, what="a backlog before the change")
                res = CliRunner().invoke(cli, ["topics", "create", q.name, "--partitions", "4",
                                               "--bootstrap", bootstrap])
                assert res.exit_code == 0, res.output
                layout = describe(cfg.kafka, cfg.queue(q.name))
                assert (layout.queue_partitions, layout.markers_partitions) == (4, 4)
                wait_until(lambda: {p for p, _ in produced} >= {2, 3}, 30, what="records in the new partitions")
                wait_until(lambda: t.ready() == (True, "ready: 4 partition(s)"), 30,
                           what="the tracker tracking the new markers partitions")
                time.sleep(1)  # more records after the change, into all four partitions
                stop.set()
                thread.join(10)

                def all_acked() -> bool:
                    acked = set().union(*(a.acked for a in apps))
                    return set(produced) <= acked

                wait_until(all_acked, 60, what=f"every one of the {len(produced)} records acked")
                wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 0, 30,
                           what="every START ended")
                assert metric(t.http_port, "kmq_tracker_dead_lettered_total", queue=q.name) == 0
                assert metric(t.http_port, "kmq_tracker_redelivered_total", queue=q.name) == 0
                assert metric(t.http_port, "kmq_tracker_missing_offsets_total", queue=q.name) == 0
                served = {p for a in apps for p, _ in a.acked}
                assert served == {0, 1, 2, 3}
            finally:
                for w in workers:
                    w.close()
    finally:
        stop.set()
        producer.close()
