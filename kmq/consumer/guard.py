"""IdempotencyGuard: at most one effective processing per message origin (Redis).

KMQ is at-least-once: a message whose lease ran out is redelivered even if
the first worker was only slow, so a late original and its redelivered copy
can both arrive. Both carry the same ``origin`` (``topic/partition/offset`` of
the first delivery). The guard keeps one Redis key per origin:

* ``begin``: ``SET key running:<token> NX PX lock_ttl`` -- only one holder;
  an expired lock (crashed worker) lets the next copy in.
* ``done``: ``SET key done PX ttl`` -- every later copy is skipped.
* ``release`` (on failure): delete the key if we still hold it, so a retry runs.

::

    guard = IdempotencyGuard(cfg.redis.url, ttl=24 * 3600)
    consumer.run(guard.wrap(handler))       # duplicates are acked without running handler

    # asyncio (kmq.aio): the same keys and rules on redis.asyncio, never blocking the loop
    guard = AsyncIdempotencyGuard(cfg.redis.url, ttl=24 * 3600)
    await consumer.run(guard.wrap(async_handler))
"""

from __future__ import annotations

import functools
import logging
import uuid
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

from kmq.core.errors import KmqError, install_extra
from kmq.core.message import origin_of

if TYPE_CHECKING:
    import redis

