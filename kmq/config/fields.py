"""How a section's fields are declared and read: kinds, units, names and their checks.

Each field's metadata (:func:`_f`) says how :func:`_build` reads it and is the one source of
the JSON Schema of :mod:`kmq.config.schema`. Pure: no environment, no files.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import field
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

from kmq.config.client_settings import CONFLUENT_REFUSED, KAFKA_PYTHON_REFUSED, client_settings
from kmq.core.errors import ConfigError
# The name of a queue's default group (queues[].group unset): its topics keep the names
# <queue>__markers and <queue>__dlq, and its copies carry no kmq-group header.
from kmq.core.message import DEFAULT_GROUP as DEFAULT_GROUP

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
#: A duration as text: a number of seconds or a number with a unit of ``_UNIT`` (also the JSON Schema
#: pattern of kmq.config.schema, so it is written in the regular expressions both understand).
DURATION_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$"
#: A config section's dataclass, built by :func:`_build`.
_D = TypeVar("_D", bound="DataclassInstance")

_DURATION_RE = re.compile(DURATION_PATTERN)
#: A Kafka topic name ("." and ".." excepted).
TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
_TOPIC_RE = re.compile(TOPIC_PATTERN)
#: A queue's consumer group (``queues[].group``): letters, digits, ".", "_", "-", no "__" and no "_" at
#: either end, so ``<queue>__<group>__markers`` names one queue and one group only.
GROUP_PATTERN = r"^[A-Za-z0-9.-]+(_[A-Za-z0-9.-]+)*$"  # no look-ahead: the chart's schema is read by Go (RE2)
_GROUP_RE = re.compile(GROUP_PATTERN)
# The longest suffix kmq appends to ``<queue>__<group>``: the Spark job's metrics topic.
_LONGEST_SUFFIX = len("__kmq_metrics")
# Bounds that keep the tracker's arithmetic and the markers retention safe.
MARKERS_RETENTION_S = 7 * 24 * 3600.0  # = kmq.client.topics.MARKERS_RETENTION_MS
# One lower bound for topics.markers_retention and queues[].markers_retention: a tracker outage
# longer than the retention loses markers, so anything shorter than an hour is a typo.
MIN_MARKERS_RETENTION_S = 3600.0
MAX_DELIVERIES = 1000
#: Kafka's compression codecs (a producer's ``compression.type``), as ``queues[].compression`` takes them.
COMPRESSION_CODECS = ("NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD")
_MAX_U32_MS_S = 0xFFFFFFFF / 1000  # durations written into markers as u32 milliseconds


def parse_duration(value: Any, path: str = "") -> float:
    """Seconds from ``250ms``/``30s``/``5m``/``1h``/``7d`` or a number of seconds."""
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
    if not math.isfinite(seconds):  # .inf / .nan from YAML would overflow the wire's u32 ms
        raise ConfigError(path, f"expected a finite duration like 30s, got {value!r}")
    return seconds


def _duration_text(seconds: float) -> str:
    ms = round(seconds * 1000)
    if ms % 86_400_000 == 0 and ms:
        return f"{ms // 86_400_000}d"
    if ms % 3_600_000 == 0 and ms:
        return f"{ms // 3_600_000}h"
    if ms % 60000 == 0 and ms:
        return f"{ms // 60000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


# ---------------------------------------------------------------- field metadata
# Each field's metadata says how to read it (and is the one source of the JSON Schema of
# kmq.config.schema): "kind" is one of duration, optduration, int, optint, float, bool, str,
# optstr, choice, optchoice, topic, optname, settings; "min"/"max" bound numbers and durations (seconds);
# "choices" lists a choice's values (read case-insensitively, stored upper case, or lower
# case with "lower"); "secret" marks a value never read from kmq.yaml.


def _f(default: Any, kind: str, **meta: Any) -> Any:
    return field(default=default, metadata={"kind": kind, **meta})


#: librdkafka's debug contexts (its CONFIGURATION.md, ``debug``).
LIBRDKAFKA_DEBUG_CONTEXTS = ("generic", "broker", "topic", "metadata", "feature", "queue", "msg", "protocol", "cgrp",
                             "security", "fetch", "interceptor", "plugin", "consumer", "admin", "eos", "mock",
                             "assignor", "conf", "telemetry", "all")


def _comma_list_pattern(item: str) -> str:
    """A JSON Schema / Python pattern: ``item`` values separated by commas, blanks around them, empty allowed."""
    return rf"^[\s,]*(({item})\s*(,[\s,]*({item})\s*)*,?[\s,]*)?$"


def _comma_list(text: str | None) -> list[str]:
    """The items of a comma-separated setting, blanks and empty items dropped."""
    return [item.strip() for item in (text or "").split(",") if item.strip()]


#: ``kafka.librdkafka_debug`` and ``logging.debug`` as patterns (kmq and the chart's schema).
LIBRDKAFKA_DEBUG_PATTERN = _comma_list_pattern("|".join(LIBRDKAFKA_DEBUG_CONTEXTS))
LOGGER_NAMES_PATTERN = _comma_list_pattern(r"[A-Za-z0-9_.\-]+")


def _topic_prefix(name: str, group: str | None) -> str:
    """What the topics of queue ``name``'s ``group`` are named after (:attr:`QueueConfig.label`)."""
    return name if group is None else f"{name}__{group}"


