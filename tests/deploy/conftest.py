"""Shared pieces of the deployment tests: the validator script as a module, rendering."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "validate-deploy.py"


def _load_validator():
    spec = importlib.util.spec_from_file_location("kmq_validate_deploy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


vd = _load_validator()


@pytest.fixture(scope="session")
def validator():
    """scripts/validate-deploy.py, imported."""
    return vd


@pytest.fixture(scope="session")
def promtool_binary():
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not found: scripts/test.sh installs it (Debian package prometheus)")
    return binary


def render(values: dict | None = None, chart: Path = vd.CHART) -> list[dict]:
    """The chart's manifests for ``values`` (release kmq in namespace kmq)."""
    return [doc for _, doc in vd.rendered_docs(vd.render_chart(chart, values or {}))]


def find(docs: list[dict], kind: str, name_suffix: str = "") -> dict:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(matches) == 1, f"expected one {kind} named *{name_suffix}, got {[d['metadata']['name'] for d in matches]}"
    return matches[0]
