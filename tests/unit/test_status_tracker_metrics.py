"""`kmq status --tracker-url` shows the tracker's samples of one queue, as Prometheus
exposes them, without the ``*_created`` series prometheus_client adds to every counter
and histogram (a creation timestamp, not a figure an operator reads)."""

from __future__ import annotations

import http.server
import threading
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, generate_latest

from kmq.ops.status import tracker_metrics
from kmq.telemetry.metrics import TrackerMetrics


@contextmanager
def serving(body: bytes):
    """A loopback HTTP server answering every GET with ``body`` (a tracker's /metrics)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _tracker_exposition() -> bytes:
    registry = CollectorRegistry()
    m = TrackerMetrics(registry)
    m.markers.labels("orders", "start").inc(3)
    m.redelivered.labels("orders", "timeout").inc()
    m.redelivered.labels("payments", "timeout").inc(7)
    m.in_flight.labels("orders", "0").set(2)
    m.bad_markers.inc()
    m.redelivery_delay_seconds.observe(0.01)
    body = generate_latest(registry)
    assert b"_created" in body  # what a real tracker exposes, or this test proves nothing
    return body


def test_tracker_metrics_leave_out_created_series():
    with serving(_tracker_exposition()) as url:
        lines = tracker_metrics(url, "orders")
    assert [line for line in lines if "_created" in line] == []
    assert 'kmq_tracker_markers_total{queue="orders",type="start"} 3.0' in lines
    assert 'kmq_tracker_redelivered_total{queue="orders",reason="timeout"} 1.0' in lines
    assert 'kmq_tracker_in_flight{partition="0",queue="orders"} 2.0' in lines
    assert "kmq_tracker_bad_markers_total 1.0" in lines  # unlabelled: the tracker's, shown for every queue
    assert not any('queue="payments"' in line for line in lines)
    assert not any(line.startswith("#") or "_bucket" in line for line in lines)
