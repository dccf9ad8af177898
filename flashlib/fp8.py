"""FP8 attention as FlashAttention-3 does it: scaled e4m3 inputs, and the Hadamard rotation.

float8_e4m3fn has 3 fraction bits and a largest value of 448, so a tensor is stored scaled:
``X ~ X_q * s`` with ``s = max|X| / 448`` for the whole tensor (per-tensor scaling) or one
``s`` per block of rows (per-block scaling, FlashAttention-3's "block quantization": one scale
per B_r rows of Q and per B_c rows of K and V, the tiles the kernel loads).  Outlier features,
a few entries far larger than the rest, are the trouble: the rounding error of an outlier
coordinate lands where the scores are most sensitive.  "Incoherent processing" multiplies Q and
K by the same random orthogonal matrix ``M`` (a Hadamard matrix with random signs), which
leaves ``Q K^T = (Q M)(K M)^T`` unchanged and spreads each outlier over every coordinate
before the cast (Shah et al. 2024, FlashAttention-3; its Section 4.3, Table 3, reports RMSE
9.1e-3 with both against 2.4e-2 for baseline FP8 attention).

:func:`fp8_attention` is FlashAttention-2's loop
(:func:`flashlib.precision.flash2_forward_with_casts`) on the quantised inputs, with ``P``
cast to e4m3 before the ``P V`` matmul and everything else (S, m, l, the accumulator) in
float32; :func:`fp8_study` compares the four combinations on inputs with outliers.
Needs ``ml_dtypes`` (through :mod:`flashlib.precision`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from flashlib._validate import check_int, check_rng
from flashlib.accuracy import ErrorStats, error_stats
from flashlib.precision import (
    Casts,
    _attention,
    _carrier,
    _check_qkv,
    as_dtype,
    number_line,
    random_inputs,
    saturate_to,
)

__all__ = [
    "FP8",
    "hadamard",
    "random_hadamard",
    "quantize",
    "fp8_attention",
    "FP8Row",
    "fp8_study",
    "scores_unchanged",
]

#: The FP8 format of FlashAttention-3's forward pass.
FP8 = "float8_e4m3fn"


def hadamard(d: int) -> np.ndarray:
    """The d x d Sylvester Hadamard matrix (entries +-1, ``H H^T = d I``); d a power of 2."""
    d = check_int(d, "d", minimum=1)
    if d & (d - 1):
        raise ValueError(f"d must be a power of 2 for a Hadamard matrix, got {d}")
    H = np.ones((1, 1))
    while H.shape[0] < d:
        H = np.block([[H, H], [H, -H]])
    return H


def random_hadamard(d: int, rng: np.random.Generator) -> np.ndarray:
    """M = diag(signs) H / sqrt(d): orthogonal (M M^T = I), random signs from ``rng``.

    Q M (K M)^T = Q M M^T K^T = Q K^T: the scores are unchanged.  (d, d), float64.
    """
    H = hadamard(d)
    signs = check_rng(rng).choice([-1.0, 1.0], size=d)
    return signs[:, None] * H / math.sqrt(d)


def quantize(X: Any, dtype: Any = FP8, block: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Scaled cast: ``X ~ X_q * s``, X_q holding values of ``dtype`` (saturated, never NaN).

    s = max|X| / max(dtype) for the whole tensor (``block=None``) or for each block of
    ``block`` rows.  X: (n, d) -> X_q: (n, d) float64, s: (n, 1) float64 (each row its
    block's scale; an all-zero block gets s = 1).
    """
    X = _carrier(X, "X")
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D (n, d) array, got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X must be finite")
    top = number_line(as_dtype(dtype)).max
    n = X.shape[0]
    size = n if block is None else check_int(block, "block", minimum=1)
    s = np.ones((n, 1))
    for i in range(0, n, size):
        amax = float(np.max(np.abs(X[i : i + size]), initial=0.0))
        s[i : i + size] = amax / top if amax > 0 else 1.0
    return saturate_to(X / s, dtype), s


def fp8_attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray, *, block_scaling: bool,
                  M: np.ndarray | None = None, B_r: int = 64, B_c: int = 64) -> np.ndarray:
    """FlashAttention-3's FP8 forward, emulated: rotate, quantise, then FlashAttention-2's loop.

    M: the rotation (e.g. :func:`random_hadamard`) or None.  block_scaling: one scale per B_r
    rows of Q and per B_c rows of K and V (else one per tensor).
    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v), float64 (kept in float32).
    """
    if M is not None:
        Q, K = Q @ M, K @ M  # same scores, outliers spread over every coordinate
    Q_q, s_Q = quantize(Q, FP8, B_r if block_scaling else None)
    K_q, s_K = quantize(K, FP8, B_c if block_scaling else None)
    V_q, s_V = quantize(V, FP8, B_c if block_scaling else None)
    # the kernel multiplies S_ij by s_Q s_K and O by s_V; here the inputs are dequantised
    c = Casts(inputs="float32", S="float32", P=FP8, acc="float32", m="float32",
              l="float32", O="float32", compute="float32")
    return _attention(Q_q * s_Q, K_q * s_K, V_q * s_V, c, B_c)


class FP8Row(NamedTuple):
    """One variant of :func:`fp8_study` and its error against float64."""

    label: str
    block_scaling: bool
    rotation: bool
    error: ErrorStats


def fp8_study(n: int = 1024, d: int = 128, *, seed: int = 0, outlier: float = 10.0,
              rate: float = 0.001, B: int = 64) -> list[FP8Row]:
    """FP8 attention's error against float64 with and without per-block scaling and the
    Hadamard rotation, on inputs with outlier features (:func:`~flashlib.precision.random_inputs`
    with ``outlier`` and ``rate``), plus FlashAttention-2 in float16 and bfloat16 for scale.

    n x d inputs from ``np.random.default_rng(seed)`` (the same rng then draws the rotation's
    signs); blocks of B rows (B_r = B_c = B).  Returns one :class:`FP8Row` per variant, the
    baseline (per-tensor, no rotation) first.
    """
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    d = check_int(d, "d", minimum=1)
    Q, K, V = _check_qkv(*random_inputs(n, d, rng, outlier=outlier, rate=rate))
    B = check_int(B, "B", minimum=1)
    M = random_hadamard(d, rng)
    ref = _attention(Q, K, V, Casts.exact(), None)
    rows = []
    for label, block, rotate in (("per-tensor", False, False), ("per-block", True, False),
                                 ("per-tensor + rotation", False, True),
                                 ("per-block + rotation", True, True)):
        O = fp8_attention(Q, K, V, block_scaling=block, M=M if rotate else None, B_r=B, B_c=B)
        rows.append(FP8Row(label, block, rotate, error_stats(O, ref)))
    for dt in ("float16", "bfloat16"):
        O = _attention(Q, K, V, Casts.flash(dt), B)
        rows.append(FP8Row(f"FlashAttention-2, {dt}", False, False, error_stats(O, ref)))
    return rows


def scores_unchanged(Q: Any, K: Any, M: Any) -> float:
    """max |Q K^T - (Q M)(K M)^T|: 0 up to float64 rounding for an orthogonal M."""
    Q, K, M = _carrier(Q, "Q"), _carrier(K, "K"), _carrier(M, "M")
    return float(np.max(np.abs(Q @ K.T - (Q @ M) @ (K @ M).T), initial=0.0))

