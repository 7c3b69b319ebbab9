"""The docs cannot rot: the README quickstart commands run for real (its Python blocks in
test_readme_snippets.py), and every `kmq ...`
command line in README.md and docs/*.md parses against the real CLI.

Commands are executed where this machine can run them (the README
quickstart, as a user would, against a broker it starts itself). Lines for
tools that cannot run here (helm, kubectl, docker, spark-submit) are checked
by the deployment validation (tests/deploy) instead; `./scripts/test.sh` is
what CI runs and `kmq demo` has its own end-to-end test.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
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
FENCE_LINE = re.compile(r"^\s*```(\w*)")
SHELL_LANGS = ("bash", "sh", "console", "shell")
INLINE = re.compile(r"`([^`]+)`")
NOT_RUN_HERE = ("helm", "kubectl", "docker", "spark-submit", "pip", "export", "curl", "git", "cd", "kustomize", "promtool")


def _blocks(path: Path, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(path.read_text()) if kind == lang]


def _fenced(text: str) -> tuple[list[tuple[str, int, list[str]]], str]:
    """The fenced blocks of a Markdown text as (language, line number of their first line, lines),
    and the text with every fenced line blanked (the prose, line numbers kept)."""
    blocks, prose, lang, start, body = [], [], None, 0, []
    for no, line in enumerate(text.splitlines(), 1):
        fence = FENCE_LINE.match(line)
        if lang is None and fence:
            lang, start, body = fence.group(1), no + 1, []
            prose.append("")
        elif lang is not None and line.strip().startswith("```"):
            blocks.append((lang, start, body))
            lang = None
            prose.append("")
        elif lang is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    return blocks, "\n".join(prose)


def _numbered_command_lines(lines: list[str], first: int) -> list[tuple[int, str]]:
    """(line number, shell line) of a block: comments dropped, continuations folded onto the first line."""
    out, cur, cur_no = [], "", first
    for no, raw in enumerate(lines, first):
        line = raw.rstrip()
        if not cur:
            cur_no = no
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        line = (cur + line).strip()
        cur = ""
        line = re.sub(r"\s+#.*$", "", line) if not line.startswith("#") else ""
        if line:
            out.append((cur_no, line))
    return out


def _command_lines(text: str) -> list[str]:
    """Shell lines of a block, comments and continuations folded."""
    return [line for _, line in _numbered_command_lines(text.splitlines(), 1)]


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


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}"


def kmq_block_lines(path: Path) -> list[tuple[str, str]]:
    """(file:line, command) of every `kmq ...` command in the shell blocks of a Markdown file."""
    out = []
    blocks, _ = _fenced(path.read_text())
    for lang, first, lines in blocks:
        if lang not in SHELL_LANGS:
            continue
        for no, line in _numbered_command_lines(lines, first):
            for words in _simple_commands(line.removeprefix("$ ")):
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]  # VAR=value prefixes
                if words and words[0] == "kmq":
                    out.append((_where(path, no), shlex.join(words)))
    return out


def kmq_inline_spans(path: Path) -> list[tuple[str, str]]:
    """(file:line, text) of every inline code span of the prose that is a `kmq ...` command."""
    _, prose = _fenced(path.read_text())
    out = []
    for m in INLINE.finditer(prose):
        span = m.group(1)
        if "\n\n" in span:
            continue  # not a span: a stray backtick paired across paragraphs
        text = " ".join(span.split())
        if re.match(r"kmq\s", text):
            out.append((_where(path, prose.count("\n", 0, m.start()) + 1), text))
    return out


def kmq_synopses(path: Path) -> list[tuple[str, str]]:
    """(file:line, text) of every `kmq ...` usage synopsis in the unlabelled blocks of a Markdown file
    (``[--flag VALUE]`` brackets dropped; indented lines below continue it)."""
    out = []
    blocks, _ = _fenced(path.read_text())
    for lang, first, lines in blocks:
        if lang:
            continue
        for i, line in enumerate(lines):
            if not line.startswith("kmq "):
                continue
            text = [line]
            for more in lines[i + 1:]:
                if not more[:1].isspace():
                    break
                text.append(more)
            out.append((_where(path, first + i), " ".join(" ".join(text).replace("[", " ").replace("]", " ").split())))
    return out


def _option_names(cmd: click.Command, ctx: click.Context) -> dict[str, click.Option]:
    names = {}
    for param in cmd.get_params(ctx):  # with the help option
        if isinstance(param, click.Option):
            for name in param.opts + param.secondary_opts:
                names[name] = param
    return names


def command_problem(words: list[str]) -> str | None:
    """What is wrong with ``kmq WORDS`` as a path of subcommands with their options, or None.

    Checks names only (what the prose can promise): every subcommand exists under its group and
    every ``-x``/``--flag`` belongs to the command it follows. Arguments and option values are
    not checked (prose writes placeholders such as QUEUE or ``...``); ``a|b`` stands for
    alternatives, each checked. A shell operator ends the command.
    """
    ctx = click.Context(cli, info_name="kmq")
    return _problem(cli, ctx, ["kmq"], list(words[1:]))


def _problem(cmd: click.Command, ctx: click.Context, path: list[str], rest: list[str]) -> str | None:
    while rest:
        tok, rest = rest[0], rest[1:]
        if tok in ("|", "||", "&&", ";", "&", ">", ">>") or tok.startswith((">", "2>")):
            return None
        if tok.startswith("-") and len(tok) > 1 and not re.fullmatch(r"-[0-9.]+", tok):
            name = tok.split("=", 1)[0]
            option = _option_names(cmd, ctx).get(name)
            if option is None:
                return f"`{' '.join(path)}` has no option {name}"
            if not (option.is_flag or option.count) and "=" not in tok and rest:
                rest = rest[1:]  # its value
            continue
        if isinstance(cmd, click.Group) and tok not in ("...", "…"):
            for alternative in tok.split("|"):
                sub = cmd.get_command(ctx, alternative)
                if sub is None:
                    return f"`{' '.join(path)}` has no command {alternative!r}"
                problem = _problem(sub, click.Context(sub, info_name=alternative, parent=ctx),
                                   [*path, alternative], rest)
                if problem:
                    return problem
            return None
    return None


def parse_problem(line: str) -> str | None:
    """What click says is wrong with the command line ``kmq ...`` (parsed for real), or None."""
    words = shlex.split(line)
    args = [w for w in words[1:] if not re.fullmatch(r"<.*>|\$\w+", w)]
    ctx = click.Context(cli, info_name="kmq")
    cmd: click.Command = cli
    # walk down the groups, then let click parse options and arguments for real
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        sub = cmd.get_command(ctx, args[0])
        if sub is None:
            return f"unknown command {args[0]!r}"
        ctx = click.Context(sub, info_name=args[0], parent=ctx)
        cmd, args = sub, args[1:]
    if args in (["--help"], ["-h"]) or args == ["--version"]:
        return None
    try:
        cmd.make_context(cmd.name, list(args), parent=ctx.parent)
    except click.UsageError as exc:
        return exc.format_message()
    return None


KMQ_LINES = [entry for path in DOCS for entry in kmq_block_lines(path)]
KMQ_SPANS = [entry for path in DOCS for entry in kmq_inline_spans(path) + kmq_synopses(path)]


def test_docs_mention_kmq_commands():
    assert len(KMQ_LINES) >= 8, KMQ_LINES
    assert len(KMQ_SPANS) >= 20, KMQ_SPANS


@pytest.mark.parametrize("where,line", KMQ_LINES, ids=[f"{w} {line}" for w, line in KMQ_LINES])
def test_every_documented_kmq_command_parses(where, line):
    problem = command_problem(shlex.split(line)) or parse_problem(line)
    assert problem is None, f"{where}: {line}: {problem}"


@pytest.mark.parametrize("where,text", KMQ_SPANS, ids=[f"{w} {text}" for w, text in KMQ_SPANS])
def test_every_kmq_command_in_the_prose_exists_with_its_flags(where, text):
    problem = command_problem(text.split())
    assert problem is None, f"{where}: `{text}`: {problem}"


def test_a_wrong_command_or_flag_is_named_with_file_and_line(tmp_path):
    doc = tmp_path / "guide.md"
    doc.write_text(textwrap.dedent("""\
        # Guide

        ```bash
        kmq status orders
        kmq stauts orders       # misspelled command
        kmq topics create orders \\
          --partition 6         # misspelled flag, on a continued line
        ```

        Replay with `kmq dlq replay orders --purge`, list with `kmq dlq list|replay
        orders --limit 5`, or `kmq dlq purge orders`.
        """))
    blocks = [(where, command_problem(shlex.split(line)) or parse_problem(line)) for where, line in kmq_block_lines(doc)]
    assert [where for where, _ in blocks] == [f"{doc}:4", f"{doc}:5", f"{doc}:6"]
    assert blocks[0][1] is None and "'stauts'" in blocks[1][1] and "--partition" in blocks[2][1], blocks
    spans = [(where, command_problem(text.split())) for where, text in kmq_inline_spans(doc)]
    assert spans == [(f"{doc}:10", "`kmq dlq replay` has no option --purge"), (f"{doc}:10", None),
                     (f"{doc}:11", "`kmq dlq` has no command 'purge'")]


def test_a_usage_synopsis_is_checked_with_its_continuation_lines(tmp_path):
    doc = tmp_path / "synopsis.md"
    doc.write_text("```\nkmq lag-job --config kmq.yaml [--source python|kafka]\n            [--chekpoint DIR]\n```\n")
    ((where, text),) = kmq_synopses(doc)
    assert where == f"{doc}:2" and command_problem(text.split()) == "`kmq lag-job` has no option --chekpoint"


# ---------------------------------------------------------------- quickstart, for real
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
                    wait_until(lambda url=url: _get(url) == 200, 30, what="tracker /healthz")
                continue
            res = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
            assert res.returncode == 0, f"{line}\n{res.stdout}\n{res.stderr}"
        # The README's Python blocks run in tests/integration/test_readme_snippets.py, each on a
        # queue of its own.
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
