"""The tracker across rebalances and pauses, on the real broker.

* The high-water question: a markers partition revoked and assigned again to
  the same member keeps kafka-python's old high-water mark. Catch-up must not
  end on it, or the tracker redelivers before reading ENDs written during the
  rebalance.
* A paused tracker (SIGSTOP past the session timeout, SIGCONT later) must not
  act on its stale view: nothing lost, duplicates bounded and reported.
"""

from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from kafka import KafkaConsumer

from kmq.core.markers import End, Start
from kmq.client.kafka_python.group_join import keep_finished_joins
from kmq.client.topics import ensure_topics
from kmq.dev.processes import set_pdeathsig, stop_processes
from tests.conftest import unique
from tests.helpers.kafka import APP_RECORD, produce, read_all, wait_until
from tests.integration.tracker_util import QUEUE, MarkerProducer, TrackerProcess, metric, running_tracker
from tracker.service import _DUE_LIMIT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FILLER = 6000  # more markers than one poll returns (5000): catch-up needs a second fetch


#: A member of the tracker's group in its own process, on another topic: once it prints "joined" it
#: is SIGSTOPped, and a rebalance then waits for it (its session and rebalance timeouts, 30 s) until
#: SIGCONT lets it rejoin. That holds the tracker's revoke open for as long as the test needs, on any
#: broker (Apache Kafka ends a rebalance among live members within milliseconds).
HOLDER = """
import sys, time
from kafka import KafkaConsumer
from kafka.structs import MemberState
from kmq.client.kafka_python.group_join import keep_finished_joins
c = KafkaConsumer(sys.argv[2], bootstrap_servers=sys.argv[1], group_id=sys.argv[3], enable_auto_commit=False,
                  session_timeout_ms=30000, max_poll_interval_ms=30000, request_timeout_ms=40000,
                  heartbeat_interval_ms=1000)
keep_finished_joins(c)  # kafka-python 3.0 drops a join finished between short polls (slow joins on tansu)
said = False
while True:
    c.poll(timeout_ms=100)
    if c._coordinator.state is MemberState.STABLE and not said:  # in the group, with or without partitions
        print("joined", flush=True)
        said = True
"""


def _join_in_a_thread(bootstrap: str, topic: str, group: str, stop: threading.Event) -> threading.Thread:
    """A member of ``group`` on ``topic`` polling until ``stop``: its join rebalances the group."""

    def member() -> None:
        c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, session_timeout_ms=6000,
                          heartbeat_interval_ms=1000, enable_auto_commit=False)
        keep_finished_joins(c)
        try:
            while not stop.is_set():
                c.poll(timeout_ms=100)
        finally:
            c.close()

    thread = threading.Thread(target=member, daemon=True)
    thread.start()
    return thread


# kafka_client: the tracker's group membership (the other members are kafka-python members of the same group).
def test_reassigned_partition_catches_up_to_a_fresh_high_water_mark(bootstrap, queue_topics, kafka_client):
    cfg, q = queue_topics(1, queue={**QUEUE, "lease": "1s"}, kafka={"client": kafka_client})
    produce(bootstrap, q.name, 1, **APP_RECORD)
    other = unique("other")
    from kmq.config import QueueConfig

    ensure_topics(cfg.kafka, QueueConfig.named(other), 1)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    stop = threading.Event()
    thread: threading.Thread | None = None
    holder = None
    try:
        with running_tracker(cfg) as t:
            port = t.http_port
            markers.send(0, End([(999, 1)]))  # read before the rebalance: the high-water mark kafka-python keeps
            wait_until(lambda: metric(port, "kmq_tracker_markers_total", queue=q.name, type="end") == 1, 10,
                       what="first marker read")
            holder = subprocess.Popen([sys.executable, "-c", HOLDER, bootstrap, other, cfg.tracker.group_id],
                                      stdout=subprocess.PIPE, text=True, preexec_fn=set_pdeathsig)
            ready, _, _ = select.select([holder.stdout], [], [], 30)
            assert ready and holder.stdout.readline().strip() == "joined", "the holding member did not join in 30 s"
            wait_until(lambda: t.ready() == (True, "ready: 1 partition(s)"), 30, what="the tracker back after the join")
            os.kill(holder.pid, signal.SIGSTOP)
            thread = _join_in_a_thread(bootstrap, other, cfg.tracker.group_id, stop)
            wait_until(lambda: t.ready()[1] == "ready: 0 partition(s)", 20, interval=0.01, what="partition revoked")
            # Written while the partition is revoked: a START already expired (its marker time a minute ago),
            # more markers than one poll returns, then its END. Catching up to the old mark would
            # redeliver it before reading the END.
            now_ms = int(time.time() * 1000)
            markers.send(0, Start([(0, 1)], lease_ms=1000, owner="w"), ts_ms=now_ms - 60_000, flush=False)
            for i in range(FILLER):
                markers.send(0, End([(1_000_000 + i, 1)]), flush=False)
            markers.send(0, End([(0, 1)]))
            assert t.ready()[1] == "ready: 0 partition(s)", "the rebalance ended before the markers were written"
            # The held member rejoins: the group's next generation gives the partition back to the tracker.
            os.kill(holder.pid, signal.SIGCONT)
            wait_until(lambda: t.ready() == (True, "ready: 1 partition(s)"), 45, what="partition back and caught up")
            wait_until(lambda: metric(port, "kmq_tracker_markers_total", queue=q.name, type="end") == FILLER + 2, 45,
                       what="every END read")
            wait_until(lambda: metric(port, "kmq_tracker_in_flight", queue=q.name) == 0, 5, what="gauge published")
            assert metric(port, "kmq_tracker_redelivered_total", queue=q.name) == 0
        assert len(read_all(bootstrap, q.name)) == 1  # no copy of the acked message
    finally:
        stop.set()
        if holder is not None:
            os.kill(holder.pid, signal.SIGCONT)
        stop_processes([holder])
        if thread is not None:
            thread.join(10)
        markers.close()


