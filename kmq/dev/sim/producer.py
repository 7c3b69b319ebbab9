"""The simulated producer: kafka-python's ``send() -> future`` shape over a :class:`SimCluster`.

``send`` returns a :class:`SimDelivery`, the seam's :class:`~kmq.client.api.Delivery`
whose ``get`` waits in simulated time. The record is written and acknowledged
when the cluster says so (at once without faults; later, never, or written
but reported failed under a :class:`~kmq.dev.sim.faults.ProduceFault` or a
broker pause), or fail with :class:`~kmq.client.api.ProducerFatal` once the
producer went fatal (:class:`~kmq.dev.sim.faults.ProducerGoesFatal`: then
:attr:`SimProducer.fatal` says so, as confluent-kafka's producers do, and it
sends nothing more). Callbacks run when the clock reaches the acknowledgement,
inside whichever call advanced it, as a real client's I/O thread runs them
at a moment of its own.

Failures are the seam's errors: :class:`~kmq.client.api.ProduceFailed` for a
record not acknowledged within the delivery timeout, one too large, one for
a partition that does not exist, and for ``flush`` running out of time (all
in :func:`kmq.client.produce_errors`). Refusals before sending are the
builtin errors kafka-python raises (``refuses_like="kafka-python"``, the
default, as kmq's default client): ``TypeError`` for a null header value,
``ValueError`` for a record with neither key nor value. With
``refuses_like="confluent"`` both are sent, as librdkafka does.

Without an explicit partition a keyed record goes to ``crc32(key) % partitions``
(not Kafka's murmur2: same key, same partition, which is what matters here),
an unkeyed one round-robin.
"""

from __future__ import annotations

import itertools
import zlib
from typing import Any, Sequence

from kmq.client.api import CONFLUENT, KAFKA_PYTHON, Delivery, ProduceFailed, ProducerFatal
from kmq.client.errors import RecordTooLarge, TopicUnknown
from kmq.core.markers import MarkerDecodeError, decode
from kmq.dev.sim.clock import VirtualClock
from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.errors import SimulationError
from kmq.dev.sim.faults import newer_marker
from kmq.dev.sim.log import record_size

__all__ = ["SimProducer", "SimDelivery"]

_BYTES = (bytes, bytearray, memoryview)


#: How a markers topic's name ends (kmq.config.queues names them ``<queue>[__<group>]__markers``).
MARKERS_SUFFIX = "__markers"

class SimDelivery(Delivery):
    """A :class:`~kmq.client.api.Delivery` whose ``get(timeout)`` advances the virtual clock
    (at most ``timeout`` simulated seconds) instead of blocking a thread."""

    __slots__ = ("_clock",)

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def get(self, timeout: float | None = None) -> Any:
        if not self.is_done:
            wait = 3600.0 if timeout is None else max(0.0, timeout)  # every send settles by its delivery timeout
            if not self._clock.run_until(self._clock.now() + wait, lambda: self.is_done):
                raise ProduceFailed(f"no delivery report within {timeout}s")
        if self.exception is not None:
            raise self.exception
        return self.value


