#!/usr/bin/env bash
# Run the kmq test suite on this machine from a clean clone:
#   ./scripts/test.sh [pytest args]
# Creates/uses .venv, installs kmq with its extras, installs Debian's
# redis-server, promtool, chromium and stunnel when missing (as root), then runs pytest. Integration tests
# use the embedded tansu broker unless KMQ_TEST_BOOTSTRAP=host:port is set.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-env.sh
ensure_venv
ensure_redis
ensure_promtool
ensure_chromium
ensure_stunnel
# Two test processes (pytest-xdist): most integration tests wait on the broker, not the CPU.
# Each process starts its own embedded broker and Redis; the Spark tests share one process
# (conftest.py groups them) so two JVMs never compete. KMQ_TEST_WORKERS=0 runs in one process;
# a later -n in the arguments wins.
exec .venv/bin/python -m pytest -n "${KMQ_TEST_WORKERS:-2}" --dist loadgroup "$@"
