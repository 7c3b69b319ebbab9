"""Giving fetched messages back unprocessed (the consumer's fetcher thread).

A message fetched but never handed to user code is not settled by a marker:
it leaves the consumer's in-flight count and flow bound, and the group
delivers it again, with the same delivery count. On close that takes one
commit per partition back to its first never-handed offset
(:func:`give_back_on_close`); messages of partitions no longer owned that
were committed already can only come back through the tracker, so they are
nacked (a copy with a higher delivery count: the one case that costs one).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

from kmq.core.errors import MessageAlreadySettled
from kmq.consumer.fetch_batch import first_offsets
from kmq.core.message import ABANDON, KmqMessage

__all__ = ["RETURNED", "give_back", "nack_all", "give_back_on_close"]

log = logging.getLogger(__name__)

#: ``abandon`` argument of messages the consumer gives back unprocessed (not a user settlement).
RETURNED = "returned"


def give_back(messages: Iterable[KmqMessage]) -> None:
    """Messages never handed over and never to be: out of the in-flight count and the flow
    bound, no marker (the group delivers them again, or their lease runs out)."""
    for m in messages:
        try:
            m._settle(ABANDON, RETURNED)
        except MessageAlreadySettled:
            pass


def nack_all(messages: Iterable[KmqMessage]) -> None:
    """NACK with no delay: the tracker redelivers them now (with a higher delivery count)."""
    for m in messages:
        try:
            m.nack(0.0)
        except MessageAlreadySettled:
            pass


def give_back_on_close(kc: Any, topic: str, ready: list[KmqMessage], held: list[KmqMessage],
                       revoked: Callable[[], frozenset], pause_all: Callable[[], None],
                       session_timeout: float) -> bool:
    """Commit each partition of ``topic`` still owned back to its first never-handed offset, so the
    group delivers those messages again (no copy, same delivery count); returns whether any message
    was nacked (the caller flushes then).

    ``ready`` were committed and waited for user code; ``held`` were fetched (START sent or not) and
    not committed. Per partition the handed messages are a prefix of what was fetched (batches are
    handed in fetch order), so the rewind re-delivers exactly the never-handed ones. ``kc`` is a
    :class:`~kmq.client.GroupConsumerAdapter`; ``revoked()`` the partitions revoked so far."""
    unhanded = ready + held
    if not unhanded:
        return False
    first = first_offsets(unhanded)
    rewind: dict[int, int] = {}
    # A rebalance in progress refuses the commit until this member has rejoined: a cooperative
    # rebalance takes two rounds, and some brokers hold each join for up to half a session.
    deadline = time.monotonic() + 2 * session_timeout
    while True:
        try:
            assigned = {p for t, p in kc.assignment() if t == topic} - revoked()
            rewind = {p: o for p, o in first.items() if p in assigned}
            if rewind:
                kc.commit({(topic, p): o for p, o in rewind.items()})
            break
        except Exception as exc:  # noqa: BLE001 - e.g. a rebalance in progress: let it finish, retry
            if time.monotonic() > deadline:
                log.warning("%s: committing offsets back for never-handed messages failed (%s); they are "
                            "nacked instead and come back as copies with a higher delivery count", topic, exc)
                rewind = {}
                break
            pause_all()
            kc.fetch(0.2, 1)  # completes the rebalance; nothing is taken
    back = [m for m in unhanded if m.partition in rewind]
    rest = [m for m in ready if m.partition not in rewind]
    # Ready messages of partitions no longer ours are committed: only the tracker can redeliver
    # them. Uncommitted ones of those partitions: their new owner polls them again.
    nack_all(rest)
    give_back(unhanded)
    log.info("%s: closing; %d never-handed message(s) given back to the group (offsets committed back to %s)%s",
             topic, len(back), rewind, f", {len(rest)} of revoked partitions nacked for redelivery" if rest else "")
    return bool(rest)
