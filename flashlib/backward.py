"""FlashAttention backward: recompute each tile of S and P instead of storing them.

The forward pass keeps only the output ``O`` and the logsumexp ``lse``.  Backward rebuilds
``P_ij = exp(S_ij - lse_i)`` one tile at a time from ``Q_i``, ``K_j`` and ``lse_i`` (a form of
selective gradient checkpointing, Dao et al. 2022, Section 3.1), with
``D_i = rowsum(dO_i * O_i)`` replacing the row sums of ``dP * P``.  The loop order is
FlashAttention-2's: outer over key/value blocks, so ``dK_j`` and ``dV_j`` accumulate in "SRAM",
inner over query blocks, adding into ``dQ``.

:func:`flash2_backward` is the algorithm as the paper writes it (one head, no mask);
:func:`two_pass_backward` the other schedule a real kernel may choose (the Triton tutorial's:
one pass for dK, dV, one for dQ, so that no two programs write the same rows);
:func:`flash_attention_backward` the library version (batched, masked, validated).
"""

from __future__ import annotations

import math

import numpy as np

from flashlib._validate import Problem, check_backward_problem, check_no_overflow
from flashlib.constants import BLOCK_K, BLOCK_Q, compute_dtype
from flashlib.hbm import PLAIN, Memory
from flashlib.masks import tile_mask

__all__ = ["flash2_backward", "two_pass_backward", "flash_attention_backward"]


