"""Configuration: one YAML file plus ``KMQ_...`` environment overrides.

Pure (reads the environment only when :meth:`Config.load` is called and only
from the mapping it is given). Durations are stored as float seconds and
accept ``250ms``, ``30s``, ``5m``, ``1h`` or a bare number of seconds.
Unknown keys and bad values raise :class:`~kmq.errors.ConfigError` naming the
key path, e.g. ``queues[0].lease: expected a duration like 30s, got 'soon'``.

Secrets (``kafka.sasl_password``) come only from the environment
(``KMQ_KAFKA__SASL_PASSWORD``) or a file (``kafka.sasl_password_file``), never
from kmq.yaml, and are never shown in errors, logs or ``repr``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from kmq.errors import ConfigError

__all__ = [
    "Config",
    "KafkaConfig",
    "QueueConfig",
    "BackoffConfig",
    "ConsumerConfig",
    "TrackerConfig",
    "RedisConfig",
    "parse_duration",
    "ENV_PREFIX",
]

ENV_PREFIX = "KMQ_"
_VERBATIM_KAFKA_KEYS = {"bootstrap_servers", "client_id", "sasl_username", "sasl_password"}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def parse_duration(value: Any, path: str = "") -> float:
    """Seconds from ``250ms``/``30s``/``5m``/``1h`` or a number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(path, f"expected a duration like 30s, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    else:
        raise ConfigError(path, f"expected a duration like 30s, got {value!r}")
    if seconds < 0:
        raise ConfigError(path, f"expected a non-negative duration, got {value!r}")
    return seconds


def _duration_text(seconds: float) -> str:
    ms = round(seconds * 1000)
    if ms % 60000 == 0 and ms:
        return f"{ms // 60000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


# ---------------------------------------------------------------- sections
# Each field's metadata says how to read it: "kind" is one of duration, int,
# float, bool, str, optstr, topic; "min" bounds numbers.


def _f(default: Any, kind: str, **meta: Any) -> Any:
    return field(default=default, metadata={"kind": kind, **meta})


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str = _f("localhost:9092", "str")
    security_protocol: str = _f("PLAINTEXT", "choice", choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"))
    sasl_mechanism: str | None = _f(None, "optchoice", choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"))
    sasl_username: str | None = _f(None, "optstr")
    sasl_password: str | None = field(default=None, repr=False, metadata={"kind": "optstr", "secret": True})
    sasl_password_file: str | None = _f(None, "optstr")
    ssl_cafile: str | None = _f(None, "optstr")
    client_id: str = _f("kmq", "str")
    # Group timing for every kmq consumer group member (workers, tracker).
    session_timeout: float = _f(10.0, "duration", min=1.0)
    heartbeat_interval: float = _f(1.0, "duration", min=0.1)
    # How long a component waits for the cluster before failing with a clear error.
    connect_timeout: float = _f(10.0, "duration", min=0.1)

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by kafka-python clients (security included)."""
        kw: dict[str, Any] = {
            "bootstrap_servers": [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()],
            "security_protocol": self.security_protocol,
            "client_id": self.client_id,
        }
        if self.sasl_mechanism:
            kw["sasl_mechanism"] = self.sasl_mechanism
            kw["sasl_plain_username"] = self.sasl_username
            kw["sasl_plain_password"] = self.password()
        if self.ssl_cafile:
            kw["ssl_cafile"] = self.ssl_cafile
        return kw

    def password(self) -> str | None:
        if self.sasl_password is not None:
            return self.sasl_password
        if self.sasl_password_file:
            try:
                return Path(self.sasl_password_file).read_text().strip()
            except OSError as exc:
                raise ConfigError("kafka.sasl_password_file", f"cannot read the password file: {exc.strerror}") from exc
        return None


@dataclass(frozen=True)
class BackoffConfig:
    initial: float = _f(1.0, "duration")
    max: float = _f(60.0, "duration")
    multiplier: float = _f(2.0, "float", min=1.0)

    def delay(self, attempt: int) -> float:
        """Backoff before redelivery number ``attempt`` (1 = first redelivery)."""
        if attempt < 1:
            return 0.0
        return min(self.max, self.initial * self.multiplier ** (attempt - 1))


@dataclass(frozen=True)
class QueueConfig:
    name: str = _f("", "topic")
    markers_topic: str = _f("", "topic")
    dlq_topic: str = _f("", "topic")
    lease: float = _f(30.0, "duration", min=0.001)
    max_deliveries: int = _f(5, "int", min=1)
    backoff: BackoffConfig = field(default_factory=BackoffConfig)

    @classmethod
    def named(cls, name: str, **kw: Any) -> "QueueConfig":
        """A queue with default settings and the default topic names."""
        return cls(name=name, markers_topic=f"{name}__markers", dlq_topic=f"{name}__dlq", **kw)

    @property
    def metrics_topic(self) -> str:
        return f"{self.name}__kmq_metrics"


@dataclass(frozen=True)
class ConsumerConfig:
    group_id: str = _f("kmq-workers", "str")
    max_in_flight_per_partition: int = _f(10_000, "int", min=1)
    ack_flush_interval: float = _f(0.1, "duration")
    auto_renew: bool = _f(False, "bool")
    max_lease: float = _f(600.0, "duration")
    # Flow control (kmq/flow.py): bounds on fetched-but-unsettled messages of one consumer.
    max_outstanding_messages: int = _f(10_000, "int", min=1)
    max_outstanding_bytes: int = _f(100 * 1024 * 1024, "int", min=1)
    # cooperative-sticky: a rebalance revokes only the partitions that move (KIP-429).
    assignor: str = _f("COOPERATIVE-STICKY", "choice", choices=("COOPERATIVE-STICKY", "RANGE"))
    # A fetcher whose Kafka poll has not returned for this long is stalled: the consumer fails loudly.
    fetch_stall_timeout: float = _f(10.0, "duration", min=1.0)


@dataclass(frozen=True)
class TrackerConfig:
    group_id: str = _f("kmq-tracker", "str")
    tick: float = _f(0.05, "duration", min=0.001)
    http_port: int = _f(9108, "int", min=0, max=65535)


@dataclass(frozen=True)
class RedisConfig:
    url: str | None = _f(None, "optstr")


_SECTIONS: dict[str, type] = {
    "kafka": KafkaConfig,
    "consumer": ConsumerConfig,
    "tracker": TrackerConfig,
    "redis": RedisConfig,
}


@dataclass(frozen=True)
class Config:
    """The whole kmq configuration. Build with :meth:`load` or :meth:`from_dict`."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    queues: tuple[QueueConfig, ...] = ()
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)

    # ------------------------------------------------------------ building
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> "Config":
        """Validate a plain mapping (as read from YAML). ``env`` overrides apply if given."""
        raw = _deep_copy(data or {})
        if not isinstance(raw, dict):
            raise ConfigError("", f"the configuration must be a mapping, got {type(raw).__name__}")
        if env:
            _apply_env(raw, env)
        return _build_config(raw)

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> "Config":
        """Read ``path`` (YAML; None = defaults only) and apply ``KMQ_*`` overrides from ``env``
        (default: the process environment)."""
        data: Any = {}
        if path is not None:
            p = Path(path)
            try:
                text = p.read_text()
            except FileNotFoundError:
                raise ConfigError("", f"config file {p} not found; pass --config PATH or create it (see docs/configuration.md)") from None
            except OSError as exc:
                raise ConfigError("", f"cannot read config file {p}: {exc.strerror}") from None
            try:
                data = yaml.safe_load(text) or {}
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f" at line {mark.line + 1}" if mark else ""
                raise ConfigError("", f"{p} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
            if isinstance(data, dict):
                _reject_file_secrets(data)
        return cls.from_dict(data, os.environ if env is None else env)

    # ------------------------------------------------------------ lookup
    def queue(self, name: str) -> QueueConfig:
        """The configured queue ``name``, or one with defaults when it is not configured."""
        for q in self.queues:
            if q.name == name:
                return q
        try:
            _check_topic("queue", name)
        except ConfigError as exc:
            raise ConfigError("queue", exc.problem) from None
        return QueueConfig.named(name)

    def with_queue(self, name: str) -> "Config":
        """This config with ``name`` among its queues (added with defaults if missing)."""
        if any(q.name == name for q in self.queues):
            return self
        return dataclasses.replace(self, queues=self.queues + (self.queue(name),))

    def replace(self, **sections: Any) -> "Config":
        return dataclasses.replace(self, **sections)

    def to_dict(self, redact: bool = True) -> dict[str, Any]:
        """Plain mapping (durations as text); secrets replaced by ``***``."""
        def conv(obj: Any) -> Any:
            if dataclasses.is_dataclass(obj):
                out = {}
                for f in dataclasses.fields(obj):
                    v = getattr(obj, f.name)
                    if f.metadata.get("secret") and v is not None and redact:
                        out[f.name] = "***"
                    elif f.metadata.get("kind") == "duration":
                        out[f.name] = _duration_text(v)
                    else:
                        out[f.name] = conv(v)
                return out
            if isinstance(obj, tuple):
                return [conv(x) for x in obj]
            return obj

        return conv(self)


# ---------------------------------------------------------------- env
def _apply_env(raw: dict, env: Mapping[str, str]) -> None:
    """``KMQ_KAFKA__BOOTSTRAP_SERVERS=x`` sets raw['kafka']['bootstrap_servers'];
    ``KMQ_QUEUES__0__LEASE=5s`` sets the first queue's lease. Values are read
    as YAML scalars so ``true``/``5`` get their types."""
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        if len(parts) < 2 or parts[0] not in (*_SECTIONS, "queues"):
            continue  # e.g. KMQ_TEST_BOOTSTRAP belongs to the test suite, not to config
        path_text = ".".join(parts)
        try:
            value = yaml.safe_load(env[name]) if env[name] != "" else None
        except yaml.YAMLError:
            value = env[name]
        if parts[0] == "kafka" and parts[-1] in _VERBATIM_KAFKA_KEYS:
            value = env[name]  # keep strings verbatim (a password may look like a number)
        node: Any = raw
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list):
                if not part.isdigit():
                    raise ConfigError(name, f"expected a list index in {name} at {part!r}")
                idx = int(part)
                while len(node) <= idx:
                    node.append({})
                node = node[idx]
            else:
                nxt = node.get(part)
                if nxt is None:
                    nxt = [] if part == "queues" else {}
                    node[part] = nxt
                elif not isinstance(nxt, (dict, list)):
                    raise ConfigError(path_text, f"{name} sets a key below {part!r}, which is not a section")
                node = nxt
        last = parts[-1]
        if isinstance(node, list):
            if not last.isdigit():
                raise ConfigError(name, f"expected a list index in {name} at {last!r}")
            raise ConfigError(name, f"{name} replaces a whole list entry; set its keys instead (…__{last}__LEASE)")
        node[last] = value


def _reject_file_secrets(data: dict) -> None:
    kafka = data.get("kafka")
    if isinstance(kafka, dict) and kafka.get("sasl_password") not in (None, ""):
        raise ConfigError(
            "kafka.sasl_password",
            "secrets are not read from the config file; set KMQ_KAFKA__SASL_PASSWORD or kafka.sasl_password_file",
        )


# ---------------------------------------------------------------- validation
def _deep_copy(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {k: _deep_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_deep_copy(v) for v in obj]
    return obj


def _check_topic(path: str, value: Any) -> str:
    if not isinstance(value, str) or not _TOPIC_RE.match(value) or value in (".", ".."):
        raise ConfigError(path, f"expected a Kafka topic name (letters, digits, '.', '_', '-'), got {value!r}")
    return value


def _value(path: str, f: dataclasses.Field, value: Any) -> Any:
    kind = f.metadata.get("kind")
    shown = "***" if f.metadata.get("secret") else repr(value)
    if kind == "duration":
        v = parse_duration(value, path)
        if "min" in f.metadata and v < f.metadata["min"]:
            raise ConfigError(path, f"expected at least {_duration_text(f.metadata['min'])}, got {value!r}")
        return v
    if kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "int" and not float(value).is_integer()):
            raise ConfigError(path, f"expected {'an integer' if kind == 'int' else 'a number'}, got {shown}")
        v = int(value) if kind == "int" else float(value)
        lo, hi = f.metadata.get("min"), f.metadata.get("max")
        if lo is not None and v < lo:
            raise ConfigError(path, f"expected at least {lo}, got {shown}")
        if hi is not None and v > hi:
            raise ConfigError(path, f"expected at most {hi}, got {shown}")
        return v
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {shown}")
        return value
    if kind in ("str", "optstr"):
        if value is None and kind == "optstr":
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or (kind == "str" and not value.strip()):
            raise ConfigError(path, f"expected a non-empty string, got {shown}")
        return value
    if kind in ("choice", "optchoice"):
        if value is None and kind == "optchoice":
            return None
        choices = f.metadata["choices"]
        if not isinstance(value, str) or value.upper() not in choices:
            raise ConfigError(path, f"expected one of {', '.join(choices)}, got {shown}")
        return value.upper()
    if kind == "topic":
        return _check_topic(path, value)
    raise AssertionError(f"field {f.name} has no kind")  # pragma: no cover


def _build(cls: type, raw: Any, path: str, nested: Mapping[str, Any] | None = None) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(path, f"expected a mapping of keys, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            near = ", ".join(sorted(fields))
            raise ConfigError(f"{path}.{key}" if path else str(key), f"unknown key; known keys here: {near}")
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        sub = f"{path}.{name}" if path else name
        if nested and name in nested:
            kwargs[name] = nested[name](value, sub)
        else:
            kwargs[name] = _value(sub, fields[name], value)
    return cls(**kwargs)


def _build_queue(raw: Any, path: str) -> QueueConfig:
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict):
        raise ConfigError(path, f"expected a queue mapping with at least a name, got {type(raw).__name__}")
    if "name" not in raw:
        raise ConfigError(f"{path}.name", "missing: every queue needs a name")
    name = _check_topic(f"{path}.name", raw["name"])
    filled = {"markers_topic": f"{name}__markers", "dlq_topic": f"{name}__dlq", **raw}
    q = _build(QueueConfig, filled, path, {"backoff": lambda v, p: _build(BackoffConfig, v, p)})
    if q.backoff.max < q.backoff.initial:
        raise ConfigError(f"{path}.backoff.max", f"must be at least backoff.initial ({_duration_text(q.backoff.initial)})")
    topics = {q.name, q.markers_topic, q.dlq_topic}
    if len(topics) != 3:
        raise ConfigError(path, "queue, markers_topic and dlq_topic must be three different topics")
    return q


def _build_config(raw: dict) -> Config:
    for key in raw:
        if key not in (*_SECTIONS, "queues"):
            raise ConfigError(str(key), f"unknown key; known top-level keys: {', '.join(sorted((*_SECTIONS, 'queues')))}")
    kwargs: dict[str, Any] = {name: _build(cls, raw.get(name), name) for name, cls in _SECTIONS.items()}
    queues_raw = raw.get("queues") or []
    if not isinstance(queues_raw, list):
        raise ConfigError("queues", f"expected a list of queues, got {type(queues_raw).__name__}")
    queues = tuple(_build_queue(q, f"queues[{i}]") for i, q in enumerate(queues_raw))
    seen: dict[str, int] = {}
    for i, q in enumerate(queues):
        if q.name in seen:
            raise ConfigError(f"queues[{i}].name", f"queue {q.name!r} is configured twice (also queues[{seen[q.name]}])")
        seen[q.name] = i
    kafka: KafkaConfig = kwargs["kafka"]
    if kafka.sasl_mechanism and not kafka.security_protocol.startswith("SASL"):
        raise ConfigError("kafka.sasl_mechanism", f"is set but kafka.security_protocol is {kafka.security_protocol}; use SASL_SSL or SASL_PLAINTEXT")
    if kafka.security_protocol.startswith("SASL") and not kafka.sasl_mechanism:
        raise ConfigError("kafka.sasl_mechanism", f"required when kafka.security_protocol is {kafka.security_protocol}")
    return Config(queues=queues, **kwargs)
