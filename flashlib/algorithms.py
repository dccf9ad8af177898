"""The book's algorithms, in book order: each one as the paper writes it, in plain numpy.

This is the file to open first.  Every function here is a *teaching function*: one head, 2-D
arrays, the papers' names (``Q_i``, ``K_j``, ``m_i``, ``l_i``, ``B_r``, ``B_c``), no input
checks, about 30 lines or fewer.  The chapters show them verbatim (``literalinclude``).  Their
*library twins* (batched, masked, validated, fast) are in :mod:`flashlib.fast`, re-exported by
:mod:`flashlib`; the package docstring's table pairs each teaching function with its twin, and
the tests check every pair equal.

1. softmax:                 :func:`safe_softmax`
2. the online softmax:      :func:`online_update` (one step), :func:`merge_states` (two
                            partial states over disjoint keys)
3. standard attention:      :func:`standard_attention` (Algorithm 0: S and P go through HBM)
4. FlashAttention:          :func:`flash1_forward` (Algorithm 1), :func:`flash2_forward`
                            (FlashAttention-2's loop order), :func:`masked_flash_forward`
5. the backward pass:       :func:`standard_attention_backward`, :func:`delta_from_O`,
                            :func:`recompute_P`, :func:`flash2_backward`,
                            :func:`two_pass_backward`
6. decoding and GQA:        :func:`split_kv_decode`, :func:`grouped_query_attention`

HBM traffic: the tiled functions talk to "HBM" through their ``mem`` argument
(:mod:`flashlib.core.hbm`); its default is plain numpy (a block is a slice, a write an
assignment), and a counting memory turns the same function into the HBM counter, the SRAM
checker and the race simulator of the tiling and IO-model chapters.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from flashlib.core.hbm import PLAIN, Memory
from flashlib.core.masks import Predicate, tile_class

__all__ = [
    "safe_softmax",
    "online_update",
    "merge_states",
    "standard_attention",
    "flash1_forward",
    "flash2_forward",
    "masked_flash_forward",
    "standard_attention_backward",
    "delta_from_O",
    "recompute_P",
    "flash2_backward",
    "two_pass_backward",
    "split_kv_decode",
    "grouped_query_attention",
]


# --- softmax ------------------------------------------------------------------------------


def safe_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax of each row of x: (..., n), the maximum subtracted first so no exp overflows."""
    m = np.max(x, axis=-1, keepdims=True)  # (..., 1): the row maximum
    e = np.exp(x - m)  # (..., n): every exponent is <= 0, so every term is <= 1
    return e / np.sum(e, axis=-1, keepdims=True)


# --- the online softmax: one step, and the merge of two partial states ----------------------


