"""The image's install steps are the package's: run the Dockerfile's own pip
commands (parsed from it) outside Docker. The builder's `pip wheel` runs on a
copy of exactly what the builder COPYs; the runtime's `pip install` runs in a
clean venv; then the console script answers `kmq --version` and
`kmq tracker run --help`, kafka-python there reads every codec, and the image's
environment picks confluent-kafka, which is installed. pip's cache is
reused (--no-cache-dir is dropped)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from kmq import __version__
from tests.deploy.dockerfile import ROOT, stage_env, stages

pytestmark = pytest.mark.slow

_, STAGES = stages()
BY_NAME = {s.name: s for s in STAGES}


def pip_command(stage: str, verb: str) -> str:
    (run,) = [r for r in BY_NAME[stage].all("RUN") if f"pip {verb}" in r.text]
    _, command = run.flags()  # drop --mount=...
    return command.replace("--no-cache-dir ", "")


def sh(command: str, cwd: Path, python: Path, wheels: Path, timeout: float) -> subprocess.CompletedProcess:
    assert command.startswith("python -m pip "), command
    command = command.replace("/wheels", str(wheels)).replace("python -m pip ", f"{python} -m pip ", 1)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_wheel_installs_in_a_clean_venv_and_runs(tmp_path):
    # 1. The builder stage: COPY its sources into a fresh directory, run its pip wheel.
    src = tmp_path / "src"
    src.mkdir()
    for ins in BY_NAME["builder"].all("COPY"):
        *sources, dest = ins.text.split()
        for s in sources:
            target = src / dest / Path(s).name if dest.endswith("/") else src / dest
            if (ROOT / s).is_dir():
                shutil.copytree(ROOT / s, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(ROOT / s, target)
    wheels = tmp_path / "wheels"
    built = sh(pip_command("builder", "wheel"), src, Path(sys.executable), wheels, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("kmq-*.whl")
    assert wheel.name.startswith(f"kmq-{__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"kmq/__init__.py", "kmq/cli/__init__.py", "kmq/py.typed", "tracker/__init__.py"} <= names
    assert f"kmq-{__version__}.dist-info/licenses/LICENSE" in names, "the builder stage must COPY LICENSE"

    # 2. The runtime stage: its pip install into a clean venv (dependencies from the index).
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, symlinks=True)
    python = env_dir / "bin" / "python"
    installed = sh(pip_command("runtime", "install"), tmp_path, python, wheels, timeout=120)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    # 3. The entry point, away from the source tree so nothing is imported from it.
    kmq = env_dir / "bin" / "kmq"
    run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KMQ_CONFIG")}
    version = subprocess.run([str(kmq), "--version"], cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and __version__ in version.stdout, version.stdout + version.stderr
    helptext = subprocess.run([str(kmq), "tracker", "run", "--help"], cwd=tmp_path, env=run_env,
                              capture_output=True, text=True, timeout=60)
    assert helptext.returncode == 0, helptext.stdout + helptext.stderr
    assert "--config" in helptext.stdout
    where = subprocess.run([str(python), "-c", "import kmq, tracker; print(kmq.__file__); print(tracker.__file__)"],
                           cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0 and str(ROOT) not in where.stdout, where.stdout + where.stderr
    # Every codec Kafka has: kafka-python reads snappy, lz4 and zstd batches only with their libraries.
    codecs = subprocess.run([str(python), "-c", "from kmq.client.kafka_python.clients import require_codecs; "
                             "require_codecs()"], cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=60)
    assert codecs.returncode == 0, codecs.stdout + codecs.stderr
    # The image's environment picks confluent-kafka (KMQ_KAFKA__CLIENT), and the installed extras have it.
    client = subprocess.run([str(python), "-c", "from kmq.config import Config; from kmq.client.api import client_of, "
                             "require_client; k = Config.load(None).kafka; require_client(client_of(k)); "
                             "import confluent_kafka; print(client_of(k))"],
                            cwd=tmp_path, env={**run_env, **stage_env(STAGES, "runtime")}, capture_output=True,
                            text=True, timeout=60)
    assert client.returncode == 0 and client.stdout.strip() == "confluent", client.stdout + client.stderr
    # The OpenTelemetry SDK and the OTLP/HTTP exporter the chart's otel values send the tracker's spans through.
    otel = subprocess.run([str(python), "-c", "from kmq.telemetry.otel_sdk import _exporter; "
                           "print(type(_exporter('otlp_proto_http')).__name__)"],
                          cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=60)
    assert otel.returncode == 0 and otel.stdout.strip() == "OTLPSpanExporter", otel.stdout + otel.stderr
    # No Spark in the tracker image: the spark extra is the other target's.
    spark = subprocess.run([str(python), "-c", "import pyspark"], cwd=tmp_path, env=run_env, capture_output=True, timeout=60)
    assert spark.returncode != 0
