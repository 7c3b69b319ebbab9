"""``KMQ_...`` environment overrides, and the secrets kmq.yaml may not hold."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import yaml

from kmq.config.client_settings import is_secret
from kmq.core.errors import ConfigError

ENV_PREFIX = "KMQ_"
_VERBATIM_KAFKA_KEYS = {"bootstrap_servers", "client_id", "sasl_username", "sasl_password", "ssl_password",
                        "sasl_oauth_token_command"}


def _apply_env(raw: dict[str, Any], env: Mapping[str, str], sections: Iterable[str]) -> None:
    """``KMQ_KAFKA__BOOTSTRAP_SERVERS=x`` sets raw['kafka']['bootstrap_servers'];
    ``KMQ_QUEUES__0__LEASE=5s`` sets the first queue's lease. Values are read
    as YAML scalars so ``true``/``5`` get their types. ``sections``: the top-level keys
    of kmq.yaml."""
    known = set(sections)
    for name in sorted(env):
        parts = _env_path(name, known)
        if parts is not None:
            _set_path(raw, parts, _env_value(parts, env[name]), name)


def _env_path(name: str, sections: set[str]) -> list[str] | None:
    """The key path an environment variable sets, or None when it is not a setting of kmq.yaml."""
    if not name.startswith(ENV_PREFIX):
        return None
    parts = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
    if len(parts) < 2 or parts[0] not in sections:
        return None  # e.g. KMQ_TEST_BOOTSTRAP belongs to the test suite, not to config
    if parts[:2] == ["kafka", "confluent"] and len(parts) == 3:
        # librdkafka's properties are dotted and none has an underscore, which env names allow
        parts[2] = parts[2].replace("_", ".")
    return parts


def _env_value(parts: list[str], text: str) -> Any:
    """An environment value read as a YAML scalar; Kafka names and secrets stay verbatim."""
    if parts[0] == "kafka" and (parts[-1] in _VERBATIM_KAFKA_KEYS or (len(parts) == 3 and is_secret(parts[2]))):
        return text  # keep strings verbatim (a password may look like a number)
    try:
        return yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        return text


def _set_path(raw: dict[str, Any], parts: list[str], value: Any, name: str) -> None:
    """Set ``value`` at ``parts`` below ``raw``, making the sections and list entries on the way."""
    path_text = ".".join(parts)
    node: Any = raw
    for part in parts[:-1]:
        node = _child(node, part, name, path_text)
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit():
            raise ConfigError(name, f"expected a list index in {name} at {last!r}")
        raise ConfigError(name, f"{name} replaces a whole list entry; set its keys instead (…__{last}__LEASE)")
    node[last] = value


def _child(node: Any, part: str, name: str, path_text: str) -> Any:
    """The entry ``part`` of a section or list on an environment variable's path (made if missing)."""
    if isinstance(node, list):
        if not part.isdigit():
            raise ConfigError(name, f"expected a list index in {name} at {part!r}")
        idx = int(part)
        while len(node) <= idx:
            node.append({})
        return node[idx]
    nxt = node.get(part)
    if nxt is None:
        nxt = [] if part == "queues" else {}
        node[part] = nxt
    elif not isinstance(nxt, (dict, list)):
        raise ConfigError(path_text, f"{name} sets a key below {part!r}, which is not a section")
    return nxt


def _reject_file_secrets(data: dict[str, Any]) -> None:
    kafka = data.get("kafka")
    for section in ("kafka_python", "confluent"):
        passed = kafka.get(section) if isinstance(kafka, dict) else None
        for key, value in (passed.items() if isinstance(passed, dict) else ()):
            if isinstance(key, str) and is_secret(key) and value not in (None, ""):
                env = f"KMQ_KAFKA__{section.upper()}__{key.upper().replace('.', '_')}"
                raise ConfigError(f"kafka.{section}.{key}", f"secrets are not read from the config file; set {env}")
    if isinstance(kafka, dict) and kafka.get("sasl_password") not in (None, ""):
        raise ConfigError(
            "kafka.sasl_password",
            "secrets are not read from the config file; set KMQ_KAFKA__SASL_PASSWORD or kafka.sasl_password_file",
        )
    if isinstance(kafka, dict) and kafka.get("ssl_password") not in (None, ""):
        raise ConfigError(
            "kafka.ssl_password",
            "secrets are not read from the config file; set KMQ_KAFKA__SSL_PASSWORD or kafka.ssl_password_file",
        )