def online_update(m: np.ndarray, l: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One step of the online softmax (Milakov & Gimelshein 2018): fold the value x into the
    running maximum m and the running sum l of exp(x_j - m).  m, l, x: (N,) or scalars."""
    m_new = np.maximum(m, x)  # the new running maximum
    l_new = l * np.exp(m - m_new) + np.exp(x - m_new)  # rescale the old sum, add the new term
    return m_new, l_new


def merge_states(
    a: tuple[np.ndarray, np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge two partial attention states (m, l, acc) over disjoint sets of keys.

    m, l: (B_r,) row maximum and sum of exp(s - m); acc: (B_r, d_v) sum of exp(s - m) v.
    """
    m_a, l_a, acc_a = a
    m_b, l_b, acc_b = b
    m = np.maximum(m_a, m_b)  # (B_r,)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)  # (B_r,) each, both <= 1
    l = alpha * l_a + beta * l_b  # (B_r,)
    acc = alpha[:, None] * acc_a + beta[:, None] * acc_b  # (B_r, d_v)
    return m, l, acc


# --- standard attention (Algorithm 0) ------------------------------------------------------


def standard_attention(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, mem: Memory = PLAIN
) -> np.ndarray:
    """Standard attention (Dao et al. 2022, Algorithm 0), one head: S and P go through HBM.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v).  Every HBM access goes through
    ``mem`` (:mod:`flashlib.core.hbm`; plain numpy by default).
    """
    scale = 1 / math.sqrt(Q.shape[1])
    S = mem.put("S", scale * (mem.read(Q) @ mem.read(K).T))  # 1. read Q, K; write S: (N_q, N_k)
    P = mem.put("P", safe_softmax(mem.read(S)))  # 2. read S; write P = softmax(S): (N_q, N_k)
    O = mem.put("O", mem.read(P) @ mem.read(V))  # 3. read P, V; write O = P V: (N_q, d_v)
    return O


# --- FlashAttention: Algorithm 1, then FlashAttention-2's loop order -------------------------


def flash1_forward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int, mem: Memory = PLAIN
) -> np.ndarray:
    """FlashAttention (Dao et al. 2022, Algorithm 1), one head: O, l and m live in "HBM".

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v).  Every HBM access goes through
    ``mem`` (:mod:`flashlib.core.hbm`: plain numpy by default, or a counting memory).
    """
    N_q, d_v, scale = Q.shape[0], V.shape[1], 1 / math.sqrt(Q.shape[1])
    O = mem.full("O", (N_q, d_v), 0.0, Q.dtype)  # initialise O, l, m in HBM
    l = mem.full("l", (N_q,), 0.0, Q.dtype)
    m = mem.full("m", (N_q,), -np.inf, Q.dtype)
    for _, K_j, V_j in mem.blocks(B_c, K, V):  # outer loop: load K_j, V_j to SRAM
        for i, Q_i, O_i, l_i, m_i in mem.blocks(B_r, Q, O, l, m):  # load Q_i, O_i, l_i, m_i
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            m_tilde_ij = S_ij.max(axis=1)  # (B_r,): the block's row maximum
            P_tilde_ij = np.exp(S_ij - m_tilde_ij[:, None])  # (B_r, B_c)
            l_tilde_ij = P_tilde_ij.sum(axis=1)  # (B_r,)
            m_new = np.maximum(m_i, m_tilde_ij)  # (B_r,)
            alpha, beta = np.exp(m_i - m_new), np.exp(m_tilde_ij - m_new)  # (B_r,) each
            l_new = alpha * l_i + beta * l_tilde_ij  # (B_r,)
            O_new = (l_i * alpha)[:, None] * O_i + beta[:, None] * (P_tilde_ij @ V_j)
            mem.write(O, i, O_new / l_new[:, None])  # diag(l_new)^-1: O_i stays normalised
            mem.write(l, i, l_new)  # write l_i, m_i back to HBM
            mem.write(m, i, m_new)
    return O


