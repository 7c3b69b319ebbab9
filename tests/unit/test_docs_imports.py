"""What the docs tell users to import is public: every ``from kmq... import ...`` in a Python
block of README.md or docs/*.md, and every name the prose says to take "from `kmq...`", is
either in a public module (``kmq``, ``kmq.aio``, ``kmq.share``) or named as public by
docs/architecture.md; and it imports."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PUBLIC_MODULES = {"kmq", "kmq.aio", "kmq.share"}
# Prose such as: pass `metrics=ConsumerMetrics(registry)` (from `kmq.telemetry.metrics`)
PROSE = re.compile(r"`(?:\w+=)?(\w+)\([^`]*\)`\s*\(from `(kmq(?:\.\w+)*)`\)")


def told_to_import() -> set[tuple[str, str, str]]:
    """(doc, module, name) of every import the docs show."""
    out = set()
    for path in DOCS:
        text = path.read_text()
        for block in re.findall(r"```python\n(.*?)```", text, re.S):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kmq"):
                    out |= {(path.name, node.module, a.name) for a in node.names}
        out |= {(path.name, module, name) for name, module in PROSE.findall(" ".join(text.split()))}
    return out


def stated_public() -> str:
    """The paragraph of docs/architecture.md that states the public surface."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    (paragraph,) = [p for p in text.split("\n\n") if "is the public surface" in p]
    return " ".join(paragraph.split())


def test_the_docs_show_imports_and_the_prose_pattern_finds_one():
    found = told_to_import()
    assert ("operations.md", "kmq.telemetry.metrics", "ConsumerMetrics") in found
    assert ("capacity.md", "kmq.config.process", "tune_collector") in found
    assert any(module == "kmq.aio" for _, module, _ in found)


def test_every_name_the_docs_import_is_public_and_imports():
    public = stated_public()
    problems = []
    for doc, module, name in sorted(told_to_import()):
        if module not in PUBLIC_MODULES and f"`{module}.{name}`" not in public:
            problems.append(f"{doc}: {module}.{name} is not in the public surface docs/architecture.md states")
        elif not hasattr(importlib.import_module(module), name):
            problems.append(f"{doc}: {module} has no {name}")
    assert not problems, "\n".join(problems)
