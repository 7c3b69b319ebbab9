"""Both readers of originals (kafka-python's and confluent-kafka's) on the real broker:
every requested offset is found, reported missing (deleted) or at or past the end of the log
the read found (then neither: a read that ends below an offset proves nothing about it)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from kmq.client.kafka_python import clients
from kmq.client.topics import ensure_topics
from kmq.client.kafka_python.log_reader import LogReader
from tests.helpers.kafka import produce

pytestmark = pytest.mark.integration


def _reader(cfg, client):
    if client == "confluent":
        pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
        from kmq.client.confluent.log_reader import ConfluentLogReader

        return ConfluentLogReader(cfg.kafka, timeout_s=10)
    return LogReader(cfg.kafka, timeout_s=10)


def test_reads_exact_offsets_reports_the_rest_and_the_log_end(queue_topics, kafka_client):
    cfg, q = queue_topics(partitions=2)
    produce(cfg, q.name, 3000, keys=b"k%d", values=b"v%d", headers=lambda i: [("h", b"%d" % i)])
    reader = _reader(cfg, kafka_client)
    try:
        # Two ranges far apart (a re-seek between them), one running past the end of the log.
        got = reader.read(q.name, 0, [(5, 3), (2990, 20)])
        assert sorted(got.records) == [5, 6, 7, *range(2990, 3000)]
        assert got.records[2995].value == b"v2995" and list(got.records[2995].headers) == [("h", b"2995")]
        assert got.missing == [] and got.log_end == 3000  # 3000..3009: past the end, not missing
        # Wholly beyond the end: nothing read, nothing missing, the end reported at or below the request.
        far = reader.read(q.name, 0, [(10_000, 5)])
        assert far.records == {} and far.missing == []
        assert far.log_end is not None and 3000 <= far.log_end <= 10_000
        # A START over 10^12 offsets (a corrupt or hostile marker): answered as ranges, never per offset.
        huge = reader.read(q.name, 0, [(2998, 10**12)])
        assert sorted(huge.records) == [2998, 2999] and huge.missing == [] and huge.log_end == 3000
        # An empty partition.
        empty = reader.read(q.name, 1, [(0, 2)])
        assert empty.records == {} and empty.missing == [] and empty.log_end == 0
        assert reader.partition_count(q.name) == 2 and reader.partition_count("no-such-topic-kmq") == 0
    finally:
        reader.close()


def test_log_ends_answers_each_partition_and_one_without_a_leader_costs_only_its_own_answer(queue_topics,
                                                                                             kafka_client):
    """A partition whose leader does not answer (here one the topic does not have, so no broker leads
    it) is reported failed after the reader's timeout; the others are answered in the same call.
    high_waters() is all or nothing and raises."""
    from kmq.core.errors import LogReadError

    cfg, q = queue_topics(partitions=2)
    produce(cfg, q.name, 7, values=b"v%d")
    if kafka_client == "confluent":
        pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
        from kmq.client.confluent.log_reader import ConfluentLogReader

        reader = ConfluentLogReader(cfg.kafka, timeout_s=2)
    else:
        reader = LogReader(cfg.kafka, timeout_s=2)
    try:
        assert reader.log_ends({(q.name, 0): None, (q.name, 1): 0}).ends == {(q.name, 0): 7, (q.name, 1): 0}
        began = time.monotonic()
        got = reader.log_ends({(q.name, 0): None, (q.name, 7): None})
        assert got.ends == {(q.name, 0): 7} and list(got.failed) == [(q.name, 7)], got
        assert time.monotonic() - began < 2 + 3  # one timeout for the call, not one per partition
        with pytest.raises(LogReadError):
            reader.high_waters({(q.name, 0): None, (q.name, 7): None})
    finally:
        reader.close()


@pytest.fixture
def own_broker():
    """An embedded broker of this test's own: it is paused (SIGSTOP), which must not stall the session's broker."""
    from kmq.dev.broker import DevBroker

    broker = DevBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _paused(broker, seconds: float) -> threading.Timer:
    """Stop the broker process now and let it go on after ``seconds`` (a GC pause, a leader move)."""
    os.kill(broker.pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, os.kill, (broker.pid, signal.SIGCONT))
    timer.start()
    return timer


def test_a_broker_pause_during_a_read_delays_it_and_never_reports_offsets_missing(own_broker, make_config, kafka_client):
    # The reader read this partition before (its client caches that fetch's high-water mark, 10); the log has
    # grown since. A first fetch slower than the reader's idle rounds must not take the old mark for the end.
    cfg = make_config(kafka={"bootstrap_servers": own_broker.bootstrap, "client": kafka_client})
    q = cfg.queues[0]
    ensure_topics(cfg.kafka, q, 1)
    p = clients.producer(cfg.kafka)
    try:
        for i in range(10):
            p.send(q.name, value=b"v%d" % i, partition=0)
        p.flush()
        reader = _reader(cfg, kafka_client)
        try:
            assert sorted(reader.read(q.name, 0, [(0, 10)]).records) == list(range(10))
            for i in range(10, 30):
                p.send(q.name, value=b"v%d" % i, partition=0)
            p.flush()
            timer = _paused(own_broker, 1.5)
            try:
                got = reader.read(q.name, 0, [(10, 20)])
            finally:
                timer.join()
            assert [tuple(r) for r in got.missing] == [] and got.log_end is None
            assert sorted(got.records) == list(range(10, 30))
        finally:
            reader.close()
    finally:
        p.close()


def test_confluent_reads_of_a_partition_read_before_fetch_at_once_without_probing_the_log_start(queue_topics):
    """The tracker reads a backlog chunk after chunk, producing copies in between. librdkafka fetched
    nothing for a partition resumed after its new assignment until the read probed the log start
    (0.6 s later): it then assigned the partition at the log start (a probe) on most reads."""
    cfg, q = queue_topics(partitions=1)
    produce(cfg, q.name, 20_000, values=b"x" * 100, settings={"linger_ms": 20})
    reader = _reader(cfg, "confluent")
    import confluent_kafka

    assigned: list[int] = []
    real_assign = reader._assign

    def assign(at, active, fresh):
        assigned.extend(at.values())
        real_assign(at, active, fresh)

    reader._assign = assign
    try:
        for first in range(0, 20_000, 2000):
            got = reader.read(q.name, 0, [(first, 2000)])
            assert sorted(got.records) == list(range(first, first + 2000))
            time.sleep(0.05)  # the tracker produces the chunk's copies before it reads the next one
    finally:
        reader.close()
    assert confluent_kafka.OFFSET_BEGINNING not in assigned, assigned


def test_a_read_that_goes_on_where_the_last_stopped_finds_what_was_written_since(queue_topics, kafka_client):
    """The confluent reader keeps a read's assignment for a read that continues it. What that
    assignment fetched ahead (here its high-water mark, 5,000) predates the next read: taken for
    the end, offsets 5,000-5,099 written since would be reported missing (and the tracker would
    close them unredelivered). Checked: with the kept assignment's mark counted, this fails."""
    from tests.helpers.kafka import wait_until

    cfg, q = queue_topics(partitions=1)
    produce(cfg, q.name, 5000, values=b"v%d")
    reader = _reader(cfg, kafka_client)
    try:
        first = reader.read(q.name, 0, [(0, 100)])
        assert sorted(first.records) == list(range(100)) and first.missing == [] and first.log_end is None
        if kafka_client == "confluent":
            from confluent_kafka import TopicPartition

            assert reader._parked is not None  # else this test shows nothing of the kept assignment
            # The kept assignment has fetched up to the end as it stood (its mark is 5,000).
            wait_until(lambda: reader._consumer.get_watermark_offsets(TopicPartition(q.name, 0), cached=True)[1] == 5000,
                       timeout=10, what="the kept assignment's fetch of the log end")
        produce(cfg, q.name, 100, values=b"v%d", start=5000)
        on = reader.read(q.name, 0, [(100, 5000)])
        assert on.missing == [] and on.log_end is None
        assert sorted(on.records) == list(range(100, 5100)) and on.records[5050].value == b"v5050"
        # Going on past the end: the end is this read's own.
        past = reader.read(q.name, 0, [(5100, 10)])
        assert past.records == {} and past.missing == [] and past.log_end == 5100
    finally:
        reader.close()


