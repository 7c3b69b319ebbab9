"""Delivery verdicts known at flush, without a delivery callback per record.

confluent-kafka makes a Python object for every record given its own ``on_delivery``
callback, and keeps it until the report: that costs about 1.5 µs a record, half of
what producing one costs (measured with 100-byte records, confluent-kafka 2.16). A
producer that only needs its verdicts after ``flush`` (the tracker's copies: judged
once a round is flushed) can do without: librdkafka reports failures only
(``delivery.report.only.error``) to one producer-wide callback, and once a flush left
nothing in the producer's queue, every record sent before it that no failure names
was acknowledged.

A failure report carries the record (topic, partition, key, value; its headers not
always: a record that timed out comes back without them), not which send it was: it is
matched by that content, narrowed by the headers when they are there. Records with
the same content sent in one flush window all take the failure (retried: a duplicate
at worst). A failure that matches no record leaves every verdict of the window
undecided, which the caller treats as a send it cannot vouch for (retried after the
producer is replaced). So does a producer's fatal error (:mod:`kmq.client.confluent.fatal`):
it can swallow a failure report, so from then on the records no report names take that
error instead of an acknowledgement (retried on a new producer: a duplicate at worst).

Not thread-safe: one thread sends and flushes; failures may be recorded from the
thread that serves the producer's reports, and :meth:`FlushSettlement.settle` must run
only once that thread is not inside a poll (see ``ConfluentProducer.flush``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from kmq.client.api import UNDECIDED, Delivery

__all__ = ["FlushSettlement"]

log = logging.getLogger(__name__)

_Key = tuple  # (topic, partition, key, value)


def _headers(headers: Any) -> tuple:
    return tuple(tuple(h) for h in headers or ())


class FlushSettlement:
    """The sends of one producer since its last complete flush, and the failures reported for them.

    ``error_of(err, what)`` turns a client error into the exception stored as a verdict."""

    def __init__(self, error_of: Callable[[Any, str], Exception]) -> None:
        self._error_of = error_of
        self._batches: list[tuple[Sequence[Any], list[Any]]] = []  # (records, verdicts)
        self._futures: list[tuple[Delivery, tuple]] = []  # (future, (topic, partition, key, value, headers))
        self._failures: list[tuple[Any, _Key, tuple | None]] = []  # (error, record, its headers if reported)

    def batch(self, records: Sequence[Any], verdicts: list[Any]) -> None:
        """``records`` (topic, partition, key, value, headers) were sent; ``verdicts`` is filled at settle
        (a slot already set, e.g. refused before it left, is kept)."""
        self._batches.append((records, verdicts))

    def future(self, fut: Delivery, topic: str, partition: int | None, key: bytes | None, value: bytes | None,
               headers: Any) -> None:
        self._futures.append((fut, (topic, partition, key, value, headers)))

    def report(self, err: Any, msg: Any) -> None:
        """The producer's ``on_delivery``: with ``delivery.report.only.error`` only failures come here."""
        if err is not None:
            headers = msg.headers()
            self._failures.append((err, (msg.topic(), msg.partition(), msg.key(), msg.value()),
                                   None if headers is None else _headers(headers)))

    def settle(self, unknown: Exception | None = None) -> None:
        """Every record sent so far has been reported (the producer's queue is empty): give each
        its verdict, the failures by content, acknowledged for the others; with ``unknown`` (the
        producer's fatal error: a report may have been lost), ``unknown`` for the others."""
        batches, futures, failures = self._batches, self._futures, self._failures
        self._batches, self._futures, self._failures = [], [], []
        failed: dict[int, dict[int, Exception]] = {}  # id(verdicts) -> slot -> error
        failed_futures: dict[int, Exception] = {}
        if failures and not self._match(batches, futures, failures, failed, failed_futures):
            return  # verdicts stay undecided: nothing is vouched for
        for _records, verdicts in batches:
            errors = failed.get(id(verdicts), {})
            verdicts[:] = [errors.get(i, unknown) if v is UNDECIDED else v for i, v in enumerate(verdicts)]
        for i, (fut, (topic, partition, _, _, _)) in enumerate(futures):
            if i in failed_futures or unknown is not None:
                fut.failure(failed_futures.get(i, unknown))  # type: ignore[arg-type]  # not None: the condition above
            else:
                fut.success((topic, partition, None))  # the offset is not reported for an acknowledged record

    def _match(self, batches, futures, failures, failed, failed_futures) -> bool:
        """Find the sends each failure names; False when one names none."""
        index: dict[_Key, list[tuple[Any, int, Any]]] = {}  # record -> (verdicts or None for a future, slot, headers)
        for records, verdicts in batches:
            for i, (topic, partition, key, value, headers) in enumerate(records):
                index.setdefault((topic, partition, key, value), []).append((verdicts, i, headers))
        for i, (_, (topic, partition, key, value, headers)) in enumerate(futures):
            index.setdefault((topic, partition, key, value), []).append((None, i, headers))
        for err, k, reported in failures:
            # A record sent without a partition is reported with the one it was given, if any.
            hits = index.get(k) or index.get((k[0], None, *k[2:]))
            if hits and reported is not None:
                hits = [h for h in hits if _headers(h[2]) == reported] or hits
            if not hits:
                log.warning("a delivery failure (%s) names a record this producer has no send for; every send of "
                            "this flush is treated as undecided", err)
                return False
            exc = self._error_of(err, f"{k[0]}: ")
            for verdicts, i, _ in hits:
                if verdicts is None:
                    failed_futures[i] = exc
                else:
                    failed.setdefault(id(verdicts), {})[i] = exc
        return True
