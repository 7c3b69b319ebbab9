#!/usr/bin/env bash
# The kmq demo on an embedded local broker: ./scripts/demo.sh [kmq demo options]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-env.sh
ensure_venv
ensure_redis
exec .venv/bin/kmq demo "$@"
