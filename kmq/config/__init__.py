"""Configuration: one YAML file plus ``KMQ_...`` environment overrides.

Pure (reads the environment only when :meth:`Config.load` is called and only
from the mapping it is given). Durations are stored as float seconds and
accept ``250ms``, ``30s``, ``5m``, ``1h``, ``7d`` or a bare number of seconds.
Unknown keys and bad values raise :class:`~kmq.core.errors.ConfigError` naming the
key path, e.g. ``queues[0].lease: expected a duration like 30s, got 'soon'``.

Secrets (``kafka.sasl_password``, ``kafka.ssl_password``) come only from the
environment (``KMQ_KAFKA__SASL_PASSWORD``) or a file (``kafka.sasl_password_file``),
never from kmq.yaml, and are never shown in errors, logs or ``repr``.

Security settings are checked in two steps: :meth:`Config.from_dict` checks
what the keys say together (a SASL mechanism needs a SASL protocol, TLS files
need SSL); :meth:`KafkaConfig.check_security` (run by :meth:`Config.load`
and again before any client is built) checks what only the running process
can know: credentials present after the environment is applied. Files (TLS,
password, token) are only named here: the client builders check and read them
(:mod:`kmq.client.secrets`), so configuration does no I/O but reading kmq.yaml.

Here: :class:`Config` and :class:`KafkaConfig`, and the rules between sections.
The rest is in :mod:`kmq.config.fields` (how a field is declared and read),
:mod:`kmq.config.sections`, :mod:`kmq.config.queues` and :mod:`kmq.config.env`
(``KMQ_...`` overrides); users import them all from ``kmq.config``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from kmq.config.client_settings import ClientSettings
from kmq.config.env import ENV_PREFIX, _apply_env, _reject_file_secrets
# Names of the modules below, imported from kmq.config by users ("X as X": re-exported).
from kmq.config.fields import (
    _MAX_U32_MS_S,
    COMPRESSION_CODECS,
    DEFAULT_GROUP,
    DURATION_PATTERN,
    GROUP_PATTERN,
    LIBRDKAFKA_DEBUG_CONTEXTS,
    LIBRDKAFKA_DEBUG_PATTERN,
    LOGGER_NAMES_PATTERN as LOGGER_NAMES_PATTERN,
    MARKERS_RETENTION_S as MARKERS_RETENTION_S,
    MAX_DELIVERIES as MAX_DELIVERIES,
    MIN_MARKERS_RETENTION_S as MIN_MARKERS_RETENTION_S,
    TOPIC_PATTERN,
    _build,
    _check_group,
    _check_topic,
    _comma_list,
    _deep_copy,
    _duration_text,
    _f,
    parse_duration,
)
from kmq.config.queues import QueueConfig, _build_queue, _check_groups
from kmq.config.sections import (
    MAVEN_CENTRAL as MAVEN_CENTRAL,
    BackoffConfig,
    ConsumerConfig,
    LoggingConfig,
    RedisConfig,
    SparkConfig,
    TopicsConfig,
    TrackerConfig,
)
from kmq.core.errors import ConfigError

__all__ = [
    "Config",
    "KafkaConfig",
    "QueueConfig",
    "BackoffConfig",
    "ConsumerConfig",
    "TrackerConfig",
    "RedisConfig",
    "LoggingConfig",
    "TopicsConfig",
    "SparkConfig",
    "parse_duration",
    "ENV_PREFIX",
    "DURATION_PATTERN",
    "TOPIC_PATTERN",
    "PASSWORD_MECHANISMS",
    "COMPRESSION_CODECS",
    "DEFAULT_GROUP",
    "GROUP_PATTERN",
    "ConfigError",
]

#: The SASL mechanisms that log in with a user name and a password.
PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str = _f("localhost:9092", "str")
    security_protocol: str = _f("PLAINTEXT", "choice", choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"))
    sasl_mechanism: str | None = _f(
        None, "optchoice", choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "AWS_MSK_IAM"))
    sasl_username: str | None = _f(None, "optstr")
    sasl_password: str | None = field(default=None, repr=False, metadata={"kind": "optstr", "secret": True})
    sasl_password_file: str | None = _f(None, "optstr")
    ssl_cafile: str | None = _f(None, "optstr")
    # Mutual TLS: client certificate (PEM; may also hold the key), its key, and
    # the key's password (a secret: environment or file only).
    ssl_certfile: str | None = _f(None, "optstr")
    ssl_keyfile: str | None = _f(None, "optstr")
    ssl_password: str | None = field(default=None, repr=False, metadata={"kind": "optstr", "secret": True})
    ssl_password_file: str | None = _f(None, "optstr")
    # Off only for brokers reached by a name their certificate does not carry.
    ssl_check_hostname: bool = _f(True, "bool")
    # OAUTHBEARER: where the token comes from (exactly one of the two).
    sasl_oauth_token_file: str | None = _f(None, "optstr")
    sasl_oauth_token_command: str | None = _f(None, "optstr")
    client_id: str = _f("kmq", "str")
    # Group timing for every kmq consumer group member (workers, tracker).
    session_timeout: float = _f(10.0, "duration", min=1.0)
    heartbeat_interval: float = _f(1.0, "duration", min=0.1)
    # How often workers and trackers refresh topic metadata: partitions added to a queue (and its
    # markers topic) are fetched and tracked within this (the clients' own default is 5 minutes).
    metadata_max_age: float = _f(30.0, "duration", min=0.1)
    # How long a component waits for the cluster before failing with a clear error.
    connect_timeout: float = _f(10.0, "duration", min=0.1)
    # Which Python Kafka client every component uses (kmq.client): kafka-python (base
    # install), confluent (librdkafka, the confluent extra) or aiokafka (kmq.aio's consumer only,
    # on its event loop; the aio extra).
    client: str = _f("kafka-python", "choice", choices=("KAFKA-PYTHON", "CONFLUENT", "AIOKAFKA"), lower=True)
    # librdkafka's own debug contexts (its `debug` property, e.g. eos,msg) for clients on
    # confluent-kafka; their lines go to the logger kmq.librdkafka at DEBUG.
    librdkafka_debug: str | None = _f(None, "optstr", pattern=LIBRDKAFKA_DEBUG_PATTERN)
    # The clients' own settings, passed through to every client kmq builds on that client
    # (kmq.config.client_settings says what is refused and why).
    kafka_python: ClientSettings = field(default_factory=ClientSettings, hash=False,
                                         metadata={"kind": "settings", "client": "kafka-python"})
    confluent: ClientSettings = field(default_factory=ClientSettings, hash=False,
                                      metadata={"kind": "settings", "client": "confluent"})

    def __post_init__(self) -> None:
        if not re.match(LIBRDKAFKA_DEBUG_PATTERN, self.librdkafka_debug or ""):
            unknown = [c for c in self.librdkafka_debug_contexts if c not in LIBRDKAFKA_DEBUG_CONTEXTS]
            raise ConfigError("kafka.librdkafka_debug", f"unknown librdkafka debug context(s) {', '.join(unknown)}; "
                                                        f"use some of {', '.join(LIBRDKAFKA_DEBUG_CONTEXTS)}")

    @property
    def librdkafka_debug_contexts(self) -> list[str]:
        """The contexts of ``librdkafka_debug``."""
        return _comma_list(self.librdkafka_debug)

    @property
    def servers(self) -> list[str]:
        """``bootstrap_servers`` as a list of ``host:port``."""
        return _comma_list(self.bootstrap_servers)

    def to_json(self) -> str:
        """Every field as JSON, secrets included: how a process hands its Kafka connection to
        another one of the same job (the Spark source's tasks). Never log it."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "KafkaConfig":
        """The KafkaConfig of :meth:`to_json`, checked as the ``kafka:`` section of kmq.yaml is."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError("kafka", f"expected a KafkaConfig as JSON: {exc}") from None
        return cls.from_mapping(data)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "KafkaConfig":
        """A KafkaConfig from a mapping of its keys, checked as the ``kafka:`` section of kmq.yaml is."""
        kafka = _build(cls, dict(data), "kafka")
        _check_security_keys(kafka)
        return kafka

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def check_security(self) -> None:
        """Fail with the key's path when credentials are missing.

        Needs the final values (environment applied), so it runs in :meth:`Config.load` and before
        clients are built, not in :meth:`Config.from_dict`. The files the keys name (TLS, password,
        token) are checked and read where a client is built (:mod:`kmq.client.secrets`): a rendered
        chart names files that exist only in the pod.
        """
        mech = self.sasl_mechanism
        if mech in PASSWORD_MECHANISMS:
            if not self.sasl_username:
                raise ConfigError("kafka.sasl_username", f"required with sasl_mechanism {mech} (or KMQ_KAFKA__SASL_USERNAME)")
            if self.sasl_password is None and not self.sasl_password_file:
                raise ConfigError(
                    "kafka.sasl_password",
                    f"required with sasl_mechanism {mech}: set KMQ_KAFKA__SASL_PASSWORD or kafka.sasl_password_file",
                )
        if mech == "AWS_MSK_IAM":
            import importlib.util

            if importlib.util.find_spec("botocore") is None:
                raise ConfigError("kafka.sasl_mechanism", "AWS_MSK_IAM signs with AWS credentials through botocore: pip install botocore")


_SECTIONS: dict[str, type] = {
    "kafka": KafkaConfig,
    "consumer": ConsumerConfig,
    "tracker": TrackerConfig,
    "redis": RedisConfig,
    "logging": LoggingConfig,
    "topics": TopicsConfig,
    "spark": SparkConfig,
}


@dataclass(frozen=True)
class Config:
    """The whole kmq configuration. Build with :meth:`load` or :meth:`from_dict`."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    queues: tuple[QueueConfig, ...] = ()
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)

    # ------------------------------------------------------------ building
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> "Config":
        """Validate a plain mapping (as read from YAML). ``env`` overrides apply if given."""
        raw = _deep_copy(data or {})
        if not isinstance(raw, dict):
            raise ConfigError("", f"the configuration must be a mapping, got {type(raw).__name__}")
        if env:
            _apply_env(raw, env, (*_SECTIONS, "queues"))
        return _build_config(raw)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> "Config":
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
        cfg = cls.from_dict(data, os.environ if env is None else env)
        cfg.kafka.check_security()
        return cfg

    # ------------------------------------------------------------ lookup
    def queue(self, name: str, group: str | None = None) -> QueueConfig:
        """The configured queue ``name`` of consumer group ``group``, or one with defaults when it is
        not configured. ``group`` None: the queue's only configured group (the default group when
        none is configured); a queue configured for several groups needs one named (``default`` for
        the default group)."""
        try:
            _check_topic("queue", name)
        except ConfigError as exc:
            raise ConfigError("queue", exc.problem) from None
        entries = [q for q in self.queues if q.name == name]
        if group is None:
            if len(entries) > 1:
                raise ConfigError("group", (
                    f"queue {name!r} is configured for {len(entries)} groups "
                    f"({', '.join(q.group_name for q in entries)}): name one (--group, or group=...)"))
            if entries:
                return entries[0]
        else:
            wanted = _check_group("group", group)
            for q in entries:
                if q.group == wanted:
                    return q
            group = wanted
        return _build_queue({"name": name, "group": group}, "queue", self.topics)

    def queue_labelled(self, label: str) -> QueueConfig:
        """The configured entry whose :attr:`~QueueConfig.label` is ``label`` (``orders``,
        ``orders__billing``), else :meth:`queue` of that name (one configured group, or defaults)."""
        for q in self.queues:
            if q.label == label:
                return q
        return self.queue(label)

    def workers_group(self, queue: QueueConfig) -> str:
        """The Kafka consumer group of ``queue``'s workers: ``queues[].workers_group``, else ``consumer.group_id``."""
        return queue.workers_group or self.consumer.group_id

    def with_queue(self, name: str, group: str | None = None) -> "Config":
        """This config with ``name`` (of ``group``) among its queues (added with defaults if missing)."""
        q = self.queue(name, group)
        if q in self.queues:
            return self
        return dataclasses.replace(self, queues=self.queues + (q,))

    def replace(self, **sections: Any) -> "Config":
        return dataclasses.replace(self, **sections)

    def to_dict(self, redact: bool = True) -> dict[str, Any]:
        """Plain mapping (durations as text); secrets replaced by ``***``."""
        def conv(obj: Any) -> Any:
            if dataclasses.is_dataclass(obj):
                out: dict[str, Any] = {}
                for f in dataclasses.fields(obj):
                    v = getattr(obj, f.name)
                    if f.metadata.get("secret") and v is not None and redact:
                        out[f.name] = "***"
                    elif f.metadata.get("kind") in ("duration", "optduration") and v is not None:
                        out[f.name] = _duration_text(v)
                    elif f.metadata.get("kind") == "settings":
                        out[f.name] = v.redacted() if redact else dict(v)
                    else:
                        out[f.name] = conv(v)
                return out
            if isinstance(obj, tuple):
                return [conv(x) for x in obj]
            return obj

        out: dict[str, Any] = conv(self)
        return out


