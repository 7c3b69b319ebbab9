"""Redelivery backoff by delivery count: exponential, capped, never overflowing.

Pure. The one place the delay is computed: ``BackoffConfig.delay`` (the
tracker's due times), ``KmqConsumer.run`` and ``@kmq.marked`` (nack delays on
a handler exception) all call :func:`backoff_delay`.

The naive ``initial * multiplier ** (count - 1)`` raises ``OverflowError`` for
a ``kmq-delivery-count`` of a few thousand (``2.0 ** 4999``), and the count
comes from a header anyone can write. Here the exponent is compared with the
number of steps that reach the cap first, so any count -- 5000, ``10**6``,
``10**400`` -- costs one logarithm and returns the cap.
"""

from __future__ import annotations

import math

from kmq.core.settlement import MAX_MS

__all__ = ["backoff_delay", "MAX_BACKOFF"]

#: The longest delay the wire can carry (NACK ``u32 delay_ms``): every result is capped to it.
MAX_BACKOFF = MAX_MS / 1000


def backoff_delay(attempt: int, initial: float, maximum: float, multiplier: float) -> float:
    """Seconds before redelivery number ``attempt`` (1 = the first):
    ``initial * multiplier ** (attempt - 1)``, at most ``maximum`` (and at most
    :data:`MAX_BACKOFF`). ``attempt < 1`` gives 0. Never raises for any int."""
    if not attempt >= 1:  # also false for NaN
        return 0.0
    cap = min(maximum, MAX_BACKOFF) if maximum == maximum else MAX_BACKOFF
    cap = max(cap, 0.0)
    if not initial > 0:
        return 0.0
    if initial >= cap or not multiplier > 1.0:
        return min(initial, cap)
    if math.isinf(multiplier):
        return initial if attempt == 1 else cap
    # Steps after which the product reaches the cap; comparing an int of any size
    # with this float is exact in Python and cannot overflow.
    steps = math.log(cap / initial) / math.log(multiplier)
    if attempt - 1 >= steps:
        return cap
    return min(cap, initial * multiplier ** (attempt - 1))
