"""Hotspots stay broken into named pieces: no function of the library or the services with more
than ``MAX_BRANCHES`` branches, no module over ``MAX_LINES`` lines (docs/architecture.md, STYLE).

A branch is a decision point, counted from the syntax tree: ``if``/``elif``, a ``for`` or
``while`` loop, an ``except`` clause, a ``match`` case, a conditional expression, a
comprehension's ``for`` and each of its conditions, and each ``and``/``or`` operand after the
first. A nested function or class counts on its own; a lambda counts in the function around it.

Functions: ``kmq/`` and ``tracker/``, without the benchmarks (``kmq/bench``) and the developer
tools (``kmq/dev``: the simulated cluster, mutants). Lines: every module of ``kmq/`` and ``tracker/``.
``ALLOWED`` names today's remaining offenders, each at no more than its count today; it is
being emptied, not grown.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_BRANCHES = 20
MAX_LINES = 600
PACKAGES = ("kmq", "tracker")
NOT_COUNTED = ("kmq/bench/", "kmq/dev/")  # benchmarks and developer tools: branches not counted

#: "path::qualified name" (or a path, for its line count) -> the most it may have until split.
ALLOWED: dict[str, int] = {}

_DECISIONS = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.match_case)
_OWN_SCOPE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def branches(fn: ast.AST) -> int:
    """The branches of ``fn``'s own body (see the module docstring)."""
    n = 0
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, _OWN_SCOPE):
            continue
        if isinstance(node, _DECISIONS):
            n += 1
        elif isinstance(node, ast.comprehension):
            n += 1 + len(node.ifs)
        elif isinstance(node, ast.BoolOp):
            n += len(node.values) - 1
        todo.extend(ast.iter_child_nodes(node))
    return n


def functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function in ``tree``, methods and nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def _modules() -> list[tuple[str, str]]:
    return [(p.relative_to(ROOT).as_posix(), p.read_text())
            for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _over(name: str, count: int, limit: int) -> str | None:
    allowed = ALLOWED.get(name)
    if count <= limit or (allowed is not None and count <= allowed):
        return None
    return f"{name}: {count}" + (f" (allowed {allowed} until split)" if allowed is not None else "")


def test_no_function_has_more_than_20_branches():
    over = []
    for path, text in _modules():
        if path.startswith(NOT_COUNTED):
            continue
        for name, fn in functions(ast.parse(text, path)):
            found = _over(f"{path}::{name}", branches(fn), MAX_BRANCHES)
            if found:
                over.append(found)
    assert not over, (f"functions with more than {MAX_BRANCHES} branches; split them into named pieces "
                      f"(see {Path(__file__).name}):\n" + "\n".join(over))


def test_no_module_is_longer_than_600_lines():
    over = [found for path, text in _modules() if (found := _over(path, len(text.splitlines()), MAX_LINES))]
    assert not over, f"modules over {MAX_LINES} lines; split them by concept:\n" + "\n".join(over)


@pytest.mark.parametrize(("source", "expected"), [
    ("def f():\n    return 1\n", 0),
    ("def f(a, b):\n    if a and b or a:\n        pass\n    elif b:\n        pass\n    else:\n        pass\n", 4),
    ("def f(xs):\n    for x in xs:\n        try:\n            pass\n        except ValueError:\n            pass\n"
     "        except KeyError:\n            pass\n    while xs:\n        xs.pop()\n", 4),
    ("def f(xs):\n    return [x for x in xs if x] + [1 if xs else 2] + list(map(lambda x: x or 0, xs))\n", 4),
    ("def f(xs):\n    return {x: y for x in xs if x if not x.y for y in x}\n", 4),
    ("def f(x):\n    match x:\n        case 1:\n            pass\n        case _:\n            pass\n", 2),
    ("def f(x):\n    def g():\n        if x:\n            pass\n    class C:\n        def h(self):\n"
     "            if x:\n                pass\n    return g\n", 0),
])
def test_the_branch_count(source, expected):
    (_name, fn), *_ = functions(ast.parse(source))
    assert branches(fn) == expected


def test_methods_and_nested_functions_are_named_by_their_scope():
    tree = ast.parse("class A:\n    def m(self):\n        def inner():\n            pass\n\ndef top():\n    pass\n")
    assert [name for name, _ in functions(tree)] == ["A.m", "A.m.inner", "top"]
