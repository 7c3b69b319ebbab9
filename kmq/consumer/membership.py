"""A member whose application stopped taking leaves the group, and joins again at its next take.

:class:`~kmq.core.poll_interval.PollInterval` decides (``consumer.max_poll_interval``, pure);
:class:`Membership` carries it out on the consumer's fetcher thread. Leaving gives the partitions
up as closing does (never-handed messages committed back, their leases handed off) and closes the
group consumer; messages in user code stay with this member. The next take opens a new group
consumer that joins again; a broker that cannot be reached then is tried again after
:data:`REJOIN_RETRY`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from kmq import client as client_api
from kmq.config import Config
from kmq.consumer.fetcher import Fetcher
from kmq.core.poll_interval import LEAVE, PollInterval
from kmq.telemetry.metrics import ConsumerMetrics

__all__ = ["Membership", "REJOIN_RETRY"]

log = logging.getLogger(__name__)

#: Seconds before a failed join after such a stall is tried again.
REJOIN_RETRY = 1.0


class Membership:
    """Leaving and joining again for ``step`` (the fetcher step, whose ``consumer`` is None while out).

    :param open_consumer: a new group consumer, not subscribed yet (the stall watch on it).
    :param give_back: gives the never-handed messages back, as closing does (not final).
    :param close_consumer: closes the group consumer last opened (best effort).
    """

    def __init__(self, cfg: Config, queue: str, metrics: ConsumerMetrics, step: Fetcher,
                 open_consumer: Callable[[], Any], give_back: Callable[[], None], close_consumer: Callable[[], None],
                 now: float) -> None:
        self._cfg = cfg
        self._queue = queue
        self._metrics = metrics
        self._step = step
        self._open = open_consumer
        self._give_back = give_back
        self._close = close_consumer
        self._watch = PollInterval(cfg.consumer.max_poll_interval, now)
        self._join_at = 0.0  # out of the group: not before this time is joining tried again

    def look(self, now: float, takes: int, ready: bool) -> bool:
        """Whether this member is in the group for the fetcher's turn, given the application's
        ``takes`` so far and whether messages wait to be taken: it leaves or joins as they say."""
        step = self._step
        if self._watch.look(now, takes, ready) is LEAVE and step.consumer is not None:
            self._leave(self._watch.stalled_for(now))
        if step.consumer is not None:
            return True
        return not (self._watch.left or now < self._join_at) and self._rejoin(now)

    def _leave(self, waited: float) -> None:
        name = self._queue
        self._metrics.poll_interval_exceeded.labels(name).inc()
        log.warning("%s: the application took no message for %.0fs while messages were ready (consumer.max_poll_interval"
                    " %gs): this member gives its partitions to the rest of the group and leaves it (never-handed "
                    "messages go back to the group, messages in user code stay here); it joins again at the "
                    "application's next poll", name, waited, self._cfg.consumer.max_poll_interval)
        try:
            self._give_back()
        finally:
            self._close()
        self._step.left()

    def _rejoin(self, now: float) -> bool:
        """A new group consumer joins the group; False when the broker cannot be reached."""
        name = self._queue
        kc = None
        try:
            kc = self._open()
            self._step.join(kc)
        except Exception as exc:
            error = client_api.client_error(self._cfg.kafka, exc, f"joining the group of {name} again")
            if kc is not None:
                self._close()
            if error is None or not error.retriable:
                raise
            log.warning("%s: joining the group again failed (%s); retrying in %gs", name, error, REJOIN_RETRY)
            self._join_at = now + REJOIN_RETRY
            return False
        log.info("%s: the application takes messages again: joining the group", name)
        return True
