"""A user's own confluent-kafka loop adopted with MarkerWriter and ``@kmq.marked``, as a
worker process for chaos tests, with the failure injection of ``kmq work``.

Run as ``python -m tests.helpers.marked_worker QUEUE --config kmq.yaml [--fail-rate F]
[--hang-rate H] [--poison-rate P] [--ack-log FILE]``: the options mean what they mean
for ``kmq work`` (the same deterministic fate per delivery, :func:`kmq.dev.workload.fate`),
so the chaos test treats both kinds of worker alike. The marker producer uses
``kafka.client`` (``KMQ_KAFKA__CLIENT`` applies); the loop's consumer is always
confluent-kafka's ``Consumer``, built as in the README's example. SIGTERM stops the
loop, flushes the markers and leaves the group; SIGKILL is what the test is for.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

log = logging.getLogger("tests.helpers.marked_worker")


def _main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("queue")
    ap.add_argument("--config", required=True)
    ap.add_argument("--fail-rate", type=float, default=0.0)
    ap.add_argument("--hang-rate", type=float, default=0.0)
    ap.add_argument("--poison-rate", type=float, default=0.0)
    ap.add_argument("--ack-log", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s marked_worker %(levelname)s %(message)s")

    from confluent_kafka import Consumer

    import kmq
    from kmq.dev.workload import InjectedFailure, fate, is_poison
    from kmq.core.errors import MarkerWriteError
    from kmq.core.message import delivery_count_of, origin_of
    from kmq.consumer.writer import CommitError

    cfg = kmq.Config.load(args.config)
    consumer = Consumer({
        "bootstrap.servers": cfg.kafka.bootstrap_servers, "group.id": cfg.consumer.group_id,
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": int(cfg.kafka.session_timeout * 1000),
        "heartbeat.interval.ms": int(cfg.kafka.heartbeat_interval * 1000),
        # The group's KmqConsumers use consumer.assignor (cooperative-sticky by default):
        # a member must offer it too, or the group refuses it (no common protocol).
        "partition.assignment.strategy": cfg.consumer.assignor.lower(),
    })
    consumer.subscribe([args.queue])
    writer = kmq.MarkerWriter(cfg, queue=args.queue, consumer=consumer)
    ack_log = open(args.ack_log, "a", buffering=1) if args.ack_log else None  # noqa: SIM115 - closed below
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    @kmq.marked(writer)
    def handle(msg, origin: str, kind: str) -> None:
        if kind == "fail":
            raise InjectedFailure("injected failure")  # -> nack with the queue's backoff
        if ack_log is not None:
            # Logged before the ack is buffered: a kill in between costs a redelivery, never a lost line.
            ack_log.write(f"{msg.topic()}/{msg.partition()}/{msg.offset()} {origin}\n")

    try:
        while not stop.is_set():
            msgs = consumer.consume(500, timeout=0.5)
            try:
                records = writer.start(msgs)
            except (MarkerWriteError, CommitError) as exc:  # retriable: the consumer is back at the batch
                log.warning("start failed (%s); polling again", exc)
                continue
            for msg in records:
                headers = msg.headers() or []
                if is_poison(msg.value(), args.poison_rate):
                    writer.reject(msg, "poison payload")  # as kmq work: the DLQ's kmq-dlq-error
                    continue
                origin = origin_of(headers, msg.topic(), msg.partition(), msg.offset())
                kind = fate(origin, delivery_count_of(headers), args.fail_rate, args.hang_rate)
                if kind == "hang":
                    continue  # never settled: the lease expires and the tracker redelivers
                handle(msg, origin, kind)
    finally:
        writer.close()
        consumer.close()
        if ack_log is not None:
            ack_log.close()


if __name__ == "__main__":
    _main()
