"""A tracker interrupted in the middle of redelivering a crash-sized backlog, with real processes.

A fleet that crashed leaves every message of its last fetches STARTed and never ENDed:
when their leases end, one tracker redelivers them in one large step. Such a step runs
with Python's cyclic garbage collector paused and holds tens of thousands of originals
and copies in memory, and it is the longest window between a copy produced and its
CLOSED marker. Here that window is hit for real:

* SIGKILL: the tracker dies mid-step; a second tracker replays the markers and
  redelivers whatever the first did not close;
* a broker restart: the step's copies, CLOSED markers and commit fail part-way and
  are retried (a dev broker with durable storage);
* SIGSTOP: the tracker freezes mid-step (a VM pause, a debugger), a second tracker
  takes its partition when the session times out, and then the first one resumes
  its step as a zombie: it writes the rest of its copies, notices it stood still
  past its session, and drops its state rather than trusting it.

Either way every original has a copy (nothing lost), and no original has more than
two (one by each tracker: duplicates stay within the interrupted step).
"""

from __future__ import annotations

import collections
import os
import signal
import time
from typing import Callable

import pytest
from kafka import KafkaConsumer, TopicPartition

from kmq.bench.consumer import _produce
from kmq.client.topics import ensure_topics
from kmq.config import Config
from kmq.dev.broker import DevBroker
from kmq.dev.kafka import KafkaCluster
from kmq.core.markers import Start
from kmq.core.ranges import coalesce
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import DUPLICATE_SEQUENCE_GAP, broker_kind, own_broker, wait_until
from tests.integration.tracker_util import MarkerProducer, TrackerProcess, headers, markers_covering, metric

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(300)]

#: Originals STARTed by the crashed fleet: well above the step size that pauses the
#: collector (tracker.redeliver._GC_PAUSE_OFFSETS), and long enough to copy (a second or
#: more on either client) for the interruption to land inside the step.
N = 40_000
LEASE_MS = 2_000
QUEUE = {"lease": f"{LEASE_MS}ms", "max_deliveries": 5}


class CopiesSeen:
    """How many copies the queue partition holds so far, counted by reading them: the end
    offset (ListOffsets) of a dev broker on durable storage lags behind its records (so do
    its fetches: once the tracker stops writing, the last few thousand copies were seen to
    stay unreadable for minutes)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        tp = TopicPartition(topic, 0)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
        self.consumer.assign([tp])
        self.consumer.seek(tp, N)
        self.count = 0

    def __call__(self) -> int:
        self.count += sum(len(recs) for recs in self.consumer.poll(timeout_ms=5, max_records=10_000).values())
        return self.count

    def close(self) -> None:
        self.consumer.close()


class QueueEnd:
    """The queue partition's end offset (originals + copies acknowledged so far)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.tp = TopicPartition(topic, 0)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)

    def __call__(self) -> int:
        return self.consumer.end_offsets([self.tp])[self.tp]

    def close(self) -> None:
        self.consumer.close()


