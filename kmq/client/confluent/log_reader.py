"""Read original records back from the queue log with confluent-kafka (``kafka.client: confluent``).

The same contract as :class:`kmq.client.kafka_python.log_reader.LogReader`: each requested
offset is returned with its record or reported missing, never a neighbour in
its place. The end of the log comes from the fetches themselves
(librdkafka's partition-EOF event carries the high-water mark of the fetch
that reached it), not from a ListOffsets request; an offset beyond the end
is an out-of-range fetch, reported (``auto.offset.reset: error``) instead of
silently restarting from the log start.
"""

from __future__ import annotations

import time
from typing import Iterable

from kmq.client.api import Record
from kmq.client.confluent.consumer import settings
from kmq.config import KafkaConfig
from kmq.core.ranges import RangeSet, missing
from kmq.client.kafka_python.log_reader import LogReadError, ReadResult, needs_seek, next_target

import confluent_kafka as ck  # noqa: E402,I001 - after kmq.client.confluent.consumer: its import names the missing extra
from confluent_kafka import KafkaError, KafkaException, TopicPartition  # noqa: E402

__all__ = ["ConfluentLogReader"]

_BATCH = 2000
# Empty fetch rounds (0.2 s each) before the cached high-water mark of the current assignment's
# fetches decides that a position is at or past the end. Kafka answers such a fetch with an
# out-of-range error or an end-of-partition event first; some brokers send neither.
_IDLE_ROUNDS = 3


class ConfluentLogReader:
    """Reads given offsets of one partition at a time (assign at an offset, consume, verify)."""

    def __init__(self, kafka: KafkaConfig, timeout_s: float = 10.0) -> None:
        self._timeout_s = timeout_s
        conf = settings(kafka)
        self._log_bridge = conf["logger"]  # holds the counts of repeated librdkafka lines until close
        self._consumer = ck.Consumer({
            **conf,
            "group.id": f"{kafka.client_id}-log-reader",  # required by librdkafka; never joined, never committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 50,
        })

    def close(self) -> None:
        self._consumer.close()
        self._log_bridge.flush()

    def _assign(self, topic: str, partition: int, offset: int) -> None:
        self._consumer.assign([TopicPartition(topic, partition, offset)])

    def read(self, topic: str, partition: int, ranges: Iterable[tuple[int, int]]) -> ReadResult:
        """Records at exactly these offsets; raises :class:`LogReadError` on timeout."""
        wanted = RangeSet(ranges)
        found: dict[int, Record] = {}
        if not wanted:
            return ReadResult(found, [])
        todo = wanted.ranges()
        deadline = time.monotonic() + self._timeout_s
        known = -1  # every wanted offset below this is decided (found or absent)
        pos: int | None = None  # the offset the current assignment reads from next
        log_end: int | None = None
        i = 0
        idle = 0
        c = self._consumer
        try:
            while True:
                i, target = next_target(todo, i, known)
                if target is None:
                    break
                if log_end is not None and target >= log_end:
                    break  # at or past the end of the log: nothing from here on exists
                if needs_seek(pos, target):
                    self._assign(topic, partition, target)
                    pos = target
                    idle = 0
                progressed = False
                for m in c.consume(_BATCH, 0.2):
                    err = m.error()
                    if err is None:
                        off = m.offset()
                        if off in wanted:
                            _kind, ts = m.timestamp()
                            found[off] = Record(m.topic(), m.partition(), off, m.key(), m.value(), m.headers() or [], ts)
                        pos = known = max(known, off + 1)
                        progressed = True
                    elif err.code() == KafkaError._PARTITION_EOF:
                        # The fetch reached the high-water mark: nothing at or above it exists.
                        log_end = m.offset()
                        known = max(known, log_end)
                    elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                        pos, known, log_end = self._out_of_range(topic, partition, pos, known)
                        progressed = True
                    elif err.fatal() or not err.retriable():
                        raise LogReadError(f"reading {topic}[{partition}] failed: {err.str()}")
                if progressed or log_end is not None:
                    idle = 0
                    continue
                idle += 1
                if idle >= _IDLE_ROUNDS and self._past_end(topic, partition, target):
                    # No record, no end-of-partition event and no out-of-range error: the fetches
                    # (their high-water marks) say the log ends at or before ``target``.
                    log_end = known = max(known, target)
                    continue
                if time.monotonic() > deadline:
                    raise LogReadError(f"timed out reading {topic}[{partition}] at offset {pos}")
        except KafkaException as exc:
            raise LogReadError(f"reading {topic}[{partition}] failed: {exc}") from exc
        return ReadResult(found, missing(todo, found), log_end)

    def _past_end(self, topic: str, partition: int, target: int) -> bool:
        """Whether the high-water mark of this assignment's latest fetch responses is at or below ``target``."""
        try:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        except (KafkaException, TypeError):
            return False
        return 0 <= high <= target

    def _out_of_range(self, topic: str, partition: int, pos: int | None, known: int) -> tuple[int, int, int | None]:
        """The fetch at ``pos`` is out of range: below the log start (retention deleted it:
        continue from the start) or beyond the end (nothing from ``pos`` on exists)."""
        low, _high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self._timeout_s)
        # Only the log start is asked for: some brokers answer the latest offset wrongly, and
        # beyond the end is known without it (an out-of-range fetch at or above the start).
        if pos is not None and pos < low:
            self._assign(topic, partition, low)
            return low, max(known, low), None
        end = pos if pos is not None else known
        return end, max(known, end), end

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic``; 0 when it does not exist or this client may not see it."""
        try:
            md = self._consumer.list_topics(topic, timeout=self._timeout_s)
        except KafkaException as exc:
            raise LogReadError(f"metadata of {topic} could not be read: {exc}") from exc
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return 0
        return len(t.partitions)
