"""A queue worker written against the share-consumer API (KIP-932).

It runs on any Kafka through kmq; to run it on a cluster with native share
groups (Apache Kafka 4.2+, confluent-kafka 2.16+), change the one import below
to ``from confluent_kafka import AcknowledgeType, ShareConsumer`` and drop the
``kmq.*`` keys of the configuration (docs/share-consumer.md).

What it shows: explicit acknowledgement, ``RELEASE`` for a transient failure
(the record comes back with ``delivery_count()`` one higher), ``REJECT`` for a
record that can never succeed (kmq: the DLQ), giving up after a few
deliveries, a commit per batch, and a clean stop on SIGTERM (close() releases
what is held, so another worker takes it at once).

Configuration from the environment:

* ``SHARE_BOOTSTRAP`` (default ``localhost:9092``), ``SHARE_GROUP`` (default
  ``orders-workers``), ``SHARE_TOPIC`` (default ``orders``);
* ``SHARE_CONFIG``: a JSON object of further consumer keys, e.g.
  ``{"kmq.lease.ms": 30000}``.

Run ``kmq topics create orders`` first (kmq needs the markers and DLQ topics)
and a tracker (``kmq tracker run``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading

from kmq.share import AcknowledgeType, ShareConsumer  # native: from confluent_kafka import ...

log = logging.getLogger("share_service")

#: Deliveries after which a failing record is rejected instead of released again.
GIVE_UP_AFTER = 3


class TransientError(Exception):
    """Worth another try: a timeout, a database failover."""


def handle(value: bytes, delivery: int) -> None:
    """The service's work. Demo rules: ``poison`` can never succeed, ``flaky`` fails on its first delivery."""
    if value.startswith(b"poison"):
        raise ValueError(f"cannot parse {value!r}")
    if value.startswith(b"flaky") and delivery == 1:
        raise TransientError("database failover")


def serve(conf: dict, topic: str, stop: threading.Event) -> None:
    """Consume ``topic`` until ``stop`` is set."""
    with ShareConsumer({**conf, "share.acknowledgement.mode": "explicit"}) as consumer:
        consumer.subscribe([topic])
        while not stop.is_set():
            batch = consumer.poll(timeout=0.5)
            for msg in batch:
                if msg.error():
                    continue
                outcome = AcknowledgeType.ACCEPT
                try:
                    handle(msg.value(), msg.delivery_count())
                except TransientError as exc:
                    outcome = AcknowledgeType.REJECT if msg.delivery_count() >= GIVE_UP_AFTER else AcknowledgeType.RELEASE
                    log.warning("%r failed (%s) on delivery %d", msg.value(), exc, msg.delivery_count())
                except Exception as exc:  # noqa: BLE001 - a record that can never succeed
                    outcome = AcknowledgeType.REJECT
                    log.warning("%r rejected: %s", msg.value(), exc)
                consumer.acknowledge(msg, outcome)
                log.info("%s %s delivery=%d", outcome.name, msg.value().decode(errors="replace"), msg.delivery_count())
            if not batch.is_empty():
                for tp, error in consumer.commit_sync(timeout=10).items():
                    if error is not None:
                        log.error("acknowledgements of %s[%d] not committed: %s", tp.topic, tp.partition, error)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    conf = {"bootstrap.servers": os.environ.get("SHARE_BOOTSTRAP", "localhost:9092"),
            "group.id": os.environ.get("SHARE_GROUP", "orders-workers"),
            **json.loads(os.environ.get("SHARE_CONFIG", "{}"))}
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    serve(conf, os.environ.get("SHARE_TOPIC", "orders"), stop)
    log.info("stopped")


if __name__ == "__main__":
    main()