def _interrupt_mid_step(tracker: TrackerProcess, bootstrap: str, topic: str, interrupt: Callable[[], None],
                        timeout: float = 120.0, end: QueueEnd | None = None, open_step: Callable[[], bool] | None = None,
                        least: int = N // 10, recovers: bool = False) -> int:
    """Call ``interrupt()`` once ``least`` (a tenth), not all, of the backlog's copies are written
    by ``tracker``; return how many were. Fails (rather than pass without testing the window)
    when the step was never seen in progress.

    With ``end`` (a broker whose end offset is current: in memory), progress is the end offset,
    and after the interrupt it must still be short of every copy: the step's flush had not
    finished, so the tracker was inside it. Without it (durable storage, whose end offset and
    fetches lag), progress is counted by reading the copies, which can lag far behind a fast
    tracker: then ``open_step()`` must still say, just before the interrupt, that the step's
    CLOSED markers are not written."""
    seen = CopiesSeen(bootstrap, topic) if end is None else (lambda: end() - N)
    deadline = time.monotonic() + timeout
    copies = 0
    try:
        while time.monotonic() < deadline:
            copies = seen()
            if copies >= N:
                raise AssertionError(f"the tracker copied all {N} before the test could interrupt it: "
                                     "raise N so the step lasts longer than one poll")
            if copies >= least:
                if open_step is not None and not open_step():
                    raise AssertionError(f"the tracker closed the whole step before the test saw more than {copies} "
                                         "copies (reading them lags): the interrupt would miss the step; raise N")
                interrupt()
                # ``recovers``: the interrupt returns once the tracker can go on (a broker restarted), so
                # the copies it writes after are no sign the interrupt missed the step.
                if end is not None and not recovers and end() - N >= N:
                    raise AssertionError(f"every copy was written by the time the interrupt landed (seen at "
                                         f"{copies}): it missed the step; raise N so the step lasts longer")
                return copies
            if tracker.proc.poll() is not None:
                raise AssertionError(f"tracker exited with {tracker.proc.returncode}: "
                                     f"{tracker.log_path.read_text()[-2000:]}")
    finally:
        if isinstance(seen, CopiesSeen):
            seen.close()
    # Tells a tracker that never copied from copies written but not read back yet (durable storage lags).
    try:
        step = "" if open_step is None else (" (by the tracker's own count not every copy is written yet)" if open_step()
                                             else " (by the tracker's own count every copy is written: the read lags)")
    except Exception as exc:  # noqa: BLE001 - the tracker's metrics endpoint may be gone; the failure stands
        step = f" (the tracker's own count could not be read: {exc})"
    raise AssertionError(f"{copies} copies read within {timeout}s{step}: {tracker.log_path.read_text()[-2000:]}")


#: How long the copies are read once the tracker says it closed every original: they are all
#: acknowledged then, so this only bounds the read of records known to be in the log.
SETTLED_READ_S = 30.0


def _copies_by_origin(bootstrap: str, topic: str, timeout: float, upto: int | None = None,
                      offsets: list[int] | None = None, settled: Callable[[], bool] | None = None,
                      ) -> collections.Counter:
    """Copies per origin in the queue partition: read until every original has one, or with
    ``upto`` until that end offset; at most ``timeout`` seconds, and at most
    :data:`SETTLED_READ_S` more once ``settled()`` says the tracker closed everything. With
    ``offsets``, the copies' offsets are appended to it."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      max_poll_records=5_000)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek(tp, N)  # the copies come after the originals
    copies: collections.Counter = collections.Counter()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and (len(copies) < N if upto is None else c.position(tp) < upto):
            for recs in c.poll(timeout_ms=200).values():
                for r in recs:
                    copies[headers(r)["kmq-origin"]] += 1
                    if offsets is not None:
                        offsets.append(r.offset)
            if settled is not None and settled():
                deadline = min(deadline, time.monotonic() + SETTLED_READ_S)
                settled = None
    finally:
        c.close()
    return copies


def _setup(queue_topics, kafka_client, broker: DevBroker | KafkaCluster | None = None, kafka: dict | None = None, **sections):
    if broker is None:
        cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    else:
        cfg = Config.from_dict({
            "kafka": {"bootstrap_servers": broker.bootstrap, **TEST_GROUP_TIMING, "client": kafka_client, **(kafka or {})},
            "queues": [{"name": unique("q"), **QUEUE}],
            "tracker": {"group_id": unique("tracker"), "http_port": 0, "tick": "50ms"},
            **sections,
        })
        q = cfg.queues[0]
        ensure_topics(cfg.kafka, q, 1)
    bootstrap = cfg.kafka.bootstrap_servers
    _produce(bootstrap, q.name, N, 20, 1, kafka_client)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    markers.send(0, Start([(0, N)], lease_ms=LEASE_MS, owner="crashed-fleet"))
    markers.close()
    return cfg, q, bootstrap


def _offset_holes(offsets: list[int]) -> list:
    """Offsets of the queue partition, from the first copy's on, that hold no record."""
    return coalesce(sorted(set(range(N, max(offsets) + 1)).difference(offsets))) if offsets else []


def _assert_nothing_lost(copies: collections.Counter, q, interrupted_at: int, how: str, bootstrap: str,
                         tracker: TrackerProcess, offsets: list[int] | None = None) -> None:
    missing = N - len(copies)
    if missing:
        lost = coalesce(i for i in range(N) if copies[f"{q.name}/0/{i}"] == 0)
        log = tracker.log_path.read_text()[-4000:]
        holes = f"; offsets without a record: {_offset_holes(offsets)[:10]}" if offsets is not None else ""
        raise AssertionError(f"{missing} of {N} originals never redelivered after the {how}: offsets {lost[:10]}{holes}; "
                             f"markers covering {lost[0].first}: "
                             f"{markers_covering(bootstrap, q.markers_topic, f'{q.name}/0/{lost[0].first}')}\n{log}")
    assert set(copies) == {f"{q.name}/0/{i}" for i in range(N)}
    most = max(copies.values())
    dups = sum(copies.values()) - N
    # One copy by each tracker at most: the second one's replay starts at the first one's last commit.
    assert most <= 2, f"an original was copied {most} times"
    print(f"{how} after {interrupted_at} of {N} copies: 0 lost, {dups} duplicate copies")


# kafka_client: both trackers' reads of originals, copies and CLOSED markers on each client.
def test_a_tracker_sigkilled_mid_way_through_a_crash_sized_step_loses_nothing(queue_topics, tmp_path, kafka_client):
    cfg, q, bootstrap = _setup(queue_topics, kafka_client)
    end = QueueEnd(bootstrap, q.name)
    a = TrackerProcess(cfg, tmp_path)
    b = None
    try:
        a.wait_port()
        at = _interrupt_mid_step(a, bootstrap, q.name, lambda: os.kill(a.proc.pid, signal.SIGKILL), end=end)
        a.proc.wait(10)
        b = TrackerProcess(cfg, tmp_path)
        b.wait_port()
        copies = _copies_by_origin(bootstrap, q.name, timeout=120)
        _assert_nothing_lost(copies, q, at, "SIGKILL", bootstrap, b)
    finally:
        end.close()
        a.close()
        if b is not None:
            b.close()


def test_a_tracker_frozen_mid_step_then_resumed_as_a_zombie_loses_nothing(queue_topics, tmp_path, kafka_client):
    cfg, q, bootstrap = _setup(queue_topics, kafka_client)
    end = QueueEnd(bootstrap, q.name)
    a = TrackerProcess(cfg, tmp_path)
    b = None
    try:
        a_port = a.wait_port()
        at = _interrupt_mid_step(a, bootstrap, q.name, lambda: os.kill(a.proc.pid, signal.SIGSTOP), end=end)
        b = TrackerProcess(cfg, tmp_path)  # joins; gets the partition once the frozen one's session ends
        b.wait_ready(60)
        _assert_nothing_lost(_copies_by_origin(bootstrap, q.name, timeout=120), q, at, "SIGSTOP", bootstrap, b)
        # The zombie wakes up, finishes its step (more copies, never fewer), notices it stood
        # still past its session and drops its state instead of trusting it.
        os.kill(a.proc.pid, signal.SIGCONT)
        # Up to a delivery timeout (31 s) per chunk of the step, if its sends timed out while frozen.
        wait_until(lambda: metric(a_port, "kmq_tracker_stale_copies_total", queue=q.name) > 0, 120,
                   what="the resumed tracker counting its stale copies")
        everything = _copies_by_origin(bootstrap, q.name, timeout=120, upto=end())
        _assert_nothing_lost(everything, q, at, "SIGSTOP and SIGCONT", bootstrap, a)
        assert a.proc.poll() is None, a.log_path.read_text()[-2000:]  # no crash over its fenced step
    finally:
        if a.proc.poll() is None:
            os.kill(a.proc.pid, signal.SIGCONT)
        end.close()
        a.close()
        if b is not None:
            b.close()


#: What each client's producer logs when a batch is answered so, and the settings that show it:
#: kafka-python's sender at DEBUG; librdkafka with its debug contexts (through kmq.librdkafka).
_DUPLICATE_ANSWER = {"kafka-python": "Received DUPLICATE_SEQUENCE_NUMBER", "confluent": "DUPSEQ"}
_PRODUCER_DEBUG = {"kafka-python": {"logging": {"debug": "kafka.producer.sender"}},
                   "confluent": {"logging": {"debug": "kmq.librdkafka"}, "kafka": {"librdkafka_debug": "eos,msg"}}}


def _skip_if_the_broker_dropped_a_batch_it_called_duplicate(copies: collections.Counter, offsets: list[int], q,
                                                            tracker: TrackerProcess, kafka_client: str) -> None:
    """Skip, naming the gap, only when the loss is what the gap leaves and the gap is seen: the
    originals missing a copy are one run (one producer batch), and either the queue partition has a
    hole of that size where their copies were given offsets (the broker assigned them and kept no
    record), or the tracker's producer logged the broker's DUPLICATE_SEQUENCE_NUMBER answer (when
    the broker had not advanced its offsets either). Any other loss fails the test."""
    missing = N - len(copies)
    if not missing:
        return
    lost = coalesce(i for i in range(N) if copies[f"{q.name}/0/{i}"] == 0)
    if len(lost) != 1:
        return
    holes = _offset_holes(offsets)
    if [h.count for h in holes] == [lost[0].count]:
        pytest.skip(f"tansu gap: {DUPLICATE_SEQUENCE_GAP} (seen here: the copies of originals {lost[0]} are "
                    f"missing and the queue partition's offsets {holes[0]} hold no record)")
    if not holes and _DUPLICATE_ANSWER[kafka_client] in tracker.log_path.read_text(errors="replace"):
        pytest.skip(f"tansu gap: {DUPLICATE_SEQUENCE_GAP} (seen here: the copies of originals {lost[0]} are "
                    f"missing, and the tracker's producer was answered DUPLICATE_SEQUENCE_NUMBER)")


# kafka_client: each client's producer and group membership through the outage.
def test_a_broker_restart_mid_way_through_a_crash_sized_step_loses_nothing(tmp_path, kafka_client):
    broker = own_broker(tmp_path)
    broker.start()
    try:
        # The producer's answers in the tracker's log: the line that tells the gap from a loss.
        cfg, q, bootstrap = _setup(None, kafka_client, broker, **_PRODUCER_DEBUG[kafka_client])
        a = TrackerProcess(cfg, tmp_path)
        # Apache Kafka's end offsets are current on disk too: progress is the end offset, seen as soon
        # as a copy is written. tansu on S3 storage answers them late: progress is the copies read.
        end = QueueEnd(bootstrap, q.name) if broker_kind() == "kafka" else None
        try:
            port = a.wait_port()
            # From the first copy seen: reading them lags on durable storage. The step is open until
            # its copies are counted redelivered, which the tracker does just before writing their
            # CLOSED markers (the in-flight gauge is published between steps, not during one).
            at = _interrupt_mid_step(a, bootstrap, q.name, broker.restart, least=1, end=end, recovers=True,
                                     open_step=lambda: metric(port, "kmq_tracker_redelivered_total", queue=q.name) < N)

            def settled() -> bool:
                return (metric(port, "kmq_tracker_ready") == 1 and metric(port, "kmq_tracker_in_flight", queue=q.name) == 0
                        and metric(port, "kmq_tracker_redelivered_total", queue=q.name) >= N)

            offsets: list[int] = []
            copies = _copies_by_origin(bootstrap, q.name, timeout=180, offsets=offsets, settled=settled)
            _skip_if_the_broker_dropped_a_batch_it_called_duplicate(copies, offsets, q, a, kafka_client)
            _assert_nothing_lost(copies, q, at, "broker restart", bootstrap, a, offsets)
            assert a.proc.poll() is None, a.log_path.read_text()[-2000:]
        finally:
            a.close()
            if end is not None:
                end.close()
    finally:
        broker.stop()