def _story(what: str, *trackers: TrackerProcess) -> str:
    """``what`` and each tracker's log lines about ownership, pauses and copies (a failure's evidence)."""
    words = ("assigned", "revoked", "stood still", "stale", "view", "caught up", "redeliver", "commit", "duplicate")
    out = [what]
    for name, t in zip("AB", trackers):
        lines = [ln for ln in t.log_path.read_text(errors="replace").splitlines() if any(w in ln for w in words)]
        out.append(f"--- tracker {name} ({len(lines)} lines)")
        out.extend(lines[-60:])
    return "\n".join(out)


def test_a_paused_tracker_loses_nothing_and_its_stale_view_is_fenced(bootstrap, queue_topics, tmp_path, kafka_client):
    # kafka_client: the paused tracker's group membership, reader and producer (librdkafka's threads are frozen too).
    n = 200
    cfg, q = queue_topics(2, queue={"lease": "2s", "max_deliveries": 5,
                                    "backoff": {"initial": "200ms", "max": "1s", "multiplier": 2.0}},
                          kafka={"client": kafka_client})
    for p in (0, 1):
        produce(bootstrap, q.name, n, partition=p, **APP_RECORD)
    a, b = TrackerProcess(cfg, tmp_path), TrackerProcess(cfg, tmp_path)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    stopped = False
    try:
        pa, pb = a.wait_ready(60), b.wait_ready(60)
        wait_until(lambda: metric(pa, "kmq_tracker_marker_lag") + metric(pb, "kmq_tracker_marker_lag") == 0
                   and len(open(a.log_path).read().split("assigned markers partitions: q")) >= 2, 30,
                   what="both trackers own a partition")
        for p in (0, 1):  # work in flight on both partitions: leases of 2 s
            for first in range(0, n, 50):
                markers.send(p, Start([(first, 50)], lease_ms=2000, owner="w"))
        os.kill(a.proc.pid, signal.SIGSTOP)
        stopped = True
        # B takes A's partition over after the session timeout and redelivers both partitions' messages.
        originals = {f"{q.name}/{p}/{o}" for p in (0, 1) for o in range(n)}

        def origins():
            recs = read_all(bootstrap, q.name, timeout=10)
            return [dict(r.headers)["kmq-origin"].decode() for r in recs if "kmq-origin" in dict(r.headers)]

        wait_until(lambda: originals <= set(origins()), 60, interval=0.5, what="every message redelivered by B")
        os.kill(a.proc.pid, signal.SIGCONT)
        stopped = False
        wait_until(lambda: b"the process stood still for" in a.log_path.read_bytes(), 30, what="A saw its pause")
        # A drops its stale view, unless its client learnt first that the session expired and revoked
        # every partition inside the poll (librdkafka may, on its own thread): then there is none to drop.
        assert (metric(pa, "kmq_tracker_stale_views_total") >= 1
                or b"no partition is held any more, so there is no view to drop" in a.log_path.read_bytes())
        wait_until(lambda: a.proc.poll() is None and "caught up" in open(a.log_path).read().split("stood still")[-1], 30,
                   what="A rejoined and caught up")
        copies = collections.Counter(origins())
        duplicates = sum(c - 1 for c in copies.values())
        stale = metric(pa, "kmq_tracker_stale_copies_total", queue=q.name)
        # B may be in a redelivery step when A's return moves a partition back: its copies made
        # meanwhile are possible duplicates too, and reported the same way.
        stale_b = metric(pb, "kmq_tracker_stale_copies_total", queue=q.name)
        fenced = metric(pa, "kmq_tracker_fenced_commits_total")
        assert set(copies) == originals  # nothing lost
        # A copied nothing from its stale view; a pause inside a redelivery step would be counted here,
        # bounded by one step (_DUE_LIMIT offsets a partition). Every duplicate is reported.
        assert duplicates <= stale + stale_b and duplicates <= _DUE_LIMIT, _story(
            f"{duplicates} duplicate(s), {stale:.0f} stale copies reported by A, {stale_b:.0f} by B; "
            f"copied more than once: {sorted(o for o, c in copies.items() if c > 1)[:5]} ...", a, b)
        print(f"\npaused tracker: {len(originals)} messages, {len(copies)} redelivered, {duplicates} duplicates, "
              f"{stale:.0f} stale copies reported, {fenced:.0f} fenced commits")
    finally:
        if stopped:
            os.kill(a.proc.pid, signal.SIGCONT)
        markers.close()
        a.close()
        b.close()
