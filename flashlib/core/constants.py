"""Constants shared by the tiled implementations: exp2 conversion, default tile, compute dtype."""

from __future__ import annotations

import numpy as np

__all__ = ["LOG2E", "LN2", "BLOCK_Q", "BLOCK_K", "compute_dtype"]

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) = log2(x) * LN2

# The default tile B_r x B_c of every tiled function (flash_attention, flash_attention_v1,
# flash_attention_backward and the ladder's rungs), chosen from two runs of
#     env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m flashlib.bench cpu \
#         --n 1024 4096 --causal --repeats 5
# (Intel Xeon with AVX-512, 2 cores shared with other work, load average 5 to 7; one thread,
# OpenBLAS 0.3.31 SkylakeX kernel, 8 heads, d = 64, float32): flash_attention's GFLOP/s as a
# percentage of numpy's single-thread sgemm peak measured in the same run (run 1 / run 2),
# against PyTorch SDPA's percentage of torch's own peak in the same runs.
#
#     B_r x B_c         64x64      128x64     64x128     128x128    256x128    128x256    SDPA
#     n = 1024        52.9/52.4  54.4/53.8  55.5/57.5  58.1/57.0  59.2/58.3  52.5/51.1  64.5/64.1
#     n = 1024 causal 37.5/43.3  34.8/40.0  37.3/42.3  32.8/37.4  30.8/34.6  29.5/32.3  40.8/43.0
#     n = 4096        56.3/60.0  58.4/61.1  63.0/64.0  62.9/64.8  65.4/64.8  55.3/54.7  68.6/70.7
#     n = 4096 causal 53.3/52.9  53.0/49.2  54.6/53.5  55.2/53.9  52.7/49.6  46.1/44.3  60.9/59.5
#
# 128 x 128 is the default: within 2% of the best from n = 4096 up, causal or not (256 x 128
# is as good without the causal mask, worse with it: a taller block wastes more of its
# diagonal tiles), and the backward's best too (flash_attention_backward at 1.04 to 1.15
# times torch autograd's backward time at 128 x 128, 1.16 at 192 x 128, 1.20 at 128 x 64,
# 1.23 at 64 x 128, in the same runs).  Why it wins: every product of a 128 x 128 tile cut
# into 64-row BLAS calls (64 x 64 x 128 and 64 x 128 x 64 multiply-adds, d = 64) stays below
# the 100**3 multiply-adds that OpenBLAS runs on its small-matrix kernels
# (flashlib.fast.tiles.CALL_MACS), which reach about 0.85 of its large-matrix peak here, while
# the 128 keys per tile halve the per-tile work outside BLAS (adding P V into the accumulator,
# the Python statements) against 64; a 256-key tile needs 32-row calls or the general path,
# both slower.  Short sequences (n = 1024 causal) prefer 64-row blocks (fewer diagonal
# entries computed and masked).  At d = 128 a 64-key tile is the one whose 64-row calls stay
# below the small-matrix limit: flash_attention ran 1.25 times SDPA's time with block_k = 64
# against 1.31 at the default, the backward 1.13 to 1.23 times torch's against 1.27 to 1.36,
# so pass block_k=64 there.  The backward alone, measured again during its rework of December
# 2026 (n = 4096, 8 heads, d = 64, one thread, interleaved medians against 128 x 128): 192 x 128
# within 1%, 256 x 128 1 to 2% slower (also with TILE_BYTES doubled to keep 8 key blocks per
# group), 128 x 192 5 to 6% slower (4096 keys are not whole 192-key blocks), 64 x 128 with 16
# key blocks per group 9 to 10% slower: 128 x 128 stays its default too.
BLOCK_Q = 128
BLOCK_K = 128


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of the running statistics: float32 for float16 inputs (as GPU kernels keep m,
    l and the accumulator in registers in float32), otherwise the input dtype."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)
