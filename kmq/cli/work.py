"""``kmq produce`` and ``kmq work``: a demo producer and a worker with failure injection.

Deterministic by design, so demos and chaos tests can predict outcomes:

* Payload of message i (``kmq produce``): ``POISON:`` for poison messages,
  then ``i`` as 10 digits and ``:``, padded with ``.`` to ``--size`` bytes.
  Message i is poison when ``floor((i+1)*p) > floor(i*p)`` for
  ``--poison-rate p``: exactly ``floor(N*p)`` of N messages, evenly spread.
* ``kmq work`` decides per delivery from ``blake2b-64(origin + "#" + delivery_count) / 2^64``:
  a fraction in [0, 1) below ``--fail-rate`` raises (-> nack with backoff);
  the next ``--hang-rate`` band never settles (the lease expires and the tracker
  redelivers). Poison payloads are always rejected (-> DLQ). The same message
  on the same delivery always gets the same fate.
* ``kmq work --asyncio`` runs the same decisions as a coroutine handler on
  :meth:`kmq.aio.AsyncKmqConsumer.run` (``--workers`` = its concurrency), so a
  fleet can mix threaded and asyncio workers.
* ``kmq work --share`` runs them through :class:`kmq.share.ShareConsumer` (the
  share-consumer API) in explicit acknowledgement mode: a batch's deliveries on
  ``--workers`` threads, each acknowledged on the polling thread as it ends
  (``ACCEPT`` for ok and slow, ``RELEASE`` for the fail band, ``REJECT`` for
  poison); the hang band is never acknowledged (left to the lock's end, as a
  crashed share consumer's record would be).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import threading
import time
from typing import Any, Callable, Generator, NamedTuple, Union

import click

from kmq.cli.common import config_options, group_option, reaches_kafka_at_once
from kmq.config import Config
from kmq.core.errors import CannotListen
from kmq.dev.workload import InjectedFailure, fate, is_poison, is_poison_index, payload
from kmq.tracing import use_span

__all__ = ["produce", "work"]

log = logging.getLogger(__name__)

@click.command()
@click.argument("queue")
@click.option("--count", "-n", type=click.IntRange(min=0), required=True, help="Messages to produce.")
@click.option("--size", type=click.IntRange(min=1), default=100, show_default=True, help="Payload bytes per message.")
@click.option("--rate", type=click.FloatRange(min=0), default=0.0, help="Messages per second (0 = as fast as possible).")
@click.option("--poison-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of messages made poison (payload starts with POISON:, chosen evenly: "
                   "message i is poison when floor((i+1)*p) > floor(i*p)).")
@click.option("--start", type=click.IntRange(min=0), default=0, help="Number of the first message (payload index).")
@config_options
@reaches_kafka_at_once
def produce(queue: str, count: int, size: int, rate: float, poison_rate: float, start: int, cfg: Config) -> None:
    """Produce COUNT demo messages to QUEUE (key = message number), compressed with its queues[].compression."""
    from kmq.client import close_producer, producer as make_producer

    # Originals go to the queue topic every consumer group of the queue reads: any group's entry
    # names the codec (the first configured one), none is needed.
    entries = [q for q in cfg.queues if q.name == queue]
    compression = (entries[0] if entries else cfg.queue(queue)).compression
    producer = make_producer(cfg.kafka, linger=0.02, batch_size=256 * 1024, compression=compression)
    t0 = time.monotonic()
    poisons = 0
    try:
        for n in range(count):
            i = start + n
            poison = is_poison_index(i, poison_rate)
            poisons += poison
            producer.send(queue, key=str(i).encode(), value=payload(i, size, poison))
            if rate > 0:
                ahead = (n + 1) / rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        producer.flush()
    finally:
        close_producer(producer)
    took = time.monotonic() - t0
    click.echo(f"produced {count} messages ({poisons} poison) to {queue} in {took:.2f}s")


class _Sleep(NamedTuple):
    """Wait ``seconds`` (simulated work): a thread sleeps, a coroutine awaits."""

    seconds: float


class _Blocking(NamedTuple):
    """A blocking call (the Redis guard): inline on a thread, off the loop for a coroutine."""

    call: Callable[[Any], Any]
    arg: Any


_Wait = Union[_Sleep, _Blocking]


def _run_steps(steps: Generator[_Wait, Any, None]) -> None:
    """Drive a delivery on a worker thread."""
    try:
        step = next(steps)
        while True:
            step = steps.send(time.sleep(step.seconds) if isinstance(step, _Sleep) else step.call(step.arg))  # type: ignore[func-returns-value]  # sends None
    except StopIteration:
        return


async def _await_steps(steps: Generator[_Wait, Any, None]) -> None:
    """Drive a delivery as a coroutine: sleeps awaited, blocking calls on a thread."""
    try:
        step = next(steps)
        while True:
            if isinstance(step, _Sleep):
                await asyncio.sleep(step.seconds)
                step = steps.send(None)
            else:
                step = steps.send(await asyncio.to_thread(step.call, step.arg))
    except StopIteration:
        return


@click.command()
@click.argument("queue")
@click.option("--workers", type=click.IntRange(min=1), default=4, show_default=True, help="Handler threads.")
@click.option("--fail-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of deliveries whose handler raises (-> nack with backoff). Chosen by blake2b(origin#delivery).")
@click.option("--hang-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of deliveries never settled (lease expires -> the tracker redelivers).")
@click.option("--slow-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of deliveries that take 1.5 x the lease and then ack (a late ack: the tracker has "
                   "redelivered a copy by then, so the message is processed twice; --redis-url dedupes the effect).")
@click.option("--poison-rate", type=click.FloatRange(0, 1), default=None,
              help="Also treat message i of `kmq produce` (index read from the payload) as poison when "
                   "floor((i+1)*p) > floor(i*p). Payloads starting with POISON: are always poison. Poison -> reject (DLQ).")
@click.option("--processing-ms", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Simulated work per message.")
@click.option("--ack-log", type=click.Path(dir_okay=False), default=None,
              help='Append "topic/partition/offset origin" per ack to this file (flushed each line).')
@click.option("--max-messages", type=click.IntRange(min=0), default=0, help="Stop after settling this many (0 = run until SIGTERM).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, help="Serve Prometheus metrics on this port.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address the --metrics-port server binds (0.0.0.0 in a container, for Prometheus to scrape it).")
@click.option("--redis-url", default=None,
              help="Guard the effect (the ack and its --ack-log line) with IdempotencyGuard on this Redis, so a "
                   "message whose copy was already processed is acked without effect (default: redis.url).")
@click.option("--asyncio", "use_asyncio", is_flag=True, default=False,
              help="Run coroutine handlers on kmq.aio.AsyncKmqConsumer.run(concurrency=--workers) instead of threads "
                   "(same handler behaviour and flags).")
@click.option("--share", "use_share", is_flag=True, default=False,
              help="Consume through kmq.share.ShareConsumer (the share-consumer API) in explicit acknowledgement "
                   "mode: ACCEPT, RELEASE for the fail band, REJECT for poison, nothing for the hang band "
                   "(same handler behaviour and flags; --workers threads per batch).")
@group_option
@config_options
def work(queue: str, workers: int, fail_rate: float, hang_rate: float, slow_rate: float, poison_rate: float | None,
         processing_ms: float,
         ack_log: str | None, max_messages: int, metrics_port: int | None, metrics_host: str, redis_url: str | None,
         use_asyncio: bool, use_share: bool, group: str | None, cfg: Config) -> None:
    """Consume QUEUE with failure injection until SIGTERM/SIGINT (drain, flush, close).

    Deterministic per delivery: fate = blake2b-64("origin#delivery_count")/2^64;
    below --fail-rate -> raise (nack), next --hang-rate band -> never settle,
    next --slow-rate band -> ack after 1.5 x the lease (late ack, a duplicate);
    payload starting with POISON: -> reject (DLQ). With --redis-url (or redis.url)
    a copy whose origin already took effect is acked without effect, and one being
    processed elsewhere is nacked for later. Prints one summary line on exit.
    """
    from kmq.config.process import tune_collector
    from kmq.consumer.consumer import KmqConsumer
    from kmq.telemetry.metrics import ConsumerMetrics
    from kmq.telemetry.otel_sdk import process_tracing

    if use_asyncio and use_share:
        raise click.BadParameter("--asyncio and --share are two ways to run the worker: choose one")
    if use_share and group is not None:
        raise click.BadParameter("--share reads the queue's default group (its group.id is consumer.group_id): "
                                 "run --group without --share")
    if fail_rate + hang_rate + slow_rate > 1:
        raise click.BadParameter("--fail-rate, --hang-rate and --slow-rate must not add up to more than 1")
    tune_collector()
    lease = cfg.queue(queue, group).lease
    slow_s = 1.5 * lease
    metrics = ConsumerMetrics.shared()
    if metrics_port is not None:
        from prometheus_client import start_http_server

        try:
            start_http_server(metrics_port, addr=metrics_host, registry=metrics.registry)
        except OSError as exc:
            raise CannotListen("kmq work's metrics server", metrics_host, metrics_port, exc,
                               "pick another --metrics-port (0 = any free port) or --metrics-host") from exc
    log_file = open(ack_log, "a", buffering=1) if ack_log else None  # noqa: SIM115 - closed below
    log_lock = threading.Lock()
    counts = {"ok": 0, "fail": 0, "hang": 0, "poison": 0, "slow": 0, "duplicate": 0}
    guard = None
    if redis_url or cfg.redis.url:
        from kmq.consumer.guard import IdempotencyGuard

        # One group's effects are not another's: a named group's keys have a prefix of their own.
        guard = IdempotencyGuard(redis_url or cfg.redis.url,  # type: ignore[arg-type]  # one is set: the test above
                                 **({} if group in (None, "default") else {"prefix": f"kmq:done:{group}:"}))  # type: ignore[arg-type]
    consumer: Any = None  # KmqConsumer, AsyncKmqConsumer with --asyncio, _ShareWorker with --share

    def count(kind: str) -> None:
        with log_lock:
            counts[kind] += 1
            total = sum(counts.values())
        if max_messages and total >= max_messages:
            consumer.stop()

    def delivery(msg: Any) -> Generator[_Wait, Any, None]:
        """One delivery's fate (see the module docstring). Waits are yielded, not done here, so
        the same decisions run on a worker thread (:func:`_run_steps`) and as a coroutine
        (:func:`_await_steps`); settlements are memory-only either way. A failure raises:
        the consumer's run() nacks it with the queue's backoff (kmq.core.outcome)."""
        if is_poison(msg.value, poison_rate or 0.0):
            msg.reject("poison payload")
            count("poison")
            return
        kind = fate(msg.origin, msg.delivery_count, fail_rate, hang_rate, slow_rate)
        if processing_ms:
            yield _Sleep(processing_ms / 1000.0)
        if kind == "slow":
            yield _Sleep(slow_s)  # past the lease: the tracker redelivers a copy meanwhile
        # The guard covers the effect (the ack and its log line), claimed just before it.
        if kind in ("ok", "slow") and guard is not None and not (yield _Blocking(guard.begin, msg)):
            if (yield _Blocking(guard.state, msg)) == "running":
                # Another worker is applying a copy right now; if it dies, its effect never happens.
                msg.nack(delay=lease)
                return
            count("duplicate")  # a copy already took effect: ack without a second effect
            msg.ack()
            return
        count(kind)
        if kind == "fail":
            raise InjectedFailure(f"injected failure on delivery {msg.delivery_count}")
        if kind == "hang":
            msg.abandon()
            return
        msg.ack()
        if log_file is not None:
            with log_lock:
                log_file.write(f"{msg.topic}/{msg.partition}/{msg.offset} {msg.origin}\n")
                log_file.flush()
        if guard is not None:
            yield _Blocking(guard.done, msg)

    def handler(msg: Any) -> None:
        _run_steps(delivery(msg))

    async def async_handler(amsg: Any) -> None:
        await _await_steps(delivery(amsg.message))

    stop_asked = threading.Event()  # a signal before the consumer exists still stops it

    def on_signal(signum: int, frame: Any) -> None:
        log.info("signal %d: draining", signum)
        stop_asked.set()
        if consumer is not None:
            consumer.stop()

    def started(c: Any) -> None:
        nonlocal consumer
        consumer = c
        if stop_asked.is_set():
            c.stop()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    kind_of = "asyncio handlers" if use_asyncio else "share-API workers" if use_share else "workers"
    click.echo(f"working on {queue} with {workers} {kind_of}", err=True)
    # Before the consumer is built: its delivery spans use the provider installed here (OTEL_* env).
    with process_tracing("kmq-worker", lambda line: click.echo(line, err=True)):
        try:
            if use_asyncio:
                asyncio.run(_run_async(cfg, queue, metrics, async_handler, workers, started, group))
            elif use_share:
                worker = _ShareWorker(cfg, queue, delivery, workers)
                started(worker)
                worker.run()
            else:
                started(KmqConsumer(cfg, queue=queue, metrics=metrics, group=group))
                try:
                    consumer.run(handler, workers=workers)
                finally:
                    consumer.close()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if log_file is not None:
                log_file.close()
            if guard is not None:
                guard.close()
    click.echo("settled: " + " ".join(f"{k}={v}" for k, v in counts.items()))


async def _run_async(cfg: Config, queue: str, metrics: Any, handler: Any, concurrency: int,
                     started: Any, group: str | None = None) -> None:
    """``kmq work --asyncio``: the handler on :meth:`kmq.aio.AsyncKmqConsumer.run`."""
    from kmq.consumer.aio import AsyncKmqConsumer

    async with AsyncKmqConsumer(cfg, queue=queue, metrics=metrics, group=group) as consumer:
        started(consumer)
        await consumer.run(handler, concurrency=concurrency)


class _ShareDelivery:
    """A share-API record seen by :func:`work`'s ``delivery``: the reads it makes, and its
    settlement recorded as the acknowledgement the polling thread sends (not applied here: the
    share consumer is not thread-safe)."""

    __slots__ = ("record", "kmq", "outcome", "delay")

    def __init__(self, record: Any) -> None:
        self.record = record  # a kmq.share.Message
        self.kmq = record.kmq_message
        #: "accept", "release" (``delay`` seconds), "reject", "abandon"; None: not settled (it raised).
        self.outcome: str | None = None
        self.delay = 0.0

    @property
    def value(self) -> bytes | None:
        return self.kmq.value

    @property
    def origin(self) -> str:
        return self.kmq.origin

    @property
    def delivery_count(self) -> int:
        return self.record.delivery_count()

    @property
    def topic(self) -> str:
        return self.kmq.topic

    @property
    def partition(self) -> int:
        return self.kmq.partition

    @property
    def offset(self) -> int:
        return self.kmq.offset

    def ack(self) -> None:
        self.outcome = "accept"

    def nack(self, delay: float = 0.0) -> None:
        self.outcome, self.delay = "release", delay

    def reject(self, reason: str = "") -> None:
        self.outcome = "reject"

    def abandon(self) -> None:
        self.outcome = "abandon"


class _ShareWorker:
    """``kmq work --share``: the demo worker on :class:`kmq.share.ShareConsumer`, explicit mode.

    Each poll's records run on ``workers`` threads; the polling thread acknowledges each one as it
    ends and sends what is acknowledged (``commit_async``) while the rest still run, so a slow
    record does not hold its batch's acknowledgements back. A delivery that raises (the fail band)
    is released; one never settled (the hang band) is not acknowledged at all: kmq leaves it to
    the lock's end (``kmq_message.abandon()``, a kmq extra: the native consumer cannot poll on in
    explicit mode past a record it never acknowledges)."""

    def __init__(self, cfg: Config, queue: str, delivery: Callable[[Any], Generator[_Wait, Any, None]],
                 workers: int) -> None:
        self.cfg = cfg
        self.queue = queue
        self.delivery = delivery
        self.workers = workers
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def _handle(self, record: Any) -> _ShareDelivery:
        msg = _ShareDelivery(record)
        try:
            with use_span(record):  # the poll-based share API: user code makes the delivery span current
                _run_steps(self.delivery(msg))
        except Exception as exc:  # noqa: BLE001 - a failing handler: released, as run() nacks it
            log.debug("%r failed: %s; released", record, exc)
            msg.nack(0.0)
        return msg

    def _settle(self, consumer: Any, msg: _ShareDelivery, kinds: dict[str, Any]) -> None:
        outcome = msg.outcome or "abandon"
        if outcome == "release" and msg.delay > 0:
            consumer.kmq_release(msg.record, msg.delay)  # the guard's "running elsewhere": later
        elif outcome == "abandon":
            # Left to the lock's end: no marker; the RELEASE recorded after it finds the record
            # settled and is dropped (it only lets explicit mode poll on).
            msg.kmq.abandon()
            consumer.acknowledge(msg.record, kinds["release"])
        else:
            consumer.acknowledge(msg.record, kinds[outcome])

    def run(self) -> None:
        from kmq.share import AcknowledgeType, ShareConsumer

        kinds = {"accept": AcknowledgeType.ACCEPT, "release": AcknowledgeType.RELEASE,
                 "reject": AcknowledgeType.REJECT}

        conf = {"bootstrap.servers": self.cfg.kafka.bootstrap_servers, "group.id": self.cfg.consumer.group_id,
                "share.acknowledgement.mode": "explicit", "max.poll.records": 4 * self.workers,
                "kmq.config": self.cfg}
        with ShareConsumer(conf) as consumer, \
                concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="kmq-share-work") as pool:
            consumer.subscribe([self.queue])
            while not self._stop.is_set():
                pending = {pool.submit(self._handle, record) for record in consumer.poll(timeout=0.5)}
                while pending:
                    done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                    for future in done:
                        self._settle(consumer, future.result(), kinds)
                    consumer.commit_async()
