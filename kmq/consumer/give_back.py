"""Giving fetched messages back unprocessed (the consumer's fetcher thread).

A message fetched but never handed to user code is not settled by a marker:
it leaves the consumer's in-flight count and flow bound, and the group
delivers it again, with the same delivery count. On close that takes one
commit per partition back to its first never-handed offset
(:func:`give_back_on_close`); committed messages of partitions no longer
owned, or owned again only since an interim owner moved their committed
offset on, can only come back through the tracker: they are nacked "not a
delivery", so its copy keeps their delivery count.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

from kmq.consumer.fetch_pipeline import ClosePlan
from kmq.core.errors import MessageAlreadySettled
from kmq.core.message import ABANDON, KmqMessage

__all__ = ["RETURNED", "give_back", "release_all", "nack_refused", "give_back_on_close"]

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


def release_all(messages: Iterable[KmqMessage]) -> None:
    """NACK "not a delivery" with no delay: the tracker redelivers them now, with the delivery
    count they had (they never reached user code)."""
    for m in messages:
        try:
            m._give_back(0.0)
        except MessageAlreadySettled:
            pass


def nack_refused(queue: str, refused: list[KmqMessage]) -> None:
    """Closing: messages taken for iteration and never handed out that cannot go back to the group
    (their partitions given up, or their keys let go): nacked "not a delivery"."""
    release_all(refused)
    log.warning("%s: %d message(s) taken for iteration were never handed out before the close and could "
                "not be given back to the group; nacked: the tracker redelivers them now with the same "
                "delivery count", queue, len(refused))


def give_back_on_close(kc: Any, topic: str, plan: Callable[[set[int]], ClosePlan], pause_all: Callable[[], None],
                       session_timeout: float, hand_off: Callable[[dict[int, list[int]]], Any]) -> bool:
    """Carry out the close plan of the never-handed messages: commit each partition in its
    ``rewind`` back to its first never-handed offset, so the group delivers those messages again
    (no copy, same delivery count), NACK "not a delivery" what only the tracker can redeliver (a
    copy, same delivery count), give back the rest.
    Returns whether any message was nacked (the caller flushes then).

    ``plan(assigned)`` is :meth:`kmq.consumer.fetch_pipeline.FetchPipeline.close_plan` for the
    partitions ``kc`` (a :class:`~kmq.client.GroupConsumerAdapter`) still holds; it is asked
    again after each retry, since the polls that complete a rebalance can revoke partitions.
    Never raises for a Kafka error: if the commit cannot be made, the committed messages are
    NACKed instead (copies, same delivery count) and the caller closes the client.
    ``hand_off(offsets)`` (:meth:`~kmq.consumer.writer.MarkerWriter.hand_off`) runs before each
    commit back, for the offsets it returns to the group. The same commit carries the plan's
    ``forward`` offsets: messages handed over before their commit (``consumer.hand_over:
    started``), committed on so the group does not deliver them again."""
    # A rebalance in progress refuses the commit until this member has rejoined: a cooperative
    # rebalance takes two rounds, and some brokers hold each join for up to half a session.
    if not plan(set()).give_back and not _forward(kc, topic, plan):
        return False
    deadline = time.monotonic() + 2 * session_timeout
    handed: dict[int, list[int]] | None = None
    while True:
        try:
            current = _assigned_plan(kc, topic, plan)
            if current.commit:
                if current.handoff and current.handoff != handed:
                    hand_off(current.handoff)
                    handed = current.handoff
                kc.commit({(topic, p): o for p, o in current.commit.items()})
            break
        except Exception as exc:  # noqa: BLE001 - e.g. a rebalance in progress: let it finish, retry
            if time.monotonic() > deadline or not _poll_paused(kc, pause_all, topic):
                log.warning("%s: committing offsets back for never-handed messages failed (%s); they are "
                            "nacked instead and come back as copies with the same delivery count", topic, exc)
                current = plan(set())  # as if nothing were ours: every committed message is nacked
                break
    release_all(current.nack)
    give_back(current.give_back)
    n_back = len(current.give_back) - len(current.nack)
    log.info("%s: closing; %d never-handed message(s) given back to the group (offsets committed back to %s)%s%s",
             topic, n_back, current.rewind,
             f", {len(current.nack)} of partitions no longer ours nacked for redelivery" if current.nack else "",
             f"; handed-over messages committed up to {current.forward}" if current.forward else "")
    return bool(current.nack)


def _forward(kc: Any, topic: str, plan: Callable[[set[int]], ClosePlan]) -> dict[int, int]:
    """The plan's ``forward`` offsets ({} when the client cannot say what it holds any more)."""
    try:
        return _assigned_plan(kc, topic, plan).forward
    except Exception as exc:  # noqa: BLE001 - a failing client: nothing can be committed anyway
        log.debug("%s: no assignment to commit handed-over messages for (%s)", topic, exc)
        return {}


def _assigned_plan(kc: Any, topic: str, plan: Callable[[set[int]], ClosePlan]) -> ClosePlan:
    """The close plan for the partitions of ``topic`` the client holds now."""
    return plan({p for t, p in kc.assignment() if t == topic})


def _poll_paused(kc: Any, pause_all: Callable[[], None], topic: str) -> bool:
    """One poll with every partition paused, which lets a rebalance complete (nothing is taken);
    False when the client cannot poll any more (then retrying the commit is pointless)."""
    try:
        pause_all()
        kc.fetch(0.2, 1)
    except Exception as exc:  # noqa: BLE001 - the client is failing: the caller gives up and closes it
        log.warning("%s: polling to complete a rebalance before the commit-back failed (%s)", topic, exc)
        return False
    return True
