#!/usr/bin/env bash
# Run the kmq test suite on this machine from a clean clone:
#   ./scripts/test.sh [pytest args]
# Creates/uses .venv, installs kmq with its extras, runs scripts/lint.sh (ruff and mypy: a finding
# fails the run before any test; KMQ_LINT=0 skips it for a quick rerun), installs Debian's
# redis-server, promtool, chromium, stunnel, a Java runtime and Maven when missing (as root),
# then runs pytest. The suite runs on Apache Kafka 4.2 (kmq.dev.kafka, resolved from Maven Central
# once): one broker per test process, three-broker clusters for the cluster-fault tests; then the
# Spark tests on it; then the embedded tansu broker's own tests (below). KMQ_TEST_BROKER=tansu runs
# the whole suite on tansu instead, KMQ_TEST_BOOTSTRAP=host:port on any broker.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-env.sh
ensure_venv
if [ "${KMQ_LINT:-1}" != 0 ]; then
  ./scripts/lint.sh || { echo "scripts/test.sh: stopped by scripts/lint.sh (the findings are above); no test ran" >&2; exit 1; }
fi
ensure_redis
ensure_promtool
ensure_chromium
ensure_stunnel
if [ -z "${KMQ_TEST_BOOTSTRAP:-}" ]; then
  ensure_java
  ensure_kafka
fi
# Everything but Spark on two test processes (pytest-xdist; KMQ_TEST_WORKERS to change, 0 for one
# process): most integration tests wait on the broker, not the CPU. Each process starts its own
# broker and Redis. Then the Spark tests on their own, in one process: their JVM needs
# both cores for its micro-batches, and they share one SparkSession. With arguments, one pytest
# run with them (a later -n in them wins).
workers="${KMQ_TEST_WORKERS:-2}"
[ -n "${KMQ_TEST_BOOTSTRAP:-}" ] || export KMQ_TEST_BROKER="${KMQ_TEST_BROKER:-kafka}"
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -n "$workers" "$@"
fi
# What only the embedded broker shows: the demo and the dev broker it runs on, and the tests whose
# premise only tansu gives (a broker that reports no topic configs, or has no CreatePartitions).
TANSU_PHASE=(tests/integration/test_demo.py
             tests/integration/test_topics.py::test_markers_topic_with_fewer_partitions_is_a_clear_error
             tests/integration/test_large_records.py::test_a_record_too_large_for_the_tracker_leaves_a_reference_dead_letter)
rc=0
note() { r=$?; [ "$rc" -ne 0 ] || rc=$r; }
if [ -n "${KMQ_TEST_BOOTSTRAP:-}" ] || [ "$KMQ_TEST_BROKER" = tansu ]; then
  .venv/bin/python -m pytest -n "$workers" -m "not spark" || note
  .venv/bin/python -m pytest -n 0 -m spark || note
else
  .venv/bin/python -m pytest -n "$workers" -m "not spark" || note
  .venv/bin/python -m pytest -n 0 -m spark || note
  KMQ_TEST_BROKER=tansu .venv/bin/python -m pytest -n "$workers" "${TANSU_PHASE[@]}" || note
fi
exit "$rc"
