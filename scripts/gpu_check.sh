#!/usr/bin/env bash
# The GPU checks, as one command for a CUDA machine: the tests marked `gpu` (among them streaming a model
# larger than its budget and prefetch on a side stream: tests/offload/test_gpu_streaming.py), then the GPU
# offload benchmark. Logs go to $OUT (or ./gpu-logs). It uses the machine's python3 and torch as they are.
#
# A machine without diffusers: put its wheel (and any other missing ones) in .whl/ first, e.g.
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl diffusers==0.42.1
# and this script installs them with --no-deps before running.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-gpu-logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-deps .whl/*.whl 2>&1 | tee "$LOGS/install.log"
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$LOGS/device.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
status=0
"$PY" -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee "$LOGS/gpu-tests.log" || status=1
"$PY" benchmarks/gpu_offload.py 2>&1 | tee "$LOGS/gpu-offload.records.log" || status=1
exit $status
