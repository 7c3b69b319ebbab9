"""A tracker interrupted in the middle of redelivering a crash-sized backlog, with real processes.

A fleet that crashed leaves every message of its last fetches STARTed and never ENDed:
when their leases end, one tracker redelivers them in one large step. Such a step runs
with Python's cyclic garbage collector paused and holds tens of thousands of originals
and copies in memory, and it is the longest window between a copy produced and its
CLOSED marker. Here that window is hit for real:

* SIGKILL: the tracker dies mid-step; a second tracker replays the markers and
  redelivers whatever the first did not close;
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

import pytest
from kafka import KafkaConsumer, TopicPartition

from kmq.bench.consumer import _produce
from kmq.core.markers import Start
from tests.helpers.kafka import wait_until
from tests.integration.tracker_util import MarkerProducer, TrackerProcess, headers, metric

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(300)]

#: Originals STARTed by the crashed fleet: well above the step size that pauses the
#: collector (tracker.redeliver._GC_PAUSE_OFFSETS), and long enough to copy (a second or
#: more on either client) for the interruption to land inside the step.
N = 40_000
LEASE_MS = 2_000


class QueueEnd:
    """The queue partition's end offset (originals + copies acknowledged so far)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.tp = TopicPartition(topic, 0)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)

    def __call__(self) -> int:
        return self.consumer.end_offsets([self.tp])[self.tp]

    def close(self) -> None:
        self.consumer.close()


def _interrupt_mid_step(tracker: TrackerProcess, end: QueueEnd, sig: int, timeout: float = 120.0) -> int:
    """Send ``sig`` to ``tracker`` once a tenth, not all, of the backlog's copies are written;
    return how many were. Fails (rather than pass without testing the window) when the
    step was never seen in progress."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        copies = end() - N
        if copies >= N:
            raise AssertionError(f"the tracker copied all {N} before the test could interrupt it: "
                                 "raise N so the step lasts longer than one end-offset look-up")
        if copies >= N // 10:
            os.kill(tracker.proc.pid, sig)
            return copies
        if tracker.proc.poll() is not None:
            raise AssertionError(f"tracker exited with {tracker.proc.returncode}: {tracker.log_path.read_text()[-2000:]}")
        time.sleep(0.005)
    raise AssertionError(f"no copy within {timeout}s: {tracker.log_path.read_text()[-2000:]}")


def _copies_by_origin(bootstrap: str, topic: str, timeout: float, upto: int | None = None) -> collections.Counter:
    """Copies per origin in the queue partition: read until every original has one, or with
    ``upto`` until that end offset; at most ``timeout`` seconds."""
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
    finally:
        c.close()
    return copies


def _setup(queue_topics, kafka_client):
    cfg, q = queue_topics(1, queue={"lease": f"{LEASE_MS}ms", "max_deliveries": 5}, tracker={"tick": "50ms"},
                          kafka={"client": kafka_client})
    bootstrap = cfg.kafka.bootstrap_servers
    _produce(bootstrap, q.name, N, 20, 1, kafka_client)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    markers.send(0, Start([(0, N)], lease_ms=LEASE_MS, owner="crashed-fleet"))
    markers.close()
    return cfg, q, bootstrap


def _assert_nothing_lost(copies: collections.Counter, q, interrupted_at: int, how: str) -> None:
    missing = N - len(copies)
    assert missing == 0, f"{missing} of {N} originals never redelivered after the {how}"
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
        at = _interrupt_mid_step(a, end, signal.SIGKILL)
        a.proc.wait(10)
        b = TrackerProcess(cfg, tmp_path)
        b.wait_port()
        copies = _copies_by_origin(bootstrap, q.name, timeout=120)
        _assert_nothing_lost(copies, q, at, "SIGKILL")
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
        at = _interrupt_mid_step(a, end, signal.SIGSTOP)
        b = TrackerProcess(cfg, tmp_path)  # joins; gets the partition once the frozen one's session ends
        b.wait_ready(60)
        _assert_nothing_lost(_copies_by_origin(bootstrap, q.name, timeout=120), q, at, "SIGSTOP")
        # The zombie wakes up, finishes its step (more copies, never fewer), notices it stood
        # still past its session and drops its state instead of trusting it.
        os.kill(a.proc.pid, signal.SIGCONT)
        wait_until(lambda: metric(a_port, "kmq_tracker_stale_copies_total", queue=q.name) > 0, 60,
                   what="the resumed tracker counting its stale copies")
        everything = _copies_by_origin(bootstrap, q.name, timeout=120, upto=end())
        _assert_nothing_lost(everything, q, at, "SIGSTOP and SIGCONT")
        assert a.proc.poll() is None, a.log_path.read_text()[-2000:]  # no crash over its fenced step
    finally:
        if a.proc.poll() is None:
            os.kill(a.proc.pid, signal.SIGCONT)
        end.close()
        a.close()
        if b is not None:
            b.close()
