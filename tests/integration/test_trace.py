"""``kmq trace`` on real runs: a KmqConsumer and a tracker on the real broker, then
each message's timeline checked event by event."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kmq.cli import cli
from tests.helpers.cli import by_copy
from tests.helpers.kafka import produce, wait_until
from tests.helpers.settling_worker import SettlingWorker
from tests.integration.tracker_util import metric, running_tracker
from kmq.ops.dlq import replay

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUEUE = {"lease": "1s", "max_deliveries": 5, "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0}}
KEYS = ["ack", "nack2", "timeout", "reject", "redrive", "held"]


class Application:
    """Settles each message by its key, as a real application would (on the worker's thread)."""

    def __init__(self) -> None:
        self.done: dict[str, bool] = {}
        self.held = {}

    def settle(self, msg) -> None:
        key = msg.key.decode()
        first = msg.origin == f"{msg.topic}/{msg.partition}/{msg.offset}"
        if key == "ack" or (key == "nack2" and msg.delivery_count == 3):
            msg.ack()
        elif key == "nack2":
            msg.nack(0)
        elif key == "timeout" and first:
            self.held["timeout"] = msg  # never settled in time: the lease runs out
        elif key == "timeout":
            msg.ack()
            self.held.pop("timeout").ack()  # the slow first attempt finishes late
        elif key in ("reject", "redrive") and first:
            msg.reject("bad payload")
        elif key == "redrive":
            msg.ack()
        elif key == "held":
            msg.renew(60.0)
            self.held["held"] = msg
            return
        self.done[key] = True


def _trace_json(bootstrap, cfg, q, *args) -> list[dict]:
    res = CliRunner().invoke(cli, ["trace", q.name, *args, "--output", "json", "--bootstrap", bootstrap,
                                   "--tracker-group", cfg.tracker.group_id, "--workers-group", cfg.consumer.group_id])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["messages"]


def test_trace_timelines_of_real_runs(bootstrap, queue_topics):
    # auto_renew off: the "timeout" message is left to let its lease lapse.
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"},
                          consumer={"ack_flush_interval": "50ms", "auto_renew": False})
    produce(bootstrap, q.name, keys=[k.encode() for k in KEYS], values=[f"<b>{k}</b>".encode() for k in KEYS],
            headers=[("app", b"x")], flush_each=True)
    origin = {k: f"{q.name}/0/{i}" for i, k in enumerate(KEYS)}
    with running_tracker(cfg) as t:
        app = Application()
        w = SettlingWorker(cfg, q.name, app.settle)
        try:
            wait_until(lambda: {"ack", "nack2", "timeout", "reject", "redrive"} <= set(app.done) and "held" in app.held,
                       40, what="every message settled once")
            wait_until(lambda: metric(t.http_port, "kmq_tracker_dead_lettered_total", queue=q.name) == 2, 20,
                       what="two dead letters")
            # Redrive one of the two rejected messages, through the same code as `kmq dlq replay`.
            app.done.pop("redrive")
            res = replay(cfg, q.name, select=lambda dl: dl.key == b"redrive", group="trace-test-redrive")
            assert (res.replayed, res.skipped) == (1, 1)
            wait_until(lambda: app.done.get("redrive"), 30, what="the redriven copy acked")
            w.consumer.writer.flush()
            # Everything but "held" settled and closed by the tracker.
            wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 1, 20,
                       what="only the held message in flight")
            wait_until(lambda: metric(t.http_port, "kmq_tracker_late_acks_total", queue=q.name) == 1, 20,
                       what="the late ack counted")

            # Default window (the tracker's committed marker offset): the held message is in flight.
            (held,) = _trace_json(bootstrap, cfg, q, origin["held"])
            assert held["state"] == "in-flight", held
            assert [e["kind"] for e in held["events"]] == ["delivered", "start", "renew"]
            assert held["events"][2]["lease_ms"] == 60_000 and held["scan"]["markers_from_source"] in (
                "tracker committed offset", "log start")

            traces = {k: _trace_json(bootstrap, cfg, q, origin[k], "--since", "10m")[0] for k in KEYS[:5]}
        finally:
            w.close()

    for tr in traces.values():
        ts = [e["ts_ms"] for e in tr["events"]]
        assert ts == sorted(ts)

    a = traces["ack"]
    assert (a["state"], a["key"], a["deliveries"]) == ("acked", "ack", 1)
    assert by_copy(a) == {0: ["delivered", "start", "ack"]}
    assert a["events"][0]["via"] == "first delivery" and a["events"][1]["lease_ms"] == 1000
    assert a["events"][1]["owner"]

    n = traces["nack2"]
    copies = [e["offset"] for e in n["events"] if e["kind"] == "delivered"]
    assert n["state"] == "acked" and len(copies) == 3 and copies[0] == 1
    assert [e["delivery_count"] for e in n["events"] if e["kind"] == "delivered"] == [1, 2, 3]
    assert by_copy(n) == {copies[0]: ["delivered", "start", "nack", "closed"],
                           copies[1]: ["delivered", "start", "nack", "closed"],
                           copies[2]: ["delivered", "start", "ack"]}
    assert all(e["outcome"] == "redelivered" for e in n["events"] if e["kind"] == "closed")
    assert all(e["delay_ms"] == 0 for e in n["events"] if e["kind"] == "nack")

    o = traces["timeout"]
    c0, c1 = [e["offset"] for e in o["events"] if e["kind"] == "delivered"]
    assert o["state"] == "acked"
    assert by_copy(o) == {c0: ["delivered", "start", "lease-expired", "closed", "late-ack"],
                           c1: ["delivered", "start", "ack"]}
    expired = next(e for e in o["events"] if e["kind"] == "lease-expired")
    last_lease = [e for e in o["events"] if e["kind"] in ("start", "renew") and e["offset"] == c0][-1]
    assert expired["ts_ms"] == last_lease["ts_ms"] + last_lease["lease_ms"]
    assert next(e for e in o["events"] if e["kind"] == "late-ack")["closed_as"] == "redelivered"

    r = traces["reject"]
    assert r["state"] == "dead-lettered" and r["deliveries"] == 1
    assert by_copy(r) == {3: ["delivered", "start", "reject", "closed"], "dlq": ["dead-lettered"]}
    dead = next(e for e in r["events"] if e["kind"] == "dead-lettered")
    assert (dead["reason"], dead["error"], dead["delivery_count"]) == ("rejected", "bad payload", 1)
    assert next(e for e in r["events"] if e["kind"] == "closed")["outcome"] == "dead-lettered"

    d = traces["redrive"]
    c0, c1 = [e["offset"] for e in d["events"] if e["kind"] == "delivered"]
    assert d["state"] == "acked" and (c0, d["deliveries"]) == (4, 2)
    assert by_copy(d) == {c0: ["delivered", "start", "reject", "closed"], "dlq": ["dead-lettered"],
                           c1: ["delivered", "start", "ack"]}
    assert [e["via"] for e in d["events"] if e["kind"] == "delivered"] == ["first delivery", "redriven from the DLQ"]
    kinds = [e["kind"] for e in d["events"]]
    assert kinds.index("dead-lettered") < kinds.index("delivered", 1)  # redriven after it was dead-lettered

    # The other ways to name a message find the same history; the human output says the same.
    by_key = _trace_json(bootstrap, cfg, q, "--key", "nack2", "--since", "10m")
    assert [m["origin"] for m in by_key] == [origin["nack2"]] and by_key[0]["events"] == n["events"]
    found = _trace_json(bootstrap, cfg, q, "--partition", "0", "--offset", str(copies[2]), "--since", "10m")
    assert found[0]["origin"] == origin["nack2"] and found[0]["events"] == n["events"]
    res = CliRunner().invoke(cli, ["trace", q.name, origin["reject"], "--since", "10m", "--bootstrap", bootstrap])
    assert res.exit_code == 0, res.output
    assert "REJECT: bad payload" in res.stdout and "final state: dead-lettered" in res.stdout
    assert "dead letter, reason rejected (bad payload), after delivery 1" in res.stdout
    assert "scanning " in res.stderr  # the progress line


