"""A real TLS endpoint for the tests: throwaway certificates and stunnel in front of tansu.

tansu's own TLS and SASL options do not work here (docs/configuration.md,
"Security"), so Debian's stunnel4 terminates TLS, verifies client
certificates against the test CA, and forwards to the embedded broker, whose
advertised listener is the stunnel port: every connection a client makes
after bootstrap goes through TLS too.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kmq.dev.broker import DevBroker, _wait_port, free_port
from kmq.dev.processes import set_pdeathsig
from kmq.dev.processes import stop_processes

KEY_PASSWORD = "kmq-test-key-pass"


def stunnel_binary() -> str | None:
    return shutil.which("stunnel4") or shutil.which("stunnel")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


@dataclass
class _Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _issue(cn: str, issuer: _Issued | None, *, ca: bool = False, days: tuple[int, int] = (-1, 30),
           san_ips: tuple[str, ...] = (), client: bool = False) -> _Issued:
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(_name(cn))
         .issuer_name(issuer.cert.subject if issuer else _name(cn))
         .public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now + dt.timedelta(days=days[0]))
         .not_valid_after(now + dt.timedelta(days=days[1]))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
    else:
        usage = x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client else x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if san_ips:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(i)) for i in san_ips]), critical=False)
    signer = issuer.key if issuer else key
    return _Issued(b.sign(signer, hashes.SHA256()), key)


def _write(d: Path, name: str, issued: _Issued, password: str | None = None) -> tuple[Path, Path]:
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    crt.write_bytes(issued.cert.public_bytes(serialization.Encoding.PEM))
    enc = (serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption())
    key.write_bytes(issued.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc))
    key.chmod(0o600)
    return crt, key


@dataclass
class TestPki:
    """Paths of the throwaway PKI: a trusted CA and a rogue one, a server certificate for
    127.0.0.1 (IP only, so ``localhost`` is a host-name mismatch), and client certificates:
    valid (key encrypted with :data:`KEY_PASSWORD`), expired, and signed by the rogue CA."""

    ca: Path
    rogue_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    expired_cert: Path
    expired_key: Path
    rogue_cert: Path
    rogue_key: Path

    @classmethod
    def create(cls, d: Path) -> "TestPki":
        d.mkdir(parents=True, exist_ok=True)
        ca = _issue("kmq test CA", None, ca=True)
        rogue = _issue("someone else's CA", None, ca=True)
        ca_path, _ = _write(d, "ca", ca)
        rogue_path, _ = _write(d, "rogue-ca", rogue)
        server = _write(d, "server", _issue("127.0.0.1", ca, san_ips=("127.0.0.1",)))
        client = _write(d, "client", _issue("kmq-client", ca, client=True), password=KEY_PASSWORD)
        expired = _write(d, "expired", _issue("kmq-expired", ca, client=True, days=(-30, -1)))
        rogue_client = _write(d, "rogue-client", _issue("kmq-rogue", rogue, client=True))
        return cls(ca_path, rogue_path, *server, *client, *expired, *rogue_client)


class TlsBroker:
    """tansu on a plaintext loopback port, stunnel on :attr:`tls_port` requiring client certificates."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pki = TestPki.create(workdir / "pki")
        self.tls_port = free_port()
        self.broker = DevBroker(advertised_port=self.tls_port, workdir=str(workdir))
        self._stunnel: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        """The TLS address clients use."""
        return f"127.0.0.1:{self.tls_port}"

    @property
    def plaintext_bootstrap(self) -> str:
        """tansu's own plaintext port (its metadata still points at the TLS port)."""
        return self.broker.bootstrap

    @property
    def pids(self) -> list[int]:
        return self.broker.pids + ([self._stunnel.pid] if self._stunnel and self._stunnel.poll() is None else [])

    def start(self) -> "TlsBroker":
        import time

        binary = stunnel_binary()
        if binary is None:
            raise RuntimeError("stunnel4 is not installed (scripts/setup-env.sh installs it)")
        self.broker.start()
        conf = self.workdir / "stunnel.conf"
        log = self.workdir / "stunnel.log"
        conf.write_text("\n".join([
            "foreground = yes", "pid =", f"output = {log}", "debug = 4", "",
            "[kafka]",
            f"accept = 127.0.0.1:{self.tls_port}",
            f"connect = {self.broker.bootstrap}",
            f"cert = {self.pki.server_cert}", f"key = {self.pki.server_key}",
            f"CAfile = {self.pki.ca}",
            "verifyChain = yes", "requireCert = yes", "",
        ]))
        self._stunnel = subprocess.Popen([binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=set_pdeathsig,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_port("127.0.0.1", self.tls_port, self._stunnel, time.monotonic() + 20, "stunnel", log)
        except BaseException:
            self.stop()
            raise
        return self

    def kafka_settings(self, **overrides) -> dict:
        """``kafka:`` section for mutual TLS with the valid client certificate."""
        pw = self.workdir / "key-password"
        if not pw.exists():
            pw.write_text(KEY_PASSWORD + "\n")
        return {
            "bootstrap_servers": self.bootstrap, "security_protocol": "SSL",
            "ssl_cafile": str(self.pki.ca), "ssl_certfile": str(self.pki.client_cert),
            "ssl_keyfile": str(self.pki.client_key), "ssl_password_file": str(pw), **overrides,
        }

    def stop(self) -> None:
        stop_processes([self._stunnel], 10)
        self._stunnel = None
        self.broker.stop()


#: The SCRAM user of :class:`KafkaTlsBroker`'s SASL listener.
SCRAM_USER, SCRAM_PASSWORD = "kmq-test", "kmq-test-secret"


class KafkaTlsBroker:
    """Apache Kafka's own TLS listener (client certificates required) and SASL/SCRAM listener
    (user :data:`SCRAM_USER`), beside its plaintext one: what :class:`TlsBroker` offers, with
    no proxy in between."""

    def __init__(self, workdir: Path) -> None:
        from kmq.dev.kafka import KafkaCluster, TlsListener

        self.workdir = workdir
        self.pki = TestPki.create(workdir / "pki")
        self.cluster = KafkaCluster(workdir=str(workdir / "kafka"),
                                    tls=TlsListener(self.pki.server_cert, self.pki.server_key, self.pki.ca),
                                    scram_users={SCRAM_USER: SCRAM_PASSWORD})

    @property
    def bootstrap(self) -> str:
        return self.cluster.tls_bootstrap

    @property
    def tls_port(self) -> int:
        return self.cluster.brokers[0].tls_port

    @property
    def plaintext_bootstrap(self) -> str:
        return self.cluster.bootstrap

    @property
    def sasl_bootstrap(self) -> str:
        return self.cluster.sasl_bootstrap

    @property
    def pids(self) -> list[int]:
        return self.cluster.pids

    def start(self) -> "KafkaTlsBroker":
        self.cluster.start()
        return self

    kafka_settings = TlsBroker.kafka_settings

    def stop(self) -> None:
        self.cluster.stop()
