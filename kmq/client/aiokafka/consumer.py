"""The group member on aiokafka: kmq's :class:`~kmq.client.GroupConsumerAdapter`, driven on the loop.

:class:`AioGroupConsumer` is made off the loop (with the rest of the consumer) and started on it
(:meth:`~AioGroupConsumer.start`); the loop's driver (:mod:`kmq.consumer.loop_driver`) awaits
:meth:`~AioGroupConsumer.afetch`. The adapter's other methods are the seam's, callable on the
loop (assignment, pause, seek, an asynchronous commit) and, for closing, from another thread (a
commit or poll then runs on the loop while that thread waits: :class:`~kmq.client.aiokafka.bridge.LoopBridge`).

Rebalances: aiokafka runs its listener inside its coordinator's task; the revoke callback's
commit back (``commit_on_revoke``, which waits for its hand-off RENEW) runs on a worker thread, so
the loop, where the marker producer lives, is free meanwhile; its commit is awaited before the
partitions go. aiokafka's assignors are eager (the whole assignment is revoked, then assigned).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as ak
from aiokafka.abc import ConsumerRebalanceListener

from kmq.client.aiokafka.bridge import LoopBridge
from kmq.client.aiokafka.errors import client_error, retriable, started
from kmq.client.api import Delivery, Record
from kmq.client.errors import ClientCommitFailed

__all__ = ["AioGroupConsumer", "POLL_RETRY_WAIT"]

log = logging.getLogger(__name__)

#: Seconds a fetch that failed with a passing error (a broker restarting) waits before the next.
POLL_RETRY_WAIT = 0.5

#: Most records decoded before other tasks get a turn on the loop: a fetch of thousands of records is
#: taken in chunks of this many (aiokafka decodes them as they are taken, a few microseconds each), so
#: one fetch does not keep the loop from other work for the whole of it.
CHUNK = 500

Partition = tuple[str, int]


class AioGroupConsumer:
    """A group member of ``settings`` (aiokafka's keywords) on ``bridge``'s loop, not started yet."""

    def __init__(self, settings: dict[str, Any], bridge: LoopBridge, timeout: float) -> None:
        self._settings = settings
        self._bridge = bridge
        self._timeout = timeout  # the longest a bridged call from another thread waits
        self.raw: AIOKafkaConsumer | None = None
        self._subscription: tuple[list[str], ConsumerRebalanceListener] | None = None
        self._failing = False
        #: Revocations begun so far (the listener counts them): a fetch during which one began is dropped.
        self.revocations = 0

    # ------------------------------------------------------------ on the loop
    async def start(self) -> None:
        """Connect (on the loop); the subscription made before takes effect now."""
        raw = self.raw = await started(AIOKafkaConsumer(**self._settings), "connecting the aiokafka consumer")
        if self._subscription is not None:
            raw.subscribe(self._subscription[0], listener=self._subscription[1])

    def subscribe(self, topics: Iterable[str], on_assigned: Callable[[set], None], on_revoked: Callable[[set], None],
                  commit_on_revoke: Callable[[set], Mapping[Partition, int]] | None = None,
                  on_commit_failed: Callable[[ClientCommitFailed], None] | None = None) -> None:
        """Join the group for ``topics`` (see :meth:`kmq.client.api.GroupConsumerAdapter.subscribe`)."""
        listener = _Listener(self, on_assigned, on_revoked, commit_on_revoke, on_commit_failed)
        self._subscription = (list(topics), listener)
        if self.raw is not None:
            self.raw.subscribe(self._subscription[0], listener=listener)

    async def afetch(self, timeout: float, max_records: int, build: Callable[..., Any] = Record) -> list:
        """Up to ``max_records`` records as ``build(topic, partition, offset, key, value, headers,
        timestamp)``, waiting at most ``timeout`` seconds for the first; what is fetched already is
        taken in chunks of :data:`CHUNK`, other tasks running between them. A passing error (a broker
        restarting) is logged and returns nothing after a short wait; any other fails as kmq's error.

        Nothing is returned when a revocation began meanwhile: aiokafka's rebalances are eager, so
        every partition goes back to its committed offset and what was taken is fetched again;
        reported after the revocation, it would count as fetched after it."""
        raw = self.raw
        if raw is None:
            return []
        seen = self.revocations
        out: list = []
        wait_ms = int(timeout * 1000)
        while len(out) < max_records:
            got = await self._get(raw, wait_ms, min(CHUNK, max_records - len(out)), build)
            if not got:
                break
            out.extend(got)
            wait_ms = 0
            if len(out) < max_records:
                await asyncio.sleep(0)  # the loop's other tasks before the next chunk
            if self.revocations != seen or self.raw is not raw:
                break
        if self.revocations != seen:
            log.debug("a revocation began during a fetch: its %d record(s) are fetched again after it", len(out))
            return []
        return out

    async def _get(self, raw: AIOKafkaConsumer, wait_ms: int, max_records: int, build: Callable[..., Any]) -> list:
        try:
            batches = await raw.getmany(timeout_ms=wait_ms, max_records=max_records)
        except ak.KafkaError as exc:
            if not retriable(exc):
                raise client_error(exc, "fetching records") from exc
            log.log(logging.DEBUG if self._failing else logging.WARNING, "Kafka fetch failed (%s: %s); fetching again",
                    type(exc).__name__, exc)
            self._failing = True
            await asyncio.sleep(max(wait_ms / 1000, POLL_RETRY_WAIT))
            return []
        if self._failing:
            self._failing = False
            log.info("Kafka fetch works again")
        # One comprehension per fetch: aiokafka's records are decoded already, only kmq's message is made.
        return [build(r.topic, r.partition, r.offset, r.key, r.value, r.headers or None, r.timestamp)
                for rs in batches.values() for r in rs]

    def commit_async(self, offsets: Mapping[Partition, int]) -> Delivery:
        """Commit ``offsets`` (next offsets) without waiting (on the loop): a
        :class:`~kmq.client.api.Delivery` answered with None or :class:`~kmq.client.errors.ClientCommitFailed`."""
        answer = Delivery()
        raw = self.raw
        if raw is None:
            raise ClientCommitFailed("the aiokafka consumer is closed")
        task = asyncio.get_running_loop().create_task(raw.commit(_tps(offsets)))
        task.add_done_callback(lambda t: _answer(answer, t))
        return answer

    async def aclose(self) -> None:
        """Leave the group and disconnect (nothing is committed: auto-commit is off)."""
        raw, self.raw = self.raw, None
        if raw is not None:
            await raw.stop()

    # ------------------------------------------------------------ on the loop, or bridged from a thread
    def assignment(self) -> set[Partition]:
        raw = self.raw
        if raw is None:
            return set()
        return self._bridge.call(lambda: {(tp.topic, tp.partition) for tp in raw.assignment()})

    def pause(self, partitions: Iterable[Partition]) -> None:
        tps = [TopicPartition(t, p) for t, p in partitions]
        if self.raw is not None and tps:
            self._bridge.call(self.raw.pause, *tps)

    def resume(self, partitions: Iterable[Partition]) -> None:
        tps = [TopicPartition(t, p) for t, p in partitions]
        if self.raw is not None and tps:
            self._bridge.call(self.raw.resume, *tps)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        raw = self.raw
        if raw is None:
            raise ClientCommitFailed("the aiokafka consumer is closed")
        try:
            self._bridge.call(raw.seek, TopicPartition(topic, partition), offset)
        except ak.IllegalStateError as exc:  # not assigned (any more)
            raise ClientCommitFailed(f"seeking {topic}/{partition} failed: {exc}", rebalanced=True) from exc

    def highwater(self, topic: str, partition: int) -> int | None:
        raw = self.raw
        return None if raw is None else self._bridge.call(raw.highwater, TopicPartition(topic, partition))

    def member_id(self) -> str | None:
        coordinator = getattr(self.raw, "_coordinator", None)
        return getattr(coordinator, "member_id", None) or None

    def commit(self, offsets: Mapping[Partition, int]) -> None:
        """Commit and wait (from another thread than the loop's: closing)."""
        raw = self.raw
        if raw is None:
            raise ClientCommitFailed("the aiokafka consumer is closed")
        try:
            self._bridge.wait(raw.commit(_tps(offsets)), self._timeout, "committing offsets")
        except ak.KafkaError as exc:
            raise ClientCommitFailed(f"committing offsets failed: {type(exc).__name__}: {exc}",
                                     rebalanced=isinstance(exc, (ak.CommitFailedError, ak.RebalanceInProgressError))
                                     ) from exc

    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = Record, wake: Any = None) -> list:
        """:meth:`afetch`, waited for from another thread (closing: the polls that let a rebalance finish)."""
        return self._bridge.wait(self.afetch(timeout, max_records, build), timeout + self._timeout, "polling Kafka")

    def close(self) -> None:
        """Leave the group (from another thread; on the loop, :meth:`aclose` is awaited instead)."""
        if self.raw is not None and not self._bridge.on_loop():
            self._bridge.wait(self.aclose(), self._timeout, "closing the aiokafka consumer")

    # The stall watchdog and the starved-fetch repair are kafka-python's: nothing to do here.
    def watch(self, stall_timeout: float, on_fatal: Callable[[str], None], name: str) -> None:
        """No watchdog: aiokafka's fetch runs on the loop and cannot hang a thread."""

    def unwatch(self) -> None:
        """See :meth:`watch`."""

    def recover_starved(self) -> None:
        """aiokafka loses no fetch response: nothing to repair."""


class _Listener(ConsumerRebalanceListener):
    """The adapter's rebalance callbacks, inside aiokafka's coordinator task."""

    def __init__(self, owner: AioGroupConsumer, on_assigned: Callable[[set], None], on_revoked: Callable[[set], None],
                 commit_on_revoke: Callable[[set], Mapping[Partition, int]] | None,
                 on_commit_failed: Callable[[ClientCommitFailed], None] | None) -> None:
        self._owner = owner
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._commit_on_revoke = commit_on_revoke
        self._on_commit_failed = on_commit_failed

    async def on_partitions_revoked(self, revoked: Any) -> None:
        parts = {(tp.topic, tp.partition) for tp in revoked}
        if not parts:
            return
        self._owner.revocations += 1
        raw = self._owner.raw
        if self._commit_on_revoke is not None and raw is not None:
            # On a worker thread: it waits for the hand-off RENEW, which the loop sends.
            offsets = await asyncio.get_running_loop().run_in_executor(None, self._commit_on_revoke, parts)
            if offsets:
                try:
                    await raw.commit(_tps(offsets))
                except Exception as exc:  # noqa: BLE001 - any failure: the messages stay this member's
                    failed = ClientCommitFailed(f"committing back before a revocation failed: {type(exc).__name__}: "
                                                f"{exc}", rebalanced=True)
                    if self._on_commit_failed is not None:
                        self._on_commit_failed(failed)
        self._on_revoked(parts)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        parts = {(tp.topic, tp.partition) for tp in assigned}
        if parts:
            self._on_assigned(parts)


def _tps(offsets: Mapping[Partition, int]) -> dict[TopicPartition, int]:
    return {TopicPartition(t, p): o for (t, p), o in offsets.items()}


def _answer(answer: Delivery, task: "asyncio.Task[Any]") -> None:
    if task.cancelled():
        answer.failure(ClientCommitFailed("the commit was cancelled (closing)"))
        return
    exc = task.exception()
    if exc is None:
        answer.success(None)
    else:
        answer.failure(ClientCommitFailed(f"committing offsets failed: {type(exc).__name__}: {exc}",
                                          rebalanced=isinstance(exc, (ak.CommitFailedError, ak.RebalanceInProgressError))))