def _build_config(raw: dict[str, Any]) -> Config:
    for key in raw:
        if key not in (*_SECTIONS, "queues"):
            raise ConfigError(str(key), f"unknown key; known top-level keys: {', '.join(sorted((*_SECTIONS, 'queues')))}")
    kwargs: dict[str, Any] = {name: _build(cls, raw.get(name), name) for name, cls in _SECTIONS.items()}
    queues_raw = raw.get("queues") or []
    if not isinstance(queues_raw, list):
        raise ConfigError("queues", f"expected a list of queues, got {type(queues_raw).__name__}")
    topics: TopicsConfig = kwargs["topics"]
    queues = tuple(_build_queue(q, f"queues[{i}]", topics) for i, q in enumerate(queues_raw))
    consumer: ConsumerConfig = kwargs["consumer"]
    _check_groups(queues, consumer)
    if consumer.hand_over == "started" and consumer.ordering == "key":
        raise ConfigError("consumer.hand_over", (
            "started cannot be combined with consumer.ordering: key: a batch handed over before its commit "
            "can be delivered to a second member while this one still holds its keys; use hand_over: committed"))
    hold = min([q.max_hold for q in queues] or [topics.markers_retention / 2])
    for key in ("max_lease", "handoff_lease"):  # both lengthen a lease with RENEWs
        value = getattr(consumer, key)
        if value > hold or value > _MAX_U32_MS_S:
            raise ConfigError(f"consumer.{key}", (
                f"{_duration_text(value)} must stay below half of the markers retention "
                f"({_duration_text(hold * 2)}): a lease renewed past it outlives its START marker"))
    _check_security_keys(kwargs["kafka"])
    if topics.replication_factor and topics.min_insync_replicas and topics.min_insync_replicas > topics.replication_factor:
        raise ConfigError("topics.min_insync_replicas", f"({topics.min_insync_replicas}) must not exceed "
                          f"topics.replication_factor ({topics.replication_factor}), or no write can succeed")
    return Config(queues=queues, **kwargs)