def _old_and_new(bootstrap, queue_topics):
    """50 records with key k an hour old, then one new one."""
    import time

    cfg, q = queue_topics(1)
    old = int(time.time() * 1000) - 3_600_000
    produce(bootstrap, q.name, keys=b"k", values=[b"old"] * 50 + [b"new"], timestamps=[old + i for i in range(50)] + [None],
            flush_each=True)
    return cfg, q


def test_since_keeps_only_that_time(bootstrap, queue_topics):
    cfg, q = _old_and_new(bootstrap, queue_topics)
    everything = _trace_json(bootstrap, cfg, q, "--key", "k", "--since", "2h")
    recent = _trace_json(bootstrap, cfg, q, "--key", "k", "--since", "10m")
    assert len(everything) == 20  # the newest 20 of 51 messages with that key
    assert everything[-1]["origin"] == f"{q.name}/0/50" and everything[0]["origin"] == f"{q.name}/0/31"
    assert [m["origin"] for m in recent] == [f"{q.name}/0/50"] and recent[0]["state"] == "queued"


def test_since_starts_the_read_at_that_time(bootstrap, queue_topics, skip_on_tansu):
    skip_on_tansu("offsets_for_times ignores record timestamps (answers the log start), so there --since "
                  "filters while reading (test_since_keeps_only_that_time) instead of starting later")
    cfg, q = _old_and_new(bootstrap, queue_topics)
    (recent,) = _trace_json(bootstrap, cfg, q, "--key", "k", "--since", "10m")
    assert recent["scan"]["records_read"] < 10


@pytest.mark.parametrize("args, message", [
    ([], "name exactly one message"),
    (["nope"], "is not topic/partition/offset"),
    (["other/0/1"], "is not a message of queue"),
    (["--partition", "0"], "--partition and --offset go together"),
    (["--partition", "0", "--offset", "99"], "no record at"),
    (["--key", "none", "--since", "1h"], "no message with key 'none'"),
    (["x/0/0", "--since", "soon"], "--since"),
])
def test_trace_errors_are_one_line(bootstrap, queue_topics, args, message):
    cfg, q = queue_topics(1)
    args = [a.replace("x/0/0", f"{q.name}/0/0") for a in args]
    res = CliRunner().invoke(cli, ["trace", q.name, *args, "--bootstrap", bootstrap])
    assert res.exit_code in (1, 2) and message in res.output, res.output
    assert "Traceback" not in res.output
