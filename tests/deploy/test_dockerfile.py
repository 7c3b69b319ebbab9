"""deploy/docker/Dockerfile, checked statically (no Docker engine here): multi-stage,
slim Python 3.11, the wheel built in a builder stage and installed in the final
stages, non-root, no build tools in the final image, kmq as entry point, a Spark
target with a JRE. The spark entry point script is run with stub commands."""

from __future__ import annotations

import os
import re
import runpy
import stat
import subprocess
import sys

import pytest

from kmq.config import Config
from tests.deploy.dockerfile import DOCKERFILE, ROOT, dockerignore_excludes, exec_form, lineage, stage_env, stages

ARGS, STAGES = stages()
BY_NAME = {s.name: s for s in STAGES}
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|make|build-essential|[a-z0-9.+-]+-dev|pip wheel|python -m build|setuptools|cargo|rustc)\b")


def test_stages_and_default_target():
    assert [s.name for s in STAGES] == ["builder", "base", "spark", "runtime"]
    assert STAGES[-1].name == "runtime", "the last stage is what a plain `docker build` produces"
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", ARGS["PYTHON_IMAGE"]), ARGS
    assert {s.base for s in STAGES if s.base.startswith("python")} == {ARGS["PYTHON_IMAGE"]}


def test_builder_makes_only_the_kmq_wheel():
    (run,) = BY_NAME["builder"].all("RUN")
    assert "pip wheel" in run.text and "--no-deps" in run.text and "--wheel-dir /wheels" in run.text


@pytest.mark.parametrize("target", ["runtime", "spark"])
def test_final_stages_install_the_wheel_from_the_builder(target):
    installs = [r for r in BY_NAME[target].all("RUN") if "pip install" in r.text]
    assert len(installs) == 1
    flags, rest = installs[0].flags()
    assert flags.get("mount", "").startswith("type=bind,from=builder,source=/wheels"), flags
    assert "/wheels/kmq-*.whl" in rest
    extras = set(re.search(r"kmq-\*\.whl\)\[([a-z,-]+)\]", rest).group(1).split(","))
    assert ("spark" in extras) == (target == "spark")
    assert "confluent" in extras  # kafka.client: confluent works in every pod
    # kmq tracker run and kmq work set the SDK up from OTEL_* (the chart's otel values); the lag job makes no spans.
    assert ("otel-sdk" in extras) == (target == "runtime")


@pytest.mark.parametrize("target", ["runtime", "spark"])
def test_final_stages_run_confluent_kafka_which_they_install(target):
    env = stage_env(STAGES, target)
    assert env.get("KMQ_KAFKA__CLIENT") == "confluent", env
    # The name is kmq's own override of kafka.client: kmq tracker run, kmq work and the lag job read it so.
    assert Config.load(None, env={k: v for k, v in env.items() if k.startswith("KMQ_")}).kafka.client == "confluent"
    (install,) = [r for r in BY_NAME[target].all("RUN") if "pip install" in r.text]
    assert "confluent" in re.search(r"kmq-\*\.whl\)\[([a-z,-]+)\]", install.text).group(1).split(",")
    assert Config.load(None, env={}).kafka.client == "kafka-python"  # the library's own default stays


@pytest.mark.parametrize("target", ["runtime", "spark"])
def test_final_stages_run_as_a_numeric_non_root_user(target):
    user = BY_NAME[target].last("USER").text
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, user
    groupadd = " ".join(r.text for s in lineage(STAGES, target) for r in s.all("RUN"))
    assert f"--uid {uid}" in groupadd


def test_runtime_image_has_no_build_tools():
    for stage in lineage(STAGES, "runtime"):
        for ins in stage.all("RUN"):
            assert "apt-get install" not in ins.text, f"{stage.name}: {ins.text}"
            assert not BUILD_TOOLS.search(ins.text), f"{stage.name}: {ins.text}"
        for ins in stage.all("COPY"):
            flags, _ = ins.flags()
            assert "from" not in flags, f"{stage.name} copies build output: {ins.text}"


