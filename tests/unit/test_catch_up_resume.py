"""The tracker's catch-up when the committed markers offset is past the log end (the topic was
recreated or truncated): it seeks to the log start, and a position the client cannot tell yet is
asked again later, never taken for an offset."""

from __future__ import annotations

from kmq.config import Config
from kmq.core.lease_state import PartitionState
from kmq.telemetry.metrics import TrackerMetrics
from tracker.catch_up import CatchUp
from tracker.partition import OwnedPartition

Q = Config.from_dict({"queues": [{"name": "q", "lease": "1s"}]}).queues[0]


class Consumer:
    """A group consumer whose positions are scripted: each call to position() takes the next."""

    def __init__(self, positions: list[int | None]) -> None:
        self.positions = positions
        self.sought: list = []

    def position(self, topic: str, partition: int) -> int | None:
        return self.positions.pop(0) if self.positions else None

    def seek_to_beginning(self, partitions) -> None:
        self.sought.extend(partitions)


def owned(resume_from: int, target: int) -> OwnedPartition:
    state = PartitionState(Q.backoff.delay, Q.max_deliveries)
    state.position = resume_from
    o = OwnedPartition(Q, ("q__markers", 0), state, positioned=True)
    o.resume_from, o.target = resume_from, target
    return o


def catch_up(o: OwnedPartition) -> CatchUp:
    up = CatchUp(TrackerMetrics(), lambda o: None, lambda: 0, per_step=10)
    up.pending = {o.tp}
    return up


def reached(up: CatchUp, o: OwnedPartition, c: Consumer) -> bool:
    """One step's catch-up check (the target is read already: no look-up, so no log reader)."""
    return o in up.update({o.tp: o}, c, hw_reader=None)


def test_a_committed_offset_past_the_log_end_seeks_to_the_start_and_resumes_there():
    o, c = owned(resume_from=50, target=20), Consumer([50, 5])
    assert not reached(catch_up(o), o, c)  # from the log start (5) on, the target (20) is ahead
    assert c.sought == [("q__markers", 0)]
    assert o.state.position == 5 and o.resume_from is None


def test_a_log_start_the_client_cannot_tell_yet_is_asked_again_not_compared():
    o, c = owned(resume_from=50, target=20), Consumer([50, None])
    up = catch_up(o)
    assert not reached(up, o, c)  # no TypeError: the position is not known yet
    assert c.sought == [("q__markers", 0)]
    assert o.state.position is None and o.resume_from == 50  # the first record read tells the gap
    c.positions = [3]
    assert not reached(up, o, c) and o.state.position == 3