__all__ = ["IdempotencyGuard", "AsyncIdempotencyGuard", "GuardUnavailable", "InProgressElsewhere", "RedisNotInstalled"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_DONE = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v == false then redis.call('SET', KEYS[1], 'done', 'PX', ARGV[2]) return 1 end
if v == 'done' then return 1 end
return 0
"""


class RedisNotInstalled(KmqError, ImportError):
    """The guard needs the ``redis`` package, which the base install leaves out (the ``redis``
    extra, ``kmq[redis]``, brings it). Also an ImportError, as a missing module is."""


def _import_redis(guard: str) -> Any:
    """The redis module, imported on first use: it adds ~8 MB to every process that imports it,
    and trackers and most workers never use it (it is an extra, not a base dependency)."""
    try:
        import redis
    except ImportError as exc:
        raise RedisNotInstalled(
            f"{guard} needs the redis package ({exc}): {install_extra('redis')}, or pip install 'redis>=5.0'"
        ) from exc
    return redis


class GuardUnavailable(KmqError):
    """Redis could not be reached; the message is not processed (it will be redelivered)."""

    retriable = True


class InProgressElsewhere(KmqError):
    """Another worker holds the in-progress lock for this origin. Not a duplicate yet:
    if that worker dies its effect never happens, so this copy must be retried later
    (raised from :meth:`IdempotencyGuard.run`, so the consumer nacks it with backoff)."""

    retriable = True


def _origin(msg_or_origin: Any) -> str:
    if isinstance(msg_or_origin, str):
        return msg_or_origin
    origin = getattr(msg_or_origin, "origin", None)
    if isinstance(origin, str):  # a KmqMessage
        return origin
    # A kafka-python ConsumerRecord (MarkerWriter users): the same trusted-origin rule.
    m = msg_or_origin
    return origin_of(m.headers, m.topic, m.partition, m.offset)


class _GuardRules:
    """What both guards share: the settings, the keys and the log lines (the Redis scripts above)."""

    def __init__(self, redis_url: str, ttl: float, lock_ttl: float, prefix: str) -> None:
        if ttl <= 0 or lock_ttl <= 0:
            raise ValueError("ttl and lock_ttl must be > 0 seconds")
        self.ttl_ms = int(ttl * 1000)
        self.lock_ttl_ms = int(lock_ttl * 1000)
        self.prefix = prefix
        self._url = redis_url
        self._tokens: dict[str, str] = {}
        self.skipped = 0

    def _key(self, origin: str) -> str:
        return self.prefix + origin

    def _unavailable(self, exc: BaseException) -> GuardUnavailable:
        return GuardUnavailable(
            f"Redis at {self._url} failed ({type(exc).__name__}: {exc}); the message was not processed")

    @staticmethod
    def _new_token() -> str:
        return f"running:{uuid.uuid4().hex}"

    @staticmethod
    def _lock_lost(origin: str) -> None:
        log.warning("%s: our in-progress lock expired and another copy holds it now; "
                    "it may take effect twice (raise lock_ttl above the processing time)", origin)

    def _duplicate(self, origin: str, state: str | None) -> None:
        """After a refused claim: raise while another copy runs, else count the skip."""
        if state == "running":
            raise InProgressElsewhere(f"{origin} is being processed by another worker; retry later")
        self.skipped += 1
        log.info("%s already processed; skipped as a duplicate", origin)


def _state_of(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    return "done" if raw == b"done" else "running"


class IdempotencyGuard(_GuardRules):
    """Skip messages whose ``origin`` was already processed (or is being processed).

    :param redis_url: e.g. ``redis://localhost:6379/0``.
    :param ttl: seconds a done mark is kept (longer than any redelivery can arrive).
    :param lock_ttl: seconds an in-progress lock is held before another copy may run
        (use at least the queue's lease).
    :param prefix: Redis key prefix.
    """

    def __init__(self, redis_url: str, ttl: float = 7 * 24 * 3600, lock_ttl: float = 60.0, prefix: str = "kmq:done:",
                 client: "redis.Redis | None" = None) -> None:
        super().__init__(redis_url, ttl, lock_ttl, prefix)
        redis = _import_redis(type(self).__name__)
        self._redis_error = redis.RedisError
        self._redis = client or redis.Redis.from_url(redis_url)
        self._release = self._redis.register_script(_RELEASE)
        self._done = self._redis.register_script(_DONE)

    def _call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        try:
            return fn(*args, **kw)
        except self._redis_error as exc:
            raise self._unavailable(exc) from exc

    def begin(self, msg: Any) -> bool:
        """Claim ``msg`` (a :class:`~kmq.core.message.KmqMessage`, a kafka-python ``ConsumerRecord``
        or an origin string). False: done or in progress elsewhere."""
        origin = _origin(msg)
        token = self._new_token()
        if self._call(self._redis.set, self._key(origin), token, nx=True, px=self.lock_ttl_ms):
            self._tokens[origin] = token
            return True
        return False

    def done(self, msg: Any) -> None:
        """Mark ``msg`` processed (kept ``ttl`` seconds)."""
        origin = _origin(msg)
        token = self._tokens.pop(origin, "")
        if not self._call(self._done, keys=[self._key(origin)], args=[token, self.ttl_ms]):
            self._lock_lost(origin)

    def release(self, msg: Any) -> None:
        """Give up the claim after a failure, so a redelivered copy runs."""
        origin = _origin(msg)
        token = self._tokens.pop(origin, None)
        if token:
            self._call(self._release, keys=[self._key(origin)], args=[token])

    def state(self, msg: Any) -> str | None:
        """None (never seen or released), ``"running"`` or ``"done"``."""
        return _state_of(self._call(self._redis.get, self._key(_origin(msg))))

    def run(self, msg: Any, fn: Callable[[Any], T]) -> tuple[bool, T | None]:
        """``fn(msg)`` unless ``msg`` is a duplicate. Returns ``(ran, result)``: ``(False, None)``
        when a copy already took effect. Raises :class:`InProgressElsewhere` while another copy
        is being processed (retry later). An exception from ``fn`` releases the claim and propagates."""
        if not self.begin(msg):
            self._duplicate(_origin(msg), self.state(msg))
            return False, None
        try:
            result = fn(msg)
        except BaseException:
            self.release(msg)
            raise
        self.done(msg)
        return True, result

    def wrap(self, handler: Callable[[Any], T]) -> Callable[[Any], T | None]:
        """A handler that runs ``handler`` only for the first copy of each origin."""

        @functools.wraps(handler)
        def guarded(msg: Any) -> T | None:
            return self.run(msg, handler)[1]

        return guarded

    def close(self) -> None:
        self._redis.close()


class AsyncIdempotencyGuard(_GuardRules):
    """:class:`IdempotencyGuard` for asyncio handlers (:mod:`kmq.aio`): the same keys, scripts and
    rules on ``redis.asyncio``, so a guarded coroutine never blocks the event loop on Redis.

    The two guards interoperate: a threaded worker and an asyncio worker on one prefix see each
    other's claims and done marks."""

    def __init__(self, redis_url: str, ttl: float = 7 * 24 * 3600, lock_ttl: float = 60.0, prefix: str = "kmq:done:",
                 client: "redis.asyncio.Redis | None" = None) -> None:
        super().__init__(redis_url, ttl, lock_ttl, prefix)
        redis = _import_redis(type(self).__name__)
        import redis.asyncio  # noqa: F811 - the same module, with its asyncio part loaded

        self._redis_error = redis.RedisError
        self._redis = client or redis.asyncio.Redis.from_url(redis_url)
        self._release = self._redis.register_script(_RELEASE)
        self._done = self._redis.register_script(_DONE)

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any) -> T:
        try:
            return await fn(*args, **kw)
        except self._redis_error as exc:
            raise self._unavailable(exc) from exc

    async def begin(self, msg: Any) -> bool:
        """Claim ``msg``; False: done or in progress elsewhere."""
        origin = _origin(msg)
        token = self._new_token()
        if await self._call(self._redis.set, self._key(origin), token, nx=True, px=self.lock_ttl_ms):
            self._tokens[origin] = token
            return True
        return False

    async def done(self, msg: Any) -> None:
        """Mark ``msg`` processed (kept ``ttl`` seconds)."""
        origin = _origin(msg)
        token = self._tokens.pop(origin, "")
        if not await self._call(self._done, keys=[self._key(origin)], args=[token, self.ttl_ms]):
            self._lock_lost(origin)

    async def release(self, msg: Any) -> None:
        """Give up the claim after a failure, so a redelivered copy runs."""
        origin = _origin(msg)
        token = self._tokens.pop(origin, None)
        if token:
            await self._call(self._release, keys=[self._key(origin)], args=[token])

    async def state(self, msg: Any) -> str | None:
        """None (never seen or released), ``"running"`` or ``"done"``."""
        return _state_of(await self._call(self._redis.get, self._key(_origin(msg))))  # type: ignore[arg-type]  # bytes: not decoded

    async def run(self, msg: Any, fn: Callable[[Any], Awaitable[T]]) -> tuple[bool, T | None]:
        """``await fn(msg)`` unless ``msg`` is a duplicate; the same contract as :meth:`IdempotencyGuard.run`."""
        if not await self.begin(msg):
            self._duplicate(_origin(msg), await self.state(msg))
            return False, None
        try:
            result = await fn(msg)
        except BaseException:
            await self.release(msg)
            raise
        await self.done(msg)
        return True, result

    def wrap(self, handler: Callable[[Any], Awaitable[T]]) -> Callable[[Any], Awaitable[T | None]]:
        """A coroutine handler that runs ``handler`` only for the first copy of each origin."""

        @functools.wraps(handler)
        async def guarded(msg: Any) -> T | None:
            return (await self.run(msg, handler))[1]

        return guarded

    async def close(self) -> None:
        await self._redis.aclose()