def _check_group(path: str, value: Any) -> str | None:
    """A ``queues[].group`` value: None for the default group (unset or ``default``), else the name."""
    if value is None:
        return None
    if not isinstance(value, str) or not _GROUP_RE.match(value):
        raise ConfigError(path, f"expected a group name (letters, digits, '.', '_', '-'; no '__' and no '_' at "
                                f"either end, as it becomes part of topic names), got {value!r}")
    return None if value == DEFAULT_GROUP else value


def _fetch_wait_ms(seconds: float) -> int:
    """A fetch wait (``fetch.max.wait.ms``) in whole milliseconds, at least 1."""
    return max(1, round(seconds * 1000))


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



def _shown(f: dataclasses.Field[Any], value: Any) -> str:
    """``value`` as an error may show it: never a secret's."""
    return "***" if f.metadata.get("secret") else repr(value)


def _read_duration(path: str, f: dataclasses.Field[Any], value: Any) -> float:
    v = parse_duration(value, path)
    if "min" in f.metadata and v < f.metadata["min"]:
        raise ConfigError(path, f"expected at least {_duration_text(f.metadata['min'])}, got {value!r}")
    if "max" in f.metadata and v > f.metadata["max"]:
        raise ConfigError(path, f"expected at most {_duration_text(f.metadata['max'])}, got {value!r}")
    return v


def _read_number(path: str, f: dataclasses.Field[Any], value: Any, integer: bool) -> int | float:
    shown = _shown(f, value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        raise ConfigError(path, f"expected {'an integer' if integer else 'a number'}, got {shown}")
    v = int(value) if integer else float(value)
    if not math.isfinite(v):
        raise ConfigError(path, f"expected a finite number, got {shown}")
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if lo is not None and v < lo:
        raise ConfigError(path, f"expected at least {lo}, got {shown}")
    if hi is not None and v > hi:
        raise ConfigError(path, f"expected at most {hi}, got {shown}")
    return v


def _read_bool(path: str, f: dataclasses.Field[Any], value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(path, f"expected true or false, got {_shown(f, value)}")
    return value


def _read_str(path: str, f: dataclasses.Field[Any], value: Any, non_empty: bool) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or (non_empty and not value.strip()):
        raise ConfigError(path, f"expected a non-empty string, got {_shown(f, value)}")
    return value


def _read_choice(path: str, f: dataclasses.Field[Any], value: Any) -> str:
    choices = f.metadata["choices"]
    if not isinstance(value, str) or value.upper() not in choices:
        raise ConfigError(path, f"expected one of {', '.join(choices)}, got {_shown(f, value)}")
    return value.lower() if f.metadata.get("lower") else value.upper()


def _read_settings(path: str, f: dataclasses.Field[Any], value: Any) -> Any:
    return client_settings(path, value, CONFLUENT_REFUSED if f.metadata["client"] == "confluent"
                           else KAFKA_PYTHON_REFUSED)


# A reader per field kind; an "opt" kind also takes None (its field's null).
_READERS: dict[str, Callable[[str, dataclasses.Field[Any], Any], Any]] = {
    "duration": _read_duration,
    "optduration": _read_duration,
    "int": lambda path, f, value: _read_number(path, f, value, integer=True),
    "optint": lambda path, f, value: _read_number(path, f, value, integer=True),
    "float": lambda path, f, value: _read_number(path, f, value, integer=False),
    "bool": _read_bool,
    "str": lambda path, f, value: _read_str(path, f, value, non_empty=True),
    "optstr": lambda path, f, value: _read_str(path, f, value, non_empty=False),
    "choice": _read_choice,
    "optchoice": _read_choice,
    "topic": lambda path, f, value: _check_topic(path, value),
    "settings": _read_settings,
    "optname": lambda path, f, value: _check_group(path, value),
}
_OPTIONAL_KINDS = ("optduration", "optint", "optstr", "optchoice")


def _value(path: str, f: dataclasses.Field[Any], value: Any) -> Any:
    kind = f.metadata.get("kind")
    if kind in _OPTIONAL_KINDS and value is None:
        return None
    read = _READERS.get(kind)  # type: ignore[arg-type]
    if read is None:  # pragma: no cover
        raise AssertionError(f"field {f.name} has no kind")
    return read(path, f, value)

def _build(cls: type[_D], raw: Any, path: str, nested: Mapping[str, Any] | None = None) -> _D:
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

