"""FlashAttention (v1) forward, the library version: Algorithm 1's loop order, batched.

The outer loop runs over key/value blocks ``K_j, V_j`` (loaded into SRAM once), the inner loop
over query blocks.  The output ``O`` and the statistics ``l`` and ``m`` live in HBM: every inner
step reads the block's ``O_i, l_i, m_i``, merges the new tile in, writes them back, and keeps
``O_i`` normalised (Dao et al. 2022, Algorithm 1).  The teaching function is
:func:`flashlib.algorithms.flash1_forward`; :func:`flash_attention_v1` is its library twin, with
the options of its siblings (masks, grouped-query heads, the logsumexp).
"""

from __future__ import annotations

import numpy as np

from flashlib.core.checks import check_flag
from flashlib.core.constants import BLOCK_K, BLOCK_Q, compute_dtype
from flashlib.core.masks import band_hides, key_range
from flashlib.core.problem import Problem, check_no_overflow, check_problem, results_are_finite
from flashlib.fast.tiles import hidden_entries

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
    return_lse: bool = False,
    window: tuple[int | None, int | None] | None = None,
    key_lengths: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Exact attention, Algorithm 1 order: outer loop over K/V blocks, inner over Q blocks.

    Shapes, grouped-query heads, block_q and block_k (B_r, B_c), causal, mask, window,
    key_lengths, scale and return_lse: the options of :mod:`flashlib.fast`, said once there
    (float32 for float16 inputs; tiles that the masks hide entirely are skipped).
    Extra memory beyond inputs and output: O(n d) (the scaled Q, O, l and m in the compute
    dtype; K and V repeated per query head for grouped-query inputs) plus a few B_r x B_c
    tiles per head (S, P and their temporaries), never (n_q, n_k).
    Values large enough to overflow P~ V are handled by scaling V by a power of two (exact);
    scores that overflow the compute dtype raise ValueError.
    """
    return_lse = check_flag(return_lse, "return_lse")
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale,
                      blocks=(block_q, block_k), window=window, key_lengths=key_lengths,
                      gqa=True).repeat_kv()
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        o, m, l = _forward(p, v_exp=0)  # noqa: E741
        if not results_are_finite(o, stats=m):  # huge values: P~ V overflowed; scale V by 2^-e
            o, m, l = _forward(  # noqa: E741
                p, v_exp=int(np.frexp(float(np.max(np.abs(p.v), initial=0.0)))[1]))
    check_no_overflow(p.dtype, o, stats=m)  # m = +inf or NaN: scores beyond the dtype's range
    o = p.unflatten(o)
    if not return_lse:
        return o
    lse = np.full_like(m, -np.inf)
    np.log(l, out=lse, where=l > 0)
    lse += m  # rows that see no key: -inf + -inf
    return o, p.unflatten(lse)


def _forward(p: Problem, v_exp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Algorithm 1 on a validated problem (one K/V head per query head), with V divided by
    2**v_exp (exact), multiplied back at the end.  Returns o (B, n_q, d_v) in q's dtype and the
    row maxima m and sums l (B, n_q) in the compute dtype."""
    block_q, block_k = p.block_q, p.block_k
    dtype = compute_dtype(p.dtype)
    n_b, n_q, n_k, d_v = p.q.shape[0], p.n_q, p.n_k, p.v.shape[-1]
    q_s = np.multiply(p.q, p.scale, dtype=dtype)  # scale * Q, in the compute dtype
    v = np.ldexp(p.v.astype(dtype), -v_exp) if v_exp else p.v
    lengths = p.key_lengths
    longest = None if lengths is None else int(lengths.max(initial=0))

    # "HBM": the normalised output and the row statistics, read and written every step.
    o = np.zeros((n_b, n_q, d_v), dtype=dtype)
    l = np.zeros((n_b, n_q), dtype=dtype)  # noqa: E741
    m = np.full((n_b, n_q), -np.inf, dtype=dtype)

    for j0 in range(0, n_k, block_k):  # outer loop: K_j, V_j to SRAM
        j1 = min(j0 + block_k, n_k)
        k_j = p.k[:, j0:j1].astype(dtype, copy=False)
        v_j = v[:, j0:j1].astype(dtype, copy=False)
        for i0 in range(0, n_q, block_q):  # inner loop: Q_i, O_i, l_i, m_i to SRAM
            i1 = min(i0 + block_q, n_q)
            start, stop = key_range(i0, i1, n_k, p.lo, p.offset, longest)
            if j1 <= start or j0 >= stop:
                continue  # the causal mask, the window or the padding hides this whole tile
            hidden = None
            straddles = band_hides(i0, i1, j0, j1, p.lo, p.offset)
            if straddles or p.mask is not None or lengths is not None:
                hidden = hidden_entries(i0, i1, j0, j1, straddles, p.offset, p.mask,
                                        slice(None), p.lo, lengths, p.bands)
                if hidden is not None and hidden.all():
                    continue
            s = q_s[:, i0:i1] @ k_j.swapaxes(-1, -2)  # S_ij: (B, B_r, B_c)
            if hidden is not None:
                np.copyto(s, -np.inf, where=hidden)
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
    return o.astype(p.dtype, copy=False), m, l
