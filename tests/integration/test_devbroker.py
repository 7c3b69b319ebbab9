"""`kmq dev broker`: starts, serves a produce/consume round trip, exits cleanly on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer

pytestmark = pytest.mark.integration

KMQ = [sys.executable, "-m", "kmq"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            text = (task / "children").read_text().split()
        except FileNotFoundError:  # that thread ended after the listing: it has no children now
            continue
        out.extend(int(x) for x in text)
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_dev_broker_round_trip_and_clean_exit(sig):
    proc = subprocess.Popen(KMQ + ["dev", "broker"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"bootstrap (127\.0\.0\.1:\d+) .*pid (\d+)", line)
        assert m, line
        bootstrap, broker_pid = m.group(1), int(m.group(2))
        assert _children(proc.pid) == [broker_pid]

        producer = KafkaProducer(bootstrap_servers=bootstrap)
        producer.send("roundtrip", b"hello", key=b"k").get(10)
        producer.close()
        consumer = KafkaConsumer("roundtrip", bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10000)
        got = next(iter(consumer))
        consumer.close()
        assert (got.key, got.value) == (b"k", b"hello")

        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, rest
        assert "broker stopped" in rest
        assert not _alive(broker_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dev_broker_s3_storage_survives_a_broker_restart(tmp_path):
    from kmq.dev.broker import DevBroker

    workdir = tmp_path / "not" / "made" / "yet"  # the broker makes it (it used to fail opening its logs)
    with DevBroker(storage="s3", workdir=str(workdir)) as broker:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
        producer.send("durable", b"kept").get(10)
        producer.close()
        old_pid = broker.pid
        broker.restart()
        assert broker.pid != old_pid and not _alive(old_pid)
        consumer = KafkaConsumer("durable", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10000)
        assert [r.value for r in consumer] == [b"kept"]
        consumer.close()
        pids = broker.pids
    assert pids and not any(_alive(p) for p in pids)
    assert (workdir / "tansu.log").exists()
