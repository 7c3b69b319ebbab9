"""Consumer groups of one queue (fan-out): topic names and the rules that keep two groups' state
apart (kmq.config), the kmq-group header of copies (kmq.core.copies, kmq.core.message) and the
skip of another group's copies in the fetch pipeline (kmq.consumer.fetch_pipeline). Pure."""

from __future__ import annotations

import threading

import pytest

from kmq.config import Config, QueueConfig
from kmq.consumer.fetch_pipeline import Commit, FetchPipeline, HandOver, Skip, WriteStarts, classify
from kmq.core.copies import copy_headers, copy_headers_for, dead_letter_headers
from kmq.core.errors import ConfigError
from kmq.core.message import HEADER_GROUP, KmqMessage, for_group, group_of

LOCK = threading.Lock()


def cfg(*queues, **sections) -> Config:
    return Config.from_dict({"queues": list(queues), **sections})


# ------------------------------------------------------------------ names
def test_the_default_group_keeps_todays_topic_names():
    q = cfg({"name": "orders"}).queues[0]
    assert (q.group, q.group_name, q.markers_topic, q.dlq_topic, q.label) == (
        None, "default", "orders__markers", "orders__dlq", "orders")
    assert cfg({"name": "orders", "group": "default"}).queues[0] == q  # "default" names the default group


def test_a_named_group_has_its_own_markers_dlq_and_metrics_topics():
    q = cfg({"name": "orders", "group": "billing"}).queues[0]
    assert (q.markers_topic, q.dlq_topic, q.metrics_topic, q.label) == (
        "orders__billing__markers", "orders__billing__dlq", "orders__billing__kmq_metrics", "orders__billing")
    assert QueueConfig.named("orders", "billing").markers_topic == "orders__billing__markers"


@pytest.mark.parametrize("group", ["a__b", "_a", "a_", "", "a b", "bill/ing", 5])
def test_a_group_name_that_would_blur_topic_names_is_refused(group):
    with pytest.raises(ConfigError, match=r"queues\[0\].group: expected a group name"):
        cfg({"name": "orders", "group": group})


def test_a_group_making_topic_names_longer_than_kafka_allows_is_refused():
    with pytest.raises(ConfigError, match=r"queues\[0\].group: .*longer than Kafka's 249 characters"):
        cfg({"name": "q" * 200, "group": "g" * 40})


# ------------------------------------------------------------------ what would mix two groups' state
def test_two_groups_of_one_queue_need_their_own_workers_groups():
    with pytest.raises(ConfigError, match=r"queues\[1\].workers_group: groups 'default' and 'billing' of queue "
                                          r"'orders' would both use the workers consumer group 'kmq-workers'"):
        cfg({"name": "orders"}, {"name": "orders", "group": "billing"})
    both = cfg({"name": "orders"}, {"name": "orders", "group": "billing", "workers_group": "billing-workers"})
    assert [both.workers_group(q) for q in both.queues] == ["kmq-workers", "billing-workers"]


def test_a_group_configured_twice_is_refused():
    with pytest.raises(ConfigError, match=r"queues\[1\].name: group 'billing' of queue 'orders' is configured twice"):
        cfg({"name": "orders", "group": "billing", "workers_group": "a"},
            {"name": "orders", "group": "billing", "workers_group": "b"})


def test_two_groups_sharing_a_markers_or_dlq_topic_are_refused():
    with pytest.raises(ConfigError, match=r"queues\[1\].markers_topic: 'orders__markers' is also queues\[0\].markers_topic"):
        cfg({"name": "orders"}, {"name": "orders", "group": "billing", "workers_group": "b",
                                 "markers_topic": "orders__markers"})
    with pytest.raises(ConfigError, match=r"queues\[1\].dlq_topic: 'jobs' is also the queue topic 'jobs'"):
        cfg({"name": "jobs"}, {"name": "orders", "dlq_topic": "jobs"})


def test_a_queue_with_several_groups_is_looked_up_by_group():
    c = cfg({"name": "orders"}, {"name": "orders", "group": "billing", "workers_group": "b"})
    with pytest.raises(ConfigError, match=r"queue 'orders' is configured for 2 groups \(default, billing\)"):
        c.queue("orders")
    assert c.queue("orders", "billing").markers_topic == "orders__billing__markers"
    assert c.queue("orders", "default").markers_topic == "orders__markers"
    assert c.queue("orders", "shipping").markers_topic == "orders__shipping__markers"  # not configured: defaults
    one = cfg({"name": "orders", "group": "billing"})
    assert one.queue("orders").group == "billing"  # the only configured group of the queue


# ------------------------------------------------------------------ the kmq-group header
def test_a_copy_names_its_named_group_and_a_default_group_copy_names_none():
    original = [("app", b"1"), (HEADER_GROUP, b"someone-else")]
    assert group_of(copy_headers(original, "q/0/5", 1, "billing")) == "billing"
    assert group_of(copy_headers(original, "q/0/5", 1)) is None
    assert group_of(copy_headers_for(None, "q", 0, 5, 1, "billing")) == "billing"
    assert group_of(copy_headers_for(None, "q", 0, 5, 1)) is None
    assert group_of(dead_letter_headers(original, "q/0/5", 1, "rejected", "", 0)) is None


