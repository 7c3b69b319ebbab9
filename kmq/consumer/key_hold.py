"""``consumer.ordering: key`` in the consumer: what settlements, ended leases and the time tell
the keyed ready queue (:class:`~kmq.consumer.keyed_ready.KeyedReadyQueue`).

An ack or reject releases the message's key; a nack or an abandon (or a lease that ended in user
code) keeps it blocked until the tracker's copy comes, unless that was the last delivery (the
tracker dead-letters it); a key whose copy does not come within ``copy_wait`` is released with a
warning (docs/protocol.md, "Key order").
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kmq.config import QueueConfig
from kmq.consumer.keyed_ready import KeyedReadyQueue
from kmq.core.message import ACK, NACK, REJECT, KmqMessage
from kmq.core.settlement import Released
from kmq.telemetry.metrics import ConsumerMetrics

__all__ = ["KeyHold"]

log = logging.getLogger(__name__)


class KeyHold:
    """The consumer's side of ``keyed``: ``copy_wait`` is how long a key waits for a failed
    message's copy before it is released."""

    def __init__(self, keyed: KeyedReadyQueue, queue: QueueConfig, metrics: ConsumerMetrics, copy_wait: float) -> None:
        self.keyed = keyed
        self.copy_wait = copy_wait
        self._queue = queue
        self._metrics = metrics

    def settled(self, msg: KmqMessage, outcome: str, arg: Any) -> None:
        """``msg`` was settled (``outcome``, ``arg`` as a settler hears them; None: its lease ended)."""
        # A NACK "not a delivery" (Released) counts none: its copy comes, whatever the count.
        final = outcome is ACK or outcome is REJECT or (
            msg.delivery_count >= self._queue.max_deliveries and not isinstance(arg, Released))
        delay = float(arg) if outcome is NACK else 0.0
        self.keyed.settled(msg, final, 0.0 if final else time.monotonic() + delay + self.copy_wait)

    def settled_late(self, msg: KmqMessage, outcome: str) -> None:
        """A message settled after its lease ran out (its key awaits the copy): an ack or reject
        releases the key; the copy, if the tracker made one, is then handed in offset order."""
        if outcome is ACK or outcome is REJECT:
            self.keyed.settled_late(msg)

    def look(self, now: float) -> None:
        """Release keys whose copy did not come in time; publish the held gauges."""
        keyed, name, metrics = self.keyed, self._queue.name, self._metrics
        released = keyed.expire(now)
        if released:
            metrics.ordering_released.labels(name).inc(len(released))
            r = released[0]
            log.warning("%s: %d key(s) (first %r of partition %d) waited longer than %gs for the copy of a failed "
                        "message (first %s/%d/%d): released, their later messages go on and that copy, if it comes, "
                        "may be handled after some of them", name, len(released), r.key, r.partition, self.copy_wait,
                        name, r.partition, r.origin)
        metrics.ordering_held.labels(name).set(keyed.held)
        metrics.ordering_keys_blocked.labels(name).set(keyed.blocked_keys())
