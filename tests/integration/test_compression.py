"""Compressed topics, per codec and per client: records that both clients' compressing producers
wrote are read by KmqConsumer; the tracker's copy of a lapsed lease and its dead letter, the
workers' REJECT marker, ``kmq dlq replay``'s copy and ``kmq produce``'s record are stored with the
queue's ``compression`` (seen in the record batches the broker serves; a batch the codec would not
shrink, as most marker batches, stays uncompressed); ``kmq trace`` and ``kmq dlq list`` read them
back."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from kmq import KmqConsumer
from kmq.cli import cli
from kmq.core.markers import Reject, decode
from tests.helpers.cli import by_copy
from tests.helpers.kafka import produce, read_all, stored_codecs, wait_until
from tests.integration.tracker_util import metric, running_tracker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CODECS = ("gzip", "snappy", "lz4", "zstd")
REASON = "bad payload: " + "field x is not a number; " * 10
QUEUE = {"lease": "1s", "max_deliveries": 5, "backoff": {"initial": "100ms", "max": "200ms"}}


def _produce_compressed(bootstrap: str, topic: str, codec: str) -> dict[str, str]:
    """Four records in two batches of ``codec``, one from each client's producer (as Java producers
    with ``compression.type`` would write them); returns each key's origin."""
    origins = {}
    for client, keys, settings in (("kafka-python", [b"ack-kp", b"expire"], {"compression_type": codec, "linger_ms": 50}),
                                   ("confluent", [b"ack-ck", b"reject"], {"compression.type": codec, "linger.ms": 50})):
        done = produce(bootstrap, topic, keys=keys, values=[b"v-" + k * 50 for k in keys],
                       headers=[("app", b"kp" if client == "kafka-python" else b"ck")], client=client, settings=settings)
        origins.update({k.decode(): f"{topic}/0/{p.offset}" for k, p in zip(keys, done)})
    return origins


def _cli(config_file, *args: str, stderr: bool = False) -> str:
    res = CliRunner().invoke(cli, [*args, "--config", str(config_file)])
    assert res.exit_code == 0, res.output
    return res.output if stderr else res.stdout


@pytest.mark.parametrize("codec", CODECS)
def test_a_compressed_queue_is_read_copied_dead_lettered_and_traced_with_its_codec(
        codec, kafka_client, queue_topics, bootstrap, tmp_path):
    cfg, q = queue_topics(1, queue={**QUEUE, "compression": codec}, kafka={"client": kafka_client},
                          tracker={"tick": "50ms"}, consumer={"ack_flush_interval": "50ms", "auto_renew": False})
    config_file = tmp_path / "kmq.yaml"
    config_file.write_text(yaml.safe_dump(cfg.to_dict()))
    origin = _produce_compressed(bootstrap, q.name, codec)
    assert set(stored_codecs(bootstrap, q.name).values()) == {codec}  # the broker serves the batches as written

    acked: set[tuple[str, int]] = set()
    held = []
    with running_tracker(cfg) as t, KmqConsumer(cfg, queue=q.name) as consumer:
        def settle_what_arrives() -> bool:
            for msg in consumer.poll(timeout=0.2):
                key = msg.key.decode()
                assert msg.value == b"v-" + msg.key * 50
                if key == "expire" and msg.delivery_count == 1:
                    held.append(msg)  # never settled in time: its lease runs out and the tracker copies it
                elif key == "reject":
                    msg.reject(REASON)
                else:
                    assert dict(msg.headers)["app"] == (b"ck" if key == "ack-ck" else b"kp")
                    msg.ack()
                    acked.add((key, msg.delivery_count))
            return {("ack-kp", 1), ("ack-ck", 1), ("expire", 2)} <= acked

        wait_until(settle_what_arrives, 40, interval=0, what="both acks and the tracker's copy of the expired lease")
        held[0].ack()  # the slow first attempt ends late
        consumer.writer.flush()
        wait_until(lambda: metric(t.http_port, "kmq_tracker_dead_lettered_total", queue=q.name) == 1, 20,
                   what="the rejected message dead-lettered")
        wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 0, 20,
                   what="every message closed")

    copies = stored_codecs(bootstrap, q.name)
    assert len(copies) == 5 and set(copies.values()) == {codec}  # the four originals and the tracker's copy
    # Both clients send a batch uncompressed when the codec would not make it smaller, as most marker
    # batches are; the REJECT with its long reason is not.
    markers = stored_codecs(bootstrap, q.markers_topic)
    (reject_at,) = [r.offset for r in read_all(bootstrap, q.markers_topic) if isinstance(decode(r.value), Reject)]
    assert markers[reject_at] == codec and set(markers.values()) <= {codec, "none"}
    assert list(stored_codecs(bootstrap, q.dlq_topic).values()) == [codec]

    (expired,) = json.loads(_cli(config_file, "trace", q.name, origin["expire"], "--since", "10m",
                                 "--output", "json"))["messages"]
    first, copy = (e["offset"] for e in expired["events"] if e["kind"] == "delivered")
    assert (expired["state"], expired["deliveries"]) == ("acked", 2)
    assert by_copy(expired) == {first: ["delivered", "start", "lease-expired", "closed", "late-ack"],
                                 copy: ["delivered", "start", "ack"]}
    (rejected,) = json.loads(_cli(config_file, "trace", q.name, origin["reject"], "--since", "10m",
                                  "--output", "json"))["messages"]
    assert rejected["state"] == "dead-lettered"

    listed = _cli(config_file, "dlq", "list", q.name, stderr=True)
    assert "1 dead letter(s)" in listed and "kmq-dlq-reason: rejected" in listed and f"kmq-dlq-error: {REASON[:30]}" in listed
    assert "replayed 1 message(s)" in _cli(config_file, "dlq", "replay", q.name)
    _cli(config_file, "produce", q.name, "--count", "1")
    assert list(stored_codecs(bootstrap, q.name).values()) == [codec] * 7  # + the replay's copy and kmq produce's
