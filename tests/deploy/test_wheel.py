"""The wheel `python -m build` makes: its metadata (name, the version of kmq/version.py, the
extras, redis only in an extra, classifiers), and that it installs and imports
with only the base dependencies, offline.

Offline: the wheel is installed with ``pip install --no-deps --no-index`` into a fresh venv,
and the base dependencies (and theirs) are lent from this environment through a ``.pth`` of
symlinks, so no extra (redis, confluent-kafka, pyspark, ...) is importable there. The build
runs without build isolation when this environment has the build backend pyproject.toml asks
for (setuptools>=77 and wheel); otherwise `python -m build` fetches it from the package index
into its isolated environment, as scripts/release.sh does."""

from __future__ import annotations

import email
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.deploy.dockerfile import ROOT

pytestmark = pytest.mark.slow

EXTRAS = {"redis", "spark", "confluent", "otel", "ui", "dev"}


def _backend_here() -> bool:
    try:
        return Version(md.version("setuptools")) >= Version("77") and bool(md.version("wheel"))
    except md.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of what the wheel is made of: setuptools leaves build/ and *.egg-info
    # beside the sources, and the checkout stays as it was.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("kmq", "tracker"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "build", "--wheel", "--outdir", str(out)]
    if _backend_here():
        command.append("--no-isolation")
    built = subprocess.run([*command, str(src)], cwd=out, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (path,) = out.glob("kmq-*.whl")
    return path


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(z.read(name))


def _version_file() -> str:
    (version,) = re.findall(r'^__version__ = "([^"]+)"$', (ROOT / "kmq/version.py").read_text(), re.M)
    return version


def test_wheel_metadata_names_the_package_its_extras_and_classifiers(wheel):
    meta = _metadata(wheel)
    assert meta["Name"] == "kmq" and meta["Version"] == _version_file()
    assert wheel.name == f"kmq-{_version_file()}-py3-none-any.whl"
    assert EXTRAS <= set(meta.get_all("Provides-Extra"))
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    base = {r.name for r in requires if r.marker is None}
    assert "redis" not in base, "redis serves only IdempotencyGuard: the redis extra, not the base install"
    assert {"kafka-python", "click", "pyyaml", "prometheus-client"} <= base
    in_extra = {(r.name, str(r.marker)) for r in requires if r.marker is not None}
    assert ("redis", 'extra == "redis"') in in_extra and ("kmq", 'extra == "dev"') in in_extra
    pyspark = next(r for r in requires if r.name == "pyspark")
    assert not any(s.operator == "==" for s in pyspark.specifier), "pyspark as a range: the user's Spark must match"
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers and "Typing :: Typed" in classifiers
    # Each classifier as pyproject.toml writes it (a typo in one would be refused by an index).
    assert classifiers == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["classifiers"]
    # No Project-URL until the project has a public address: a guessed one would send users elsewhere.
    assert not meta.get_all("Project-URL"), meta.get_all("Project-URL")


def _base_closure(wheel: Path) -> set[str]:
    """The distributions the base install needs: the wheel's unconditional requirements and
    theirs, as installed here (environment markers evaluated, extras left out)."""
    todo = [Requirement(r) for r in _metadata(wheel).get_all("Requires-Dist")]
    todo = [r for r in todo if r.marker is None]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for raw in md.requires(req.name) or []:
            dep = Requirement(raw)
            if dep.marker is None or dep.marker.evaluate({"extra": ""}):
                todo.append(dep)
    return seen


def _lend(dists: set[str], into: Path) -> None:
    """Symlink each distribution's top-level files (modules, packages, .dist-info) into ``into``."""
    into.mkdir()
    for name in dists:
        dist = md.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            if src.exists() and not (into / top).exists() and top != "__pycache__":
                (into / top).symlink_to(src)


def test_the_base_wheel_imports_offline_with_only_its_base_dependencies(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, symlinks=True)
    python = env_dir / "bin" / "python"
    run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KMQ_CONFIG")}
    installed = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
                               cwd=tmp_path, env={**run_env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
                               capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    base = _base_closure(wheel)
    assert "redis" not in base
    _lend(base, tmp_path / "base-deps")
    (site,) = (env_dir / "lib").glob("python3.*/site-packages")
    (site / "base-deps.pth").write_text(str(tmp_path / "base-deps") + "\n")

    check = """
import importlib.util, sys
import kmq, kmq.cli, tracker
assert "site-packages" in kmq.__file__, kmq.__file__
missing = [m for m in ("redis", "confluent_kafka", "pyspark", "opentelemetry", "starlette") if importlib.util.find_spec(m)]
assert not missing, missing
try:
    kmq.IdempotencyGuard("redis://127.0.0.1:1/0")
except kmq.KmqError as exc:
    print("guard:", exc)
print("version:", kmq.__version__)
"""
    out = subprocess.run([str(python), "-c", check], cwd=tmp_path, env=run_env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"version: {_version_file()}" in out.stdout
    assert "guard: IdempotencyGuard needs the redis package" in out.stdout and "redis extra" in out.stdout
    cli = subprocess.run([str(env_dir / "bin" / "kmq"), "--version"], cwd=tmp_path, env=run_env,
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and _version_file() in cli.stdout, cli.stdout + cli.stderr
