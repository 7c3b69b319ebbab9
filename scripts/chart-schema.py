#!/usr/bin/env python3
"""Regenerate the configuration part of helm/kmq/values.schema.json from kmq.config.

    python scripts/chart-schema.py           # rewrite the file
    python scripts/chart-schema.py --check   # exit 1 when the file is out of date (CI, tests/unit)

The chart writes kmq.yaml from its values, so the values that end up in kmq.yaml
are checked by the schemas of kmq.config.schema, generated from the config's field
definitions (kinds, bounds, choices): ``queues[]`` entries (plus the chart's own
``partitions``), the ``extraConfig`` sections, and the chart values written into
kmq.yaml (or passed as its environment override) under another name (``CHART_KEYS``). Each generated schema carries a
``$comment`` naming its source. Everything else in the file is the chart's own and
is kept as written.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kmq.config import _SECTIONS  # noqa: E402
from kmq.config.schema import field_schema, queue_schema, section_schema  # noqa: E402

SCHEMA_FILE = ROOT / "helm" / "kmq" / "values.schema.json"
SCRIPT = "scripts/chart-schema.py"

# Chart value (path in the values) -> the kmq.yaml key the chart writes it to, and what the chart
# changes: "also" adds values the chart itself accepts (an empty choice = unset), "set" narrows.
CHART_KEYS: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
    (("kafka", "securityProtocol"), "kafka.security_protocol", {}),
    (("kafka", "saslMechanism"), "kafka.sasl_mechanism", {"also": [""]}),
    (("kafka", "saslUsername"), "kafka.sasl_username", {}),
    (("kafka", "clientId"), "kafka.client_id", {}),
    # Passed as KMQ_KAFKA__CLIENT (the chart's env), not written into kmq.yaml.
    (("kafka", "client"), "kafka.client", {}),
    (("kafka", "tls", "checkHostname"), "kafka.ssl_check_hostname", {}),
    (("tracker", "groupId"), "tracker.group_id", {}),
    (("tracker", "tick"), "tracker.tick", {}),
    # The probes and the Service need a real port: 0 (any free port) is refused here.
    (("tracker", "httpPort"), "tracker.http_port", {"set": {"minimum": 1}}),
    (("tracker", "livenessTimeout"), "tracker.liveness_timeout", {}),
    (("tracker", "fetchWait"), "tracker.fetch_wait", {}),
    (("topicInit", "replicationFactor"), "topics.replication_factor", {}),
    (("topicInit", "minInsyncReplicas"), "topics.min_insync_replicas", {}),
    (("topicInit", "markersRetention"), "topics.markers_retention", {}),
    (("topicInit", "dlqRetention"), "topics.dlq_retention", {}),
    (("logging", "level"), "logging.level", {}),
    (("logging", "format"), "logging.format", {}),
]
# kmq.yaml keys extraConfig must not set: the chart derives them (the password file from
# kafka.existingSecret, the port of the probes and the Service from tracker.httpPort, the client
# from kafka.client as an environment variable, which beats kmq.yaml) or they are secrets, which
# never go into a ConfigMap.
EXTRA_CONFIG_FORBIDDEN = {"kafka": ("sasl_password", "sasl_password_file", "ssl_password", "client"),
                          "tracker": ("http_port",)}
# The chart's own key of a queue: partitions of the three topics it creates.
QUEUE_PARTITIONS = {"type": "integer", "minimum": 1}


def _config_field(key: str) -> dataclasses.Field:
    section, name = key.split(".")
    return next(f for f in dataclasses.fields(_SECTIONS[section]) if f.name == name)


def _chart_value(key: str, change: dict[str, Any]) -> dict[str, Any]:
    schema: Any = copy.deepcopy(field_schema(_config_field(key)))
    if "also" in change:
        schema["enum"] = [*schema["enum"], *change["also"]]
    if "set" in change:
        schema.update(change["set"])
    return {"$comment": f"generated from kmq.config ({key}) by {SCRIPT}", **schema}


def _properties(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = schema
    for part in path:
        node = node["properties"][part]
    return node["properties"]


def generate(current: dict[str, Any]) -> dict[str, Any]:
    """``current`` (the chart's values.schema.json) with its configuration part regenerated."""
    out = copy.deepcopy(current)
    queue = queue_schema()
    queue["properties"]["partitions"] = QUEUE_PARTITIONS
    out["properties"]["queues"]["items"] = {
        "$comment": f"generated from kmq.config.QueueConfig by {SCRIPT} (partitions: the chart's own)", **queue}
    extra = out["properties"]["extraConfig"]
    extra["propertyNames"] = {"enum": list(_SECTIONS)}
    extra["properties"] = {}
    for name, cls in _SECTIONS.items():
        section = section_schema(cls)
        for key in EXTRA_CONFIG_FORBIDDEN.get(name, ()):
            section["properties"][key] = False
        extra["properties"][name] = {"$comment": f"generated from kmq.config ({name}) by {SCRIPT}", **section}
    for path, key, change in CHART_KEYS:
        _properties(out, path[:-1])[path[-1]] = _chart_value(key, change)
    return out


def text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is not what would be generated")
    parser.add_argument("--file", type=Path, default=SCHEMA_FILE)
    args = parser.parse_args(argv)
    current = args.file.read_text()
    wanted = text(generate(json.loads(current)))
    if args.check:
        if current != wanted:
            print(f"{args.file} is out of date with kmq/config: run python {SCRIPT}", file=sys.stderr)
            return 1
        print(f"{args.file}: up to date")
        return 0
    if current != wanted:
        args.file.write_text(wanted)
        print(f"{args.file}: regenerated")
    else:
        print(f"{args.file}: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