def flash2_forward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int, mem: Memory = PLAIN
) -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2 forward (Dao 2023, Algorithm 1), one head.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v) and the logsumexp L: (N_q,).
    Every HBM access goes through ``mem`` (:mod:`flashlib.core.hbm`; plain numpy by default).
    """
    N_q, d_v, scale = Q.shape[0], V.shape[1], 1 / math.sqrt(Q.shape[1])
    O, L = mem.empty("O", (N_q, d_v), Q.dtype), mem.empty("L", (N_q,), Q.dtype)  # in HBM
    for i, Q_i in mem.blocks(B_r, Q):  # outer loop: load Q_i to SRAM
        O_i, l_i, m_i = mem.on_chip(  # on chip: unnormalised output, running sum and maximum
            O_i=np.zeros((len(Q_i), d_v), Q.dtype), l_i=np.zeros(len(Q_i), Q.dtype),
            m_i=np.full(len(Q_i), -np.inf, Q.dtype))
        for _, K_j, V_j in mem.blocks(B_c, K, V):  # inner loop: load K_j, V_j to SRAM
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            m_new = np.maximum(m_i, S_ij.max(axis=1))  # (B_r,)
            P_ij = np.exp(S_ij - m_new[:, None])  # (B_r, B_c): P~_ij, unnormalised
            alpha = np.exp(m_i - m_new)  # (B_r,): rescales what was summed against m_i
            l_i = alpha * l_i + P_ij.sum(axis=1)
            O_i = alpha[:, None] * O_i + P_ij @ V_j
            m_i = m_new
        mem.write(O, i, O_i / l_i[:, None])  # the one division, at the end; write O_i
        mem.write(L, i, m_i + np.log(l_i))  # logsumexp, saved for the backward pass
    return O, L


# --- masks: skip the empty tiles, mask the partial ones ------------------------------------


def masked_flash_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, visible: Predicate,
                         B_r: int, B_c: int, guard: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2's forward with a mask predicate, one head: empty tiles skipped, partial
    tiles masked; ``guard=False`` is the careless kernel (NaN on a row with no visible key yet).

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v) (0 on rows that see no key) and
    L: (N_q,) (-inf there).
    """
    N_q, N_k, scale = Q.shape[0], K.shape[0], 1 / math.sqrt(Q.shape[1])
    O, L = np.zeros((N_q, V.shape[1])), np.full(N_q, -np.inf)
    for i0 in range(0, N_q, B_r):
        i1 = min(i0 + B_r, N_q)
        O_i, l_i = np.zeros((i1 - i0, V.shape[1])), np.zeros(i1 - i0)  # on chip
        m_i = np.full(i1 - i0, -np.inf)
        for j0 in range(0, N_k, B_c):
            j1 = min(j0 + B_c, N_k)
            kind = tile_class(visible, i0, i1, j0, j1, N_q, N_k)
            if kind == "empty":
                continue  # skipped: no work at all
            S_ij = scale * (Q[i0:i1] @ K[j0:j1].T)  # (B_r, B_c)
            if kind == "partial":  # hide the masked entries
                seen = visible(np.arange(i0, i1)[:, None], np.arange(j0, j1)[None, :], N_q, N_k)
                S_ij = np.where(seen, S_ij, -np.inf)
            m_new = np.maximum(m_i, S_ij.max(axis=1))  # -inf on a row that has seen no key yet
            if guard:
                m_new = np.where(np.isneginf(m_new), 0.0, m_new)  # the guard: exp(-inf - 0) = 0
            P_ij = np.exp(S_ij - m_new[:, None])  # careless: exp(-inf - (-inf)) = NaN
            alpha = np.exp(m_i - m_new)
            l_i = alpha * l_i + P_ij.sum(axis=1)
            O_i = alpha[:, None] * O_i + P_ij @ V[j0:j1]
            m_i = m_new
        seen_any = l_i > 0  # rows that saw at least one key
        O[i0:i1] = O_i / np.where(seen_any, l_i, 1)[:, None]
        L[i0:i1] = np.where(seen_any, m_i + np.log(np.where(seen_any, l_i, 1)), -np.inf)
    return O, L


# --- the backward pass: recompute P from the logsumexp ------------------------------------


