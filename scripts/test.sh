#!/usr/bin/env bash
# Run the kmq test suite on this machine from a clean clone:
#   ./scripts/test.sh [pytest args]
# Creates/uses .venv, installs kmq with its extras, installs Debian's
# redis-server, promtool, chromium, stunnel, a Java runtime and Maven when missing (as root),
# then runs pytest. Integration tests run on Apache Kafka (kmq.dev.kafka, resolved from Maven
# Central once); KMQ_TEST_BROKER=tansu runs them on the embedded broker instead, and
# KMQ_TEST_BOOTSTRAP=host:port on any broker you run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-env.sh
ensure_venv
ensure_redis
ensure_promtool
ensure_chromium
ensure_stunnel
export KMQ_TEST_BROKER="${KMQ_TEST_BROKER:-kafka}"
if [ "$KMQ_TEST_BROKER" = kafka ] && [ -z "${KMQ_TEST_BOOTSTRAP:-}" ]; then
  ensure_java
  ensure_kafka
fi
# Everything but Spark on two test processes (pytest-xdist; KMQ_TEST_WORKERS to change, 0 for one
# process): most integration tests wait on the broker, not the CPU. Each process starts its own
# embedded broker and Redis. Then the Spark tests on their own, in one process: their JVM needs
# both cores for its micro-batches, and they share one SparkSession. With arguments, one pytest
# run with them (a later -n in them wins).
workers="${KMQ_TEST_WORKERS:-2}"
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -n "$workers" "$@"
fi
rc=0
.venv/bin/python -m pytest -n "$workers" -m "not spark" || rc=$?
.venv/bin/python -m pytest -n 0 -m spark || { r=$?; [ "$rc" -ne 0 ] || rc=$r; }
exit "$rc"