def test_runtime_entrypoint_is_kmq_and_default_command_runs_the_tracker():
    rt = BY_NAME["runtime"]
    assert exec_form(rt.last("ENTRYPOINT")) == ["kmq"]
    assert exec_form(rt.last("CMD")) == ["tracker", "run", "--config", "/etc/kmq/kmq.yaml"]
    assert rt.last("EXPOSE").text == "9108"


def test_spark_target_has_a_headless_jre_and_its_entry_point():
    spark = BY_NAME["spark"]
    apt = " ".join(r.text for r in spark.all("RUN") if "apt-get" in r.text)
    assert "openjdk-17-jre-headless" in apt and "--no-install-recommends" in apt and "rm -rf /var/lib/apt/lists/*" in apt
    envs = " ".join(e.text for e in spark.all("ENV"))
    assert "JAVA_HOME=" in envs and "SPARK_HOME=" in envs
    assert exec_form(spark.last("ENTRYPOINT")) == ["/opt/kmq/entrypoint.sh"]
    assert exec_form(spark.last("CMD"))[0] == "lag-job"


def test_copied_sources_exist_and_are_in_the_build_context():
    for stage in STAGES:
        for ins in stage.all("COPY"):
            flags, rest = ins.flags()
            if "from" in flags:
                continue
            for src in rest.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: missing"
                assert not dockerignore_excludes(src), f"COPY {src}: excluded by .dockerignore"
    for junk in ("tests", ".venv", ".git", "docs", "kmq/__pycache__", "helm"):
        assert dockerignore_excludes(junk), f".dockerignore lets {junk} into the build context"


def test_no_secrets_baked_into_the_image():
    text = DOCKERFILE.read_text()
    assert not re.search(r"(?i)(password|secret|token)\s*=", text)


# ------------------------------------------------------------------ spark entry point
@pytest.fixture
def stub_env(tmp_path):
    """PATH with a stub `kmq`, SPARK_HOME with a stub spark-submit: each prints its argv."""
    bin_dir = tmp_path / "bin"
    spark_bin = tmp_path / "spark" / "bin"
    for d in (bin_dir, spark_bin):
        d.mkdir(parents=True)
    for path, name in ((bin_dir / "kmq", "kmq"), (spark_bin / "spark-submit", "spark-submit")):
        path.write_text(f'#!/bin/sh\necho {name} "$@"\n')
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SPARK_HOME": str(tmp_path / "spark"),
            "SPARK_DRIVER_BIND_ADDRESS": "10.1.2.3"}


ENTRY = ROOT / "deploy" / "docker" / "spark-entrypoint.sh"


def test_spark_entrypoint_runs_kmq_by_default(stub_env):
    out = subprocess.run([str(ENTRY), "lag-job", "--config", "x"], env=stub_env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "kmq lag-job --config x"


def test_spark_entrypoint_speaks_the_spark_on_kubernetes_driver_contract(stub_env):
    out = subprocess.run([str(ENTRY), "driver", "--properties-file", "/opt/spark/conf/spark.properties",
                          "local:///opt/kmq/lag_job.py", "--config", "x"], env=stub_env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["spark-submit", "--conf", "spark.driver.bindAddress=10.1.2.3",
                                  "--conf", "spark.executorEnv.SPARK_DRIVER_POD_IP=10.1.2.3", "--deploy-mode", "client",
                                  "--properties-file", "/opt/spark/conf/spark.properties", "local:///opt/kmq/lag_job.py",
                                  "--config", "x"]


def test_lag_job_main_file_runs_kmq_lag_job(monkeypatch):
    import kmq.cli

    seen = []
    monkeypatch.setattr(kmq.cli, "main", lambda argv: seen.append(argv))
    monkeypatch.setattr(sys, "argv", ["lag_job.py", "--config", "/etc/kmq/kmq.yaml", "--sink", "prometheus"])
    runpy.run_path(str(ROOT / "deploy" / "docker" / "lag_job.py"), run_name="__main__")
    assert seen == [["lag-job", "--config", "/etc/kmq/kmq.yaml", "--sink", "prometheus"]]
