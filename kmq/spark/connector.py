"""Spark's own Kafka connector (``spark-sql-kafka-0-10``) for the lag job's launcher.

The connector is not part of pyspark. When ``kmq lag-job`` starts its own Spark
(not under ``spark-submit``) with ``spark.source: kafka``, the launcher asks Spark to
resolve it (``spark.jars.packages``, Spark's Ivy) at the version of the installed
pyspark, into a cache outside any project: ``spark.jars_cache`` or
``~/.cache/kmq/spark-jars``, one folder per Spark version. The first start downloads
it from ``spark.maven_repository`` (Maven Central by default) and, once Spark runs,
notes the resolved jars (:func:`mark_cached`); every later start puts those files on
the classpath directly (``spark.jars``, :func:`cached_conf`): no Ivy, no network and
no write, so a filled cache also works read-only (the Spark image carries one).

Decisions are pure (:attr:`Connector.coordinate`, :func:`ivy_settings`,
:func:`session_conf`); the edges are :func:`installed` (pyspark's version),
:func:`prepare` (writes the Ivy settings file), :func:`mark_cached` / :func:`is_cached`
and :func:`check_reachable` (one HTTP request, made only while nothing is cached, so a
machine that cannot reach the repository gets one clear line instead of Ivy's report).

``python -m kmq.spark.connector [CACHE]`` fills the cache (the Spark image does this
at build time) and prints the folder whose ``jars/`` hold the connector and its
dependencies.
"""

from __future__ import annotations

import logging
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

from kmq.core.errors import KmqError

__all__ = ["Connector", "ConnectorUnavailable", "installed", "default_cache", "home", "is_cached", "mark_cached",
           "cached_conf", "ivy_settings", "session_conf", "prepare", "check_reachable", "CONNECTOR_CLASS", "PROVIDED",
           "CACHED_NOTE"]

log = logging.getLogger(__name__)

#: The class Spark's ``format("kafka")`` resolves to; present once the connector is on the classpath.
CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
#: Dependencies of the connector that every pyspark already ships in its ``jars/`` (about 60 MB):
#: left out of the resolution, so they are neither downloaded nor on the classpath twice.
PROVIDED = ("org.apache.hadoop:hadoop-client-runtime", "org.apache.hadoop:hadoop-client-api")


class ConnectorUnavailable(KmqError):
    """Spark's Kafka connector is neither cached nor obtainable from the Maven repository."""


@dataclass(frozen=True)
class Connector:
    """``org.apache.spark:spark-sql-kafka-0-10_<scala>:<spark>``: it must match the Spark it runs in."""

    spark_version: str
    scala_version: str = "2.13"

    @property
    def artifact(self) -> str:
        return f"spark-sql-kafka-0-10_{self.scala_version}"

    @property
    def coordinate(self) -> str:
        return f"org.apache.spark:{self.artifact}:{self.spark_version}"

    @property
    def jar_name(self) -> str:
        """The connector's file name in the folder Spark's Ivy copies resolved jars to."""
        return f"org.apache.spark_{self.artifact}-{self.spark_version}.jar"

    def pom_url(self, repository: str) -> str:
        return f"{repository.rstrip('/')}/org/apache/spark/{self.artifact}/{self.spark_version}/" \
               f"{self.artifact}-{self.spark_version}.pom"


def installed() -> Connector:
    """The connector matching the installed pyspark (its version, and Scala from its scala-library jar)."""
    import pyspark

    scala = "2.13"
    jars = Path(pyspark.__file__).parent / "jars"
    for jar in jars.glob("scala-library-*.jar"):
        scala = ".".join(jar.name[len("scala-library-"):].split(".")[:2])
    return Connector(pyspark.__version__, scala)


def default_cache() -> Path:
    """``~/.cache/kmq/spark-jars`` (``$XDG_CACHE_HOME/kmq/spark-jars`` when that is set)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kmq" / "spark-jars"


def home(cache: str | os.PathLike | None, connector: Connector) -> Path:
    """The Ivy home of one Spark version inside the cache (``spark.jars_cache``, None: the default):
    ``jars/`` holds what Spark loads, ``cache/`` Ivy's own records."""
    root = Path(cache).expanduser() if cache else default_cache()
    return root / f"spark-{connector.spark_version}_{connector.scala_version}"


#: The note :func:`mark_cached` leaves in a Spark version's folder: the resolved jars, one name a line.
CACHED_NOTE = "kmq-cached-jars.txt"


def _noted_jars(cache: str | os.PathLike | None, connector: Connector) -> list[Path] | None:
    h = home(cache, connector)
    try:
        names = [n for n in (h / CACHED_NOTE).read_text().splitlines() if n.strip()]
    except OSError:
        return None
    jars = [h / "jars" / n for n in names]
    if connector.jar_name not in names or not all(j.is_file() for j in jars):
        return None
    return jars