class SimProducer:
    """A producer on a :class:`~kmq.dev.sim.cluster.SimCluster` (``acks=all``, idempotent: one
    producer's records to one partition are written in send order).

    :param name: names the producer in the history.
    :param refuses_like: whose client-side refusals to copy (``kafka-python`` or ``confluent``).
    :param max_request_size: records larger than this fail (kafka-python's ``max_request_size``).
    :param delivery_timeout: seconds after which an unacknowledged send fails.
    """

    def __init__(self, cluster: SimCluster, name: str = "producer", *, refuses_like: str = KAFKA_PYTHON,
                 max_request_size: int = 1_048_576, delivery_timeout: float = 30.0) -> None:
        if refuses_like not in (KAFKA_PYTHON, CONFLUENT):
            raise SimulationError(f"refuses_like must be {KAFKA_PYTHON!r} or {CONFLUENT!r}, not {refuses_like!r}")
        self.cluster = cluster
        self.name = name
        self.refuses_like = refuses_like
        self.max_request_size = max_request_size
        self.delivery_timeout = delivery_timeout
        self._pending: list[tuple[SimDelivery, Any]] = []
        self._round_robin = itertools.count()
        self._closed = False
        #: The fatal error this producer reported (:func:`kmq.client.producer_fatal` reads it), or None.
        self.fatal: ProducerFatal | None = None
        for at in cluster.faults.fatal_at(name, cluster.t()):
            cluster.clock.call_at(cluster.clock.now() + (at - cluster.t()), self._go_fatal)

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
             headers: Sequence[tuple[str, bytes | None]] | None = None, timestamp_ms: int | None = None) -> SimDelivery:
        """Send one record; returns its delivery (see the module docstring for what fails how)."""
        if self._closed:
            raise ProduceFailed(f"producer {self.name} is closed")
        if self.fatal is not None:
            failed = SimDelivery(self.cluster.clock)
            failed.failure(self.fatal)
            return failed
        headers = list(headers or [])
        self._refuse(key, value, headers)
        counts = self.cluster.partition_counts()
        if topic not in counts or (partition is not None and not 0 <= partition < counts[topic]):
            raise TopicUnknown(f"{topic}[{partition}]: unknown topic or partition")
        if partition is None:
            partition = (zlib.crc32(bytes(key)) if key is not None else next(self._round_robin)) % counts[topic]
        if value is not None and topic.endswith(MARKERS_SUFFIX) and self.cluster.faults.writes_newer_markers(
                self.name, self.cluster.t()):
            value = _as_newer(bytes(value))
        fut = SimDelivery(self.cluster.clock)
        size = record_size(key and bytes(key), value and bytes(value), headers)
        if size > self.max_request_size:
            fut.failure(RecordTooLarge(f"{topic}[{partition}]: the record is {size} bytes, more than max_request_size "
                                      f"({self.max_request_size})"))
            return fut
        ts = self.cluster.wall_ms(self.name) if timestamp_ms is None else timestamp_ms
        skew_ms = ts - self.cluster.clock.now_ms() if timestamp_ms is None else 0
        cancel = self.cluster.produce(
            self.name, topic, partition, None if key is None else bytes(key), None if value is None else bytes(value),
            headers, ts, self.delivery_timeout, on_written=lambda _offset: None, on_acked=fut.success,
            on_failed=fut.failure, skew_ms=skew_ms)
        self._pending.append((fut, cancel))
        return fut

    def _refuse(self, key: Any, value: Any, headers: list) -> None:
        for what, v in (("key", key), ("value", value)):
            if v is not None and not isinstance(v, _BYTES):
                raise TypeError(f"Unsupported type for serialized {what}: {type(v)}")
        if self.refuses_like == KAFKA_PYTHON:
            if key is None and value is None:
                raise ValueError("Need at least one: key or value")
            if any(not (isinstance(k, str) and isinstance(v, _BYTES)) for k, v in headers):
                raise TypeError("All headers items must be (str, bytes) tuples")

    def _unsettled(self) -> list[tuple[SimDelivery, Any]]:
        self._pending = [(f, c) for f, c in self._pending if not f.is_done]
        return self._pending

    def flush(self, timeout: float | None = None) -> None:
        """Wait (in simulated time) until every send is answered; raises
        :class:`~kmq.client.api.ProduceFailed` when some are not within ``timeout`` seconds."""
        wait = self.delivery_timeout + 1.0 if timeout is None else max(0.0, timeout)
        clock = self.cluster.clock
        if not clock.run_until(clock.now() + wait, lambda: not self._unsettled()):
            raise ProduceFailed(f"{len(self._unsettled())} record(s) not delivered within {timeout}s")

    def _go_fatal(self) -> None:
        """A fatal error: what is not acknowledged yet fails (and is never written if it was not)."""
        if self._closed or self.fatal is not None:
            return
        self.fatal = ProducerFatal(f"producer {self.name}: fatal error (simulated: an idempotence guarantee it "
                                   f"can no longer keep)")
        self.cluster.record(f"producer {self.name} fatal")
        for fut, cancel in self._unsettled():
            cancel()
            fut.failure(self.fatal)
        self._pending = []

    def close(self, timeout: float = 5.0) -> None:
        """Flush for at most ``timeout`` seconds; what is left fails, and what was not written yet never is."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        except ProduceFailed:
            pass
        for fut, cancel in self._unsettled():
            cancel()
            fut.failure(ProduceFailed(f"producer {self.name} closed before the record was acknowledged"))
        self._pending = []
        self._closed = True

    def __repr__(self) -> str:
        return f"SimProducer({self.name!r}, {len(self._pending)} pending)"


def _as_newer(value: bytes) -> bytes:
    """A marker of this build's as a later kmq writes it (:class:`~kmq.dev.sim.faults.NewerMarkers`);
    anything else as it is."""
    try:
        decode(value)
    except MarkerDecodeError:
        return value
    return newer_marker(value)
