"""KmqMessages made without a consumer, with a settler that records what they were told (no I/O)."""

from __future__ import annotations

import threading

from kmq.core.message import KmqMessage


class Recorder:
    """A settler that records every settlement and renewal, in order: ``(offset, outcome, arg)``."""

    def __init__(self):
        self.calls = []

    def settled(self, msg, outcome, arg):
        self.calls.append((msg.offset, outcome, arg))

    def renewed(self, msg, lease):
        self.calls.append((msg.offset, "renew", lease))


def make(offset=5, headers=None, settler=None):
    """A message of ``orders`` partition 2 (key ``k``, value ``v``) settled into ``settler`` (a new :class:`Recorder`)."""
    return KmqMessage("orders", 2, offset, b"k", b"v", headers, 1000, settler or Recorder(), threading.Lock())
