"""A real Apache Kafka cluster (KRaft) on loopback, for tests and development.

The broker's jars are resolved from Maven Central with Maven into a cache
outside the repository (``~/.cache/kmq/kafka/<version>``, or
``$KMQ_KAFKA_CACHE``); once filled, the cache is used as it is, offline. Nothing
is downloaded but ``org.apache.kafka:kafka_2.13`` and its dependencies.

One broker runs in combined mode (broker and controller in one JVM). Several
brokers run beside one dedicated controller, so stopping brokers never takes
the metadata quorum with it: with three brokers, topics are created with
replication factor 3 and ``min.insync.replicas=2``, and two brokers down make
``acks=all`` writes fail with NOT_ENOUGH_REPLICAS as on a production cluster.

Settings chosen for tests (all stated in :data:`TEST_SETTINGS`): no initial
rebalance delay, 10 partitions for the internal topics (50 by default, which
only slows the first group join), share groups on. Everything listens on
127.0.0.1 on ports picked at start; a node keeps its ports and its data
across :meth:`KafkaCluster.kill_node` and :meth:`KafkaCluster.start_node`, so a
restarted broker is the same broker.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kmq.core.errors import DevBrokerError
from kmq.dev.broker import free_port
from kmq.dev.processes import log_tail, set_pdeathsig, stop_processes

__all__ = ["KAFKA_VERSION", "TEST_SETTINGS", "KafkaCluster", "KafkaNode", "TlsListener", "kafka_classpath"]

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.2.0"
_LOG4J_VERSION = "2.25.3"  # the log4j2 Kafka 4.2 is built against; its slf4j 1.x binding routes the broker's logs

# Broker settings for tests; every other setting is Kafka's default.
TEST_SETTINGS: dict[str, str] = {
    "group.initial.rebalance.delay.ms": "0",  # a first join waits 3 s by default
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.num.partitions": "10",
    "share.coordinator.state.topic.num.partitions": "10",
    "group.share.enable": "true",
    # Share-group locks as short as kmq's test leases, so a native lock expiry takes a test 1.5 s.
    "group.share.record.lock.duration.ms": "1500",
    "group.share.min.record.lock.duration.ms": "1000",
    "num.partitions": "1",
    "log.retention.check.interval.ms": "1000",  # retention tests see the log start move within seconds
    "log.initial.task.delay.ms": "1000",
    "group.min.session.timeout.ms": "1000",
}

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.kmq.dev</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{version}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Logger:
      - name: kafka
        level: INFO
      - name: org.apache.kafka
        level: INFO
      - name: state.change.logger
        level: WARN
      - name: kafka.log
        level: WARN
      - name: org.apache.kafka.storage
        level: WARN
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
"""

