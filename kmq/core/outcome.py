"""What the end of a handler makes of its message: the one rule behind
``KmqConsumer.run``, ``AsyncKmqConsumer.run``, ``@kmq.marked`` and ``kmq work``.

=====================================  =============================================
the handler                            the message
=====================================  =============================================
returns                                ack, unless the handler settled it itself
raises an exception of ``reject_on``   reject: to the DLQ, reason ``"Type: text"``
raises another ``Exception``           nack: redelivered after the queue's backoff
                                       for the message's delivery count
=====================================  =============================================

A ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``,
``SystemExit``, a cancellation) is not a handler failure: the caller lets it
through and the message is left to its lease.

:class:`OutcomeRule` decides (pure); :func:`settle` makes the settlement on
anything with ``ack``/``nack``/``reject`` (a :class:`~kmq.core.message.KmqMessage`,
or a ``MarkerWriter`` bound to one record) and logs a failure with its consequence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Protocol, Union

from kmq.core.errors import MessageAlreadySettled
from kmq.core.log_fields import message_fields
from kmq.core.message import ACK, NACK, REJECT
from kmq.core.settlement import clip_reason

__all__ = ["RejectOn", "HandlerOutcome", "OutcomeRule", "Settleable", "settle"]

log = logging.getLogger(__name__)

#: Exception classes that reject a message instead of nacking it (as for ``isinstance``).
RejectOn = Union[type[BaseException], tuple[type[BaseException], ...]]


@dataclass(frozen=True, slots=True)
class HandlerOutcome:
    """The settlement a handler's end asks for: ``action`` is ``ack``, ``nack`` (after ``delay``
    seconds) or ``reject`` (with ``reason``); ``error`` is what the handler raised."""

    action: str
    delay: float = 0.0
    reason: str = ""
    error: Exception | None = field(default=None, compare=False)


ACKED = HandlerOutcome(ACK)


@dataclass(frozen=True, slots=True)
class OutcomeRule:
    """The rule for one queue: ``backoff(delivery_count)`` is the nack delay (the queue's
    ``BackoffConfig.delay``); exceptions of ``reject_on`` reject.

    Raises ``TypeError`` at once for a ``reject_on`` that is not exception classes (rather
    than on the first failing message)."""

    backoff: Callable[[int], float]
    reject_on: RejectOn = ()

    def __post_init__(self) -> None:
        classes = self.reject_on if isinstance(self.reject_on, tuple) else (self.reject_on,)
        if not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
            raise TypeError(f"reject_on must be an exception class or a tuple of them, got {self.reject_on!r}")

    def returned(self, settled: bool) -> HandlerOutcome | None:
        """A handler returned: ack, or nothing when it settled the message itself."""
        return None if settled else ACKED

    def failed(self, error: Exception, delivery_count: int) -> HandlerOutcome:
        """A handler raised ``error`` on delivery number ``delivery_count``: reject or nack."""
        if self.reject_on and isinstance(error, self.reject_on):
            return HandlerOutcome(REJECT, reason=clip_reason(f"{type(error).__name__}: {error}"), error=error)
        return HandlerOutcome(NACK, delay=self.backoff(delivery_count), error=error)


class Settleable(Protocol):
    """What :func:`settle` settles: a :class:`~kmq.core.message.KmqMessage` is one."""

    topic: str
    partition: int
    offset: int

    def ack(self) -> None: ...

    def nack(self, delay: float = ...) -> None: ...

    def reject(self, reason: str = ...) -> None: ...


def settle(target: Settleable, outcome: HandlerOutcome | None) -> None:
    """Make ``outcome`` on ``target`` (None: nothing to do).

    A failure is logged with what happens to the message. A message that was settled
    meanwhile (by the handler before it raised, or by another thread) keeps that settlement."""
    if outcome is None:
        return
    try:
        if outcome.action == ACK:
            target.ack()
        elif outcome.action == REJECT:
            target.reject(outcome.reason)
        else:
            target.nack(outcome.delay)
    except MessageAlreadySettled:
        if outcome.error is not None:
            log.warning("handler failed on %s/%s/%s (%s: %s) after the message was settled; that settlement stands",
                        target.topic, target.partition, target.offset, type(outcome.error).__name__, outcome.error)
        return
    if outcome.action == REJECT:
        log.warning("handler rejected %s/%s/%s (%s); it goes to the DLQ",
                    target.topic, target.partition, target.offset, outcome.reason,
                    extra=message_fields(target, outcome="reject"))
    elif outcome.action == NACK:
        err = outcome.error
        log.warning("handler failed on %s/%s/%s (%s: %s); nacked, redelivery in %.3gs",
                    target.topic, target.partition, target.offset, type(err).__name__, err, outcome.delay,
                    extra=message_fields(target, outcome="nack"))
