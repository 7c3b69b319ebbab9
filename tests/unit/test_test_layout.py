"""The tests' own layout: a test module imports no other test module. What tests share lives
in tests/helpers/ (or a helper module beside them, such as tests/integration/tracker_util.py),
so that running, moving or deleting one test module never changes another."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Imports of one test module by another that stay for now, each with the reason; the test also
#: fails when one of them is gone, so that the list only shrinks.
KNOWN: dict[tuple[str, str], str] = {}


def _is_test_module(dotted: str) -> bool:
    return dotted.startswith("tests.") and dotted.rsplit(".", 1)[-1].startswith("test_")


def _imported(path: Path, repo: Path) -> set[str]:
    """The modules of tests/ that ``path`` imports, at its top or inside functions."""
    package = ".".join(path.relative_to(repo).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the importer's package up
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            # ``from tests.unit import test_x`` imports a module too
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return {m for m in out if m.startswith("tests.")}


def cross_test_imports(repo: Path = ROOT) -> set[tuple[str, str]]:
    """(importing file, imported test module) for every import of a test module by another module
    of ``repo``'s tests/."""
    found = set()
    for path in sorted((repo / "tests").rglob("*.py")):
        me = ".".join(path.relative_to(repo).with_suffix("").parts)
        for module in _imported(path, repo):
            if _is_test_module(module) and module != me:
                found.add((path.relative_to(repo).as_posix(), module))
    return found


def test_no_test_module_imports_another_test_module():
    found = cross_test_imports()
    new = sorted(found - KNOWN.keys())
    assert not new, ("test modules import other test modules; move what they share to tests/helpers/: "
                     + "; ".join(f"{a} imports {b}" for a, b in new))
    gone = sorted(KNOWN.keys() - found)
    assert not gone, f"no longer imported, take them off KNOWN: {gone}"


def test_the_check_sees_every_form_of_import(tmp_path):
    tests = tmp_path / "tests"
    (tests / "unit").mkdir(parents=True)
    (tests / "unit" / "test_a.py").write_text("X = 1\n")
    (tests / "unit" / "test_b.py").write_text("from tests.unit.test_a import X\n")
    (tests / "unit" / "test_c.py").write_text("def f():\n    import tests.unit.test_a\n")
    (tests / "unit" / "test_d.py").write_text("from tests.unit import test_a\n")
    (tests / "unit" / "test_e.py").write_text("from .test_a import X\n")
    (tests / "unit" / "test_f.py").write_text("from tests.helpers.kafka import produce\n")
    found = cross_test_imports(tmp_path)
    assert {a for a, _ in found} == {f"tests/unit/test_{x}.py" for x in "bcde"}
    assert {b for _, b in found} == {"tests.unit.test_a"}