def _check_security_keys(kafka: KafkaConfig) -> None:
    """Keys that contradict each other (values only; files and credentials: KafkaConfig.check_security)."""
    _check_sasl_protocol(kafka)
    _check_tls_keys(kafka)
    _check_oauth_keys(kafka)
    if kafka.sasl_mechanism in ("OAUTHBEARER", "AWS_MSK_IAM"):
        for key in ("sasl_username", "sasl_password", "sasl_password_file"):
            if getattr(kafka, key) is not None:
                raise ConfigError(f"kafka.{key}", f"not used with sasl_mechanism {kafka.sasl_mechanism}; remove it")


def _check_sasl_protocol(kafka: KafkaConfig) -> None:
    """A SASL mechanism goes with a SASL protocol, and the other way round."""
    if kafka.sasl_mechanism and not kafka.security_protocol.startswith("SASL"):
        raise ConfigError("kafka.sasl_mechanism", f"is set but kafka.security_protocol is {kafka.security_protocol}; use SASL_SSL or SASL_PLAINTEXT")
    if kafka.security_protocol.startswith("SASL") and not kafka.sasl_mechanism:
        raise ConfigError("kafka.sasl_mechanism", f"required when kafka.security_protocol is {kafka.security_protocol}")


def _check_tls_keys(kafka: KafkaConfig) -> None:
    """TLS keys only with a TLS protocol; a client key and its password only with its certificate."""
    if not kafka.uses_tls:
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_password_file"):
            if getattr(kafka, key) is not None:
                raise ConfigError(f"kafka.{key}", f"is set but kafka.security_protocol is {kafka.security_protocol}; use SSL or SASL_SSL")
        if not kafka.ssl_check_hostname:
            raise ConfigError("kafka.ssl_check_hostname", f"is false but kafka.security_protocol is {kafka.security_protocol}; use SSL or SASL_SSL")
    if kafka.ssl_keyfile and not kafka.ssl_certfile:
        raise ConfigError("kafka.ssl_keyfile", "needs kafka.ssl_certfile (the client certificate that goes with the key)")
    if (kafka.ssl_password is not None or kafka.ssl_password_file) and not kafka.ssl_certfile:
        raise ConfigError("kafka.ssl_password" if kafka.ssl_password is not None else "kafka.ssl_password_file",
                          "protects a client key: set kafka.ssl_certfile (and kafka.ssl_keyfile)")
    if kafka.ssl_password is not None and kafka.ssl_password_file:
        raise ConfigError("kafka.ssl_password_file", "set either KMQ_KAFKA__SSL_PASSWORD or kafka.ssl_password_file, not both")


