"""Run kmq's CLI and read what it prints: the tables, JSON and one-line errors several tests check."""

from __future__ import annotations

import yaml
from click.testing import CliRunner

from kmq.cli import EXIT_FAILURE, cli

#: A connect timeout for commands meant to fail: the error comes in seconds, not the default's wait.
FAST = {"connect_timeout": "2s"}


def status_rows(output: str) -> dict[str, list[str]]:
    """The rows of ``kmq status``'s table, by partition (and ``total``): its five columns after the first."""
    rows = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 6 and (parts[0].isdigit() or parts[0] == "total"):
            rows[parts[0]] = parts[1:]
    return rows


def by_copy(t: dict) -> dict:
    """Kinds of each queue copy's events in order, the dead letters under "dlq".

    RENEWs are checked and left out: a consumer renews what it fetched but has not yet
    handed over once half a lease has passed, so a copy that waits in the prefetch
    buffer on a loaded machine legitimately has one between its START and its
    settlement, and a copy that does not wait has none."""
    out: dict = {}
    for e in t["events"]:
        out.setdefault("dlq" if e["kind"] == "dead-lettered" else e["offset"], []).append(e["kind"])
    for kinds in out.values():
        renews = [i for i, k in enumerate(kinds) if k == "renew"]
        if renews:
            assert "start" in kinds and kinds.index("start") < renews[0], kinds
            settled = [i for i, k in enumerate(kinds) if k in ("ack", "nack", "reject", "lease-expired")]
            assert not settled or renews[-1] < settled[0], kinds
    return {k: [kind for kind in kinds if kind != "renew"] for k, kinds in out.items()}


def describe_topic(tmp_path, kafka: dict, env: dict | None = None):
    """``kmq topics describe orders`` with a config of only ``kafka`` (keys set to None are left out)."""
    path = tmp_path / "kmq.yaml"
    path.write_text(yaml.safe_dump({"kafka": {k: v for k, v in kafka.items() if v is not None}}))
    return CliRunner().invoke(cli, ["topics", "describe", "orders", "--config", str(path)], env=env or {})


def one_line_error(res) -> str:
    """The one line of a CLI command that failed as it should (exit code 1, no traceback)."""
    assert res.exit_code == EXIT_FAILURE, res.output
    assert "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    return lines[0]
