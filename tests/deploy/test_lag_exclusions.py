"""docs/operations.md, "Lag alerts of other tools fire on kmq's groups": every exclusion
pattern it gives matches the tracker group and the DLQ replay groups kmq really uses by
default, and never the workers group, whose lag is a real backlog."""

from __future__ import annotations

import re

from kmq.config import Config
from kmq.ops.dlq import replay_group
from tests.deploy.conftest import ROOT

SECTION = "## Lag alerts of other tools fire on kmq's groups"


def _section() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return text[start:end]


def _patterns() -> dict[str, re.Pattern]:
    """Each tool's pattern, anchored as that tool applies it."""
    text = _section()
    found = {
        "kafka-exporter": re.search(r"--group\.exclude='([^']+)'", text).group(1),
        "burrow": re.search(r'group-denylist="([^"]+)"', text).group(1),
        "promql": re.search(r'consumergroup!~"([^"]+)"', text).group(1),
        "confluent": re.search(r'consumer_group_id!~"([^"]+)"', text).group(1),
    }
    # Go's regexp (kafka-exporter, Burrow) searches; PromQL matchers are anchored at both ends.
    return {tool: re.compile(p if tool in ("kafka-exporter", "burrow") else f"^(?:{p})$") for tool, p in found.items()}


def test_exclusions_match_kmqs_tracker_and_replay_groups_and_not_the_workers():
    cfg = Config.from_dict({"queues": [{"name": "orders"}]})
    excluded = [cfg.tracker.group_id, replay_group(cfg, "orders", None), replay_group(cfg, "orders", "timeout")]
    kept = [cfg.consumer.group_id, "orders-workers", "billing-kmq-tracker-audit"]
    patterns = _patterns()
    for tool, pattern in patterns.items():
        for group in excluded:
            assert pattern.search(group), f"{tool}: {pattern.pattern!r} does not exclude kmq group {group!r}"
        for group in kept:
            assert not pattern.search(group), f"{tool}: {pattern.pattern!r} also hides {group!r}"


def test_the_runbook_names_the_default_group_names():
    cfg = Config.from_dict({"queues": [{"name": "q"}]})
    text = _section()
    assert f"`{cfg.tracker.group_id}` (`tracker.group_id`)" in text
    assert f"default `{cfg.consumer.group_id}`" in text
