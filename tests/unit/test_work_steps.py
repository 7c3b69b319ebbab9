"""kmq work writes each delivery's decisions once: a thread and a coroutine drive the same steps
(sleeps, blocking guard calls whose answers flow back, a failure raised to run())."""

from __future__ import annotations

import asyncio

import pytest

from kmq.cli.work import _await_steps, _Blocking, _run_steps, _Sleep


def delivery(log: list, fail: bool = False):
    yield _Sleep(0)
    claimed = yield _Blocking(lambda key: key == "m1", "m1")  # the guard's answer comes back
    log.append(("claimed", claimed))
    state = yield _Blocking(str.upper, "running")
    log.append(("state", state))
    if fail:
        raise RuntimeError("injected")
    log.append(("done", None))


@pytest.mark.parametrize("drive", ["thread", "coroutine"])
def test_both_drivers_run_the_same_steps(drive):
    log: list = []
    if drive == "thread":
        _run_steps(delivery(log))
    else:
        asyncio.run(_await_steps(delivery(log)))
    assert log == [("claimed", True), ("state", "RUNNING"), ("done", None)]


@pytest.mark.parametrize("drive", ["thread", "coroutine"])
def test_a_failure_reaches_the_caller(drive):
    with pytest.raises(RuntimeError, match="injected"):
        if drive == "thread":
            _run_steps(delivery([], fail=True))
        else:
            asyncio.run(_await_steps(delivery([], fail=True)))
