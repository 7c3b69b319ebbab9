"""`kmq produce` to a queue read by several consumer groups: originals need no group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kmq.client.topics import ensure_topics
from tests.conftest import unique
from tests.helpers.kafka import read_all

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_produce_to_a_queue_of_two_groups_needs_no_group(make_config, bootstrap, tmp_path):
    q = unique("q")
    cfg = make_config(q)
    cfg = cfg.from_dict({**cfg.to_dict(), "queues": [{"name": q}, {"name": q, "group": "ship",
                                                                   "workers_group": unique("ship")}]})
    for entry in cfg.queues:
        ensure_topics(cfg.kafka, entry, 1)
    conf = tmp_path / "kmq.yaml"
    conf.write_text(yaml.safe_dump(cfg.to_dict()))
    proc = subprocess.run([sys.executable, "-m", "kmq", "produce", q, "--count", "5", "--config", str(conf)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(read_all(bootstrap, q, timeout=30)) == 5
