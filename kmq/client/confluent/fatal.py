"""librdkafka's fatal producer errors, as confluent-kafka shows them.

A producer in a fatal state (an idempotence guarantee it can no longer keep:
with ``enable.gapless.guarantee`` a batch the broker refused for good, or a
producer id the cluster stopped accepting) sends nothing more: librdkafka
purges the records it still queues and fails every later ``produce`` with
``_FATAL``. confluent-kafka does not hand the fatal error to ``error_cb``: it
raises it, as a ``KafkaException`` whose ``KafkaError`` says ``fatal()``, from
whichever ``poll`` or ``flush`` serves it. So a producer adapter must expect it
from its serving thread (which would otherwise die with it) and from
``flush``.

A ``flush`` that raised it may have lost delivery reports: it goes on serving
reports with the exception still set. Seen with confluent-kafka 2.16 against Apache
Kafka 4.2: the report of the record the broker refused never reached its callback
(a callback that called into confluent-kafka raised ``SystemError``), and with a
report callback set, ``flush`` raised the ``KafkaError`` object itself, which is no
``BaseException``: only a bare ``except`` catches it. With
``delivery.report.only.error`` a lost failure would read as an acknowledgement, so
once a producer is fatal, what no report names is not vouched for
(:class:`~kmq.client.confluent.flush_settlement.FlushSettlement`'s ``unknown``).

:class:`FatalState` recognises the error wherever it comes from and keeps the
first one as a :class:`~kmq.client.api.ProducerFatal`. No confluent-kafka import:
it reads the error objects it is given.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kmq.client.api import ProducerFatal

__all__ = ["FatalState", "fatal_error_of", "FATAL_CODE"]

log = logging.getLogger(__name__)

#: librdkafka's ``RD_KAFKA_RESP_ERR__FATAL``: what ``produce`` fails with once the producer is fatal.
FATAL_CODE = -150


def fatal_error_of(exc: Any) -> Any:
    """The fatal ``KafkaError`` that ``exc`` is (confluent-kafka's ``flush`` can raise the error
    object itself) or carries (in its arguments, its ``__cause__`` or ``__context__``: a report
    callback that ran with the fatal exception set raises ``SystemError`` from it), or None."""
    seen = 0
    while exc is not None and seen < 5:
        if _is_fatal(exc):
            return exc
        args = getattr(exc, "args", None)
        if args and _is_fatal(args[0]):
            return args[0]
        exc, seen = getattr(exc, "__cause__", None) or getattr(exc, "__context__", None), seen + 1
    return None


def _is_fatal(err: Any) -> bool:
    try:
        return bool(err.fatal()) or err.code() == FATAL_CODE
    except (AttributeError, TypeError):
        return False


class FatalState:
    """The fatal error of one producer handle, once it reported one (thread-safe: the serving
    thread and the sending thread both see errors)."""

    def __init__(self, name: str = "producer") -> None:
        self._name = name
        self._lock = threading.Lock()
        self.error: ProducerFatal | None = None

    def note(self, exc: Any) -> bool:
        """Whether ``exc``, raised by ``poll``, ``flush`` or ``produce``, is the fatal error (then it is
        kept, and logged the first time)."""
        err = fatal_error_of(exc)
        if err is None:
            return False
        self.noted(err)
        return True

    def noted(self, err: Any) -> ProducerFatal:
        """Keep ``err`` (a fatal ``KafkaError``) unless one is kept already; returns the kept one."""
        with self._lock:
            if self.error is None:
                self.error = ProducerFatal(f"the {self._name} is in a fatal state: {err.str()} ({err.name()})")
                log.error("the confluent-kafka %s reported a fatal error: %s (%s); it sends nothing more, and what "
                          "it had not delivered fails: it must be replaced", self._name, err.str(), err.name())
            return self.error

    def refused(self, err: Any) -> ProducerFatal | None:
        """What a ``produce`` that failed with ``err`` raises: the kept fatal error when ``err`` is
        fatal (``_FATAL``), else None (an ordinary refusal)."""
        return self.noted(err) if _is_fatal(err) else None
