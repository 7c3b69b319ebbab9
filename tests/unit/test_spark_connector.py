"""The lag job's launcher for Spark's Kafka connector: coordinates, the jars cache, Ivy's settings,
and the one clear error when nothing is cached and the Maven repository cannot be reached
(nothing here starts Spark)."""

from __future__ import annotations

import http.server
import socket
import threading
import xml.etree.ElementTree as ET

import pytest

from kmq.config import MAVEN_CENTRAL, Config, SparkConfig
from kmq.spark import connector as cn

C = cn.Connector("4.2.0", "2.13")


def test_the_connector_is_named_after_spark_and_scala():
    assert C.coordinate == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    assert C.jar_name == "org.apache.spark_spark-sql-kafka-0-10_2.13-4.2.0.jar"
    assert C.pom_url("https://repo.example/m2") == (
        "https://repo.example/m2/org/apache/spark/spark-sql-kafka-0-10_2.13/4.2.0/spark-sql-kafka-0-10_2.13-4.2.0.pom")


def test_the_installed_pyspark_names_the_connector():
    pyspark = pytest.importorskip("pyspark")
    c = cn.installed()
    assert (c.spark_version, c.scala_version) == (pyspark.__version__, "2.13")


def test_config_defaults_to_spark_s_connector_from_maven_central():
    assert Config.from_dict({}).spark == SparkConfig("kafka", None, MAVEN_CENTRAL)
    cfg = Config.from_dict({"spark": {"source": "Python", "jars_cache": "/opt/jars"}},
                           env={"KMQ_SPARK__MAVEN_REPOSITORY": "https://mirror.example/maven2"})
    assert cfg.spark == SparkConfig("python", "/opt/jars", "https://mirror.example/maven2")


def test_ivy_resolves_from_the_repository_alone():
    root = ET.fromstring(cn.ivy_settings('https://m.example/a&b'))
    (resolver,) = root.find("resolvers")
    assert resolver.get("root") == "https://m.example/a&b/" and resolver.get("m2compatible") == "true"
    assert root.find("settings").get("defaultResolver") == resolver.get("name")


def test_prepare_makes_one_ivy_home_per_spark_version(tmp_path):
    conf = cn.prepare(tmp_path, "https://m.example/", C)
    home = tmp_path / "spark-4.2.0_2.13"
    assert conf == {"spark.jars.packages": C.coordinate, "spark.jars.excludes": ",".join(cn.PROVIDED),
                    "spark.jars.ivy": str(home), "spark.jars.ivySettings": str(home / "ivysettings.xml")}
    assert (home / "ivysettings.xml").read_text() == cn.ivy_settings("https://m.example/")
    assert not cn.is_cached(tmp_path, C)
    (home / "jars").mkdir()
    with pytest.raises(cn.ConnectorUnavailable, match="is not in"):
        cn.mark_cached(tmp_path, C)  # Ivy copied nothing
    for name in (C.jar_name, "org.apache.kafka_kafka-clients-3.9.2.jar"):
        (home / "jars" / name).write_bytes(b"PK")
    assert not cn.is_cached(tmp_path, C)  # jars without the note: maybe cut short, resolve again
    cn.mark_cached(tmp_path, C)
    assert cn.is_cached(tmp_path, C) and not cn.is_cached(tmp_path, cn.Connector("4.3.0"))
    assert cn.cached_conf(tmp_path, C) == {"spark.jars": ",".join(
        str(home / "jars" / n) for n in ("org.apache.kafka_kafka-clients-3.9.2.jar", C.jar_name))}
    (home / "jars" / "org.apache.kafka_kafka-clients-3.9.2.jar").unlink()
    assert not cn.is_cached(tmp_path, C)  # a noted jar went missing


def test_the_default_cache_lives_outside_the_project(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cn.home(None, C) == tmp_path / "kmq" / "spark-jars" / "spark-4.2.0_2.13"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert str(cn.home(None, C)).endswith(".cache/kmq/spark-jars/spark-4.2.0_2.13")


def test_an_unreachable_repository_with_nothing_cached_is_one_clear_error(tmp_path):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(cn.ConnectorUnavailable) as err:
        cn.check_reachable(f"http://127.0.0.1:{port}/maven2/", C, tmp_path, timeout=2)
    text = str(err.value)
    assert C.coordinate in text and str(tmp_path / "spark-4.2.0_2.13") in text
    assert "cannot be reached" in text and "spark.maven_repository" in text and "spark.source: python" in text


@pytest.fixture
def repository():
    """A loopback Maven repository holding one POM: the connector of Spark 4.2.0."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200 if self.path.endswith("spark-sql-kafka-0-10_2.13-4.2.0.pom") else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/maven2"
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def test_a_spark_version_without_a_published_connector_is_named(repository, tmp_path):
    cn.check_reachable(repository, C, tmp_path)  # published: no error
    with pytest.raises(cn.ConnectorUnavailable, match=r"spark-sql-kafka-0-10_2\.13:4\.3\.0 does not exist in .*404"):
        cn.check_reachable(repository, cn.Connector("4.3.0"), tmp_path)


def test_the_launcher_asks_the_repository_only_while_nothing_is_cached(tmp_path):
    pytest.importorskip("pyspark")
    from kmq.spark.job import _connector_conf

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    offline = SparkConfig(jars_cache=str(tmp_path), maven_repository=f"http://127.0.0.1:{port}/")
    with pytest.raises(cn.ConnectorUnavailable, match="cannot be reached"):
        _connector_conf(offline, {})
    c = cn.installed()
    (cn.home(tmp_path, c) / "jars").mkdir(parents=True)
    (cn.home(tmp_path, c) / "jars" / c.jar_name).write_bytes(b"PK")
    cn.mark_cached(tmp_path, c)
    got, conf, resolving = _connector_conf(offline, {"spark.jars": "/opt/extra.jar"})
    jar = cn.home(tmp_path, c) / "jars" / c.jar_name
    assert (got, conf, resolving) == (c, {"spark.jars": f"/opt/extra.jar,{jar}"}, False)  # no Ivy, no network
