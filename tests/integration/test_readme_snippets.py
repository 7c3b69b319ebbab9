"""Every Python block of README.md runs as pasted against the suite's broker and acks the
messages of its queue: each block defines what it uses (its handler and exceptions), so a
reader can paste it.

Each block runs in a thread on a queue of its own (``kmq.yaml`` in the working directory,
written from the test's config). What the test changes, and nothing else:

* the names a user would have: ``localhost:9092``, the queue ``"orders"``, the group ids;
* the bounds of the endless loops, only once every message is acked: ``while True:`` reads
  ``while not _readme_stop.is_set():``; a ``for msg in consumer:`` loop over a
  ``KmqConsumer`` ends by ``consumer.stop()``; ``asyncio.run(main())`` runs ``main()`` until
  the stop and then cancels it (its ``async with`` closes the consumer).

"Acked" is read from the markers topic: an END marker covers every message produced, with no
NACK or REJECT, so no message is left leased when the block stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from pathlib import Path

import pytest
import yaml

import kmq
from kmq.core.markers import End, Nack, Reject
from tests.helpers.kafka import produce, wait_until
from tests.helpers.workers import markers_by_partition

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 10
STOP = "_readme_stop"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def kind(block: str) -> str:
    """Which API a README block shows (one block per kind)."""
    if "kmq.share" in block:
        return "share"
    if "AsyncKmqConsumer" in block:
        return "asyncio"
    if "MarkerWriter" in block:
        return "confluent-loop" if "confluent_kafka" in block else "kafka-python-loop"
    if "KmqConsumer" in block:
        return "KmqConsumer"
    raise AssertionError(f"a README Python block this test does not know how to run:\n{block}")


BLOCKS = {kind(b): b for b in python_blocks()}
CASES = [("share", None), ("KmqConsumer", "kafka-python"), ("KmqConsumer", "confluent"), ("asyncio", None),
         ("kafka-python-loop", None), ("confluent-loop", None)]


def test_every_readme_python_block_is_run_here():
    assert len(BLOCKS) == len(python_blocks()), "two README blocks of one kind: give each its own case"
    assert set(BLOCKS) == {k for k, _ in CASES}


def adapted(block: str, bootstrap: str, queue: str, group: str) -> str:
    code = (block.replace("localhost:9092", bootstrap)
            .replace('"orders-share-workers"', repr(group)).replace('"orders-workers"', repr(group))
            .replace('"orders"', repr(queue)))
    assert "orders" not in re.sub(r"#.*", "", code), "a name of the README's queue left in the code"
    loops = code.count("while True:")
    assert loops <= 1
    code = code.replace("while True:", f"while not {STOP}.is_set():")
    if "asyncio.run(main())" in code:
        code = code.replace("asyncio.run(main())", "asyncio.run(_readme_until_stopped(main()))")
    else:
        assert loops == 1 or "for msg in consumer:" in code, "a loop this test cannot bound"
    return code


def acked(bootstrap: str, markers_topic: str) -> tuple[set[int], set[int]]:
    """(offsets an END covers, offsets a NACK or REJECT covers) of queue partition 0."""
    markers = markers_by_partition(bootstrap, markers_topic).get(0, [])
    ends = {o for m in markers if isinstance(m, End) for r in m.ranges for o in r.offsets()}
    failed = {o for m in markers if isinstance(m, (Nack, Reject)) for r in m.ranges for o in r.offsets()}
    return ends, failed


@pytest.mark.parametrize("name,client", CASES, ids=[f"{k}-{c}" if c else k for k, c in CASES])
def test_readme_block_runs_as_pasted_and_acks_its_messages(name, client, queue_topics, bootstrap, tmp_path,
                                                         monkeypatch):
    cfg, q = queue_topics(partitions=1, consumer={"ack_flush_interval": "50ms"},
                          **({"kafka": {"client": client}} if client else {}))
    (tmp_path / "kmq.yaml").write_text(yaml.safe_dump(cfg.to_dict(redact=False)))
    monkeypatch.chdir(tmp_path)  # the blocks load ./kmq.yaml
    produce(cfg, q.name, MESSAGES, values=b"readme-%d", partition=None)

    stop = threading.Event()

    async def until_stopped(main):
        task = asyncio.ensure_future(main)
        stopped = asyncio.ensure_future(asyncio.to_thread(stop.wait))
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            stop.set()  # main() ended on its own (an error): let the waiting thread go too
            await stopped

    space = {"__name__": "__readme__", STOP: stop, "_readme_until_stopped": until_stopped}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            exec(compile(adapted(BLOCKS[name], bootstrap, q.name, cfg.consumer.group_id), f"README-{name}", "exec"),
                 space)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"readme-{name}", daemon=True)
    thread.start()
    try:
        wait_until(lambda: errors or acked(bootstrap, q.markers_topic)[0] >= set(range(MESSAGES)), 90,
                   interval=0.5, what=f"the {name} block to ack {MESSAGES} messages")
    finally:
        stop.set()
        consumer = space.get("consumer")
        if isinstance(consumer, kmq.KmqConsumer):
            consumer.stop()
        thread.join(30)
        # The `while True:` blocks leave their clients open, as a loop a user stops would: close
        # them, the marker writer first (its pending ENDs), before the broker goes.
        for client_obj in (space.get("writer"), space.get("consumer")):
            if client_obj is not None:
                with contextlib.suppress(Exception):
                    client_obj.close()
    assert not thread.is_alive(), f"the {name} block did not stop"
    assert not errors, f"the {name} block failed: {errors[0]!r}"
    ends, failed = acked(bootstrap, q.markers_topic)
    assert ends >= set(range(MESSAGES)) and not failed, (sorted(ends), sorted(failed))
