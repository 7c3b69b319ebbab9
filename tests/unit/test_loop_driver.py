"""kmq.consumer.loop_driver: the fetcher step on the event loop never waits there."""

from __future__ import annotations

import threading
import time

from kmq.consumer.fetch_pipeline import FetchPipeline, SeekBack
from kmq.consumer.fetcher import FetcherParts
from kmq.consumer.loop_driver import LoopFetcher
from kmq.telemetry.metrics import ConsumerMetrics


class Member:
    """The group member's part a seek back uses: its assignment and seek."""

    def __init__(self) -> None:
        self.sought: list[tuple[str, int, int]] = []

    def assignment(self) -> set[tuple[str, int]]:
        return {("q", 0)}

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self.sought.append((topic, partition, offset))


def test_a_seek_back_notes_its_rest_for_the_driver_instead_of_waiting_on_the_loop():
    rested: list[float] = []
    blocking = threading.Event()

    def rest(seconds: float) -> None:  # the threaded consumer's: its stop event's wait
        rested.append(seconds)
        blocking.wait(seconds)

    parts = FetcherParts("q", "q", FetchPipeline(5.0, 5.0), writer=None, ready=None, build=lambda *a: None,
                         hand_over=lambda a: None, fetched=lambda b: None, metrics=ConsumerMetrics(), wake=threading.Event(),
                         rest=rest)
    member = Member()
    step = LoopFetcher(parts, member)
    began = time.monotonic()
    step.run([SeekBack({0: 7}, "a commit kept failing", start_failed=False)])
    assert time.monotonic() - began < 0.2 and not rested
    assert member.sought == [("q", 0, 7)] and step.rest_due == 0.5
