#!/usr/bin/env bash
# Sets up, then runs the main job on the built-in default: Stable Diffusion text-to-image on a tiny
# random repo built on the fly; the image is saved under ./out.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
"${VENV:-.venv}/bin/modular" run --out out "$@"
