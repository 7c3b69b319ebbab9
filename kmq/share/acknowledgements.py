"""Which acknowledgements a share-consumer call sends: the rules of both modes, pure.

No Kafka, no clock. A poll's records stay *in flight* until their acknowledgement
is applied (sent as a marker); what each call applies:

==========================  ===========================================  ==========================================
call                        implicit mode                                explicit mode
==========================  ===========================================  ==========================================
``poll``, ``commit_*``      every record of the last poll: ACCEPT        the records acknowledged since, as recorded
``subscribe``,              every record of the last poll: ACCEPT        the recorded ones; the rest: RELEASE*
``unsubscribe``
``close``                   every record of the last poll: RELEASE*      the recorded ones; the rest: RELEASE*
``poll`` (explicit only)    --                                           refused while a record is unacknowledged
==========================  ===========================================  ==========================================

A subscription change accepts in implicit mode as the native clients do: the Java
``KafkaShareConsumer`` keeps the last batch across ``subscribe``/``unsubscribe``
and accepts it with the next ``poll`` or commit, and confluent-kafka's reports it
accepted; kmq leaves its consumer group on the change, so it accepts then.

RELEASE* is the release of a record the application did not acknowledge: it
does not count a delivery (unlike native share groups, where it does) (the copy keeps ``kmq-delivery-count``;
its kmq argument is a :class:`~kmq.core.settlement.Released` delay). A
RELEASE the application asked for counts one.

A record acknowledged twice before it is applied keeps the last type (as the
native consumer); once applied it is no longer in flight.
"""

from __future__ import annotations

from typing import Any, Iterable

from kmq.core.settlement import Released
from kmq.share.settings import AckMode
from kmq.share.types import AcknowledgeType, Message, TopicPartition

__all__ = ["Due", "due", "due_on_leave", "unacknowledged", "offsets_by_partition", "KMQ_REJECT_REASON"]

#: The DLQ reason of a record rejected with ``AcknowledgeType.REJECT`` (``kmq_reject`` gives its own).
KMQ_REJECT_REASON = "AcknowledgeType.REJECT"

#: (message, type, kmq argument: the nack delay of RELEASE, the reason of REJECT, None for ACCEPT).
Due = tuple[Message, AcknowledgeType, Any]

_RELEASE_NOW: tuple[AcknowledgeType, Any] = (AcknowledgeType.RELEASE, Released(0.0))


def due(batch: Iterable[Message], mode: AckMode, closing: bool = False) -> list[Due]:
    """The acknowledgements a call applies now to ``batch`` (the records in flight)."""
    out: list[Due] = []
    if mode is AckMode.IMPLICIT:
        kind: tuple[AcknowledgeType, Any] = _RELEASE_NOW if closing else (AcknowledgeType.ACCEPT, None)
        for m in batch:
            if not m._applied:
                out.append((m, *kind))
        return out
    for m in batch:
        if m._applied:
            continue
        ack = m._ack if m._ack is not None else (_RELEASE_NOW if closing else None)
        if ack is not None:
            out.append((m, *ack))
    return out


def due_on_leave(batch: Iterable[Message], mode: AckMode, closing: bool) -> list[Due]:
    """The acknowledgements a subscription change (``closing``: ``close``) applies to ``batch``."""
    return due(batch, mode, closing=closing or mode is AckMode.EXPLICIT)


def unacknowledged(batch: Iterable[Message]) -> int:
    """Records of ``batch`` neither acknowledged nor applied (explicit mode refuses a poll then)."""
    return sum(1 for m in batch if m._ack is None and not m._applied)


def offsets_by_partition(messages: Iterable[Message]) -> dict[TopicPartition, set[int]]:
    """``{TopicPartition: {offsets}}``: the shape of commit results and of the commit callback."""
    by: dict[tuple[str, int], set[int]] = {}
    for m in messages:
        km = m.kmq_message
        offsets = by.get((km.topic, km.partition))
        if offsets is None:
            offsets = by[(km.topic, km.partition)] = set()
        offsets.add(km.offset)
    return {TopicPartition(t, p): offsets for (t, p), offsets in by.items()}
