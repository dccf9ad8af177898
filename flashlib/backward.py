"""FlashAttention backward: recompute each tile of S and P instead of storing them.

The forward pass keeps only the output ``O`` and the logsumexp ``lse``.  Backward rebuilds
``P_ij = exp(S_ij - lse_i)`` one tile at a time from ``Q_i``, ``K_j`` and ``lse_i`` (a form of
selective gradient checkpointing, Dao et al. 2022, Section 3.1), with
``D_i = rowsum(dO_i * O_i)`` replacing the row sums of ``dP * P``.  The loop order is
FlashAttention-2's: outer over key/value blocks, so ``dK_j`` and ``dV_j`` accumulate in "SRAM",
inner over query blocks, adding into ``dQ``.
"""

from __future__ import annotations

import numpy as np

from flashlib._validate import check_block, check_finite, check_like, check_problem
from flashlib.constants import BLOCK_K, BLOCK_Q, compute_dtype
from flashlib.masks import tile_mask

__all__ = ["flash_attention_backward"]


def _first_query_block(j0: int, offset: int | None, block_q: int) -> int:
    """Start of the first query block that may see key ``j0`` (row i sees j if j <= i + offset)."""
    if offset is None:
        return 0
    first_row = max(0, j0 - offset)
    return first_row - first_row % block_q


def flash_attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    do: np.ndarray,
    *,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    causal: bool | str = False,
    mask: np.ndarray | None = None,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dq, dk, dv) of ``sum(do * o)`` where ``o, lse = flash_attention(...,
    return_lse=True)``, recomputing P tile by tile; P is never stored or passed in.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v), o and do: (..., n_q, d_v),
    lse: (..., n_q).  Options must match the forward call; block sizes need not (default
    BLOCK_Q x BLOCK_K, honoured as given; a tile is min(block, n) on each side).  Returns
    arrays of q's dtype.  Extra memory beyond inputs and outputs: O(n d) (D and copies in the
    compute dtype) plus a few B_r x B_c tiles per head (S, P, dP, dS), never (n_q, n_k).
    """
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale)
    block_q = check_block(block_q, "block_q")
    block_k = check_block(block_k, "block_k")
    n_b, n_q, n_k, d_v = p.q.shape[0], p.n_q, p.n_k, p.v.shape[-1]
    o = check_like(o, "o", p.batch_shape + (n_q, d_v), p.dtype)
    do = check_like(do, "do", p.batch_shape + (n_q, d_v), p.dtype)
    lse = check_like(lse, "lse", p.batch_shape + (n_q,), None)
    check_finite(o, "o")
    check_finite(do, "do")
    if np.isnan(lse).any() or np.isposinf(lse).any():
        raise ValueError("lse must not contain NaN or +inf (-inf marks rows that see no key)")
    dtype = compute_dtype(p.dtype)

    q_s = p.q.astype(dtype) * dtype.type(p.scale)  # scale folded into Q
    k, v = p.k.astype(dtype, copy=False), p.v.astype(dtype, copy=False)
    do = do.reshape(n_b, n_q, d_v).astype(dtype, copy=False)
    o = o.reshape(n_b, n_q, d_v).astype(dtype, copy=False)
    # Rows that saw no key have lse = -inf; +inf there makes every recomputed P entry 0.
    lse = lse.reshape(n_b, n_q).astype(dtype)
    lse[np.isneginf(lse)] = np.inf
    delta = np.sum(do * o, axis=-1)  # D = rowsum(dO * O): (B, n_q)

    dq = np.zeros((n_b, n_q, p.q.shape[-1]), dtype=dtype)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    for j0 in range(0, n_k, block_k):  # outer loop: K_j, V_j; dK_j, dV_j accumulate here
        j1 = min(j0 + block_k, n_k)
        k_j, v_j = k[:, j0:j1], v[:, j0:j1]
        dk_j, dv_j = dk[:, j0:j1], dv[:, j0:j1]
        for i0 in range(_first_query_block(j0, p.offset, block_q), n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            s = q_s[:, i0:i1] @ k_j.swapaxes(-1, -2)  # recompute S_ij
            visible = tile_mask(i0, i1, j0, j1, p.offset, p.mask)
            if visible is not None:
                if not visible.any():
                    continue
                np.copyto(s, -np.inf, where=~visible)
            s -= lse[:, i0:i1, None]
            p_ij = np.exp(s, out=s)  # recompute P_ij = exp(S_ij - lse_i)
            do_i = do[:, i0:i1]
            dv_j += p_ij.swapaxes(-1, -2) @ do_i
            dp = do_i @ v_j.swapaxes(-1, -2)
            ds = p_ij * (dp - delta[:, i0:i1, None])  # dS_ij = P_ij * (dP_ij - D_i)
            dq[:, i0:i1] += ds @ k_j
            dk_j += ds.swapaxes(-1, -2) @ q_s[:, i0:i1]  # scale * dS^T Q = dS^T (scale Q)
    dq *= dtype.type(p.scale)
    return tuple(p.unflatten(x.astype(p.dtype, copy=False)) for x in (dq, dk, dv))
