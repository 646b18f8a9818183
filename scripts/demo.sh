#!/usr/bin/env bash
# Sets up, then runs the main job: the seed's three FLUX.1 workflows (text-to-image, Canny and Depth
# control) on tiny repos built on the fly, on one ComponentsManager under auto offload. Prints the
# manager's table after each workflow and the offload summary; images and memory.png go to ./out.
# Extra arguments go to `modular run` (e.g. --quiet, --steps 4, or a REPO to run instead).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
"${VENV:-.venv}/bin/modular" run --output out "$@"
