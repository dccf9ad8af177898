"""FlashAttention (v1) forward, the library version: Algorithm 1's loop order, batched.

The outer loop runs over key/value blocks ``K_j, V_j`` (loaded into SRAM once), the inner loop
over query blocks.  The output ``O`` and the statistics ``l`` and ``m`` live in HBM: every inner
step reads the block's ``O_i, l_i, m_i``, merges the new tile in, writes them back, and keeps
``O_i`` normalised (Dao et al. 2022, Algorithm 1).  The teaching function is
:func:`flashlib.algorithms.flash1_forward`; :func:`flash_attention_v1` is its library twin.
"""

from __future__ import annotations

import numpy as np

from flashlib.core.constants import BLOCK_K, BLOCK_Q, compute_dtype
from flashlib.core.masks import key_stop, tile_mask
from flashlib.core.problem import Problem, check_no_overflow, check_problem, results_are_finite

__all__ = ["flash_attention_v1"]


def flash_attention_v1(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    causal: bool | str = False,
    mask: np.ndarray | None = None,
    scale: float | None = None,
) -> np.ndarray:
    """Exact attention, Algorithm 1 order: outer loop over K/V blocks, inner over Q blocks.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) -> o: (..., n_q, d_v), q's dtype.
    block_q, block_k: B_r and B_c (default BLOCK_Q x BLOCK_K, as every tiled function),
    honoured as given; a tile is min(block, n) on each side.
    causal, mask and scale as in :func:`flash_attention` (float32 for float16 inputs).
    Extra memory beyond inputs and output: O(n d) (the scaled Q, O, l and m in the compute
    dtype) plus a few B_r x B_c tiles per head (S, P and their temporaries), never (n_q, n_k).
    Values large enough to overflow P~ V are handled by scaling V by a power of two (exact);
    scores that overflow the compute dtype raise ValueError.
    """
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale,
                      blocks=(block_q, block_k))
    with np.errstate(over="ignore", invalid="ignore"):
        o, m = _forward(p, v_exp=0)
        if not results_are_finite(o, stats=m):  # huge values: P~ V overflowed; scale V by 2^-e
            o, m = _forward(p, v_exp=int(np.frexp(float(np.max(np.abs(p.v), initial=0.0)))[1]))
    check_no_overflow(p.dtype, o, stats=m)  # m = +inf or NaN: scores beyond the dtype's range
    return p.unflatten(o)


def _forward(p: Problem, v_exp: int) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1 on a validated problem, with V divided by 2**v_exp (exact), multiplied back
    at the end.  Returns o (B, n_q, d_v) in q's dtype and the row maxima m (B, n_q)."""
    block_q, block_k = p.block_q, p.block_k
    dtype = compute_dtype(p.dtype)
    n_b, n_q, n_k, d_v = p.q.shape[0], p.n_q, p.n_k, p.v.shape[-1]
    q_s = np.multiply(p.q, p.scale, dtype=dtype)  # scale * Q, in the compute dtype
    v = np.ldexp(p.v.astype(dtype), -v_exp) if v_exp else p.v

    # "HBM": the normalised output and the row statistics, read and written every step.
    o = np.zeros((n_b, n_q, d_v), dtype=dtype)
    l = np.zeros((n_b, n_q), dtype=dtype)
    m = np.full((n_b, n_q), -np.inf, dtype=dtype)

    for j0 in range(0, n_k, block_k):  # outer loop: K_j, V_j to SRAM
        j1 = min(j0 + block_k, n_k)
        k_j = p.k[:, j0:j1].astype(dtype, copy=False)
        v_j = v[:, j0:j1].astype(dtype, copy=False)
        for i0 in range(0, n_q, block_q):  # inner loop: Q_i, O_i, l_i, m_i to SRAM
            i1 = min(i0 + block_q, n_q)
            if key_stop(i0, i1, n_k, p.offset) <= j0:
                continue  # the causal mask hides this whole tile
            s = q_s[:, i0:i1] @ k_j.swapaxes(-1, -2)  # S_ij: (B, B_r, B_c)
            visible = tile_mask(i0, i1, j0, j1, p.offset, p.mask)
            if visible is not None:
                if not visible.any():
                    continue
                np.copyto(s, -np.inf, where=~visible)
            m_tile = s.max(axis=-1)  # m~_ij
            p_tile = np.exp(s - np.where(np.isneginf(m_tile), 0, m_tile)[..., None])  # P~_ij
            l_tile = p_tile.sum(axis=-1)  # l~_ij

            m_i, l_i = m[:, i0:i1], l[:, i0:i1]
            m_new = np.maximum(m_i, m_tile)
            m_ref = np.where(np.isneginf(m_new), 0, m_new)  # finite, so no exp(-inf + inf)
            alpha = np.exp(m_i - m_ref)  # e^(m_i - m_new)
            beta = np.exp(m_tile - m_ref)  # e^(m~_ij - m_new)
            l_new = alpha * l_i + beta * l_tile
            o_new = (alpha * l_i)[..., None] * o[:, i0:i1] + beta[..., None] * (p_tile @ v_j)
            o[:, i0:i1] = np.divide(
                o_new, l_new[..., None], out=np.zeros_like(o_new), where=l_new[..., None] > 0
            )
            l[:, i0:i1] = l_new
            m[:, i0:i1] = m_new
    if v_exp:
        o = np.ldexp(o, v_exp)
    return o.astype(p.dtype, copy=False), m