def _check_oauth_keys(kafka: KafkaConfig) -> None:
    """OAUTHBEARER takes one token source (or librdkafka's OIDC login); no other mechanism takes one."""
    mech = kafka.sasl_mechanism
    token_keys = [k for k in ("sasl_oauth_token_file", "sasl_oauth_token_command") if getattr(kafka, k)]
    oidc = str(kafka.confluent.get("sasl.oauthbearer.method", "")).lower() == "oidc"
    if oidc and (mech != "OAUTHBEARER" or kafka.client != "confluent"):
        raise ConfigError("kafka.confluent.sasl.oauthbearer.method", "oidc is librdkafka's own OAUTHBEARER login: it "
                          "needs kafka.sasl_mechanism: OAUTHBEARER and kafka.client: confluent")
    if mech == "OAUTHBEARER":
        # With librdkafka's OIDC login a token file or command is only for the clients still on
        # kafka-python (topic administration).
        if not token_keys and not oidc:
            raise ConfigError("kafka.sasl_oauth_token_file",
                              "OAUTHBEARER needs a token: set kafka.sasl_oauth_token_file or kafka.sasl_oauth_token_command")
        if len(token_keys) == 2:
            raise ConfigError("kafka.sasl_oauth_token_command", "set either kafka.sasl_oauth_token_file or kafka.sasl_oauth_token_command, not both")
    elif token_keys:
        raise ConfigError(f"kafka.{token_keys[0]}", f"only used with sasl_mechanism OAUTHBEARER (it is {mech})")
