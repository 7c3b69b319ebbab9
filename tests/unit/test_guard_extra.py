"""redis is an extra (``kmq[redis]``): without it ``import kmq`` works and the guards say
what to install, in one line, as our own error."""

from __future__ import annotations

import sys

import pytest

import kmq
from kmq.aio import AsyncIdempotencyGuard
from kmq.consumer.guard import RedisNotInstalled


@pytest.mark.parametrize("guard", [kmq.IdempotencyGuard, AsyncIdempotencyGuard])
def test_a_guard_without_the_redis_package_names_the_extra(monkeypatch, guard):
    monkeypatch.setitem(sys.modules, "redis", None)  # what a base install without the extra has
    with pytest.raises(RedisNotInstalled) as err:
        guard("redis://127.0.0.1:1/0")
    message = str(err.value)
    assert guard.__name__ in message and "redis extra" in message and "[redis]" in message
    assert "\n" not in message
    assert isinstance(err.value, kmq.KmqError) and isinstance(err.value, ImportError)
