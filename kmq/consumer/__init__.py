"""The consumer side: :class:`KmqConsumer`, :class:`MarkerWriter` and its parts
(marker batching and retries, flow control, handler pool, leases), the
idempotency guard and the asyncio bridge.

Public names are re-exported by :mod:`kmq`; the modules here are the parts.
"""
