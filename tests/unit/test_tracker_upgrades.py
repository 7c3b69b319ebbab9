"""Markers of a newer wire version than the tracker reads, on its main loop (in-memory Kafka).

Workers upgraded before the trackers (a rolling upgrade) write markers the trackers do not
know yet. At-least-once must hold across it: a START of a newer version must not lose its
lease, an END of one must not make an acked message be copied, and a marker the tracker
cannot read at all must be neither skipped nor guessed at (docs/protocol.md, "Rolling upgrades").
"""

from __future__ import annotations

import logging

from kmq.core.markers import Closed, End, Start, decode_record, encode, encode_key
from tests.helpers.tracker_step import EXPIRED_MS, PARTITIONS, Harness

TICK_S = 0.05


def newer(marker, version: int = 3, appended: bytes = b"\x00\x07later fields") -> bytes:
    """``marker`` as a later version writes it: the version-1 layout with fields appended."""
    return bytes([version]) + encode(marker)[1:] + appended


def write(h: Harness, p: int, value: bytes, ts_ms: int | None = None) -> int:
    ts = int(h.time.wall * 1000) if ts_ms is None else ts_ms
    return h.kafka.append(h.q.markers_topic, p, encode_key(p), value, timestamp=ts)


def run_for(h: Harness, seconds: float) -> None:
    h.steps(round(seconds / TICK_S))


def test_markers_of_a_newer_version_are_read_by_their_version_1_fields(caplog):
    caplog.set_level(logging.WARNING)
    h = Harness()
    run_for(h, 0.2)
    for o in range(2):
        h.kafka.append(h.q.name, 0, b"k%d" % o, b"v%d" % o)
    write(h, 0, newer(Start([(0, 2)], lease_ms=1000, owner="w2")))  # a newer worker's START: its lease holds
    run_for(h, 0.3)
    write(h, 0, newer(End([(0, 1)]), version=4))  # the first is acked; the second's worker dies
    run_for(h, 3)
    # The acked one is not copied; the abandoned one is, once (a START skipped would have lost it).
    assert [r.key for r in h.kafka.records(h.q.name, 0)[2:]] == [b"k1"]
    assert h.tracker.partitions[(h.q.markers_topic, 0)].state.in_flight == 0
    assert h.metric("newer_markers", h.q.name, "3", "read") == 1 and h.metric("newer_markers", h.q.name, "4", "read") == 1
    assert h.metric("bad_markers") == 0
    assert caplog.text.count("markers of wire version 3 are read by their version-2 fields") == 1


def test_a_marker_the_tracker_cannot_read_holds_its_partition_and_nothing_is_skipped_or_closed(caplog):
    h = Harness()
    run_for(h, 0.2)
    m = h.q.markers_topic
    for o in range(3):
        h.kafka.append(h.q.name, 0, b"k%d" % o, b"v%d" % o)
    write(h, 0, encode(Start([(0, 1)], lease_ms=1000, owner="w")))
    run_for(h, 0.2)
    # A type a later version added, for message 1: this tracker cannot know what it means.
    held_at = write(h, 0, b"\x03\x09" + encode(End([(1, 1)]))[2:] + b"body of a later type")
    write(h, 0, encode(End([(0, 1)])))  # message 0 acked, after it
    write(h, 0, encode(Start([(2, 1)], lease_ms=1000, owner="w")))
    h.kafka.append(h.q.name, 1, b"p1", b"v")  # partition 1: an abandoned message, as usual
    write(h, 1, encode(Start([(0, 1)], lease_ms=1000, owner="w")), ts_ms=int(h.time.wall * 1000) - EXPIRED_MS)
    run_for(h, 5)
    # Its committed offset never passes the marker, so a tracker that reads it resumes from it ...
    assert h.consumer.commits[(m, 0)] <= held_at
    # ... nothing there is copied, closed or skipped, and nothing after it applied ...
    markers = [decode_record(r.key, r.value, 0) for r in h.kafka.records(m, 0)]
    assert len(h.kafka.records(h.q.name, 0)) == 3 and h.metric("bad_markers") == 0
    assert not any(isinstance(x, Closed) for x in markers)
    owned = h.tracker.partitions[(m, 0)]
    assert owned.held == (held_at, 3) and owned.state.position == held_at
    # ... and the other partitions go on; the tracker stays up, ready, and says why.
    assert h.copies()[1] == 1
    assert h.metric("held_partitions", h.q.name) == 1 and h.metric("newer_markers", h.q.name, "3", "held") == 1
    ok, detail = h.tracker.ready()
    assert ok and "1 held at a marker of a newer wire version (upgrade the tracker)" in detail and f"{m}[0]" in detail
    assert h.tracker.alive()[0]
    assert caplog.text.count("the partition is held there") == 1
    assert f"offset {held_at}: marker of wire version 3" in caplog.text and "Upgrade the tracker" in caplog.text


def test_a_partition_held_while_catching_up_does_not_keep_the_tracker_unready():
    h = Harness()
    m = h.q.markers_topic
    h.kafka.append(h.q.name, 0, b"k", b"v")
    write(h, 0, encode(Start([(0, 1)], lease_ms=1000, owner="w")), ts_ms=int(h.time.wall * 1000) - EXPIRED_MS)
    held_at = write(h, 0, newer(Start([(1, 1)], lease_ms=1000), appended=b"")[:-5])  # a START body it cannot read
    run_for(h, 1)
    assert h.tracker.partitions[(m, 0)].held == (held_at, 3)
    assert h.tracker.ready()[0] and all(h.tracker.partitions[(m, p)].caught_up for p in range(1, PARTITIONS))
    assert h.copies()[0] == 0  # a partition held before it caught up is not judged at all
