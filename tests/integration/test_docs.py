"""The docs cannot rot: the README quickstart runs for real, and every `kmq ...`
command line in README.md and docs/*.md parses against the real CLI.

Commands are executed where this machine can run them (the README
quickstart, as a user would, against a broker it starts itself). Lines for
tools that cannot run here (helm, kubectl, docker, spark-submit) are checked
by the deployment validation (tests/deploy) instead; `./scripts/test.sh` is
what CI runs and `kmq demo` has its own end-to-end test.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import click
import pytest

from kmq.cli import cli
from kmq.dev.broker import free_port
from tests.helpers.kafka import wait_until

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
NOT_RUN_HERE = ("helm", "kubectl", "docker", "spark-submit", "pip", "export", "curl", "git", "cd", "kustomize", "promtool")


def _blocks(path: Path, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(path.read_text()) if kind == lang]


def _command_lines(text: str) -> list[str]:
    """Shell lines of a block, comments and continuations folded."""
    lines, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        line = (cur + line).strip()
        cur = ""
        line = re.sub(r"\s+#.*$", "", line) if not line.startswith("#") else ""
        if line:
            lines.append(line)
    return lines


def _simple_commands(line: str) -> list[list[str]]:
    """Split a shell line at ``&&``, ``||``, ``|``, ``;`` and ``&`` (quotes respected)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    out, cur = [], []
    for tok in lex:
        if tok in ("&&", "||", "|", ";", "&"):
            out.append(cur)
            cur = []
        else:
            cur.append(tok)
    out.append(cur)
    return [c for c in out if c]


def _kmq_lines() -> list[tuple[str, str]]:
    out = []
    for path in DOCS:
        for block in _blocks(path, "bash") + _blocks(path, "sh") + _blocks(path, "console"):
            for line in _command_lines(block):
                for words in _simple_commands(line.removeprefix("$ ")):
                    while words and "=" in words[0] and not words[0].startswith("-"):
                        words = words[1:]  # VAR=value prefixes
                    if words and words[0] == "kmq":
                        out.append((f"{path.name}: {shlex.join(words)}", shlex.join(words)))
    return out


KMQ_LINES = _kmq_lines()


def test_docs_mention_kmq_commands():
    assert len(KMQ_LINES) >= 8, KMQ_LINES


@pytest.mark.parametrize("where,line", KMQ_LINES, ids=[w for w, _ in KMQ_LINES])
def test_every_documented_kmq_command_parses(where, line):
    words = shlex.split(line)
    args = [w for w in words[1:] if not re.fullmatch(r"<.*>|\$\w+", w)]
    ctx = click.Context(cli, info_name="kmq")
    cmd: click.Command = cli
    # walk down the groups, then let click parse options and arguments for real
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        sub = cmd.get_command(ctx, args[0])
        assert sub is not None, f"{where}: unknown command {args[0]!r}"
        ctx = click.Context(sub, info_name=args[0], parent=ctx)
        cmd, args = sub, args[1:]
    if args in (["--help"], ["-h"]) or args == ["--version"]:
        return
    try:
        cmd.make_context(cmd.name, list(args), parent=ctx.parent)
    except click.UsageError as exc:
        pytest.fail(f"{where}: {exc.format_message()}")


# ---------------------------------------------------------------- quickstart, for real
class Done(BaseException):
    """Ends a documented infinite loop once the test has seen enough (not an Exception,
    so kmq's handlers do not catch it)."""