def flash2_backward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, O: np.ndarray, L: np.ndarray, dO: np.ndarray,
    B_r: int, B_c: int, mem: Memory = PLAIN,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FlashAttention-2 backward (Dao 2023, Algorithm 2), one head: P is recomputed, not stored.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v), O and dO: (N_q, d_v), L: (N_q,) from
    :func:`flashlib.flash.flash2_forward` -> dQ, dK, dV shaped like Q, K, V.  Every HBM access
    goes through ``mem`` (:mod:`flashlib.hbm`; plain numpy by default).
    """
    N_q, scale = Q.shape[0], 1 / math.sqrt(Q.shape[1])
    D = mem.empty("D", (N_q,), Q.dtype)
    for i, O_i, dO_i in mem.blocks(B_r, O, dO):  # D_i = rowsum(dO_i * O_i), written to HBM
        mem.write(D, i, np.sum(dO_i * O_i, axis=1))
    dQ = mem.full("dQ", Q.shape, 0.0, Q.dtype)  # initialise dQ = 0 in HBM
    dK, dV = mem.empty("dK", K.shape, K.dtype), mem.empty("dV", V.shape, V.dtype)
    for j, K_j, V_j in mem.blocks(B_c, K, V):  # outer loop: load K_j, V_j to SRAM
        dK_j, dV_j = mem.on_chip(dK_j=np.zeros_like(K_j), dV_j=np.zeros_like(V_j))
        for i, Q_i, dO_i, dQ_i, L_i, D_i in mem.blocks(B_r, Q, dO, dQ, L, D):  # inner loop
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            P_ij = np.exp(S_ij - L_i[:, None])  # (B_r, B_c): recomputed from L_i
            dV_j += P_ij.T @ dO_i  # (B_c, d_v)
            dP_ij = dO_i @ V_j.T  # (B_r, B_c)
            dS_ij = P_ij * (dP_ij - D_i[:, None])  # (B_r, B_c)
            mem.write(dQ, i, dQ_i + scale * (dS_ij @ K_j))  # dQ_i updated in HBM
            dK_j += scale * (dS_ij.T @ Q_i)  # (B_c, d)
        mem.write(dK, j, dK_j)  # dK_j, dV_j written to HBM once
        mem.write(dV, j, dV_j)
    return dQ, dK, dV


def two_pass_backward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, O: np.ndarray, L: np.ndarray, dO: np.ndarray,
    B_r: int, B_c: int, mem: Memory = PLAIN,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The backward in two passes (the Triton tutorial's schedule), one head: pass 1 keeps
    K_j, V_j on chip and writes dK_j, dV_j; pass 2 keeps Q_i on chip and writes dQ_i.  Each
    block of every output is written once, by one program (no atomic adds), at the price of
    recomputing P_ij and dP_ij twice.

    Shapes and ``mem`` as :func:`flash2_backward`: Q: (N_q, d), K: (N_k, d), V: (N_k, d_v),
    O and dO: (N_q, d_v), L: (N_q,) -> dQ, dK, dV shaped like Q, K, V.
    """
    N_q, scale = Q.shape[0], 1 / math.sqrt(Q.shape[1])
    D = mem.empty("D", (N_q,), Q.dtype)
    for i, O_i, dO_i in mem.blocks(B_r, O, dO):  # D_i = rowsum(dO_i * O_i), written to HBM
        mem.write(D, i, np.sum(dO_i * O_i, axis=1))
    dK, dV = mem.empty("dK", K.shape, K.dtype), mem.empty("dV", V.shape, V.dtype)
    for j, K_j, V_j in mem.blocks(B_c, K, V):  # pass 1: K_j, V_j stay; every Q_i streams by
        dK_j, dV_j = mem.on_chip(dK_j=np.zeros_like(K_j), dV_j=np.zeros_like(V_j))
        for _, Q_i, dO_i, L_i, D_i in mem.blocks(B_r, Q, dO, L, D):  # no dQ_i here
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            P_ij = np.exp(S_ij - L_i[:, None])  # (B_r, B_c): recomputed from L_i
            dV_j += P_ij.T @ dO_i  # (B_c, d_v)
            dP_ij = dO_i @ V_j.T  # (B_r, B_c)
            dS_ij = P_ij * (dP_ij - D_i[:, None])  # (B_r, B_c)
            dK_j += scale * (dS_ij.T @ Q_i)  # (B_c, d)
        mem.write(dK, j, dK_j)
        mem.write(dV, j, dV_j)
    dQ = mem.empty("dQ", Q.shape, Q.dtype)
    for i, Q_i, dO_i, L_i, D_i in mem.blocks(B_r, Q, dO, L, D):  # pass 2: Q_i stays
        (dQ_i,) = mem.on_chip(dQ_i=np.zeros_like(Q_i))
        for _, K_j, V_j in mem.blocks(B_c, K, V):  # every K_j, V_j streams by
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c): recomputed a second time
            P_ij = np.exp(S_ij - L_i[:, None])  # (B_r, B_c)
            dP_ij = dO_i @ V_j.T  # (B_r, B_c): recomputed a second time
            dS_ij = P_ij * (dP_ij - D_i[:, None])  # (B_r, B_c)
            dQ_i += scale * (dS_ij @ K_j)  # (B_r, d)
        mem.write(dQ, i, dQ_i)  # dQ_i written once, by this program alone
    return dQ, dK, dV


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
    p, do, o, lse = check_backward_problem(
        q, k, v, do, o=o, lse=lse, causal=causal, mask=mask, scale=scale,
        blocks=(block_q, block_k))
    with np.errstate(over="ignore", invalid="ignore"):
        grads = _backward(p, o, lse, do)
    check_no_overflow(p.dtype, *grads)
    return tuple(p.unflatten(x.astype(p.dtype, copy=False)) for x in grads)


def _backward(
    p: Problem, o: np.ndarray, lse: np.ndarray, do: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tiled backward of a validated problem; o, do: (B, n_q, d_v), lse: (B, n_q).
    Returns dq, dk, dv in the compute dtype."""
    block_q, block_k = p.block_q, p.block_k
    n_b, n_q, n_k = p.q.shape[0], p.n_q, p.n_k
    dtype = compute_dtype(p.dtype)
    q_s = np.multiply(p.q, p.scale, dtype=dtype)  # scale folded into Q
    k, v = p.k.astype(dtype, copy=False), p.v.astype(dtype, copy=False)
    do = do.astype(dtype, copy=False)
    o = o.astype(dtype, copy=False)
    # Rows that saw no key have lse = -inf; +inf there makes every recomputed P entry 0.
    lse = lse.astype(dtype)
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
    dq *= p.scale
    return dq, dk, dv
