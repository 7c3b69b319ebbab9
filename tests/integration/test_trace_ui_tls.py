"""`kmq trace` and `kmq ui` on a TLS-only cluster, configured like every other command
(kafka.security_protocol SSL + ssl_cafile).

tansu's own TLS listener is unproven (TEST-ENVIRONMENT.md), so Debian's stunnel
terminates TLS in front of a plaintext tansu whose advertised listener is the
stunnel port: every client connection, bootstrap and after metadata, is TLS,
verified against a CA made for this test. SASL is not exercised: tansu's SASL
is unproven too; kmq passes SASL settings through the same client arguments.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import urllib.request

import pytest
import yaml
from click.testing import CliRunner

from kmq.cli import cli
from kmq.clients import producer
from kmq.config import Config
from kmq.devbroker import _TANSU_ENV, free_port, tansu_binary
from kmq.markers import End, Start, encode, encode_key
from kmq.topics import ensure_topics
from tests.helpers.kafka import wait_until
from tests.integration.test_ui import UiProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _certs(d):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def make(subject, issuer_key, issuer_name, key, ca):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, srv_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kmq test CA")])
    ca = make(ca_name, ca_key, ca_name, ca_key, True)
    srv = make(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_key, ca_name, srv_key, False)
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca.public_bytes(pem))
    (d / "server.pem").write_bytes(srv.public_bytes(pem) + srv_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return d / "ca.pem", d / "server.pem"


@pytest.fixture
def tls_bootstrap(tmp_path):
    stunnel = shutil.which("stunnel4") or shutil.which("stunnel")
    if not stunnel:
        if os.environ.get("CI"):
            pytest.fail("no stunnel: scripts/test.sh installs it (ensure_stunnel)")
        pytest.skip("stunnel not installed (scripts/setup-env.sh ensure_stunnel)")
    ca, server = _certs(tmp_path)
    plain, tls = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
    procs = []
    try:
        procs.append(subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", f"tcp://127.0.0.1:{plain}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{tls}", "--storage-engine", "memory://tansu/"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL))
        conf = tmp_path / "stunnel.conf"
        conf.write_text(f"foreground = yes\npid =\n[kafka]\naccept = 127.0.0.1:{tls}\n"
                        f"connect = 127.0.0.1:{plain}\ncert = {server}\n")
        procs.append(subprocess.Popen([stunnel, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      stdin=subprocess.DEVNULL))
        yield f"127.0.0.1:{tls}", str(ca)
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def test_trace_and_ui_over_tls(tls_bootstrap, tmp_path):
    bootstrap, ca = tls_bootstrap
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": bootstrap, "security_protocol": "SSL", "ssl_cafile": ca},
                            "queues": [{"name": "tls-orders"}]})
    wait_until(lambda: _try(lambda: ensure_topics(cfg.kafka, cfg.queues[0], 1)), 30, interval=0.3,
               what="topics created over TLS")
    p = producer(cfg.kafka)
    p.send("tls-orders", key=b"k", value=b"v", partition=0).get(10)
    p.send("tls-orders__markers", key=encode_key(0), value=encode(Start([(0, 1)], 30_000, "w1")), partition=0).get(10)
    p.send("tls-orders__markers", key=encode_key(0), value=encode(End([(0, 1)])), partition=0).get(10)
    p.close()
    path = tmp_path / "kmq.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict(redact=False)))
    res = CliRunner().invoke(cli, ["trace", "tls-orders", "tls-orders/0/0", "--config", str(path), "--output", "json"])
    assert res.exit_code == 0, res.output
    (t,) = json.loads(res.stdout)["messages"]
    assert t["state"] == "acked" and [e["kind"] for e in t["events"]] == ["delivered", "start", "ack"]
    # The listener really is TLS-only: the same command in plaintext cannot talk to it.
    plain = cfg.replace(kafka=cfg.kafka.__class__(bootstrap_servers=bootstrap, connect_timeout=2.0))
    plain_path = tmp_path / "plain.yaml"
    plain_path.write_text(yaml.safe_dump(plain.to_dict(redact=False)))
    res = CliRunner().invoke(cli, ["trace", "tls-orders", "tls-orders/0/0", "--config", str(plain_path)])
    assert res.exit_code == 1 and "cannot reach Kafka" in res.output, res.output
    ui = UiProcess(cfg, tmp_path)
    try:
        base = f"http://127.0.0.1:{ui.wait_port()}"
        page = urllib.request.urlopen(f"{base}/trace?origin=tls-orders/0/0", timeout=60).read().decode()
        assert "final-state\">acked" in page
        overview = urllib.request.urlopen(f"{base}/", timeout=60).read().decode()
        assert 'id="partitions"' in overview and "error" not in overview.lower().split("<main>")[1][:200]
    finally:
        ui.close()


def _try(fn) -> bool:
    from kmq.errors import KmqError

    try:
        fn()
        return True
    except KmqError:
        return False
