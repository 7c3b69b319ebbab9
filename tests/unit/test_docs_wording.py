"""The user-facing text (README.md, docs/*.md and the docstrings of the modules under kmq/ and
tracker/ and of their classes and functions, which help() and the API docs show) carries no internal reference: design-document
names, issue numbers of a private tracker, remarks about who was working on the machine,
paths outside the repository."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (what it is, pattern). "issue" as an ordinary word ("a known issue") is fine; "issue 10" is not.
INTERNAL = [
    ("a design document's name", re.compile(r"KMQ-DESIGN", re.I)),
    ("a design-document remark", re.compile(r"\bkmq addition\b", re.I)),
    ("a design-document remark", re.compile(r"design's key list", re.I)),
    ("a tracker issue number", re.compile(r"\bissues? #?\d+", re.I)),
    ("an internal gap label", re.compile(r"tansu-gap", re.I)),
    ("a remark about colleagues", re.compile(r"other engineers", re.I)),
    ("a remark about colleagues", re.compile(r"\bthe CEO\b", re.I)),
    ("a path outside the repository", re.compile(r"\.\./shared")),
]


def _texts():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield path.relative_to(ROOT), path.read_text()
    for top in ("kmq", "tracker"):
        for path in sorted((ROOT / top).rglob("*.py")):
            # The module's docstring, and its classes' and functions' (help() shows them too).
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node, clean=False)
                    if doc:
                        where = path.relative_to(ROOT) if isinstance(node, ast.Module) else \
                            f"{path.relative_to(ROOT)} {node.name}"
                        yield where, doc


def _found(name, text: str) -> list[str]:
    out = []
    for what, pattern in INTERNAL:
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{name}: {what} {m.group(0)!r} (line {line})")
    return out


def test_user_facing_text_has_no_internal_references():
    texts = list(_texts())
    assert len(texts) > 500  # README, the docs and the docstrings were all read
    found = [f for name, text in texts for f in _found(name, text)]
    assert not found, "internal references in user-facing text:\n" + "\n".join(found)


@pytest.mark.parametrize("text, flagged", [
    ("see issue 12 for the history", True),
    ("Issues 3 and 4", True),
    ("issue #7", True),
    ("(kmq addition, see docs/protocol.md)", True),
    ("while other engineers' tests ran", True),
    ("docs in ../shared/design.md", True),
    ("a known issue with old brokers", False),
    ("retries 3 times if the issue persists; 2 issues remain", False),
    ("tissue 4", False),
])
def test_the_patterns_catch_internal_references_but_not_the_word_issue(text, flagged):
    assert bool(_found("x", text)) is flagged
