"""FlashAttention-2 forward: outer loop over query blocks, an unnormalised accumulator per block.

For each block of ``B_r`` query rows the kernel streams over the key/value blocks of ``B_c`` rows,
keeping only the running row maximum ``m_i``, the running sum ``l_i`` and the unnormalised output
``acc`` (Dao 2023, Section 3.1).  The division by ``l_i`` happens once, at the end, and only the
logsumexp ``lse = m + log(l)`` is kept for the backward pass.  No ``(n_q, n_k)`` array is ever
built: beyond inputs and outputs the memory is one ``(B_r, B_c)`` tile per head plus O(n) state.

Two tricks that GPU kernels use are applied here too: the softmax scale and ``log2(e)`` are folded
into Q once (O(n d) work instead of O(n^2)), so that the cheaper ``exp2`` replaces ``exp``; and
key blocks that the causal mask hides entirely are skipped, while an elementwise mask is applied
only to tiles that straddle the diagonal or hold masked entries.
"""

from __future__ import annotations

import numpy as np

from flashlib._validate import check_block, check_problem
from flashlib.masks import key_stop, tile_mask

__all__ = ["flash_attention", "compute_dtype", "LOG2E"]

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of the running statistics: float32 for float16 inputs (as GPU kernels keep m,
    l and the accumulator in registers in float32), otherwise the input dtype."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def _forward_row_block(
    q_i: np.ndarray,
    k_t: np.ndarray,
    v: np.ndarray,
    i0: int,
    block_k: int,
    offset: int | None,
    mask: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One query block against all the key blocks it may see.

    q_i: (B, B_r, d) already multiplied by scale * log2(e);  k_t: (B, d, n_k);  v: (B, n_k, d_v)
    Returns the normalised output block (B, B_r, d_v) and its lse (B, B_r) in natural log.
    """
    n_b, b_r, _ = q_i.shape
    i1 = i0 + b_r
    n_k, d_v = v.shape[-2:]
    dtype = q_i.dtype
    m_i = np.full((n_b, b_r), -np.inf, dtype=dtype)  # running max, base-2 units
    l_i = np.zeros((n_b, b_r), dtype=dtype)  # running sum of exp2(s - m_i)
    acc = np.zeros((n_b, b_r, d_v), dtype=dtype)  # running sum of exp2(s - m_i) v_j

    for j0 in range(0, key_stop(i0, i1, n_k, offset), block_k):
        j1 = min(j0 + block_k, n_k)
        s = q_i @ k_t[:, :, j0:j1]  # (B, B_r, B_c) tile of scores, base-2 units
        visible = tile_mask(i0, i1, j0, j1, offset, mask)
        if visible is not None:
            if not visible.any():
                continue  # an explicit mask hides the whole tile
            np.copyto(s, -np.inf, where=~visible)
        m_new = np.maximum(m_i, s.max(axis=-1))
        # Rows that have seen no visible key yet keep m = -inf; exponentiate them against 0
        # so that exp2(-inf - (-inf)) never produces a NaN.
        m_ref = np.where(np.isneginf(m_new), 0, m_new)
        s -= m_ref[..., None]
        p = np.exp2(s, out=s)  # P~_ij, in place
        alpha = np.exp2(m_i - m_ref)  # rescales what was accumulated against the old max
        l_i = alpha * l_i + p.sum(axis=-1)
        acc *= alpha[..., None]
        acc += p @ v[:, j0:j1]
        m_i = m_new

    seen = l_i > 0  # False for rows that see no key: output 0, lse -inf
    o_i = np.divide(acc, l_i[..., None], out=acc, where=seen[..., None])
    lse_i = np.full_like(l_i, -np.inf)
    np.log2(l_i, out=lse_i, where=seen)
    lse_i += m_i
    lse_i *= LN2  # back from base 2 to natural log
    return o_i, lse_i


def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    block_q: int = 64,
    block_k: int = 64,
    causal: bool | str = False,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    return_lse: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Exact attention in the FlashAttention-2 loop order, in O(n) extra memory.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) -> o: (..., n_q, d_v), q's dtype.
    block_q, block_k: the tile sizes B_r and B_c.
    causal: False, True / "top_left" (row i sees j <= i), "bottom_right" (j <= i + n_k - n_q).
    mask: boolean, broadcastable to (..., n_q, n_k); True = may attend.
    scale: defaults to 1/sqrt(d), cast to the input dtype.
    return_lse: also return lse = m + log(l): (..., n_q), natural log, at least float32,
    ``-inf`` for rows that see no key (whose output is 0).
    """
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale)
    block_q = check_block(block_q, "block_q")
    block_k = check_block(block_k, "block_k")
    dtype = compute_dtype(p.dtype)
    n_b, n_q, d_v = p.q.shape[0], p.n_q, p.v.shape[-1]

    q2 = p.q.astype(dtype) * dtype.type(float(p.scale) * LOG2E)  # fold scale and log2(e)
    k_t = p.k.astype(dtype, copy=False).swapaxes(-1, -2)
    v = p.v.astype(dtype, copy=False)

    o = np.empty((n_b, n_q, d_v), dtype=p.dtype)
    lse = np.empty((n_b, n_q), dtype=dtype)
    for i0 in range(0, n_q, block_q):
        i1 = min(i0 + block_q, n_q)
        o[:, i0:i1], lse[:, i0:i1] = _forward_row_block(
            q2[:, i0:i1], k_t, v, i0, block_k, p.offset, p.mask
        )
    o = p.unflatten(o)
    return (o, p.unflatten(lse)) if return_lse else o
