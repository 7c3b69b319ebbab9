"""`kmq trace` and `kmq ui` on a TLS-only cluster, configured like every other command
(kafka.security_protocol SSL, CA, client certificate).

Uses the TLS tier's shared broker (tests/integration/tls/conftest.py: tansu behind
stunnel4 requiring client certificates, PKI from tests/helpers/tls.py): every client
connection, bootstrap and after metadata, is TLS. SASL is not exercised here (tansu's
SASL is unproven); kmq passes SASL settings through the same client arguments.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import yaml
from click.testing import CliRunner

from kmq.cli import cli
from kmq.client.kafka_python.clients import producer
from kmq.config import KafkaConfig
from kmq.core.markers import End, Start, encode, encode_key
from tests.helpers.ui import UiProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_trace_and_ui_over_tls(tls_queue, tls_broker, tmp_path):
    cfg, q = tls_queue(1)
    origin = f"{q.name}/0/0"
    p = producer(cfg.kafka)
    p.send(q.name, key=b"k", value=b"v", partition=0).get(10)
    p.send(q.markers_topic, key=encode_key(0), value=encode(Start([(0, 1)], 30_000, "w1")), partition=0).get(10)
    p.send(q.markers_topic, key=encode_key(0), value=encode(End([(0, 1)])), partition=0).get(10)
    p.close()
    path = tmp_path / "kmq.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict(redact=False)))
    res = CliRunner().invoke(cli, ["trace", q.name, origin, "--config", str(path), "--output", "json"])
    assert res.exit_code == 0, res.output
    (t,) = json.loads(res.stdout)["messages"]
    assert t["state"] == "acked" and [e["kind"] for e in t["events"]] == ["delivered", "start", "ack"]
    # The listener really is TLS-only: the same command in plaintext cannot talk to it, and says why
    # in one line (kmq/client/diagnose.py).
    plain = cfg.replace(kafka=KafkaConfig(bootstrap_servers=tls_broker.bootstrap, connect_timeout=2.0))
    plain_path = tmp_path / "plain.yaml"
    plain_path.write_text(yaml.safe_dump(plain.to_dict(redact=False)))
    res = CliRunner().invoke(cli, ["trace", q.name, origin, "--config", str(plain_path)])
    assert res.exit_code == 1 and "expects TLS" in res.output and "kafka.security_protocol" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output, res.output
    ui = UiProcess(cfg, tmp_path)
    try:
        base = f"http://127.0.0.1:{ui.wait_port()}"
        page = urllib.request.urlopen(f"{base}/trace?origin={origin}", timeout=60).read().decode()
        assert "final-state\">acked" in page
        overview = urllib.request.urlopen(f"{base}/", timeout=60).read().decode()
        assert 'id="partitions"' in overview and "error" not in overview.lower().split("<main>")[1][:200]
    finally:
        ui.close()
