"""Closing's give-back (kmq.consumer.give_back): leases are handed off before each commit back."""

from __future__ import annotations

import threading

from kmq.consumer.fetch_pipeline import FetchPipeline
from kmq.consumer.give_back import give_back_on_close
from kmq.core.message import KmqMessage

LOCK = threading.Lock()


class Settled:
    def __init__(self) -> None:
        self.outcomes: list[tuple[int, int, str]] = []

    def settled(self, msg: KmqMessage, outcome: str, arg: object) -> None:
        self.outcomes.append((msg.partition, msg.offset, outcome))


class GroupClient:
    """What give_back_on_close uses of the client seam; the first ``refuse`` commits fail."""

    def __init__(self, owned: set[int], refuse: int = 0) -> None:
        self.owned, self.refuse, self.calls = owned, refuse, []

    def assignment(self) -> set[tuple[str, int]]:
        return {("q", p) for p in self.owned}

    def commit(self, offsets: dict) -> None:
        self.calls.append(("commit", dict(offsets)))
        if self.refuse:
            self.refuse -= 1
            raise RuntimeError("RebalanceInProgressError")

    def fetch(self, timeout: float, max_records: int) -> list:
        self.calls.append(("poll",))
        return []


def test_every_commit_back_follows_the_hand_off_of_what_it_returns_and_a_changed_plan_is_handed_off_again():
    settler = Settled()
    ready = [KmqMessage("q", p, o, None, b"v", [], 0, settler, LOCK) for p, o in [(0, 5), (0, 6), (1, 2)]]
    pipe = FetchPipeline(start_timeout=5.0, commit_timeout=10.0)
    pipe.assigned({0, 1})
    kc = GroupClient({0, 1}, refuse=1)

    def hand_off(offsets: dict[int, list[int]]) -> None:
        kc.calls.append(("hand_off", {p: sorted(o) for p, o in offsets.items()}))

    def plan(assigned: set[int]):
        if kc.calls.count(("poll",)) == 1 and 1 in pipe.owned:
            pipe.revoked({1})  # the poll that completed a rebalance took partition 1
            kc.owned = {0}
        return pipe.close_plan([(ready, 0)], assigned)

    nacked = give_back_on_close(kc, "q", plan, lambda: None, session_timeout=6.0, hand_off=hand_off)
    assert kc.calls == [
        ("hand_off", {0: [5, 6], 1: [2]}), ("commit", {("q", 0): 5, ("q", 1): 2}),  # refused: a rebalance
        ("poll",),
        ("hand_off", {0: [5, 6]}), ("commit", {("q", 0): 5}),  # partition 1 went meanwhile: only 0
    ]
    assert nacked and ("nack" in {o for p, _, o in settler.outcomes if p == 1})
