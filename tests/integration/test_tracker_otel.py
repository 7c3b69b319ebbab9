"""``kmq tracker run`` and ``kmq work`` as real processes set up the OpenTelemetry SDK from the standard ``OTEL_*``
environment: with ``OTEL_TRACES_EXPORTER=console`` its redelivery of a nacked message is a span
on its stdout, in the producer's trace, under the service name ``kmq-tracker``, and one log line
says where spans go; ``kmq work``'s deliveries are spans the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kmq import KmqConsumer
from tests.helpers.kafka import produce, wait_until
from tests.helpers.otel import PRODUCER_SPAN_ID, TRACE_ID, TRACEPARENT
from tests.integration.tracker_util import TrackerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("opentelemetry.sdk", reason="the kmq[otel] extra (opentelemetry-sdk) is not installed")


def _spans(text: str, name: str) -> list[dict]:
    """The console exporter's JSON documents named ``name`` in the process's output."""
    decoder, out, at = json.JSONDecoder(), [], 0
    marker = f'"name": "{name}"'
    while (at := text.find(marker, at)) >= 0:
        start = text.rfind("{", 0, at)
        doc, _ = decoder.raw_decode(text, start)
        out.append(doc)
        at += len(marker)
    return out


def test_the_tracker_process_exports_its_redelivery_spans_where_the_otel_environment_says(
        bootstrap, queue_topics, tmp_path):
    cfg, q = queue_topics(1, queue={"lease": "5s", "backoff": {"initial": "100ms", "max": "200ms"}},
                          tracker={"tick": "50ms"}, consumer={"ack_flush_interval": "50ms"})
    produce(bootstrap, q.name, values=[b"nacked"], headers=[("traceparent", TRACEPARENT)])
    tracker = TrackerProcess(cfg, tmp_path, env={"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "100"})
    try:
        tracker.wait_ready()
        with KmqConsumer(cfg, queue=q.name) as consumer:
            def nacked_and_redelivered() -> bool:
                for m in consumer.poll(timeout=0.2):
                    m.nack() if m.delivery_count == 1 else m.ack()
                return bool(_spans(tracker.log_path.read_text(), f"redeliver {q.name}"))
            wait_until(nacked_and_redelivered, 60, what="the tracker's redelivery span on its stdout")
        assert tracker.terminate() == 0
        text = tracker.log_path.read_text()
    finally:
        tracker.close()
    assert "OpenTelemetry: spans of service kmq-tracker go to the console (stdout)" in text
    (span,) = _spans(text, f"redeliver {q.name}")
    assert span["kind"] == "SpanKind.PRODUCER"
    assert span["context"]["trace_id"] == f"0x{TRACE_ID}" and span["parent_id"] == f"0x{PRODUCER_SPAN_ID}"
    assert span["attributes"]["kmq.origin"] == f"{q.name}/0/0"
    assert span["resource"]["attributes"]["service.name"] == "kmq-tracker"


def test_kmq_work_exports_its_delivery_spans_where_the_otel_environment_says(bootstrap, queue_topics, tmp_path):
    cfg, q = queue_topics(1, consumer={"ack_flush_interval": "50ms"})
    produce(bootstrap, q.name, 2, values=b"payload", headers=[("traceparent", TRACEPARENT)])
    conf = tmp_path / "kmq.yaml"
    conf.write_text(yaml.safe_dump(cfg.to_dict(redact=False)))
    done = subprocess.run(
        [sys.executable, "-m", "kmq", "work", q.name, "--config", str(conf), "--workers", "2", "--max-messages", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "orders-worker"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "OpenTelemetry: spans of service orders-worker go to the console (stdout)" in done.stderr
    spans = _spans(done.stdout, f"process {q.name}")
    assert sorted(s["attributes"]["messaging.kafka.offset"] for s in spans) == [0, 1]
    for s in spans:
        assert s["attributes"]["kmq.outcome"] == "ack" and s["parent_id"] == f"0x{PRODUCER_SPAN_ID}"
        assert s["resource"]["attributes"]["service.name"] == "orders-worker"
