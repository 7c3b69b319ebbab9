"""The JSON Schema of kmq.yaml (kmq.config.schema) says what Config.from_dict says, and the Helm
chart's values.schema.json carries it as generated, not as a hand-made copy."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from kmq.config import _SECTIONS, BackoffConfig, Config, ConfigError, QueueConfig
from kmq.config.schema import config_schema

ROOT = Path(__file__).resolve().parents[2]
CHART_SCHEMA = ROOT / "helm" / "kmq" / "values.schema.json"


def _chart_schema_script():
    spec = importlib.util.spec_from_file_location("kmq_chart_schema", ROOT / "scripts" / "chart-schema.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_charts_schema_is_the_generated_one():
    script = _chart_schema_script()
    committed = CHART_SCHEMA.read_text()
    assert committed == script.text(script.generate(json.loads(committed))), (
        "helm/kmq/values.schema.json differs from kmq/config: run python scripts/chart-schema.py")
    assert script.main(["--check"]) == 0


# Probe values per kind: what kmq.yaml may hold, good and bad.
PROBES = {
    "duration": ["30s", 30, 2.5, "250ms", " 2 m ", "1h", "2d", "3", "1.5m", 0, "soon", "-1s", -1, True, "1e3",
                 "5 minutes", "30S", None, [], "inf"],
    "int": [1, 5, 1000, 1001, 0, -1, 2.0, 2.5, "5", True, None, 65535, 70000, 1024],
    "float": [1, 1.5, 100, 100.5, 0.5, "2", True, None],
    "bool": [True, False, "true", 1, None],
    "str": ["kmq", "  ", "", 42, None, True, ["a"]],
    "choice": ["SSL", "PLAIN", "INFO", "text", "json", "confluent", "COOPERATIVE-STICKY", "range", "nope", "", 3, None],
    "topic": ["orders", "orders.v2", "a" * 249, "a" * 250, "..", "orders queue", "", 5, None],
}
# A client's settings: scalars by name; which names pass is kmq's (and the client's) to say.
PROBES["settings"] = [{}, None, {"fetch_min_bytes": 1, "linger.ms": 5.5, "x": True}, {"client.rack": "a"},
                      {"enable.auto.commit": True}, {"client_id": "x"}, {"a": {"b": 1}}, {"a": [1]}, "text", []]
PROBES["optname"] = ["billing", "billing.v2", "a-b_c", "default", "a__b", "_a", "a_", "", "  ", "a b", 5, None,
                      "a" * 200, "a" * 240]
PROBES["optduration"] = PROBES["duration"]
PROBES["optint"] = PROBES["int"]
PROBES["optstr"] = PROBES["str"]
PROBES["optchoice"] = PROBES["choice"]


def _kmq_accepts(data: dict) -> bool:
    try:
        Config.from_dict(data)
    except ConfigError:
        return False
    return True


def _schema_accepts(data: dict) -> bool:
    # kmq reads YAML: what the schema checks went through YAML as well.
    return jsonschema.Draft7Validator(config_schema()).is_valid(yaml.safe_load(yaml.safe_dump(data)))


def _fields(cls: type, path: str, wrap):
    """(key path, the field, a function: value -> kmq.yaml data) for each field of ``cls``."""
    for f in dataclasses.fields(cls):
        if f.name == "backoff":
            yield from _fields(BackoffConfig, f"{path}.backoff", lambda v, wrap=wrap: wrap({"backoff": v}))
        elif not f.metadata.get("secret"):
            yield f"{path}.{f.name}", f, lambda v, wrap=wrap, name=f.name: wrap({name: v})


def _all_fields():
    for section, cls in _SECTIONS.items():
        yield from _fields(cls, section, lambda v, section=section: {section: v})
    yield from _fields(QueueConfig, "queues[0]", lambda v: {"queues": [{"name": "q", **v}]})


FIELDS = list(_all_fields())
# Why kmq may refuse what the schema accepts, by the error's text: the bounds of a duration written
# with a unit (a regular expression cannot compare numbers) and rules between keys (TLS and SASL keys
# need a protocol that uses them, backoff.max and the lease against other keys, a queue's derived
# topic names).
NOT_SAYABLE = ("expected at least", "expected at most", "is set but kafka.security_protocol",
               "is false but kafka.security_protocol", "only used with sasl_mechanism", "markers_topic:",
               "must be at least backoff.initial", "must stay below half of the markers retention",
               "kmq sets this itself", "kafka-python takes its keyword argument names",
               "longer than Kafka's 249 characters")


def _spelled_as_stored(value, f: dataclasses.Field):
    """A choice spelled as kmq stores it: kmq reads choices in any case, the schema lists the stored
    spelling (one spelling for users to read)."""
    if f.metadata.get("kind") in ("choice", "optchoice") and isinstance(value, str):
        return value.lower() if f.metadata.get("lower") else value.upper()
    return value


@pytest.mark.parametrize("path, f, data", FIELDS, ids=[p for p, _, _ in FIELDS])
def test_the_schema_and_kmq_agree_on_each_key(path, f, data):
    disagree = []
    for value in PROBES[f.metadata["kind"]]:
        kmq_ok = _kmq_accepts(data(value))
        if kmq_ok and not _schema_accepts(data(_spelled_as_stored(value, f))):
            disagree.append(f"{value!r}: kmq accepts it, the schema refuses it")
        if _schema_accepts(data(value)) and not kmq_ok:
            with pytest.raises(ConfigError) as err:
                Config.from_dict(data(value))
            if not any(text in str(err.value) for text in NOT_SAYABLE):
                disagree.append(f"{value!r}: the schema accepts it, kmq refuses it ({err.value})")
    assert not disagree, f"{path}: " + "; ".join(disagree)


@pytest.mark.parametrize("queue, accepted", [
    ({"max_deliveries": 1000}, True),
    ({"max_deliveries": 1001}, False),
    ({"lease": "1d"}, True),
    ({"markers_retention": 86400}, True),  # bare seconds
    ({"markers_retention": "2 d"}, True),
    ({"lease": 0}, False),
    ({"lease": 0.001}, True),
    ({"backoff": {"multiplier": 100}}, True),
    ({"backoff": {"multiplier": 101}}, False),
])
def test_the_charts_queue_entries_follow_the_config(queue, accepted):
    # Each was wrong in the hand-made chart schema (no maximum, no "d", no bare seconds, lease >= 0).
    schema = json.loads(CHART_SCHEMA.read_text())
    values = {"kafka": {"bootstrapServers": "k:9092"}, "queues": [{"name": "orders", **queue}]}
    assert jsonschema.Draft7Validator(schema).is_valid(values) is accepted
    assert _kmq_accepts({"queues": [{"name": "orders", **queue}]}) is accepted
