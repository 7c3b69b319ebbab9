"""Two consumer groups on one queue topic (fan-out) are independent: each has its own tracker,
markers and DLQ, and a copy made for one group is never delivered to the other.

The default group (``Q__markers``) NACKs some messages; the ``shipping`` group
(``Q__shipping__markers``) abandons others as a crashed worker would (no marker: their leases run
out). Each group gets every message, a copy only where its own group failed it, and each worker
counts the other group's copies it skipped."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import urllib.parse
import urllib.request
from collections import Counter

import pytest
from click.testing import CliRunner
from kafka import KafkaConsumer, KafkaProducer

from kmq.cli import cli
from kmq.client.topics import ensure_topics
from kmq.config import Config
from kmq.consumer.writer import MarkerWriter, marked
from kmq.core.markers import Start
from kmq.cli.trace import format_trace
from kmq.core.message import HEADER_GROUP, for_group
from kmq.ops.trace_reader import trace
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import produce, read_all, wait_until
from tests.helpers.settling_worker import SettlingWorker
from tests.helpers.workers import committed, markers_by_partition
from tests.integration.tracker_util import running_tracker

pytestmark = pytest.mark.integration

N = 24
QUEUE = {"lease": "2s", "max_deliveries": 5, "backoff": {"initial": "100ms", "max": "1s"}}


def _config(bootstrap: str, queue: dict, ordering: str = "none") -> Config:
    return Config.from_dict({
        "kafka": {"bootstrap_servers": bootstrap, **TEST_GROUP_TIMING},
        "queues": [{**QUEUE, **queue}],
        "consumer": {"group_id": unique("workers"), "ack_flush_interval": "50ms", "ordering": ordering},
        "tracker": {"group_id": unique("tracker"), "http_port": 0},
    })


class Worker(SettlingWorker):
    """``fail(i, delivery_count)`` says what to do instead of acking (``"nack"``, ``"abandon"``
    or None); every delivery is recorded."""

    def __init__(self, cfg: Config, queue: str, fail) -> None:
        self.fail = fail
        self.deliveries: list[tuple[int, int]] = []  # (message number, delivery count)
        self.acked: Counter[int] = Counter()
        self.origins: dict[int, str] = {}  # message number -> its origin (topic/partition/offset)
        super().__init__(cfg, queue, self.settle, batch_size=8)

    def settle(self, msg) -> None:
        i = int(msg.value)
        self.deliveries.append((i, msg.delivery_count))
        self.origins[i] = msg.origin
        what = self.fail(i, msg.delivery_count)
        if what == "nack":
            msg.nack(delay=0.1)
        elif what == "abandon":
            msg.abandon()
        else:
            msg.ack()
            self.acked[i] += 1

    def skipped(self) -> float:
        q = self.consumer.queue
        return self.consumer.metrics.copies_skipped.labels(q.label)._value.get()


@pytest.mark.parametrize("trackers, ordering", [("one per group", "none"), ("one for both", "none"),
                                               ("one per group", "key")])
def test_two_groups_on_one_topic_each_get_every_message_once(bootstrap, trackers, ordering):
    name = unique("q")
    billing = _config(bootstrap, {"name": name}, ordering)  # the default group: today's topic names
    shipping = _config(bootstrap, {"name": name, "group": "shipping"}, ordering)
    if trackers == "one per group":
        tracker_configs = [billing, shipping]
    else:  # one tracker consumes both groups' markers topics
        both = billing.queues + (dataclasses.replace(shipping.queues[0], workers_group=shipping.consumer.group_id),)
        tracker_configs = [Config.from_dict({**billing.to_dict(redact=False),
                                             "queues": Config(queues=both).to_dict()["queues"]})]
    qa, qb = billing.queues[0], shipping.queues[0]
    assert (qa.markers_topic, qb.markers_topic) == (f"{name}__markers", f"{name}__shipping__markers")
    ensure_topics(billing.kafka, qa, 2)
    ensure_topics(shipping.kafka, qb, 2)
    # Half carry the application's own headers: an original is every group's, headers or not.
    produce(billing, name, N, keys=lambda i: b"k%d" % (i % 5), values=b"%d",
            headers=lambda i: [("app", b"x")] if i % 2 else None, partition=None)

    nacked = {i for i in range(N) if i % 4 == 0}  # the default group RELEASEs these once
    abandoned = {i for i in range(N) if i % 3 == 0}  # shipping's worker drops these once, unsettled
    workers: list[Worker] = []

    def healthy(cond):
        for w in workers:
            if w.errors:
                raise w.errors[0]
        return cond()

    with contextlib.ExitStack() as stack:
        for tc in tracker_configs:
            stack.enter_context(running_tracker(tc))
        a = Worker(billing, name, lambda i, n: "nack" if i in nacked and n == 1 else None)
        workers.append(a)
        b = Worker(shipping, name, lambda i, n: "abandon" if i in abandoned and n == 1 else None)
        workers.append(b)
        try:
            wait_until(lambda: healthy(lambda: set(a.acked) == set(b.acked) == set(range(N))), 60,
                       what="every message acked by both groups")
            # Each worker reads the other group's copies too: it skips them (or, wrongly, delivers them).
            expect_a, expect_b = N + len(nacked), N + len(abandoned)
            wait_until(lambda: healthy(lambda: (a.skipped() >= len(abandoned) and b.skipped() >= len(nacked))
                                       or len(a.deliveries) > expect_a or len(b.deliveries) > expect_b), 30,
                       what="each group's copies skipped by the other group")
        finally:
            for w in workers:
                w.close()
    assert not a.errors and not b.errors
    # Every message once per group, a second delivery only where that group failed it.
    assert sorted(a.deliveries) == sorted([(i, 1) for i in range(N)] + [(i, 2) for i in nacked])
    assert sorted(b.deliveries) == sorted([(i, 1) for i in range(N)] + [(i, 2) for i in abandoned])
    assert a.acked == b.acked == Counter(range(N))
    assert (a.skipped(), b.skipped()) == (len(abandoned), len(nacked))
    # The copies in the shared topic name their group; the default group's carry no kmq-group.
    copies = [r for r in read_all(bootstrap, name, timeout=10) if "kmq-delivery-count" in dict(r.headers or [])]
    groups = Counter(dict(r.headers).get(HEADER_GROUP) for r in copies)
    assert groups == Counter({None: len(nacked), b"shipping": len(abandoned)})
    # kmq trace of a message both groups failed once: two deliveries in each group, not the other's copy.
    both = min(nacked & abandoned)
    for cfg, w in ((billing, a), (shipping, b)):
        [t] = trace(cfg, name, origin=w.origins[both], since_s=600)
        assert t.deliveries == 2, format_trace(t)
    # Nothing dead-lettered in either group's DLQ.
    assert not read_all(bootstrap, qa.dlq_topic, timeout=2) and not read_all(bootstrap, qb.dlq_topic, timeout=2)


def test_the_commands_take_the_group_and_a_replay_goes_to_its_group_only(bootstrap, tmp_path):
    name = unique("q")
    config = tmp_path / "kmq.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: '{bootstrap}'}}\n"
                      f"queues: [{{name: {name}}}, {{name: {name}, group: billing, workers_group: billing-w}}]\n")
    runner = CliRunner()

    def kmq(*args: str) -> str:
        res = runner.invoke(cli, [*args, "--config", str(config)])
        assert res.exit_code == 0, res.output
        return res.stdout

    ambiguous = runner.invoke(cli, ["topics", "create", name, "--config", str(config)])
    assert ambiguous.exit_code != 0
    assert f"queue '{name}' is configured for 2 groups (default, billing): name one (--group" in ambiguous.output
    kmq("topics", "create", name, "--partitions", "2", "--group", "default")
    kmq("topics", "create", name, "--group", "billing")  # the queue topic exists: only billing's own topics
    doc = json.loads(kmq("topics", "describe", name, "--group", "billing", "-o", "json"))
    assert doc["group"] == "billing" and doc["aligned"] is True
    assert [(t["name"], t["partitions"]) for t in doc["topics"]] == [
        (name, 2), (f"{name}__billing__markers", 2), (f"{name}__billing__dlq", 2)]
    status = json.loads(kmq("status", name, "--group", "billing", "-o", "json"))
    assert (status["group"], status["workers_group"]) == ("billing", "billing-w")
    # A dead letter of billing, replayed: to the shared queue topic, for billing only.
    p = KafkaProducer(bootstrap_servers=bootstrap)
    p.send(f"{name}__billing__dlq", key=b"k", value=b"v", partition=1,
           headers=[("kmq-origin", f"{name}/1/0".encode()), ("kmq-dlq-reason", b"rejected")]).get(timeout=10)
    p.close()
    assert "1 dead letter(s)" in runner.invoke(cli, ["dlq", "list", name, "--queue-group", "billing",
                                                     "--config", str(config)]).output
    assert "replayed 1 message(s)" in kmq("dlq", "replay", name, "--queue-group", "billing")
    [copy] = read_all(bootstrap, name, timeout=10, expect=1)
    assert dict(copy.headers)[HEADER_GROUP] == b"billing"
    assert not for_group(copy.headers, None, name, copy.partition, copy.offset)
    assert for_group(copy.headers, "billing", name, copy.partition, copy.offset)


def test_a_marker_writer_loop_skips_other_groups_copies_and_commits_past_them(bootstrap):
    name = unique("q")
    cfg = _config(bootstrap, {"name": name, "group": "billing"})
    q = cfg.queues[0]
    ensure_topics(cfg.kafka, q, 1)
    p = KafkaProducer(bootstrap_servers=bootstrap)
    for value, headers in [(b"original", [("app", b"x")]),
                           (b"default's copy", [("kmq-delivery-count", b"2"), ("kmq-origin", f"{name}/0/0".encode())]),
                           (b"billing's copy", [("kmq-delivery-count", b"2"), ("kmq-origin", f"{name}/0/0".encode()),
                                                (HEADER_GROUP, b"billing")]),
                           (b"shipping's copy", [("kmq-delivery-count", b"2"), ("kmq-origin", f"{name}/0/0".encode()),
                                                 (HEADER_GROUP, b"shipping")])]:
        p.send(name, value=value, headers=headers, partition=0)
    p.flush()
    p.close()
    consumer = KafkaConsumer(name, bootstrap_servers=bootstrap, group_id=cfg.workers_group(q),
                             enable_auto_commit=False, auto_offset_reset="earliest")
    handled: list[bytes] = []
    writer = MarkerWriter(cfg, queue=name, consumer=consumer)  # the only configured group: billing

    @marked(writer)
    def handle(record):
        handled.append(record.value)

    try:
        polled: list = []
        wait_until(lambda: polled.extend(r for rs in consumer.poll(timeout_ms=200).values() for r in rs)
                   or len(polled) == 4, 30, what="the four records polled")
        started = writer.start(polled)
        for record in polled:  # the README's loop: over what was polled, through the marked handler
            handle(record)
        writer.flush()
    finally:
        writer.close()
        consumer.close()
    assert [r.value for r in started] == handled == [b"original", b"billing's copy"]
    assert committed(bootstrap, cfg.workers_group(q), name) == {0: 4}  # past the skipped copies
    [starts] = [[m for m in markers if isinstance(m, Start)] for markers in
                markers_by_partition(bootstrap, q.markers_topic).values()]
    assert [o for m in starts for r in m.ranges for o in r.offsets()] == [0, 2]


def test_the_console_shows_and_redrives_each_group_of_a_queue(bootstrap, tmp_path):
    from tests.helpers.ui import UiProcess

    name = unique("q")
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": bootstrap},
                            "queues": [{"name": name}, {"name": name, "group": "billing", "workers_group": "bw"}]})
    for q in cfg.queues:
        ensure_topics(cfg.kafka, q, 1)
    p = KafkaProducer(bootstrap_servers=bootstrap)
    p.send(f"{name}__billing__dlq", key=b"k", value=b"billing-dead", partition=0,
           headers=[("kmq-origin", f"{name}/0/0".encode()), ("kmq-dlq-reason", b"rejected")]).get(timeout=10)
    p.close()
    ui = UiProcess(cfg, tmp_path)
    try:
        base = f"http://127.0.0.1:{ui.wait_port()}"

        def get(path: str) -> str:
            return urllib.request.urlopen(base + path, timeout=30).read().decode()

        page = get(f"/dlq?queue={name}__billing")
        assert "billing-dead" in page and f"<option selected>{name}__billing</option>" in page
        assert "billing-dead" not in get(f"/dlq?queue={name}")  # the default group's DLQ is its own
        assert f"kmq status {name} --group billing" in get(f"/?queue={name}__billing")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        form = urllib.parse.urlencode({"csrf": csrf, "queue": f"{name}__billing", "mode": "selected", "pos": "0:0"})
        done = urllib.request.urlopen(base + "/dlq/redrive", data=form.encode(), timeout=30).read().decode()
        assert "moved 1 dead letter(s)" in done
    finally:
        ui.close()
    [copy] = read_all(bootstrap, name, timeout=10, expect=1)
    assert copy.value == b"billing-dead" and dict(copy.headers)[HEADER_GROUP] == b"billing"
