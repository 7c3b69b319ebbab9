"""The console's pure rules: who needs a token, what a credential is, what a redrive selection names."""

from __future__ import annotations

import base64

import pytest

from kmq.config import Config
from kmq.ui.auth import authorized, needs_token
from kmq.ui.redrive import Selection
from kmq.ops.dlq import DeadLetter


@pytest.mark.parametrize("host, needed", [
    ("127.0.0.1", False), ("localhost", False), ("::1", False), ("[::1]", False), ("LOCALHOST", False),
    ("127.0.0.2", True), ("0.0.0.0", True), ("::", True), ("10.1.2.3", True), ("kmq.example.com", True),
])
def test_only_loopback_names_go_without_a_token(host, needed):
    assert needs_token(host) is needed


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize("header, ok", [
    ("Bearer tok:en", True), ("bearer tok:en", True), (_basic("anyone", "tok:en"), True), (_basic("", "tok:en"), True),
    ("Bearer tok", False), (_basic("tok:en", ""), False), ("Basic !!notbase64", False), ("Token tok:en", False),
    ("", False), (None, False),
])
def test_token_as_bearer_or_basic_password(header, ok):
    assert authorized(header, "tok:en") is ok
    assert not authorized(header, "")  # no token configured never authorizes


def _dl(p=0, o=0, reason="rejected", key=b"k", ts=1000):
    return DeadLetter(p, o, key, b"v", (("kmq-dlq-reason", reason.encode()),), ts)


def test_selection_by_positions_or_filter():
    ticked = Selection(positions=frozenset({(0, 1), (1, 0)}))
    assert ticked.matches(_dl(0, 1)) and ticked.matches(_dl(1, 0, reason="timeout")) and not ticked.matches(_dl(0, 0))
    f = Selection(reason="timeout", key="k", after_ms=500, before_ms=1500)
    assert f.matches(_dl(reason="timeout"))
    assert not f.matches(_dl(reason="rejected"))
    assert not f.matches(_dl(reason="timeout", key=b"other")) and not f.matches(_dl(reason="timeout", key=None))
    assert not f.matches(_dl(reason="timeout", ts=400)) and not f.matches(_dl(reason="timeout", ts=1600))
    assert Selection().empty and not f.empty


def test_the_same_selection_always_gets_the_same_replay_group():
    cfg = Config.from_dict({"queues": [{"name": "orders"}], "tracker": {"group_id": "trk"}})
    a = Selection(positions=frozenset({(0, 1), (1, 0)}))
    b = Selection(positions=frozenset({(1, 0), (0, 1)}))
    assert a.group(cfg, "orders") == b.group(cfg, "orders")
    assert a.group(cfg, "orders").startswith("trk-ui-redrive-orders-")
    assert a.group(cfg, "orders") != Selection(positions=frozenset({(0, 1)})).group(cfg, "orders")
    assert Selection(reason="timeout").group(cfg, "orders") != Selection(reason="rejected").group(cfg, "orders")


def test_import_kmq_and_the_cli_help_leave_the_ui_stack_unloaded():
    import subprocess
    import sys

    code = ("import sys, kmq; from kmq.cli import cli; cli.main(['--help'], standalone_mode=False); "
            "print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & {'starlette', 'jinja2', 'uvicorn', 'selenium'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "LOADED []" in out.stdout and "trace" in out.stdout and "ui" in out.stdout, out.stdout + out.stderr