def test_confluent_reads_a_backlog_chunk_after_chunk_from_one_assignment(queue_topics):
    """A new assignment per chunk threw away what librdkafka had fetched ahead and fetched it again
    (a chunk of 25,000 took twice as long as in one read): reads that go on where the last one
    stopped keep the assignment, until the reader is released or reads elsewhere."""
    cfg, q = queue_topics(partitions=1)
    produce(cfg, q.name, 12_000, values=b"v%d")
    reader = _reader(cfg, "confluent")
    assigned: list[dict] = []
    real_assign = reader._assign

    def assign(at, active, fresh):
        assigned.append(dict(at))
        real_assign(at, active, fresh)

    reader._assign = assign
    try:
        for first in range(0, 10_000, 2000):
            got = reader.read(q.name, 0, [(first, 2000)])
            assert sorted(got.records) == list(range(first, first + 2000)) and got.missing == []
            assert got.records[first + 1999].value == b"v%d" % (first + 1999)
        assert [a[(q.name, 0)] for a in assigned] == [0]
        # Released: the next read assigns anew, even where the last read stopped.
        reader.release()
        assert sorted(reader.read(q.name, 0, [(10_000, 10)]).records) == list(range(10_000, 10_010))
        # Elsewhere (backwards here): assigned anew.
        assert sorted(reader.read(q.name, 0, [(5, 5)]).records) == list(range(5, 10))
        assert [a[(q.name, 0)] for a in assigned] == [0, 10_000, 5]
    finally:
        reader.close()
