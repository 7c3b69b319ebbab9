"""The demo's synthetic workload: numbered payloads, poison messages and injected
handler fates (fail, hang, slow), all deterministic so a run can be explained
afterwards. Used by ``kmq produce``, ``kmq work --fail-rate``, the demo and the tests.
"""

from __future__ import annotations

import hashlib
import math

__all__ = ["POISON_PREFIX", "payload", "is_poison_index", "is_poison", "fate", "InjectedFailure"]

POISON_PREFIX = b"POISON:"


def is_poison_index(i: int, rate: float) -> bool:
    return rate > 0 and math.floor((i + 1) * rate) > math.floor(i * rate)


def payload(i: int, size: int, poison: bool) -> bytes:
    head = (POISON_PREFIX if poison else b"") + b"%010d:" % i
    return head + b"." * max(0, size - len(head))


def is_poison(value: bytes | None, rate: float = 0.0) -> bool:
    """Poison: payload starts with ``POISON:``, or its index i (as written by
    ``kmq produce``) is chosen by ``rate``."""
    if value is None:
        return False
    if value.startswith(POISON_PREFIX):
        return True
    if rate > 0 and len(value) >= 11 and value[10:11] == b":" and value[:10].isdigit():
        return is_poison_index(int(value[:10]), rate)
    return False


def fate(origin: str, delivery_count: int, fail_rate: float, hang_rate: float, slow_rate: float = 0.0) -> str:
    """``"fail"``, ``"hang"``, ``"slow"`` or ``"ok"`` for one delivery (deterministic)."""
    digest = hashlib.blake2b(f"{origin}#{delivery_count}".encode(), digest_size=8).digest()
    x = int.from_bytes(digest, "big") / 2**64
    if x < fail_rate:
        return "fail"
    if x < fail_rate + hang_rate:
        return "hang"
    if x < fail_rate + hang_rate + slow_rate:
        return "slow"
    return "ok"


class InjectedFailure(Exception):
    """Raised by ``kmq work --fail-rate`` (the message is nacked)."""
