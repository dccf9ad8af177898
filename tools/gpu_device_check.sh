#!/usr/bin/env bash
# One short run on a CUDA machine (the device tool's `run`, timeout_s 600): what the GPU can
# show and CI cannot. Run from the repository root under the machine's own python3 (its torch
# and triton; no installs there):
#
#     bash tools/gpu_device_check.sh                     # parity suite, then the full sweep
#     bash tools/gpu_device_check.sh --n 1024 4096 16384 # the sweep's options pass through
#
# Writes to $OUT (the device tool's folder; ./gpu-out otherwise): nvidia-smi.txt,
# capabilities.txt, parity.txt (the compiled parity suite: CUDA-only tests no longer skipped),
# bench.txt and gpu-bench.json (python -m flashlib.bench gpu; saved every 10 cases, so a sweep
# cut short by the timeout keeps what it measured). Commit gpu-bench.json, renamed to
# <gpu>-<date>.json, where the chapter reads recorded results (see /work/plan/chapter-gpu.md).
set -uo pipefail
OUT=${OUT:-gpu-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
  | tee "$OUT/nvidia-smi.txt"
"$PY" -c "import flashlib.gpu as g; print(g.capabilities().summary())" \
  | tee "$OUT/capabilities.txt"
timeout 200 "$PY" -m pytest tests/test_gpu_parity.py tests/test_gpu_exercises.py -q \
  -p no:cacheprovider -rs 2>&1 | tail -60 | tee "$OUT/parity.txt"
timeout 330 "$PY" -m flashlib.bench gpu --warmup-ms 10 --rep-ms 40 --no-progress \
  --out "$OUT/gpu-bench.json" "$@" 2>&1 | tail -80 | tee "$OUT/bench.txt"
ls -l "$OUT"
