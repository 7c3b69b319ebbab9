"""A share consumer's subscription while no broker answers: retrying, and the errors reported.

Natively ``subscribe()`` returns at once and the client connects in the background:
while no broker answers, ``poll()`` returns nothing and the dict's ``error_cb`` is
called (on the polling thread) with librdkafka's transport errors, ``_TRANSPORT``
per server that refused or did not answer and ``_ALL_BROKERS_DOWN`` when none did.
kmq opens a subscription's queue consumer (which needs the broker: it checks the
queue's topics) only once a bootstrap server answers: :func:`require_reachable`
asks each one first (:func:`kmq.client.diagnose.probe`, milliseconds when refused),
:class:`Backoff` spaces the tries, :func:`errors_of` names what failed as those
``KafkaError``\\ s.

An error a retry cannot cure (a login or certificate refused, a TLS/plaintext
mismatch, an ACL denial) is raised by ``subscribe``/``poll``, as kmq's clients
raise it, rather than retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

from kmq.client.diagnose import probe
from kmq.config import KafkaConfig
from kmq.core.errors import (
    AuthenticationFailed,
    AuthorizationFailed,
    BrokerUnavailable,
    CertificateRejected,
    KmqError,
    TlsHandshakeFailed,
)
from kmq.share.types import KafkaError

__all__ = ["Backoff", "Unreachable", "errors_of", "is_transport", "require_reachable", "PROBE_TIMEOUT_S"]

#: Connection errors a retry cannot cure: raised, not reported and retried.
_NOT_TRANSPORT = (TlsHandshakeFailed, CertificateRejected, AuthenticationFailed, AuthorizationFailed)

#: How long a probe waits for each step (connect, TLS, ApiVersions) of each server: a refused
#: connection answers at once; this bounds what a poll spends on a server that does not answer.
PROBE_TIMEOUT_S = 2.0


class Unreachable(BrokerUnavailable):
    """No bootstrap server answered; ``failures`` names each one's error."""

    def __init__(self, failures: list[tuple[str, KmqError]]) -> None:
        super().__init__("; ".join(str(e) for _, e in failures) or "no bootstrap server")
        self.failures = failures


def require_reachable(kafka: KafkaConfig, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Return when a bootstrap server answers; raise :class:`Unreachable` when none does, or the
    first error of another kind (a refused login or certificate: retrying would not help)."""
    found = probe(kafka, min(timeout_s, kafka.connect_timeout))
    if any(err is None for _, err in found):
        return
    for _, err in found:
        if err is not None and not is_transport(err):
            raise err
    raise Unreachable([(server, err) for server, err in found if err is not None])


def is_transport(exc: BaseException) -> TypeGuard[BrokerUnavailable]:
    """A broker that did not answer (refused, no answer, unknown host): worth trying again."""
    return isinstance(exc, BrokerUnavailable) and not isinstance(exc, _NOT_TRANSPORT)


def errors_of(exc: BrokerUnavailable) -> list[KafkaError]:
    """The ``error_cb`` errors of a failed connection, as librdkafka reports it."""
    if isinstance(exc, Unreachable):
        down = [KafkaError(KafkaError._TRANSPORT, f"{server}/bootstrap: {e}") for server, e in exc.failures]
        return [*down, KafkaError(KafkaError._ALL_BROKERS_DOWN, f"{len(down)}/{len(down)} brokers are down")]
    return [KafkaError(KafkaError._TRANSPORT, str(exc))]


@dataclass
class Backoff:
    """When to try connecting again: ``initial`` seconds after a failure, doubling up to ``cap``
    (kmq's clients' reconnect backoff), from the first try on."""

    initial: float = 0.1
    cap: float = 1.0
    next_try: float = 0.0
    delay: float = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_try

    def failed(self, now: float) -> None:
        self.delay = min(self.cap, self.delay * 2) if self.delay else self.initial
        self.next_try = now + self.delay
