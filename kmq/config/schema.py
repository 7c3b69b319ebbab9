"""The JSON Schema of kmq.yaml, generated from the field definitions of :mod:`kmq.config`.

One source: each field's metadata (kind, bounds, choices, secret) says how
:meth:`~kmq.config.Config.from_dict` reads it, and the schema is derived from the
same metadata, so an editor, a CI check or the Helm chart (its
``values.schema.json`` embeds these schemas: ``scripts/chart-schema.py``) refuses
what kmq refuses and accepts what it accepts.

What JSON Schema cannot say stays with ``Config.from_dict`` alone: rules between
keys (``lease`` plus ``backoff.max`` below half the markers retention, a
``min_insync_replicas`` above the replication factor, ...), the bounds of a
duration written with a unit (the schema bounds a bare number of seconds), and
the case of choices (kmq reads ``ssl``; the schema lists the spelling kmq stores, ``SSL``).

``python -m kmq.config.schema`` prints the schema of kmq.yaml.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from typing import Any

from kmq.config import _SECTIONS, DURATION_PATTERN, TOPIC_PATTERN, QueueConfig

__all__ = ["field_schema", "section_schema", "queue_schema", "config_schema", "main"]

_DRAFT = "http://json-schema.org/draft-07/schema#"


def _bounds(meta: Any, out: dict[str, Any]) -> dict[str, Any]:
    if "min" in meta:
        out["minimum"] = meta["min"]
    if "max" in meta:
        out["maximum"] = meta["max"]
    return out


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    if "anyOf" in schema:
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return {**schema, "type": [*types, "null"]}


def field_schema(f: dataclasses.Field[Any]) -> dict[str, Any] | bool:
    """The JSON Schema of one config field, from its metadata."""
    meta = f.metadata
    kind: Any = meta.get("kind")
    if meta.get("secret"):
        # Refused in kmq.yaml (read from the environment or a file): absent, null or empty only.
        return {"enum": [None, ""], "description": "a secret: set it in the environment or a file, never here"}
    optional = kind in ("optduration", "optint", "optstr", "optchoice", "optname")
    base = kind[3:] if optional else kind
    schema: dict[str, Any]
    if base == "duration":
        schema = {"anyOf": [{"type": "string", "pattern": DURATION_PATTERN}, _bounds(meta, {"type": "number", "minimum": 0})]}
    elif base in ("int", "float"):
        schema = _bounds(meta, {"type": "integer" if base == "int" else "number"})
    elif base == "bool":
        schema = {"type": "boolean"}
    elif base == "str":
        # A number is read as its text; a required string must not be blank.
        schema = {"type": ["string", "number"]} if optional else {"type": ["string", "number"], "pattern": "\\S"}
        if meta.get("pattern"):  # text of a given shape (a list of names); a number only where its text fits
            schema = {"type": ["string", "number"] if meta.get("numbers") else "string", "pattern": meta["pattern"]}
    elif base == "choice":
        choices = [c.lower() for c in meta["choices"]] if meta.get("lower") else list(meta["choices"])
        schema = {"enum": choices}
    elif kind == "settings":
        # A client's own settings by name (scalars); which names pass is checked by kmq, not here.
        return {"type": ["object", "null"], "additionalProperties": {"type": ["string", "number", "boolean"]}}
    elif base == "name":  # a name that becomes part of topic names (queues[].group)
        schema = {"type": "string", "pattern": meta["pattern"]}
    elif kind == "topic":
        schema = {"type": "string", "pattern": TOPIC_PATTERN, "not": {"enum": [".", ".."]}}
    else:  # pragma: no cover - a new kind without a schema fails here, in the tests
        raise AssertionError(f"field {f.name}: no JSON Schema for kind {kind!r}")
    return _nullable(schema) if optional else schema


def section_schema(cls: type, nullable: bool = True) -> dict[str, Any]:
    """The JSON Schema of a config section (a dataclass of :mod:`kmq.config`): its keys, no others
    (an empty section, ``null`` in YAML, means the defaults)."""
    hints = typing.get_type_hints(cls)
    props: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        nested = hints[f.name]
        props[f.name] = section_schema(nested) if dataclasses.is_dataclass(nested) else field_schema(f)  # type: ignore[arg-type]  # a class
    return {"type": ["object", "null"] if nullable else "object", "additionalProperties": False, "properties": props}


def queue_schema() -> dict[str, Any]:
    """A ``queues`` entry given as a mapping (it needs a name)."""
    return {**section_schema(QueueConfig, nullable=False), "required": ["name"]}


def config_schema() -> dict[str, Any]:
    """The JSON Schema of a whole kmq.yaml."""
    props: dict[str, Any] = {name: section_schema(cls) for name, cls in _SECTIONS.items()}
    topic = field_schema(next(f for f in dataclasses.fields(QueueConfig) if f.name == "name"))
    # A queue is a mapping, or just its name.
    props["queues"] = {"type": ["array", "null"], "items": {"anyOf": [topic, queue_schema()]}}
    return {"$schema": _DRAFT, "title": "kmq.yaml", "type": ["object", "null"], "additionalProperties": False,
            "properties": props}


def main(argv: list[str] | None = None) -> int:
    """Print the schema of kmq.yaml (``python -m kmq.config.schema``)."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        print("usage: python -m kmq.config.schema   (prints the JSON Schema of kmq.yaml)", file=sys.stderr)
        return 2
    print(json.dumps(config_schema(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
