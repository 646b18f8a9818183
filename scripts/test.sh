#!/usr/bin/env bash
# Sets up, then lints (ruff), type-checks (mypy, configured in pyproject.toml) and runs the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
VENV="${VENV:-.venv}"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
"$VENV/bin/python" -m pytest -q "$@"
