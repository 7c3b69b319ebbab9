"""The spark-operator runs the image's Spark: spec.sparkVersion of the chart's SparkApplication
and of deploy/k8s/lag-job-operator equals the pyspark that the `spark` extra pins (what the
image installs), and so does every spark-sql-kafka package the tests render."""

from __future__ import annotations

import re
import tomllib

import yaml

from tests.deploy.conftest import ROOT, find, render, vd


def _pinned_pyspark() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = [d for d in extras["spark"] if d.startswith("pyspark")]
    match = re.fullmatch(r"pyspark==([0-9.]+)", pin)
    assert match, f"the spark extra should pin pyspark exactly (the image's Spark), not {pin!r}"
    return match.group(1)


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