def standard_attention_backward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, dO: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The standard backward pass (Dao et al. 2022, Algorithm 3), one head.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v), dO: (N_q, d_v) -> dQ, dK, dV shaped like Q, K, V.
    """
    scale = 1 / math.sqrt(Q.shape[1])
    P = safe_softmax(scale * (Q @ K.T))  # (N_q, N_k): what the forward pass stored
    dV = P.T @ dO  # (N_k, d_v)
    dP = dO @ V.T  # (N_q, N_k)
    D = np.sum(P * dP, axis=1, keepdims=True)  # (N_q, 1): D_i = rowsum(P_i * dP_i)
    dS = P * (dP - D)  # (N_q, N_k): through the softmax, row by row
    dQ = scale * (dS @ K)  # (N_q, d)
    dK = scale * (dS.T @ Q)  # (N_k, d)
    return dQ, dK, dV


def delta_from_O(O: np.ndarray, dO: np.ndarray) -> np.ndarray:
    """D_i = rowsum(dO_i * O_i), what kernels compute: O, dO: (..., n_q, d_v) -> (..., n_q).

    Equal to :func:`delta_from_P` because dP = dO V^T and O = P V:
    sum_j P_ij dP_ij = sum_j P_ij sum_c dO_ic V_jc = sum_c dO_ic sum_j P_ij V_jc
    = sum_c dO_ic O_ic.  It needs only O(n d) memory: no (n_q, n_k) array is formed.
    """
    return np.sum(dO * O, axis=-1)


def recompute_P(Q: np.ndarray, K: np.ndarray, L: np.ndarray, B_r: int, B_c: int) -> np.ndarray:
    """P rebuilt tile by tile as ``P_ij = exp(S_ij - L_i)`` from the logsumexp L the forward
    saved, assembled into one (N_q, N_k) array so that it can be compared with softmax(S)
    (a backward pass uses each tile and drops it).  Q: (N_q, d), K: (N_k, d), L: (N_q,)."""
    scale = 1 / math.sqrt(Q.shape[1])
    P = np.empty((Q.shape[0], K.shape[0]), dtype=np.result_type(Q, K, L))
    for i in range(0, Q.shape[0], B_r):
        for j in range(0, K.shape[0], B_c):
            S_ij = scale * (Q[i : i + B_r] @ K[j : j + B_c].T)  # (B_r, B_c)
            P[i : i + B_r, j : j + B_c] = np.exp(S_ij - L[i : i + B_r, None])
    return P


def flash2_backward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, O: np.ndarray, L: np.ndarray, dO: np.ndarray,
    B_r: int, B_c: int, mem: Memory = PLAIN,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FlashAttention-2 backward (Dao 2023, Algorithm 2), one head: P is recomputed, not stored.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v), O and dO: (N_q, d_v), L: (N_q,) from
    :func:`flashlib.algorithms.flash2_forward` -> dQ, dK, dV shaped like Q, K, V.  Every HBM access
    goes through ``mem`` (:mod:`flashlib.core.hbm`; plain numpy by default).
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


# --- decoding and grouped-query attention ------------------------------------------------


def split_kv_decode(
    q: np.ndarray, K: np.ndarray, V: np.ndarray, n_splits: int, B_c: int, mem: Memory = PLAIN
) -> np.ndarray:
    """Attention of the query rows q (a few, usually one) over K, V split into ``n_splits``
    shares, each attended by its own program, then merged.

    q: (n_q, d), K: (N, d), V: (N, d_v) -> O: (n_q, d_v).
    """
    size = -(-K.shape[0] // n_splits)  # keys per program
    parts = [flash2_forward(q, K[s : s + size], V[s : s + size], len(q), B_c, mem)
             for s in range(0, K.shape[0], size)]  # one program each: (O_s, L_s) to HBM
    # (O_s, L_s) is the partial state m = L_s, l = 1, acc = O_s: merge them pairwise
    states = [(mem.read(L_s), np.ones(len(q), q.dtype), mem.read(O_s)) for O_s, L_s in parts]
    _, l, acc = functools.reduce(merge_states, states)
    return mem.put("O", acc / l[:, None])  # (n_q, d_v)


def grouped_query_attention(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray
) -> np.ndarray:
    """Grouped-query attention (Ainslie et al. 2023): query head h attends
    with K/V head h // g, g = h_q / h_kv (h_kv = 1: multi-query attention).

    Q: (h_q, N_q, d), K: (h_kv, N_k, d), V: (h_kv, N_k, d_v)
    -> O: (h_q, N_q, d_v).
    """
    g = Q.shape[0] // K.shape[0]  # query heads per K/V head
    assert g * K.shape[0] == Q.shape[0], "h_q must be a multiple of h_kv"
    O = [standard_attention(Q[h], K[h // g], V[h // g]) for h in range(len(Q))]
    return np.stack(O)  # (h_q, N_q, d_v)
