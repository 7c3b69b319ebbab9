"""kafka-python's errors as kmq's (:mod:`kmq.client.errors`), and the producer future that raises them.

Kafka's error codes are the same numbers on both clients: a kafka-python error class carries its
code (``errno``), translated by :func:`kmq.client.errors.produce_error`. Refusals before sending
that kafka-python raises as Python's own errors (``TypeError``, ``ValueError``) stay what they are.
"""

from __future__ import annotations

from typing import Any, Callable

from kafka.errors import KafkaError, KafkaTimeoutError

from kmq.client.errors import ProduceFailed, produce_error
from kmq.core.errors import KmqError

__all__ = ["as_kmq_error", "KmqFuture"]


def as_kmq_error(exc: BaseException) -> BaseException:
    """kmq's error for a failed send (the kafka-python error its ``__cause__``); any other exception as it is."""
    if isinstance(exc, KmqError) or not isinstance(exc, KafkaError):
        return exc
    errno = getattr(exc, "errno", None)
    code = errno if isinstance(errno, int) and errno > 0 and not isinstance(exc, KafkaTimeoutError) else None
    error = produce_error(code, f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


class KmqFuture:
    """kafka-python's ``FutureRecordMetadata`` with kmq's errors: what its errbacks are given, what
    ``get`` raises and ``exception`` holds (one translation a future, made when first asked)."""

    __slots__ = ("_future", "_error")

    def __init__(self, future: Any) -> None:
        self._future = future
        self._error: BaseException | None = None

    def _translated(self, exc: BaseException) -> BaseException:
        if self._error is None:
            self._error = as_kmq_error(exc)
        return self._error

    @property
    def is_done(self) -> bool:
        return self._future.is_done

    @property
    def value(self) -> Any:
        return self._future.value

    @property
    def exception(self) -> BaseException | None:
        exc = self._future.exception
        return None if exc is None else self._translated(exc)

    def succeeded(self) -> bool:
        return self._future.succeeded()

    def failed(self) -> bool:
        return self._future.failed()

    def add_callback(self, fn: Callable[..., Any], *args: Any) -> "KmqFuture":
        self._future.add_callback(fn, *args)
        return self

    def add_errback(self, fn: Callable[..., Any], *args: Any) -> "KmqFuture":
        self._future.add_errback(lambda exc: fn(*args, self._translated(exc)))
        return self

    def add_both(self, fn: Callable[..., Any], *args: Any) -> "KmqFuture":
        self.add_callback(fn, *args)
        return self.add_errback(fn, *args)

    def get(self, timeout: float | None = None) -> Any:
        """The record's metadata; raises its failure, or :class:`~kmq.client.errors.ProduceFailed` when
        it is not decided within ``timeout``."""
        try:
            return self._future.get(timeout)
        except Exception as exc:
            if not self._future.is_done:
                raise ProduceFailed(f"no delivery report within {timeout}s") from exc
            error = self._translated(exc)
            if error is exc:
                raise
            raise error from exc
