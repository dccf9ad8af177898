"""The known traps of running attention kernels, each measured rather than asserted.

- Triton's interpreter computes bfloat16 ``tl.dot`` silently wrong (triton-lang/triton#11584):
  numpy has no bfloat16, so the interpreter stores bfloat16 values as their raw 16 bits
  (uint16) and its ``tl.dot`` is ``np.matmul`` of those bit patterns, integers in the tens of
  thousands.  :func:`interpreter_bf16_dot` runs one and shows that the result is exactly the
  product of the bit patterns; the kernels refuse bfloat16 in the interpreter for that reason.
- float32 ``tl.dot`` uses TF32 by default on NVIDIA GPUs (Ampere on): inputs rounded to 10
  mantissa bits.  The interpreter ignores ``input_precision`` (numpy multiplies in float32),
  so the TF32 error cannot be seen there; :func:`round_to_tf32` emulates the rounding in
  numpy to measure it.  The kernels pass ``input_precision="ieee"`` for float32.
- A kernel that uses ``exp2`` (scores times log2(e)) keeps its logsumexp in base 2:
  ``m2 + log2(l) = lse * log2(e)``.  The forward kernel converts it to the natural log before
  storing it, the backward converts back (:func:`lse_to_base2`, :func:`lse_from_base2`).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from flashlib.core.constants import LN2, LOG2E
from flashlib.gpu.device import require_kernels

__all__ = ["interpreter_bf16_dot", "round_to_tf32", "tf32_matmul_error", "lse_to_base2",
           "lse_from_base2"]


@triton.jit
def _dot_kernel(A, B, C, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """C = A @ B for one (M, K) x (K, N) block, accumulated in float32."""
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(A + rm[:, None] * K + rk[None, :])
    b = tl.load(B + rk[:, None] * N + rn[None, :])
    tl.store(C + rm[:, None] * N + rn[None, :], tl.dot(a, b))


def interpreter_bf16_dot(size: int = 16, seed: int = 0) -> dict[str, float]:
    """Multiply two random (size, size) bfloat16 blocks with ``tl.dot`` (in the interpreter
    without a GPU, compiled on one) and compare.

    Returns ``max_error`` (against the exact product of the bfloat16 values), ``max_exact``
    (the largest entry of that product) and ``bits_error``: the distance from the product of
    the raw bit patterns (uint16 as integers), 0 when the interpreter's bug is what happened.
    """
    caps = require_kernels()
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=g).to(torch.bfloat16)
    b = torch.randn(size, size, generator=g).to(torch.bfloat16)
    c = torch.empty(size, size, dtype=torch.float32)
    if caps.mode == "cuda":
        a, b, c = a.cuda(), b.cuda(), c.cuda()
    _dot_kernel[(1,)](a, b, c, size, size, size)
    got = c.cpu().double().numpy()
    exact = (a.cpu().double() @ b.cpu().double()).numpy()
    bits = (a.cpu().view(torch.int16).numpy().astype(np.uint16).astype(np.float64)
            @ b.cpu().view(torch.int16).numpy().astype(np.uint16).astype(np.float64))
    return {"max_error": float(np.max(np.abs(got - exact))),
            "max_exact": float(np.max(np.abs(exact))),
            "bits_error": float(np.max(np.abs(got - bits)) / np.max(np.abs(bits)))}


def round_to_tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (10 explicit mantissa bits, round to nearest even), as
    tensor cores read float32 matmul inputs by default.  x: any shape -> float32, same shape."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    drop = 13  # float32 has 23 mantissa bits, TF32 keeps 10
    half = np.uint32(1 << (drop - 1))
    keep_odd = (bits >> np.uint32(drop)) & np.uint32(1)
    rounded = (bits + half - np.uint32(1) + keep_odd) & ~np.uint32((1 << drop) - 1)
    finite = np.isfinite(np.asarray(x, dtype=np.float32))
    return np.where(finite, rounded.view(np.float32), x).astype(np.float32)


def tf32_matmul_error(n: int = 128, d: int = 64, seed: int = 0) -> dict[str, float]:
    """Max relative error of Q K^T (n x d by d x n, standard normal) with float32 inputs read
    as TF32 against IEEE float32 products, both against float64: what "ieee" buys."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, d)).astype(np.float32)
    k = rng.standard_normal((n, d)).astype(np.float32)
    exact = q.astype(np.float64) @ k.T.astype(np.float64)
    scale = float(np.max(np.abs(exact)))
    ieee = (q @ k.T).astype(np.float64)
    tf32 = round_to_tf32(q).astype(np.float64) @ round_to_tf32(k).T.astype(np.float64)
    return {"ieee": float(np.max(np.abs(ieee - exact))) / scale,
            "tf32": float(np.max(np.abs(tf32 - exact))) / scale}


def lse_to_base2(lse):
    """The natural logsumexp in the base-2 units an exp2 kernel works in: lse * log2(e)."""
    return lse * LOG2E


def lse_from_base2(lse2):
    """Back from base 2: m2 + log2(l) times ln(2) is the natural logsumexp."""
    return lse2 * LN2
