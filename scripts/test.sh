#!/usr/bin/env bash
# Sets up, then lints (ruff), type-checks (mypy, configured in pyproject.toml) and runs the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
VENV="${VENV:-.venv}"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
# Two workers (TEST_WORKERS=0: one process); tests/conftest.py groups them so each file stays on one.
"$VENV/bin/python" -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadgroup "$@"
