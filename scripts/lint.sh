#!/usr/bin/env bash
# Lint and type-check kmq; scripts/test.sh runs it first (a few seconds):
#   scripts/lint.sh
# 1. ruff check over kmq, tracker, tests, examples and scripts ([tool.ruff] in pyproject.toml:
#    pyflakes, pycodestyle, bugbear);
# 2. mypy over kmq and tracker ([tool.mypy]: strict on the public modules).
# Both run, so one run lists every finding. The tools are the dev extra's pinned ones, in .venv
# (scripts/setup-env.sh ensure_venv installs them); VENV_PYTHON=path/to/python uses another
# environment's. Exit status: 0 clean, 1 findings (listed above), 2 tools missing.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,9s/^# \{0,1\}//p' "$0"; exit 0 ;;
esac
py="${VENV_PYTHON:-.venv/bin/python}"
if ! "$py" -c 'import mypy, ruff' 2>/dev/null; then
  echo "lint: ruff or mypy is not installed for $py: run scripts/test.sh once (it installs the dev extra)," \
       "or pip install -e '.[dev]'" >&2
  exit 2
fi
failed=()
echo "==> ruff check kmq tracker tests examples scripts" >&2
"$py" -m ruff check --quiet kmq tracker tests examples scripts || failed+=("ruff (fix what it lists; 'ruff check --fix' does the safe ones)")
echo "==> mypy (kmq, tracker)" >&2
"$py" -m mypy || failed+=("mypy (annotate; docs/development.md, \"Types and lint\")")
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'lint failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "lint: clean" >&2