_STARTED = b"Kafka Server started"
_SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def _cache_root() -> Path:
    env = os.environ.get("KMQ_KAFKA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kmq" / "kafka"


def _need(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise DevBrokerError(f"Apache Kafka needs {tool!r}, which is not on PATH: {hint}")
    return path


def _resolve(version: str, root: Path, lib: Path, timeout: float) -> None:
    mvn = _need("mvn", "install Maven (apt-get install maven) to resolve the broker from Maven Central once")
    (root / "pom.xml").write_text(_POM.format(version=version, log4j=_LOG4J_VERSION))
    partial = root / "lib.partial"
    shutil.rmtree(partial, ignore_errors=True)
    log.info("resolving Apache Kafka %s from Maven Central into %s", version, root)
    try:
        done = subprocess.run(
            [mvn, "-q", "-B", "-f", str(root / "pom.xml"), "dependency:copy-dependencies",
             f"-DoutputDirectory={partial}", "-DincludeScope=runtime"],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise DevBrokerError(f"Maven did not resolve Apache Kafka {version} within {timeout:.0f} s: "
                             "is Maven Central reachable from this machine?") from None
    if done.returncode != 0:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise DevBrokerError(f"Maven could not resolve org.apache.kafka:kafka_2.13:{version} (exit {done.returncode}): "
                             f"{tail}. Check that Maven Central is reachable, or fill {root} on a machine that reaches it")
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)


def kafka_classpath(version: str = KAFKA_VERSION, cache: Path | None = None, timeout: float = 600.0) -> list[Path]:
    """The jars of Apache Kafka ``version``: from the cache, else resolved now with Maven.

    A resolution is complete only once its stamp is written, so an interrupted one is
    redone, never half used."""
    root = (cache or _cache_root()) / version
    lib, stamp = root / "lib", root / ".resolved"
    if not stamp.exists():
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # test processes starting together resolve once
            if not stamp.exists():
                _resolve(version, root, lib, timeout)
                stamp.write_text(version + "\n")
    jars = sorted(lib.glob("*.jar"))
    if not jars:
        raise DevBrokerError(f"the Kafka cache {lib} holds no jars: remove {root} to resolve it again")
    return jars


def _cluster_id() -> str:
    """A random cluster id as Kafka's ``Uuid.randomUuid`` makes them: never starting with "-",
    which the storage tool would read as an option (one id in 64 did)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _plain_jaas(users: dict[str, str]) -> str:
    """PLAIN's users live in the JAAS line (``user_<name>="<password>"``): SCRAM's stored
    credentials do not serve PLAIN."""
    for name, pw in users.items():
        if not name.replace("-", "").replace("_", "").isalnum() or '"' in pw or "\\" in pw:
            raise DevBrokerError(f"SASL user {name!r}: PLAIN needs a name of letters, digits, - and _, and a password "
                                 "without quotes or backslashes")
    return ("org.apache.kafka.common.security.plain.PlainLoginModule required "
            + " ".join(f'user_{name}="{pw}"' for name, pw in users.items()) + ";")


@dataclass(frozen=True)
class TlsListener:
    """A TLS listener on every broker (``SSL://``), beside the plaintext one."""

    cert: Path  # the server certificate (PEM), for 127.0.0.1
    key: Path  # its private key (PEM, PKCS#8, unencrypted)
    ca: Path  # the CA client certificates must chain to
    client_auth: str = "required"  # Kafka's ssl.client.auth: required, requested or none


@dataclass
class KafkaNode:
    """One JVM of the cluster: a broker, a controller, or both."""

    node_id: int
    roles: str  # "broker,controller", "broker" or "controller"
    port: int  # the client listener (0 for a controller-only node)
    controller_port: int  # the controller listener (0 for a broker-only node)
    workdir: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)
    tls_port: int = 0  # the TLS listener, when the cluster has one
    sasl_port: int = 0  # the SASL_PLAINTEXT (SCRAM and PLAIN) listener, when the cluster has users
    sasl_ssl_port: int = 0  # the SASL_SSL listener, when the cluster has users and TLS
    formatted: bool = False
    log_offset: int = 0  # where this run's lines start in the log (a restart appends to it)

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    @property
    def properties_path(self) -> Path:
        return self.workdir / "server.properties"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


class KafkaCluster:
    """Start and stop Apache Kafka on loopback: ``brokers`` brokers (one JVM in combined mode
    for one broker; a dedicated controller beside several).

    >>> with KafkaCluster(brokers=3) as cluster:    # doctest: +SKIP
    ...     print(cluster.bootstrap)                # 127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
    ...     cluster.kill_node(cluster.brokers[0])   # SIGKILL one broker; start_node() brings it back
    """

    def __init__(self, brokers: int = 1, version: str | None = None, workdir: str | None = None,
                 settings: dict[str, str] | None = None, heap: str = "512m", cache: Path | None = None,
                 tls: TlsListener | None = None, scram_users: dict[str, str] | None = None) -> None:
        """``tls``: a TLS listener beside the plaintext one; ``scram_users``: user -> password, served
        on a SASL_PLAINTEXT listener with SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN (and, with ``tls``,
        on a SASL_SSL listener that asks for no client certificate)."""
        if brokers < 1:
            raise DevBrokerError(f"a Kafka cluster needs at least one broker, got {brokers}")
        self.version = version or os.environ.get("KMQ_KAFKA_VERSION") or KAFKA_VERSION
        self.heap = heap
        self._cache = cache
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kmq-kafka-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster_id = _cluster_id()
        replicas = str(min(3, brokers))
        self.settings = {
            **TEST_SETTINGS,
            "default.replication.factor": replicas,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "share.coordinator.state.topic.replication.factor": replicas,
            "min.insync.replicas": "2" if brokers >= 3 else "1",
            "transaction.state.log.min.isr": "2" if brokers >= 3 else "1",
            "share.coordinator.state.topic.min.isr": "2" if brokers >= 3 else "1",
            **(settings or {}),
        }
        if brokers == 1:
            self.nodes = [KafkaNode(1, "broker,controller", free_port(), free_port(), self.workdir / "node-1")]
        else:
            self.nodes = [KafkaNode(1, "controller", 0, free_port(), self.workdir / "controller-1")]
            self.nodes += [KafkaNode(i, "broker", free_port(), 0, self.workdir / f"broker-{i}") for i in range(2, brokers + 2)]
        self.tls = tls
        self.scram_users = dict(scram_users or {})
        for n in self.brokers:
            n.tls_port = free_port() if tls else 0
            n.sasl_port = free_port() if self.scram_users else 0
            n.sasl_ssl_port = free_port() if self.scram_users and tls else 0
        self._classpath: str | None = None

    # ------------------------------------------------------------ addresses
    @property
    def brokers(self) -> list[KafkaNode]:
        return [n for n in self.nodes if n.is_broker]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.brokers)

    @property
    def tls_bootstrap(self) -> str:
        """The brokers' TLS listeners ("" without ``tls``)."""
        return ",".join(f"127.0.0.1:{n.tls_port}" for n in self.brokers if n.tls_port)

    @property
    def sasl_bootstrap(self) -> str:
        """The brokers' SASL_PLAINTEXT listeners ("" without ``scram_users``)."""
        return ",".join(f"127.0.0.1:{n.sasl_port}" for n in self.brokers if n.sasl_port)

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """The brokers' SASL_SSL listeners ("" without both ``scram_users`` and ``tls``)."""
        return ",".join(f"127.0.0.1:{n.sasl_ssl_port}" for n in self.brokers if n.sasl_ssl_port)

    def node(self, node_id: int) -> KafkaNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise DevBrokerError(f"no node {node_id} in this cluster (nodes {[n.node_id for n in self.nodes]})")

    @property
    def pid(self) -> int | None:
        """The first broker's PID (the one process of a one-broker cluster)."""
        return self.brokers[0].pid

    @property
    def pids(self) -> list[int]:
        return [p for p in (n.pid for n in self.nodes) if p is not None]

    def __enter__(self) -> "KafkaCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 90.0) -> "KafkaCluster":
        """Start every node that is not running and return once each broker serves clients."""
        _need("java", "install a Java 17+ runtime (apt-get install openjdk-17-jre-headless)")
        deadline = time.monotonic() + timeout
        try:
            self._format([n for n in self.nodes if not n.formatted], deadline)
            for n in self.nodes:
                if n.pid is None:
                    self._spawn(n)
            for n in self.nodes:
                self._wait_started(n, deadline)
            self._wait_registered(deadline)
        except BaseException:
            self.stop()
            raise
        log.info("Apache Kafka %s ready at %s (pids %s)", self.version, self.bootstrap, self.pids)
        return self

    def start_node(self, node: KafkaNode, timeout: float = 60.0) -> None:
        """Start one stopped node again, on its ports and with its data."""
        if node.pid is None:
            self._spawn(node)
        self._wait_started(node, time.monotonic() + timeout)

    def kill_node(self, node: KafkaNode) -> None:
        """SIGKILL one node: no controlled shutdown, its data stays."""
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait(10)

    def stop_node(self, node: KafkaNode, timeout: float = 60.0) -> None:
        """SIGTERM one node: a controlled shutdown (leadership moves away first)."""
        stop_processes([node.proc], timeout)

    def pause_node(self, node: KafkaNode) -> None:
        """SIGSTOP one node: it holds its connections and answers nothing until resumed."""
        if node.pid is not None:
            os.kill(node.pid, signal.SIGSTOP)

    def resume_node(self, node: KafkaNode) -> None:
        if node.pid is not None:
            os.kill(node.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL every node (for crash tests); the data stays for :meth:`start`."""
        for n in self.nodes:
            self.resume_node(n)  # a stopped JVM cannot die of SIGKILL until continued on some kernels
            self.kill_node(n)

    def restart(self, timeout: float = 90.0) -> None:
        """Kill every node and start the cluster again on the same ports and data."""
        self.kill()
        self.start(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (then SIGKILL) every node, brokers first; idempotent."""
        for n in self.nodes:
            self.resume_node(n)
        stop_processes([n.proc for n in self.nodes if n.is_broker], timeout)
        stop_processes([n.proc for n in self.nodes if not n.is_broker], timeout)
        for n in self.nodes:
            n.proc = None

    # ------------------------------------------------------------ helpers
    def _java(self, *args: str, heap: str) -> list[str]:
        if self._classpath is None:
            self._classpath = os.pathsep.join(str(j) for j in kafka_classpath(self.version, self._cache))
        log4j = self.workdir / "log4j2.yaml"
        if not log4j.exists():
            log4j.write_text(_LOG4J2)
        return ["java", f"-Xmx{heap}", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={log4j}", "-cp", self._classpath, *args]

    def _properties(self, n: KafkaNode) -> str:
        controllers = [c for c in self.nodes if "controller" in c.roles]
        listeners, advertised, protocols = [], [], ["CONTROLLER:PLAINTEXT"]
        extra: dict[str, str] = {}
        if n.is_broker:
            listeners.append(f"PLAINTEXT://127.0.0.1:{n.port}")
            advertised.append(f"PLAINTEXT://127.0.0.1:{n.port}")
            protocols.append("PLAINTEXT:PLAINTEXT")
            if self.tls is not None:
                listeners.append(f"SSL://127.0.0.1:{n.tls_port}")
                advertised.append(f"SSL://127.0.0.1:{n.tls_port}")
                protocols.append("SSL:SSL")
                extra.update(self._tls_settings("ssl", self.tls.client_auth))
            if self.scram_users:
                extra["sasl.enabled.mechanisms"] = ",".join((*_SCRAM, "PLAIN"))
                sasl = [("SASL_PLAINTEXT", n.sasl_port)] + ([("SASL_SSL", n.sasl_ssl_port)] if self.tls else [])
                for protocol, port in sasl:
                    listeners.append(f"{protocol}://127.0.0.1:{port}")
                    advertised.append(f"{protocol}://127.0.0.1:{port}")
                    protocols.append(f"{protocol}:{protocol}")
                    extra.update(self._sasl_settings(protocol.lower()))
                if self.tls is not None:
                    extra.update(self._tls_settings("sasl_ssl", "none"))  # the password is the credential
        if "controller" in n.roles:
            listeners.append(f"CONTROLLER://127.0.0.1:{n.controller_port}")
        props = {
            "process.roles": n.roles,
            "node.id": str(n.node_id),
            "controller.quorum.voters": ",".join(f"{c.node_id}@127.0.0.1:{c.controller_port}" for c in controllers),
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join(listeners),
            "listener.security.protocol.map": ",".join(dict.fromkeys(protocols)),
            "log.dirs": str(n.workdir / "data"),
        }
        if n.is_broker:
            props["advertised.listeners"] = ",".join(advertised)
            props["inter.broker.listener.name"] = "PLAINTEXT"
            props.update(extra)
            props.update(self.settings)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _sasl_settings(self, listener: str) -> dict[str, str]:
        prefix = f"listener.name.{listener}."
        out = {f"{prefix}{mech.lower()}.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;"
               for mech in _SCRAM}
        out[f"{prefix}plain.sasl.jaas.config"] = _plain_jaas(self.scram_users)
        return out

    def _tls_settings(self, listener: str, client_auth: str) -> dict[str, str]:
        assert self.tls is not None
        keystore = self.workdir / "tls-keystore.pem"  # Kafka's PEM keystore: the key, then the certificate
        keystore.write_bytes(Path(self.tls.key).read_bytes() + Path(self.tls.cert).read_bytes())
        keystore.chmod(0o600)
        prefix = f"listener.name.{listener}."
        return {f"{prefix}ssl.keystore.type": "PEM", f"{prefix}ssl.keystore.location": str(keystore),
                f"{prefix}ssl.truststore.type": "PEM", f"{prefix}ssl.truststore.location": str(self.tls.ca),
                f"{prefix}ssl.client.auth": client_auth}

    def _format(self, nodes: list[KafkaNode], deadline: float) -> None:
        procs = []
        for n in nodes:
            n.workdir.mkdir(parents=True, exist_ok=True)
            n.properties_path.write_text(self._properties(n))
            users = [f"{mech}=[name={user},password={pw}]" for user, pw in self.scram_users.items() for mech in _SCRAM]
            scram = [a for u in users for a in ("--add-scram", u)] if "controller" in n.roles else []
            cmd = self._java("kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(n.properties_path),
                             "--ignore-formatted", *scram, heap="256m")
            out = open(n.workdir / "format.log", "wb")
            procs.append((n, out, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)))
        for n, out, p in procs:
            try:
                rc = p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            finally:
                out.close()
            if rc != 0:
                raise DevBrokerError(f"formatting the storage of Kafka node {n.node_id} failed (exit {rc}): "
                                     f"{log_tail(n.workdir / 'format.log', 5)}")
            n.formatted = True

    def _spawn(self, n: KafkaNode) -> None:
        n.properties_path.write_text(self._properties(n))
        heap = self.heap if n.is_broker else "256m"
        cmd = self._java("kafka.Kafka", str(n.properties_path), heap=heap)
        n.log_offset = n.log_path.stat().st_size if n.log_path.exists() else 0
        with open(n.log_path, "ab") as out:
            n.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=set_pdeathsig if sys.platform.startswith("linux") else None,
            )

    def _wait_started(self, n: KafkaNode, deadline: float) -> None:
        offset = n.log_offset
        while time.monotonic() < deadline:
            if n.proc is None or n.proc.poll() is not None:
                code = None if n.proc is None else n.proc.returncode
                raise DevBrokerError(f"Kafka node {n.node_id} exited with code {code} during start; "
                                     f"see {n.log_path}: {log_tail(n.log_path, 5)}")
            with contextlib.suppress(OSError), open(n.log_path, "rb") as f:
                f.seek(offset)
                if _STARTED in f.read():
                    return
            time.sleep(0.05)
        raise DevBrokerError(f"Kafka node {n.node_id} did not start in time; see {n.log_path}: {log_tail(n.log_path, 5)}")

    def _wait_registered(self, deadline: float) -> None:
        """Until metadata names every broker: a topic created earlier would get fewer replicas."""
        from kmq.client import open_admin
        from kmq.config import KafkaConfig
        from kmq.core.errors import KmqError

        kafka = KafkaConfig.from_mapping({"bootstrap_servers": self.bootstrap})
        want = {n.node_id for n in self.brokers}
        seen: set[int] = set()
        while time.monotonic() < deadline:
            try:
                admin = open_admin(kafka, 5.0)
                try:
                    seen = admin.brokers()
                finally:
                    admin.close()
                if want <= seen:
                    return
            except (KmqError, OSError):
                pass
            time.sleep(0.1)
        raise DevBrokerError(f"Kafka brokers {sorted(want - seen)} did not register (unfenced) with the controller in time")
