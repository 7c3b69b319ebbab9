"""Read a queue's three topics (queue, markers, DLQ) into a :class:`~kmq.core.ledger.Ledger`.

No consumer group: every :meth:`QueueAudit.poll` reads each partition from where
the last one stopped to the end of its log (one :class:`~kmq.client.api.LogReader`
scan), so it changes nothing on the cluster and can run beside the system it audits.
"""

from __future__ import annotations

import time

from kmq.client import Partition, open_log_reader
from kmq.config import KafkaConfig, QueueConfig
from kmq.core.ledger import Ledger, LedgerSnapshot

__all__ = ["QueueAudit"]

_KINDS = ("queue", "markers", "dlq")


class QueueAudit:
    def __init__(self, kafka: KafkaConfig, queue: QueueConfig, timeout_s: float = 10.0) -> None:
        self.queue = queue
        self.ledger = Ledger(queue.name)
        self._kind = {queue.name: "queue", queue.markers_topic: "markers", queue.dlq_topic: "dlq"}
        self._reader = open_log_reader(kafka, timeout_s)
        # Where each partition's next read starts (None: the log start).
        self._next: dict[Partition, int | None] = {
            (t, p): None for t in self._kind for p in range(self._reader.partition_count(t))}

    def poll(self) -> int:
        """Read every partition to the end of its log; return how many records were read."""
        read: dict[str, list] = {kind: [] for kind in _KINDS}
        for tp, records in self._reader.scan(self._next):
            read[self._kind[tp[0]]].append(records)
            self._next[tp] = records[-1].offset + 1
        # Queue records first, so END markers read in the same poll resolve to their origin at once.
        n = 0
        for kind in _KINDS:
            for records in read[kind]:
                self.ledger.add_records(kind, records)
                n += len(records)
        return n

    def drain(self, max_seconds: float = 10.0) -> LedgerSnapshot:
        """Poll until a poll finds nothing new (bounded)."""
        deadline = time.monotonic() + max_seconds
        while self.poll() and time.monotonic() < deadline:
            pass
        return self.ledger.snapshot()

    def snapshot(self) -> LedgerSnapshot:
        return self.ledger.snapshot()

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> "QueueAudit":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
