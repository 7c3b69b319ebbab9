"""kafka-python's log reader puts back records its fetcher parked for a partition an earlier read
paused. kafka-python 3.0 puts parked records back only while its in-line slot is None, and a
drained slot stays as an empty object: the partition is then never fetched again, and a later read
of it waits out its whole timeout (the Spark job's planner stalled micro-batches this way). The
stand-in below is kafka-python's fetcher state in that situation, not a fake broker: the reader must
clear the drained slot before it polls, as the consumer's fetcher does."""

from __future__ import annotations

from types import SimpleNamespace

from kafka import TopicPartition

from kmq.client.kafka_python.log_reader import LogReader
from kmq.core.scan_cursor import ScanCursor


class _Drained:
    """A drained PartitionRecords: present in the slot, but empty (falsy)."""

    def __bool__(self) -> bool:
        return False


class _Consumer:
    def __init__(self) -> None:
        self._fetcher = SimpleNamespace(_next_partition_records=_Drained(),
                                        _paused_partition_records={TopicPartition("m", 1): object()})
        self.slot_at_poll: list = []

    def poll(self, timeout_ms: int) -> dict:
        self.slot_at_poll.append(self._fetcher._next_partition_records)
        return {}

    def highwater(self, tp):
        return None


def test_a_read_clears_the_drained_slot_that_would_strand_parked_records_before_each_poll():
    reader = LogReader.__new__(LogReader)
    reader._consumer = c = _Consumer()
    tp = TopicPartition("m", 1)
    polled, marked = reader._poll({tp: ScanCursor.for_mark(None, 0.0, 10.0)}, {tp})
    assert polled == {} and not marked
    assert c.slot_at_poll and all(slot is None for slot in c.slot_at_poll)