@pytest.mark.integration
@pytest.mark.slow
def test_readme_quickstart_runs_as_written(tmp_path):
    port = free_port()
    readme = (ROOT / "README.md").read_text()
    quick = next(b for b in _blocks(ROOT / "README.md", "bash") if "kmq dev broker" in b)
    env = {
        **os.environ,
        "KMQ_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
        "KMQ_KAFKA__SESSION_TIMEOUT": "6s",
        "KMQ_TRACKER__HTTP_PORT": str(free_port()),
        "KMQ_TRACKER_HTTP_HOST": "127.0.0.1",  # loopback only on test machines (pods bind 0.0.0.0)
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    yaml_block = next(b for b in _blocks(ROOT / "README.md", "yaml") if "queues:" in b)
    (tmp_path / "kmq.yaml").write_text(yaml_block.replace("localhost:9092", f"127.0.0.1:{port}"))
    background: list[subprocess.Popen] = []
    try:
        for line in _command_lines(quick):
            line = line.replace("9092", str(port))
            words = shlex.split(line.rstrip("&"))
            if words[0] in NOT_RUN_HERE:
                continue  # installation: what ./scripts/test.sh did for this run
            if line.endswith("&"):
                proc = subprocess.Popen(words, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                background.append(proc)
                if words[1:3] == ["dev", "broker"]:
                    assert "ready" in proc.stdout.readline()
                elif words[1:3] == ["tracker", "run"]:
                    url = f"http://127.0.0.1:{env['KMQ_TRACKER__HTTP_PORT']}/healthz"
                    wait_until(lambda: _get(url) == 200, 30, what="tracker /healthz")
                continue
            res = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
            assert res.returncode == 0, f"{line}\n{res.stdout}\n{res.stderr}"

        # The two Python examples, against the topics the commands above made.
        # (The asyncio example runs in tests/integration/test_aio.py.)
        examples = [b for b in _blocks(ROOT / "README.md", "python") if "AsyncKmqConsumer" not in b]
        assert len(examples) == 3 and "KmqConsumer" in examples[0] and "MarkerWriter" in examples[1]
        assert "confluent_kafka" in examples[2] and "MarkerWriter" in examples[2]
        seen: list[bytes] = []

        def until(n):
            def record(value):
                seen.append(value)
                if len(seen) >= n:
                    raise Done

            return record

        class TemporaryError(Exception):
            pass

        class BadPayload(Exception):
            pass

        cwd = os.getcwd()
        os.chdir(tmp_path)
        spaces: list[dict] = []  # each example's globals: its clients are closed below

        def space(**names) -> dict:
            spaces.append(names)
            return names

        try:
            with pytest.raises(Done):
                exec(compile(examples[0], "README-KmqConsumer", "exec"),
                     space(handle=until(300), TemporaryError=TemporaryError, BadPayload=BadPayload))
            first = len(seen)
            with pytest.raises(Done):
                exec(compile(examples[1].replace("localhost:9092", f"127.0.0.1:{port}"), "README-MarkerWriter", "exec"),
                     space(process=until(first + 300)))
            second = len(seen)
            # The confluent-kafka loop, in its own group (from the start of the queue).
            with pytest.raises(Done):
                exec(compile(examples[2].replace("localhost:9092", f"127.0.0.1:{port}")
                             .replace('"orders-workers"', '"orders-workers-confluent"'), "README-confluent", "exec"),
                     space(process=until(second + 300)))
            third = len(seen)
            # The KmqConsumer example unchanged on confluent-kafka (kafka.client from the env), own group.
            os.environ.update(KMQ_KAFKA__CLIENT="confluent", KMQ_CONSUMER__GROUP_ID="orders-workers-kmq-confluent")
            with pytest.raises(Done):
                exec(compile(examples[0], "README-KmqConsumer-confluent", "exec"),
                     space(handle=until(third + 300), TemporaryError=TemporaryError, BadPayload=BadPayload))
        finally:
            os.environ.pop("KMQ_KAFKA__CLIENT", None)
            os.environ.pop("KMQ_CONSUMER__GROUP_ID", None)
            os.chdir(cwd)
            # The examples loop for ever and are stopped by Done, so their clients stay open: close
            # them, writer first (its ENDs), before this test's broker stops (a confluent consumer left
            # open reconnected to the stopped broker, "Connect to ipv4#... failed", to the end of the run).
            for names in spaces:
                for obj in (names.get("writer"), names.get("consumer")):
                    if obj is not None:
                        with contextlib.suppress(Exception):
                            obj.close()
        assert len(seen) >= 1200 and all(v for v in seen)
    finally:
        for proc in reversed(background):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        assert all(p.returncode is not None for p in background)
    assert "./scripts/test.sh" in readme and "./scripts/demo.sh" in readme


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except OSError:
        return 0
