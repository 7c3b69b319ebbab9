"""The console's redrive (kmq/ui/redrive.py) on each client ``kafka.client`` names: the dry run counts
what a redrive would move and what this selection already moved, read through the configured client."""

from __future__ import annotations

import pytest

from kmq.client import close_producer, producer
from kmq.ui.redrive import Selection, preview, redrive

pytestmark = pytest.mark.integration


def test_preview_and_redrive_through_the_configured_client(make_config, kafka_client):
    from kmq.client.topics import ensure_topics

    cfg = make_config(kafka={"client": kafka_client})
    q = cfg.queues[0]
    ensure_topics(cfg.kafka, q, 1)
    p = producer(cfg.kafka)
    try:
        for i in range(3):
            p.send(q.dlq_topic, key=b"k%d" % i, value=b"v%d" % i, partition=0,
                   headers=[("kmq-dlq-reason", b"poison")]).get(10)
    finally:
        close_producer(p)
    sel = Selection(positions=frozenset({(0, 0), (0, 2)}))
    assert preview(cfg, q, sel) == (2, 0)
    assert redrive(cfg, q, sel).replayed == 2
    assert preview(cfg, q, sel) == (0, 2)  # the selection's replay group committed past both
