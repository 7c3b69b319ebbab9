#!/usr/bin/env bash
# Run the kmq test suite on this machine from a clean clone:
#   ./scripts/test.sh [pytest args]
# Creates/uses .venv, installs kmq with its extras, installs Debian's
# redis-server and stunnel4 when missing (as root), then runs pytest. Integration tests
# use the embedded tansu broker unless KMQ_TEST_BOOTSTRAP=host:port is set.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-env.sh
ensure_venv
ensure_redis
ensure_promtool
ensure_stunnel
exec .venv/bin/python -m pytest "$@"
