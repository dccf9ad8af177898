#!/usr/bin/env bash
# One short run on a CUDA machine (about ten minutes): what a GPU can show and CI cannot.
# Run from the repository root, under a Python that has torch with CUDA and triton
# (flash-attn too, to time it); nothing is installed:
#
#     bash tools/gpu_device_check.sh                     # parity suite, then the full sweep
#     bash tools/gpu_device_check.sh --n 1024 4096 16384 # the sweep's options pass through
#     PYTHON=.venv/bin/python OUT=gpu-out bash tools/gpu_device_check.sh
#
# Writes to $OUT (default ./gpu-out): nvidia-smi.txt, capabilities.txt, parity.txt (the parity
# suite compiled for the GPU, tests/gpu/test_parity.py and the GPU exercises'
# tests/book/exercises/test_gpu.py: the CUDA-only tests no longer skip), bench.txt and
# gpu-bench.json (python -m flashlib.bench gpu; saved every 10 cases, so a sweep cut short by
# its timeout keeps what it measured). Commit gpu-bench.json, renamed to <gpu>-<date>.json, to
# book/data/gpu-bench/: the GPU chapter (book/gpu.md) plots the results recorded there.
set -uo pipefail
OUT=${OUT:-gpu-out}
PY=${PYTHON:-python3}
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
  | tee "$OUT/nvidia-smi.txt"
"$PY" -c "import flashlib.gpu as g; print(g.capabilities().summary())" \
  | tee "$OUT/capabilities.txt"
timeout 200 "$PY" -m pytest tests/gpu/test_parity.py tests/book/exercises/test_gpu.py -q \
  -p no:cacheprovider -rs 2>&1 | tail -60 | tee "$OUT/parity.txt"
timeout 330 "$PY" -m flashlib.bench gpu --warmup-ms 10 --rep-ms 40 --no-progress \
  --out "$OUT/gpu-bench.json" "$@" 2>&1 | tail -80 | tee "$OUT/bench.txt"
ls -l "$OUT"