COPY = [("kmq-delivery-count", b"2"), ("kmq-origin", b"q/0/3")]  # a copy of q/0/3, read at q/0/9


@pytest.mark.parametrize("headers, group, delivered", [
    (None, None, True), (None, "billing", True),  # an original: every group's
    ([("traceparent", b"00-ab")], "billing", True),  # an original with the application's headers too
    ([("kmq-origin", b"q/0/9")], "billing", True),  # names its own offset: not a copy
    # Headers carried along from another queue's copy (Streams, Connect): an original here.
    ([("kmq-delivery-count", b"2"), ("kmq-origin", b"other/0/3"), (HEADER_GROUP, b"shipping")], "billing", True),
    (COPY, None, True),  # a default group's copy (or an older tracker's, or an older replay)
    (COPY, "billing", False),
    (COPY + [(HEADER_GROUP, b"billing")], "billing", True),
    (COPY + [(HEADER_GROUP, b"billing")], None, False),
    (COPY + [(HEADER_GROUP, b"billing")], "shipping", False),
    (COPY + [(HEADER_GROUP, b"default")], None, True),  # a replayed dead letter of the default group
    (COPY + [(HEADER_GROUP, b"default")], "billing", False),
    # A replay that landed at its origin's offset (the queue topic was empty): still its group's only.
    ([("kmq-origin", b"q/0/9"), (HEADER_GROUP, b"billing")], None, False),
    ([("kmq-origin", b"q/0/9"), (HEADER_GROUP, b"billing")], "billing", True),
    ([(HEADER_GROUP, b"billing")], None, True),  # no kmq-origin of this queue: not kmq's record
])
def test_a_worker_delivers_originals_and_its_own_groups_copies_only(headers, group, delivered):
    assert for_group(headers, group, "q", 0, 9) is delivered


# ------------------------------------------------------------------ the fetch pipeline's skip
def msg(p: int, o: int, group: str | None = None) -> KmqMessage:
    """An original (``group`` None), or a copy for ``group`` of the record at offset 1000."""
    headers = [] if group is None else [("kmq-delivery-count", b"2"), ("kmq-origin", f"q/{p}/1000".encode()),
                                        (HEADER_GROUP, group.encode())]
    return KmqMessage("q", p, o, None, b"v", headers, 0, None, LOCK)


def test_another_groups_copies_are_skipped_and_committed_past_without_a_start():
    pipe = FetchPipeline(start_timeout=5.0, commit_timeout=10.0, group="billing")
    pipe.assigned({0, 1})
    batch = [msg(0, 0), msg(0, 1, "shipping"), msg(0, 2, "billing"), msg(1, 7, "shipping")]
    skip, start = pipe.polled(batch, 0.0)
    assert isinstance(skip, Skip) and [(m.partition, m.offset) for m in skip.messages] == [(0, 1), (1, 7)]
    assert isinstance(start, WriteStarts) and start.batch.offsets == {0: [0, 2]}  # STARTs for its own only
    [commit] = pipe.start_answered(start.batch, None, 0.1)
    assert isinstance(commit, Commit) and commit.offsets == {0: 3, 1: 8}  # skipped offsets count as done
    [handed] = pipe.commit_answered(None, 0.2)
    assert isinstance(handed, HandOver) and [m.offset for m in handed.messages] == [0, 2]


def test_a_poll_of_skipped_copies_only_is_committed_in_its_turn():
    pipe = FetchPipeline(start_timeout=5.0, commit_timeout=10.0)  # the default group skips named groups' copies
    pipe.assigned({0})
    [start] = pipe.polled([msg(0, 0)], 0.0)
    skip, = pipe.polled([msg(0, 1, "billing"), msg(0, 2, "billing")], 0.1)
    assert isinstance(skip, Skip) and len(skip.messages) == 2
    [commit] = pipe.start_answered(start.batch, None, 0.2)  # one commit past both batches
    assert commit.offsets == {0: 3} and len(commit.batches) == 2
    assert [type(a) for a in pipe.commit_answered(None, 0.3)] == [HandOver]
    assert not pipe.pending


def test_records_without_headers_are_not_looked_at():
    mine = [msg(0, 0), msg(0, 1)]
    assert classify(mine, "billing") == (mine, [], [])


def test_the_lag_job_watches_each_group_by_its_label():
    from kmq.spark.job import JobOptions, _queues

    c = cfg({"name": "orders"}, {"name": "orders", "group": "billing", "workers_group": "b"})
    assert [q.label for q in _queues(c, JobOptions())] == ["orders", "orders__billing"]
    [billing] = _queues(c, JobOptions(queues=("orders__billing",)))
    assert (billing.name, billing.group, billing.metrics_topic) == ("orders", "billing", "orders__billing__kmq_metrics")
    assert c.queue_labelled("orders").group is None