def is_cached(cache: str | os.PathLike | None, connector: Connector) -> bool:
    """True when an earlier start resolved the connector into the cache and its jars are all there."""
    return _noted_jars(cache, connector) is not None


def mark_cached(cache: str | os.PathLike | None, connector: Connector) -> None:
    """Note the jars Ivy resolved (called once Spark runs with them): later starts load them directly."""
    h = home(cache, connector)
    names = sorted(j.name for j in (h / "jars").glob("*.jar"))
    if connector.jar_name not in names:
        raise ConnectorUnavailable(f"Spark resolved {connector.coordinate} but {connector.jar_name} is not in {h / 'jars'}")
    (h / CACHED_NOTE).write_text("".join(n + "\n" for n in names))


def cached_conf(cache: str | os.PathLike | None, connector: Connector) -> dict[str, str]:
    """The Spark configuration that loads the cached connector: its jars as files, nothing to resolve."""
    jars = _noted_jars(cache, connector)
    if jars is None:
        raise ConnectorUnavailable(f"{connector.coordinate} is not cached in {home(cache, connector)}")
    return {"spark.jars": ",".join(str(j) for j in jars)}


def ivy_settings(repository: str) -> str:
    """Ivy settings with one resolver, the Maven repository. Spark's default chain also reads
    ``~/.m2/repository``, where a POM without its jar (left by an interrupted Maven run) makes
    the whole resolution fail; kmq's cache stands on its own instead."""
    root = repository if repository.endswith("/") else repository + "/"
    return ("<ivysettings>\n"
            '  <settings defaultResolver="kmq-maven"/>\n'
            "  <resolvers>\n"
            f'    <ibiblio name="kmq-maven" m2compatible="true" root={quoteattr(root)}/>\n'
            "  </resolvers>\n"
            "</ivysettings>\n")


def session_conf(connector: Connector, ivy_home: Path, settings_file: Path) -> dict[str, str]:
    """The Spark configuration that puts the connector on the classpath of a Spark being launched."""
    return {
        "spark.jars.packages": connector.coordinate,
        "spark.jars.excludes": ",".join(PROVIDED),
        "spark.jars.ivy": str(ivy_home),
        "spark.jars.ivySettings": str(settings_file),
    }


def prepare(cache: str | os.PathLike | None, repository: str, connector: Connector) -> dict[str, str]:
    """Make the cache folder and its Ivy settings; returns :func:`session_conf` for it."""
    ivy_home = home(cache, connector)
    try:
        ivy_home.mkdir(parents=True, exist_ok=True)
        settings = ivy_home / "ivysettings.xml"
        text = ivy_settings(repository)
        if not settings.is_file() or settings.read_text() != text:
            settings.write_text(text)
    except OSError as exc:
        raise ConnectorUnavailable(
            f"cannot write Spark's Kafka connector cache {ivy_home}: {exc.strerror}; set spark.jars_cache "
            "(KMQ_SPARK__JARS_CACHE) to a writable folder") from None
    return session_conf(connector, ivy_home, settings)


def check_reachable(repository: str, connector: Connector, cache: str | os.PathLike | None,
                    timeout: float = 10.0) -> None:
    """Fail with the cause and the fixes when the connector's POM cannot be fetched (nothing cached)."""
    url = connector.pom_url(repository)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise ConnectorUnavailable(
                f"Spark's Kafka connector {connector.coordinate} does not exist in {repository} (HTTP 404): install "
                "a pyspark whose connector is published (docs/spark.md names the tested one), or set "
                "spark.source: python (the kmq-kafka source needs no jars)") from None
        reason = f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = str(getattr(exc, "reason", exc))
    raise ConnectorUnavailable(
        f"Spark's Kafka connector {connector.coordinate} is not cached in {home(cache, connector)} and "
        f"{repository} cannot be reached ({reason}): connect this machine to it once (later starts work offline), "
        "point spark.maven_repository at a reachable mirror, copy a filled cache there (spark.jars_cache), "
        "or set spark.source: python (no jars)") from None


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - thin CLI, run by the image build
    """Fill the cache: resolve the connector with a short-lived local Spark."""
    args = sys.argv[1:] if argv is None else argv
    from kmq.config import MAVEN_CENTRAL

    cache = args[0] if args else None
    repository = os.environ.get("KMQ_SPARK__MAVEN_REPOSITORY", MAVEN_CENTRAL)
    c = installed()
    if is_cached(cache, c):
        print(home(cache, c))
        return 0
    check_reachable(repository, c, cache)
    conf = prepare(cache, repository, c)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = SparkSession.builder.master("local[1]").appName("kmq-fetch-connector").config("spark.ui.enabled", "false")
    for k, v in conf.items():
        b = b.config(k, v)
    b.getOrCreate().stop()
    mark_cached(cache, c)
    print(conf["spark.jars.ivy"])
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
