"""The spark-operator runs the image's Spark: spec.sparkVersion of the chart's SparkApplication
and of deploy/k8s/lag-job-operator equals the pyspark the image installs (the Dockerfile's
PYSPARK_VERSION, inside the `spark` extra's range; the suite's install uses the same), and so
does every spark-sql-kafka package the tests render."""

from __future__ import annotations

import re
import subprocess
import tomllib

import yaml
from packaging.requirements import Requirement

from tests.deploy.conftest import ROOT, find, render, vd


def _pinned_pyspark() -> str:
    """The pyspark the Spark image installs and the suite is tested with."""
    (version,) = re.findall(r"^ARG PYSPARK_VERSION=([0-9.]+)$", (ROOT / "deploy/docker/Dockerfile").read_text(), re.M)
    return version


def test_the_spark_extra_takes_a_range_that_holds_the_image_pyspark():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pyspark,) = [Requirement(d) for d in extras["spark"] if d.startswith("pyspark")]
    # A range, so a user installs the pyspark of their cluster's Spark; the image's is one of them.
    assert not any(spec.operator == "==" for spec in pyspark.specifier), pyspark
    assert pyspark.specifier.contains(_pinned_pyspark()), (pyspark, _pinned_pyspark())


def test_the_suite_installs_the_image_pyspark():
    out = subprocess.run(["bash", "-c", "source scripts/setup-env.sh && tested_pyspark"], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == _pinned_pyspark(), out.stdout + out.stderr
    assert '"pyspark==$(tested_pyspark)"' in (ROOT / "scripts/setup-env.sh").read_text()


def test_chart_spark_version_is_the_pinned_pyspark():
    docs = render({"sparkJob": {"enabled": True, "mode": "operator"}})
    assert find(docs, "SparkApplication")["spec"]["sparkVersion"] == _pinned_pyspark()


def test_plain_manifest_spark_version_is_the_pinned_pyspark():
    app = yaml.safe_load((ROOT / "deploy/k8s/lag-job-operator/sparkapplication.yaml").read_text())
    assert app["spec"]["sparkVersion"] == _pinned_pyspark()


def test_spark_kafka_packages_in_values_sets_match_the_pinned_pyspark():
    for name, values in vd.values_sets().items():
        for package in ((values.get("sparkJob") or {}).get("operator") or {}).get("packages", []):
            if "spark-sql-kafka" in package:
                assert package.rsplit(":", 1)[1] == _pinned_pyspark(), f"{name}: {package}"


def _image_jars() -> str:
    """Where the image's connector jars are (deploy/docker/Dockerfile fills /opt/kmq/spark-jars)."""
    from kmq.spark import connector as cn

    return str(cn.home("/opt/kmq/spark-jars", cn.Connector(_pinned_pyspark())) / "jars" / "*")


def test_source_kafka_on_the_operator_loads_the_connector_the_image_carries():
    docs = render({"sparkJob": {"enabled": True, "mode": "operator"}})  # source kafka, the default
    spec = find(docs, "SparkApplication")["spec"]
    assert spec["arguments"][spec["arguments"].index("--source") + 1] == "kafka"
    assert spec["sparkConf"]["spark.driver.extraClassPath"] == spec["sparkConf"]["spark.executor.extraClassPath"] \
        == _image_jars()
    app = yaml.safe_load((ROOT / "deploy/k8s/lag-job-operator/sparkapplication.yaml").read_text())
    assert app["spec"]["sparkConf"]["spark.driver.extraClassPath"] == _image_jars()
    # Packages resolved at submission, or the Python source: no class path of the image's jars.
    for values in ({"packages": ["org.apache.spark:spark-sql-kafka-0-10_2.13:" + _pinned_pyspark()]}, None):
        sj = {"enabled": True, "mode": "operator", **({"operator": values} if values else {"source": "python"})}
        conf = find(render({"sparkJob": sj}), "SparkApplication")["spec"]["sparkConf"]
        assert "spark.driver.extraClassPath" not in conf
