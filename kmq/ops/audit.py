"""Read a queue's three topics (queue, markers, DLQ) into a :class:`~kmq.core.ledger.Ledger`.

No consumer group: it assigns every partition and reads from the beginning,
so it changes nothing on the cluster and can run beside the system it audits.
"""

from __future__ import annotations

import time

from kafka import TopicPartition

from kmq.client.kafka_python.clients import consumer as make_consumer
from kmq.config import KafkaConfig, QueueConfig
from kmq.core.ledger import Ledger, LedgerSnapshot

__all__ = ["QueueAudit"]


class QueueAudit:
    def __init__(self, kafka: KafkaConfig, queue: QueueConfig) -> None:
        self.queue = queue
        self.ledger = Ledger(queue.name)
        self._kind = {queue.name: "queue", queue.markers_topic: "markers", queue.dlq_topic: "dlq"}
        self._consumer = make_consumer(kafka, enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=5000)
        self._assigned: set[TopicPartition] = set()
        self._refresh_assignment()

    def _refresh_assignment(self) -> None:
        tps = {
            TopicPartition(t, p)
            for t in self._kind
            for p in (self._consumer.partitions_for_topic(t) or ())
        }
        if tps != self._assigned:
            self._consumer.assign(sorted(tps))
            for tp in tps - self._assigned:
                self._consumer.seek_to_beginning(tp)
            self._assigned = tps

    def poll(self, timeout: float = 0.2) -> int:
        """Read what is available; return how many records were read."""
        batch = self._consumer.poll(timeout_ms=int(timeout * 1000), max_records=5000)
        n = 0
        # Queue records first, so END markers in the same poll resolve to their origin at once.
        for kind in ("queue", "markers", "dlq"):
            for tp, records in batch.items():
                if self._kind[tp.topic] == kind:
                    self.ledger.add_records(kind, records)
                    n += len(records)
        return n

    def caught_up(self) -> bool:
        """True when every partition's position reached the high-water mark of the last fetch."""
        for tp in self._assigned:
            hw = self._consumer.highwater(tp)
            if hw is None or self._consumer.position(tp) < hw:
                return False
        return True

    def drain(self, max_seconds: float = 10.0) -> LedgerSnapshot:
        """Poll until caught up with what was in the topics (bounded)."""
        deadline = time.monotonic() + max_seconds
        while time.monotonic() < deadline:
            if self.poll(0.2) == 0 and self.caught_up():
                break
        return self.ledger.snapshot()

    def snapshot(self) -> LedgerSnapshot:
        return self.ledger.snapshot()

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> "QueueAudit":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
