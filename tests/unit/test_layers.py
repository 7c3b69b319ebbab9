"""The package layout is a contract (docs/architecture.md): checked here, not hoped for.

* import-linter's contracts in pyproject.toml (each layer imports only from the
  layers below it; the core does no I/O; only the Spark job imports pyspark;
  nothing above kmq.client imports a Kafka client or an adapter package);
* no import circle between modules, counting imports inside functions too, so a
  circle cannot hide behind a function-level import.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "KEPT" in done.stdout  # contracts were found and checked


#: Below the seam (or the seam itself), with contracts of their own; and the benchmarks, whose
#: baseline loops measure the plain clients.
_NOT_ABOVE_THE_SEAM = {"kmq.client", "kmq.core", "kmq.bench"}


def test_every_package_above_the_seam_is_kept_off_the_kafka_clients():
    # A new package (or module) of kmq must join the seam contract, or kafka.client would not be honoured there.
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (seam,) = [c for c in contracts if "only through the seam" in c["name"]]
    assert {"kafka", "confluent_kafka", "aiokafka", "kmq.client.kafka_python", "kmq.client.confluent",
            "kmq.client.aiokafka"} <= set(seam["forbidden_modules"])
    assert not seam.get("ignore_imports")
    top = {f"kmq.{p.stem}" for p in (ROOT / "kmq").iterdir()
           if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem not in ("__init__", "__main__"))}
    assert "kmq.ui" in top and "kmq.spark" in top
    assert (top | {"tracker"}) - _NOT_ABOVE_THE_SEAM <= set(seam["source_modules"])


def _cycles(graph: grimp.ImportGraph, skip: frozenset[str] = frozenset()) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative); the modules in
    ``skip`` are left out, with their edges."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0

    def children_of(module: str):
        return iter(sorted(graph.find_modules_directly_imported_by(module) - skip))

    for root in sorted(graph.modules - skip):
        if root in index:
            continue
        work = [(root, children_of(root))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, children_of(child)))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def _packages(graph: grimp.ImportGraph) -> frozenset[str]:
    # A package's __init__ re-exporting its own modules is not a circle between
    # concepts: package nodes are left out, so only module-to-module edges count.
    # (Not graph.remove_module: it removes the package's modules too.)
    return frozenset(m for m in graph.modules if (ROOT / m.replace(".", "/") / "__init__.py").exists())


def test_no_import_circles_even_through_function_level_imports():
    # Imports under TYPE_CHECKING never run: a type named in an annotation is no circle.
    graph = grimp.build_graph("kmq", "tracker", cache_dir=None, exclude_type_checking_imports=True)
    packages = _packages(graph)
    modules = graph.modules - packages
    assert {"kmq.consumer.consumer", "tracker.service", "kmq.core.markers"} <= modules  # the real graph
    assert len(modules) > 100
    assert _cycles(graph, packages) == []


def test_the_circle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for m in ("a", "b", "c"):
        graph.add_module(m)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles(graph, frozenset({"b"})) == []
