"""consumer.auto_renew on by default: a slow handler keeps its message past the lease,
up to consumer.max_lease; past it the message is no longer renewed and times out as
any other (the tracker redelivers it)."""

from __future__ import annotations

import pytest

from kmq import KmqConsumer
from kmq.core.markers import Renew, Start, decode
from tests.helpers.kafka import produce, read_all, wait_until
from tests.integration.tracker_util import running_tracker

pytestmark = pytest.mark.integration


def test_an_unsettled_message_is_renewed_by_default_until_max_lease_then_redelivered(bootstrap, queue_topics):
    cfg, q = queue_topics(1, queue={"lease": "1s", "max_deliveries": 3, "backoff": {"initial": "100ms"}},
                          tracker={"tick": "50ms"}, consumer={"max_lease": "3s", "ack_flush_interval": "50ms"})
    assert cfg.consumer.auto_renew is True  # not set above: the default
    produce(bootstrap, q.name, values=[b"slow"])
    got: list = []
    with running_tracker(cfg), KmqConsumer(cfg, queue=q.name) as consumer:
        wait_until(lambda: got.extend(consumer.poll(timeout=0.2)) or got, 30, what="the first delivery")
        # Left unsettled (a handler that hangs): renewed until max_lease, then it times out.
        wait_until(lambda: got.extend(consumer.poll(timeout=0.2)) or len(got) >= 2, 30, what="the redelivered copy")
        first, copy = got[0], got[1]
        assert (first.delivery_count, copy.delivery_count, copy.origin) == (1, 2, f"{q.name}/0/0")
        assert consumer.exhausted_leases == 1
        assert consumer.metrics.registry.get_sample_value(
            "kmq_consumer_lease_expired_total", {"queue": q.name}) == 1  # it left flow control
        copy.ack()
        consumer.writer.flush()
    decoded = [(r.timestamp, decode(r.value)) for r in read_all(bootstrap, q.markers_topic)]
    start_ts = min(ts for ts, m in decoded if isinstance(m, Start))
    renew_deadlines = [ts + m.lease_ms for ts, m in decoded if isinstance(m, Renew) and m.ranges[0].first == 0]
    assert renew_deadlines, "the first delivery was never renewed"
    assert max(renew_deadlines) >= start_ts + 2000  # kept well past its 1 s lease ...
    assert max(renew_deadlines) <= start_ts + 3000 + 100  # ... never past max_lease (ms rounding slack)
    copy_ts = copy.timestamp
    assert copy_ts >= max(renew_deadlines)  # not redelivered while its renewed lease ran
