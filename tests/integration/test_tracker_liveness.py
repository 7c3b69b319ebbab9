"""Liveness: /healthz fails when the tracker's main loop stops completing steps.

The loop is hung for real: the tracker's clock (its injected time source, read
inside every step) blocks on an event, so the main thread is stuck inside a
step exactly as it would be in a broker call that never returns, while the
HTTP thread keeps answering. SIGSTOP would stop both and prove nothing.
"""

from __future__ import annotations

import threading
import time

import pytest

from kmq.telemetry.metrics import exported_metric_names
from tests.helpers.kafka import wait_until
from tests.integration.tracker_util import http_status, metric
from tracker import Tracker

pytestmark = pytest.mark.integration

BOUND_S = 2.0


class HangableClock:
    """time.time, except that it blocks the caller while ``hang`` is set."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.release = threading.Event()
        self.blocked = threading.Event()

    def __call__(self) -> float:
        if self.hang.is_set():
            self.blocked.set()
            self.release.wait(60)
        return time.time()


def test_healthz_fails_within_the_bound_when_the_main_loop_hangs_and_recovers(queue_topics):
    cfg, q = queue_topics(1, tracker={"tick": "50ms", "liveness_timeout": f"{BOUND_S}s"})
    clock = HangableClock()
    t = Tracker(cfg, http_host="127.0.0.1", clock=clock).start()
    try:
        wait_until(lambda: http_status(t.http_port, "/readyz") == 200, 30, what="tracker ready")
        assert http_status(t.http_port, "/healthz") == 200
        assert metric(t.http_port, "kmq_tracker_ready") == 1.0

        clock.hang.set()
        assert clock.blocked.wait(5), "the main loop never read the clock"
        hung_at = time.monotonic()
        # Still alive inside the bound (a slow step is not a hang) ...
        assert http_status(t.http_port, "/healthz") == 200
        wait_until(lambda: http_status(t.http_port, "/healthz") == 503, BOUND_S + 5, what="/healthz 503")
        failed_after = time.monotonic() - hung_at
        # ... and failing once the bound has passed since the last completed step (which
        # ended up to one tick before the hang began; wait_until polls every 50 ms).
        assert BOUND_S - 0.5 <= failed_after <= BOUND_S + 1.0, failed_after

        clock.hang.clear()
        clock.release.set()
        wait_until(lambda: http_status(t.http_port, "/healthz") == 200, 10, what="/healthz 200 after the loop resumed")
    finally:
        clock.hang.clear()
        clock.release.set()
        t.stop()


def test_tracker_exports_process_and_build_info_metrics(queue_topics):
    cfg, _ = queue_topics(1, tracker={"tick": "50ms"})
    t = Tracker(cfg, http_host="127.0.0.1").start()
    try:
        from kmq import __version__

        assert metric(t.http_port, "kmq_build_info", version=__version__) == 1.0
        assert metric(t.http_port, "process_resident_memory_bytes") > 0
        assert metric(t.http_port, "process_cpu_seconds_total") > 0
        assert {"kmq_build_info", "process_resident_memory_bytes", "kmq_tracker_ready"} <= exported_metric_names()
    finally:
        t.stop()


def test_tracker_process_logs_json_when_configured(queue_topics, tmp_path):
    import dataclasses
    import json

    from tests.integration.tracker_util import TrackerProcess

    cfg, q = queue_topics(1, tracker={"tick": "50ms"})
    cfg = cfg.replace(logging=dataclasses.replace(cfg.logging, format="json", level="INFO"))
    proc = TrackerProcess(cfg, tmp_path)
    try:
        port = proc.wait_ready(60)
        assert http_status(port, "/healthz") == 200
        # Ready can come before the partition: a member that joined with nothing assigned yet is ready too.
        wait_until(lambda: b"caught up" in proc.log_path.read_bytes(), 30, what="the partition caught up")
        assert proc.terminate(30) == 0
        lines = [json.loads(line) for line in proc.log_path.read_text().splitlines() if line.strip()]
        messages = [r["message"] for r in lines if r["logger"].startswith("tracker")]
        assert any(m.startswith("tracker HTTP listening on 127.0.0.1:") for m in messages), messages
        assert any("caught up" in m for m in messages) and messages[-1] == "tracker stopped"
        assert {r["level"] for r in lines} <= {"INFO", "WARNING", "ERROR"}
    finally:
        proc.close()


@pytest.mark.slow
def test_healthz_fails_while_a_redelivery_waits_on_a_frozen_broker_and_nothing_is_lost():
    """The other real way to hang the loop: the broker stops answering (SIGSTOP of a private
    tansu) while a lease expires, so the step blocks in the read of the original record."""
    import os
    import signal

    from kmq.config import Config
    from tests.helpers.kafka import own_broker
    from kmq.core.markers import Start
    from kmq.client.topics import ensure_topics
    from tests.conftest import TEST_GROUP_TIMING, unique
    from tests.helpers.kafka import APP_RECORD, produce
    from tests.integration.tracker_util import MarkerProducer, Tail

    with own_broker(durable=False) as broker:
        cfg = Config.from_dict({
            "kafka": {"bootstrap_servers": broker.bootstrap, **TEST_GROUP_TIMING},
            "queues": [{"name": unique("q"), "lease": "3s"}],
            "tracker": {"group_id": unique("tracker"), "http_port": 0, "tick": "50ms",
                        "liveness_timeout": f"{BOUND_S}s"},
        })
        q = cfg.queues[0]
        ensure_topics(cfg.kafka, q, 1)
        produce(broker.bootstrap, q.name, 1, **APP_RECORD)
        t = Tracker(cfg, http_host="127.0.0.1").start()
        frozen = False
        try:
            wait_until(lambda: http_status(t.http_port, "/readyz") == 200, 30, what="tracker ready")
            markers = MarkerProducer(broker.bootstrap, q.markers_topic)
            markers.send(0, Start([(0, 1)], lease_ms=3000, owner="w"))
            markers.close()
            wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 1, 10,
                       what="the START applied")
            os.kill(broker.pid, signal.SIGSTOP)
            frozen = True
            # Due in under 3 s; the read of the original then blocks on the frozen broker.
            wait_until(lambda: http_status(t.http_port, "/healthz") == 503, 3 + BOUND_S + 5, what="/healthz 503")
            os.kill(broker.pid, signal.SIGCONT)
            frozen = False
            wait_until(lambda: http_status(t.http_port, "/healthz") == 200, 30, what="/healthz 200 after SIGCONT")
            tail = Tail(broker.bootstrap, q.name)
            try:
                tail.wait_for(2, timeout=30, what="the redelivered copy")  # the original plus its copy
            finally:
                tail.close()
        finally:
            if frozen:
                os.kill(broker.pid, signal.SIGCONT)
            t.stop()
