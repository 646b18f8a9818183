#!/usr/bin/env bash
# Creates the virtual environment (default .venv, or $VENV) and installs the project with its test tools and
# Ray Serve (the extra `ray`: its tests run wherever this script set up; EXTRAS=test leaves Ray out) and the
# video extra (Wan's prompt cleaning and mp4 files).
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    # torch 2.13.0 is the pinned CPU build on our machines; elsewhere any torch>=2.4 works.
    "$VENV/bin/python" -m pip install -q torch==2.13.0 || "$VENV/bin/python" -m pip install -q "torch>=2.4"
fi
"$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[${EXTRAS:-test,ray,video}]"
