"""aiokafka's exceptions as kmq's (the seam's classes: :mod:`kmq.client.errors`, :mod:`kmq.core.errors`)."""

from __future__ import annotations

from typing import Any

from aiokafka import errors as ak

from kmq.client.errors import ProduceDenied, ProduceFailed, ProducerFenced, RecordTooLarge, TopicUnknown
from kmq.core.errors import AuthenticationFailed, AuthorizationFailed, BrokerUnavailable, KmqError

__all__ = ["produce_error", "client_error", "retriable", "started"]


def produce_error(exc: BaseException) -> BaseException:
    """kmq's :class:`~kmq.client.errors.ProduceFailed` (or subclass) for a failed aiokafka send."""
    if isinstance(exc, KmqError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (ak.MessageSizeTooLargeError, ak.RecordTooLargeError)):
        return RecordTooLarge(text)
    if isinstance(exc, ak.UnknownTopicOrPartitionError):
        return TopicUnknown(text)
    if isinstance(exc, (ak.TopicAuthorizationFailedError, ak.ClusterAuthorizationFailedError)):
        return ProduceDenied(text)
    if isinstance(exc, (ak.OutOfOrderSequenceNumber, ak.ProducerFenced)):
        return ProducerFenced(text)
    return ProduceFailed(text)


def retriable(exc: BaseException) -> bool:
    """An aiokafka error that goes away by itself (a broker restarting, a rebalance)."""
    return isinstance(exc, ak.KafkaError) and bool(getattr(exc, "retriable", False)) or isinstance(
        exc, (ak.KafkaConnectionError, ak.NodeNotReadyError, ak.RequestTimedOutError, ak.KafkaTimeoutError))


def client_error(exc: BaseException, what: str) -> KmqError:
    """kmq's error for an aiokafka failure while doing ``what``."""
    if isinstance(exc, KmqError):
        return exc
    text = f"{what} failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, ak.AuthenticationFailedError):
        return AuthenticationFailed(text)
    if isinstance(exc, (ak.GroupAuthorizationFailedError, ak.TopicAuthorizationFailedError)):
        return AuthorizationFailed(text)
    return BrokerUnavailable(text)


async def started(raw: Any, what: str) -> Any:
    """``raw`` (an aiokafka consumer or producer) connected; stopped again and its error as kmq's
    (:func:`client_error`, naming ``what``) when it cannot connect."""
    try:
        await raw.start()
    except Exception as exc:
        await raw.stop()
        raise client_error(exc, what) from exc
    return raw
