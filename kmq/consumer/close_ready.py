"""Closing: the messages ready or taken ahead, never handed out, go back to the group.

A consumer's close runs in two parts, as :class:`~kmq.consumer.consumer.KmqConsumer` does it
(and the simulator's worker, :mod:`kmq.dev.sim.worker`): on the closing thread,
:func:`put_back_ahead` puts what iteration took ahead back into the ready queue (a take in
progress brings its rest back the same way, :mod:`kmq.consumer.take_ahead`); then, on the
fetcher's side, :func:`give_back_ready` waits for such a take, drains the ready queue and gives
everything back to the group (:meth:`kmq.consumer.fetcher.Fetcher.give_back_unhanded`: offsets
committed back, no copy, same delivery count).
"""

from __future__ import annotations

import logging
from typing import Any

from kmq.consumer.fetcher import Fetcher, nack_refused
from kmq.consumer.take_ahead import TakeAhead
from kmq.core.message import KmqMessage

__all__ = ["put_back_ahead", "give_back_ready"]

#: The consumer's own logger: its lines keep the name applications filter them by.
log = logging.getLogger("kmq.consumer.consumer")


def put_back_ahead(ahead: TakeAhead, ready: Any, queue: str, fetching: bool) -> None:
    """The closing thread's part: messages taken ahead for iteration and never handed out go back
    into ``ready`` (a :class:`~kmq.consumer.ready_queue.ReadyQueue` or keyed one) before the
    fetcher stops, and it gives them back to the group with the rest (same delivery count). Where
    they cannot go back (``ordering: key``: their keys were let go; not ``fetching``: nothing gives
    them back) they are nacked "not a delivery": the tracker redelivers them now, with the delivery
    count they had."""
    # A take in progress meanwhile brings its rest back the same way (the fetcher waits for it).
    ahead.put_back(ready.put_back if fetching else _refuse, lambda refused: nack_refused(queue, refused))


def give_back_ready(step: Fetcher, ahead: TakeAhead, ready: Any, queue: str, final: bool, wait: float) -> None:
    """The fetcher's part, on close (or, not ``final``, on leaving the group while the application
    stalls): never-handed messages go back to the group
    (:meth:`~kmq.consumer.fetcher.Fetcher.give_back_unhanded`). Drained first (user code takes
    nothing more); a take for iteration in progress when the close began puts its rest back first,
    waited for at most ``wait`` seconds (a taker that cannot finish: close() from a signal handler
    on its thread)."""
    if final and not ahead.idle(wait):
        log.warning("%s: a take for iteration did not finish within %gs of the close; messages it brings "
                    "later are nacked (the tracker redelivers them)", queue, wait)
    step.give_back_unhanded(ready.drain(final))


def _refuse(messages: list[KmqMessage], leased_at: float, gen: int) -> bool:
    return False
