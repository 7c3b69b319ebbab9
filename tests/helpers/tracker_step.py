"""The tracker's step over fake parts (tests.helpers.fake_kafka): a Harness that builds a Tracker on a
fake cluster and a fake clock, and pauses the process at will."""

from __future__ import annotations



import tracker.service as service
from kmq.config import Config
from kmq.core.marker_clock import SKEW_ALLOWANCE_MS
from kmq.core.markers import Closed, Start, decode
from tests.helpers.fake_kafka import FakeClients, FakeKafka, FakeTime

QUEUE = "q"


PARTITIONS = 3


READ_TIMEOUT_S = 10.0  # the log reader's own bound; an unreachable leader costs this much per read


# How old a START replayed at assignment must be for its 1 s lease to have run out: a replayed
# marker's lease may start up to the skew allowance after its record time (kmq.core.marker_clock).
EXPIRED_MS = SKEW_ALLOWANCE_MS + 60_000


def config(*more_queues: str, **tracker) -> Config:
    return Config.from_dict({
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "session_timeout": "6s", "heartbeat_interval": "1s"},
        "queues": [{"name": QUEUE, "lease": "1s", "max_deliveries": 5,
                    "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0}},
                   *({"name": name} for name in more_queues)],
        "tracker": {"tick": "50ms", "http_port": 0, **tracker},
    })


class Pauses:
    """Stands in for the tracker's pause watch (tracker.membership): pauses the test declares."""

    def __init__(self, clock: FakeTime) -> None:
        self.clock = clock
        self.seen: list[tuple[float, float]] = []  # (ended at, length)

    def start(self) -> None:
        """No thread: the test declares the pauses."""

    def stop(self) -> None:
        """See :meth:`start`."""

    def pause(self, length: float) -> None:
        self.clock.advance(length)
        self.seen.append((self.clock.mono, length))

    def longest_since(self, since: float) -> float:
        return max((length for ended, length in self.seen if ended > since), default=0.0)


class Harness:
    """A Tracker opened on the in-memory fakes (its clients, clocks and pause watch passed in), its
    markers consumer assigned every partition of ``q``; ``more_queues``: further queues in its
    configuration (with ``partitions`` partitions each, none assigned)."""

    def __init__(self, on_read=None, refuse=None, more_queues: dict[str, int] | None = None) -> None:
        self.time = FakeTime()
        self.kafka = FakeKafka(self.time)
        cfg = config(*(more_queues or {}))
        for q in cfg.queues:
            for topic in (q.name, q.markers_topic, q.dlq_topic):
                self.kafka.create(topic, (more_queues or {}).get(q.name, PARTITIONS))
        self.q = q = cfg.queues[0]
        self.clients = FakeClients(self.kafka, on_read, refuse)
        self.pauses = Pauses(self.time)
        self.tracker = t = service.Tracker(cfg, clock=self.time.time, clients=self.clients,
                                           monotonic=self.time.monotonic, pauses=self.pauses)
        t.open(serve_http=False)
        self.consumer = self.clients.consumer
        self.reader, self.hw_reader = self.clients.readers
        self.producer = self.clients.producers[0]
        self.consumer.assign([(q.markers_topic, p) for p in range(PARTITIONS)])

    def expired_start_in_every_partition(self) -> None:
        """One queue record and an expired START for it in each partition."""
        for p in range(PARTITIONS):
            self.kafka.append(self.q.name, p, b"k%d" % p, b"v%d" % p)
            self.kafka.marker(self.q.markers_topic, p, Start([(0, 1)], lease_ms=1000, owner="w"),
                              ts_ms=int(self.time.wall * 1000) - EXPIRED_MS)

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.tracker.step(0.0)
            self.time.advance(0.05)

    def copies(self) -> dict[int, int]:
        return {p: len(self.kafka.records(self.q.name, p)) - 1 for p in range(PARTITIONS)}

    def closed(self, p: int) -> list:
        return [m for m in (decode(r.value) for r in self.kafka.records(self.q.markers_topic, p))
                if isinstance(m, Closed)]

    def metric(self, name: str, *labels: str) -> float:
        m = getattr(self.tracker.metrics, name)
        return (m.labels(*labels) if labels else m)._value.get()
