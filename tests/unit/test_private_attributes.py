"""Product code gives a class its parts through the constructor: it does not write another
object's private attributes (``obj._name = ...``), except where listed here with the reason."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: (file, assignment target) -> why it may write there.
ALLOWED = {
    **{("kmq/client/kafka_python/group_join.py", t): "kafka-python's own (COORDINATOR_ATTRIBUTES, tested)"
       for t in ("coordinator._join_task", "coordinator._kmq_keeps_joins", "coordinator._metadata_snapshot")},
    ("kmq/client/kafka_python/clients.py", "producer._closed"): "kafka-python's own (PRIVATE_ATTRIBUTES, tested)",
    ("kmq/client/kafka_python/watchdog.py", "fetcher._next_partition_records"):
        "kafka-python's own (PRIVATE_ATTRIBUTES, tested)",
    ("kmq/cli/__init__.py", "handler._kmq_default"): "a tag on a logging handler kmq made",
    ("kmq/telemetry/logs.py", "handler._kmq_handler"): "a tag on a logging handler kmq made",
    **{("kmq/core/message.py", f"m._{slot}"): "message_builder fills KmqMessage's slots in its own module"
       for slot in ("headers", "settler", "lock", "outcome", "nbytes", "span")},
}


def _private_writes(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for a in ast.walk(target):
                if (isinstance(a, ast.Attribute) and a.attr.startswith("_") and not a.attr.startswith("__")
                        and not (isinstance(a.value, ast.Name) and a.value.id in ("self", "cls"))):
                    out.add(ast.unparse(a))
    return out


def test_no_product_code_writes_another_objects_private_attributes():
    found = {(str(p.relative_to(ROOT)), t) for base in ("kmq", "tracker") for p in sorted((ROOT / base).rglob("*.py"))
             for t in _private_writes(p)}
    unexpected = sorted(found - set(ALLOWED))
    assert not unexpected, ("pass these parts through the constructor (or a public method) instead of writing "
                            f"them: {unexpected}")
    assert not set(ALLOWED) - found, "listed but gone: drop them from ALLOWED"
