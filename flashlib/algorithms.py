"""The book's algorithms, in book order, as the papers write them.

This is the file to open first.  Every function here is a *teaching
function*: one head, 2-D arrays, plain numpy, the papers' names (``Q_i``,
``K_j``, ``S_ij``, ``m_i``, ``l_i``, ``B_r``, ``B_c``), no input checks,
about 30 lines or fewer, 76 columns wide.  The chapters show them verbatim
(``literalinclude``).  Their *library twins* (batched, masked, validated,
fast) are in :mod:`flashlib.fast`, re-exported by :mod:`flashlib`; the
package docstring's table pairs each teaching function with its twin, and
the tests check every pair equal.

1. softmax:             :func:`safe_softmax`
2. the online softmax:  :func:`online_update` (one step),
                        :func:`online_attention_row` (one query row,
                        key by key), :func:`merge_states` (two
                        partial states)
3. standard attention:  :func:`standard_attention` (Algorithm 0)
4. FlashAttention:      :func:`flash1_forward` (Algorithm 1),
                        :func:`flash2_forward` (FlashAttention-2),
                        :func:`masked_flash_forward`
5. the backward pass:   :func:`standard_attention_backward`,
                        :func:`delta_from_O`, :func:`recompute_P`,
                        :func:`flash1_backward` (Algorithm 4),
                        :func:`flash2_backward`, :func:`two_pass_backward`
6. dropout, not stored: :func:`flash2_dropout_forward`,
                        :func:`flash2_dropout_backward`
7. decoding and GQA:    :func:`split_kv_decode`, :func:`paged_kv_decode`,
                        :func:`grouped_query_attention`

HBM traffic is written as numpy: slicing an array in HBM is the load
(``Q_i = Q[i : i + B_r]``), assigning into it the store
(``O[i : i + B_r] = ...``), and an array made "like" an input lives where
the input lives (``np.empty_like(Q, shape=...)``: in HBM).  Called on numpy
arrays, that is all it is.  Called by a counting memory on its HBM arrays
(:class:`flashlib.core.hbm.CountingMemory`), the same lines are counted
element by element, checked against an SRAM of M elements and logged tile
by tile: the tiling and IO-model chapters' experiments.
"""

from __future__ import annotations

import math

import numpy as np

from flashlib.core.masks import Predicate
from flashlib.core.philox import dropout_keep

__all__ = [
    "safe_softmax",
    "online_update",
    "online_attention_row",
    "merge_states",
    "standard_attention",
    "flash1_forward",
    "flash2_forward",
    "masked_flash_forward",
    "standard_attention_backward",
    "delta_from_O",
    "recompute_P",
    "flash1_backward",
    "flash2_backward",
    "two_pass_backward",
    "flash2_dropout_forward",
    "flash2_dropout_backward",
    "split_kv_decode",
    "paged_kv_decode",
    "grouped_query_attention",
]

State = tuple[np.ndarray, np.ndarray, np.ndarray]


# --- softmax -----------------------------------------------------------


def safe_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax of each row of x: (..., n), the row maximum subtracted
    first so that no exp overflows."""
    m = np.max(x, axis=-1, keepdims=True)  # (..., 1): the row maximum
    e = np.exp(x - m)  # (..., n): every exponent <= 0, every term <= 1
    return e / np.sum(e, axis=-1, keepdims=True)


# --- the online softmax: one step, and the merge of two states ----------


def online_update(
    m: np.ndarray, l: np.ndarray, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One step of the online softmax (Milakov & Gimelshein 2018): fold
    the value x into the running maximum m and the running sum l of
    exp(x_j - m).  m, l, x: (N,) or scalars."""
    m_new = np.maximum(m, x)  # the new running maximum
    ref = np.where(m_new == -np.inf, 0.0, m_new)  # nothing seen: no shift
    l_new = l * np.exp(m - ref) + np.exp(x - ref)  # rescale, add
    return m_new, l_new


def online_attention_row(s: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Attention of one query row, its keys read one at a time: the
    running maximum m, sum l and unnormalised output acc, rescaled by
    alpha whenever m grows.  What the tiled loop does for each row.

    s: (N,) the row's scores (-inf: a masked key), V: (N, d_v) -> o: (d_v,)
    (zeros when every key is masked).
    """
    m, l = -np.inf, 0.0  # the empty state: nothing seen yet
    acc = np.zeros(V.shape[1], V.dtype)  # (d_v,): sum of p_j v_j
    for s_j, v_j in zip(s, V, strict=True):  # the keys, one by one
        if s_j == -np.inf:
            continue  # a masked key adds nothing (and no NaN)
        m_new = max(m, s_j)  # 1. the new running maximum
        alpha = np.exp(m - m_new)  # 2. 1 while m stays, < 1 if it grows
        p_j = np.exp(s_j - m_new)  # 3. the new term, at most 1
        l = alpha * l + p_j  # 4. rescale the old sum, add
        acc = alpha * acc + p_j * v_j  # 5. rescale the old output, add
        m = m_new
    return acc / l if l > 0 else acc  # o = acc / l


def merge_states(a: State, b: State) -> State:
    """Merge two partial attention states (m, l, acc) over disjoint sets
    of keys.

    m, l: (B_r,) row maximum and sum of exp(s - m);
    acc: (B_r, d_v) sum of exp(s - m) v.
    """
    m_a, l_a, acc_a = a
    m_b, l_b, acc_b = b
    m = np.maximum(m_a, m_b)  # (B_r,)
    ref = np.where(m == -np.inf, 0.0, m)  # both empty: no shift
    alpha, beta = np.exp(m_a - ref), np.exp(m_b - ref)  # both <= 1
    l = alpha * l_a + beta * l_b  # (B_r,)
    acc = alpha[:, None] * acc_a + beta[:, None] * acc_b  # (B_r, d_v)
    return m, l, acc


# --- standard attention (Algorithm 0) ----------------------------------


def standard_attention(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray
) -> np.ndarray:
    """Standard attention (Dao et al. 2022, Algorithm 0), one head: S and
    P are written to HBM and read back.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v).
    """
    scale = 1 / math.sqrt(Q.shape[1])  # tau
    S = np.asarray(scale * (Q @ K.T), like=Q)  # 1. read Q, K; write S
    P = np.asarray(safe_softmax(S), like=Q)  # 2. read S; write P
    O = np.asarray(P @ V, like=Q)  # 3. read P, V; write O = P V
    return O


# --- FlashAttention: Algorithm 1, then FlashAttention-2's loop order ----


def flash1_forward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int
) -> np.ndarray:
    """FlashAttention (Dao et al. 2022, Algorithm 1), one head: O, l and
    m live in HBM, and every tile reads and writes its rows of them.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v).
    """
    N_q, N_k, d_v = len(Q), len(K), V.shape[1]
    scale = 1 / math.sqrt(Q.shape[1])  # tau
    O = np.zeros_like(Q, shape=(N_q, d_v))  # initialise O, l, m in HBM
    l = np.zeros_like(Q, shape=N_q)
    m = np.full_like(Q, -np.inf, shape=N_q)
    for j in range(0, N_k, B_c):  # outer loop over key blocks
        K_j, V_j = K[j : j + B_c], V[j : j + B_c]  # load K_j, V_j
        for i in range(0, N_q, B_r):  # inner loop over query blocks
            Q_i, O_i = Q[i : i + B_r], O[i : i + B_r]  # load Q_i, O_i,
            l_i, m_i = l[i : i + B_r], m[i : i + B_r]  # l_i, m_i
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            m_tilde_ij = S_ij.max(axis=1)  # (B_r,): the tile's maximum
            P_tilde_ij = np.exp(S_ij - m_tilde_ij[:, None])  # (B_r, B_c)
            l_tilde_ij = P_tilde_ij.sum(axis=1)  # (B_r,)
            m_new = np.maximum(m_i, m_tilde_ij)  # (B_r,)
            alpha = np.exp(m_i - m_new)  # (B_r,)
            beta = np.exp(m_tilde_ij - m_new)  # (B_r,)
            l_new = alpha * l_i + beta * l_tilde_ij  # (B_r,)
            O_new = ((l_i * alpha)[:, None] * O_i
                     + beta[:, None] * (P_tilde_ij @ V_j))  # (B_r, d_v)
            O[i : i + B_r] = O_new / l_new[:, None]  # write O_i, l_i, m_i
            l[i : i + B_r] = l_new
            m[i : i + B_r] = m_new
    return O


def flash2_forward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int
) -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2 forward (Dao 2023, Algorithm 1), one head.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v) and the
    logsumexp L: (N_q,).
    """
    N_q, N_k, d_v = len(Q), len(K), V.shape[1]
    scale = 1 / math.sqrt(Q.shape[1])  # tau
    O = np.empty_like(Q, shape=(N_q, d_v))  # in HBM, like Q: (N_q, d_v)
    L = np.empty_like(Q, shape=N_q)  # in HBM: (N_q,)
    for i in range(0, N_q, B_r):  # outer loop over query blocks
        Q_i = Q[i : i + B_r]  # load Q_i: (B_r, d)
        O_i = np.zeros((len(Q_i), d_v), Q.dtype)  # on chip: (B_r, d_v)
        l_i = np.zeros(len(Q_i), Q.dtype)  # (B_r,): running sum
        m_i = np.full(len(Q_i), -np.inf, Q.dtype)  # (B_r,): running max
        for j in range(0, N_k, B_c):  # inner loop over key blocks
            K_j, V_j = K[j : j + B_c], V[j : j + B_c]  # load K_j, V_j
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            m_new = np.maximum(m_i, S_ij.max(axis=1))  # (B_r,)
            P_ij = np.exp(S_ij - m_new[:, None])  # (B_r, B_c): P~_ij
            alpha = np.exp(m_i - m_new)  # (B_r,): rescales l_i and O_i
            l_i = alpha * l_i + P_ij.sum(axis=1)
            O_i = alpha[:, None] * O_i + P_ij @ V_j
            m_i = m_new
        O[i : i + B_r] = O_i / l_i[:, None]  # write O_i: one division
        L[i : i + B_r] = m_i + np.log(l_i)  # write L_i, for backward
    return O, L


# --- masks: skip the empty tiles, mask the partial ones ----------------


def masked_flash_forward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, visible: Predicate,
    B_r: int, B_c: int, guard: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2's forward with a mask predicate, one head: empty
    tiles skipped, partial tiles masked.  A row that has seen no key yet
    keeps m_i = -inf; the guard puts 0 in its place inside the exponents
    only (as flash-attn does).  ``guard=False`` is the careless kernel:
    exp(-inf - (-inf)) = NaN on such a row.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v) (0 on rows
    that see no key) and L: (N_q,) (-inf there).
    """
    N_q, N_k, d_v = len(Q), len(K), V.shape[1]
    scale = 1 / math.sqrt(Q.shape[1])  # tau
    O = np.empty_like(Q, shape=(N_q, d_v))  # in HBM, like Q
    L = np.empty_like(Q, shape=N_q)  # in HBM: (N_q,)
    for i in range(0, N_q, B_r):
        Q_i = Q[i : i + B_r]  # (B_r, d)
        rows = np.arange(i, i + len(Q_i))[:, None]  # (B_r, 1): query rows
        O_i = np.zeros((len(Q_i), d_v), Q.dtype)  # on chip: (B_r, d_v)
        l_i = np.zeros(len(Q_i), Q.dtype)  # (B_r,)
        m_i = np.full(len(Q_i), -np.inf, Q.dtype)  # (B_r,)
        for j in range(0, N_k, B_c):
            K_j, V_j = K[j : j + B_c], V[j : j + B_c]
            cols = np.arange(j, j + len(K_j))  # (B_c,): the keys
            seen = visible(rows, cols, N_q, N_k)  # (B_r, B_c): visible?
            if not np.any(seen):
                continue  # an empty tile: skipped, no work at all
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            if not np.all(seen):  # a partial tile: hide the masked entries
                S_ij = np.where(seen, S_ij, -np.inf)
            m_new = np.maximum(m_i, S_ij.max(axis=1))  # -inf: no key yet
            m_exp = np.where(m_new == -np.inf, 0, m_new) if guard else m_new
            P_ij = np.exp(S_ij - m_exp[:, None])  # guard: exp(-inf - 0) = 0
            alpha = np.exp(m_i - m_exp)  # (B_r,)
            l_i = alpha * l_i + P_ij.sum(axis=1)
            O_i = alpha[:, None] * O_i + P_ij @ V_j
            m_i = m_new  # stays -inf on a row that has seen no key
        l_i = np.where(l_i > 0, l_i, 1)  # 1 on a row that sees no key
        O[i : i + B_r] = O_i / l_i[:, None]  # 0 on such a row
        L[i : i + B_r] = m_i + np.log(l_i)  # -inf on such a row
    return O, L


# --- the backward pass: recompute P from the logsumexp -----------------


def standard_attention_backward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, dO: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The standard backward pass (Dao et al. 2022, Algorithm 3), one
    head.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v), dO: (N_q, d_v)
    -> dQ, dK, dV shaped like Q, K, V.
    """
    scale = 1 / math.sqrt(Q.shape[1])
    P = safe_softmax(scale * (Q @ K.T))  # (N_q, N_k): what was stored
    dV = P.T @ dO  # (N_k, d_v)
    dP = dO @ V.T  # (N_q, N_k)
    D = np.sum(P * dP, axis=1, keepdims=True)  # (N_q, 1): rowsum(P * dP)
    dS = P * (dP - D)  # (N_q, N_k): through the softmax, row by row
    dQ = scale * (dS @ K)  # (N_q, d)
    dK = scale * (dS.T @ Q)  # (N_k, d)
    return dQ, dK, dV


def delta_from_O(O: np.ndarray, dO: np.ndarray) -> np.ndarray:
    """D_i = rowsum(dO_i * O_i), what kernels compute.
    O, dO: (..., n_q, d_v) -> D: (..., n_q).

    Equal to rowsum(P * dP) because dP = dO V^T and O = P V:
    sum_j P_ij dP_ij = sum_j P_ij sum_c dO_ic V_jc
                     = sum_c dO_ic sum_j P_ij V_jc = sum_c dO_ic O_ic.
    It needs O(n d) memory: no (n_q, n_k) array is formed.
    """
    return np.sum(dO * O, axis=-1)


def recompute_P(
    Q: np.ndarray, K: np.ndarray, L: np.ndarray, B_r: int, B_c: int
) -> np.ndarray:
    """P rebuilt tile by tile as P_ij = exp(S_ij - L_i) from the
    logsumexp L the forward saved, assembled into one (N_q, N_k) array to
    compare with softmax(S) (a backward pass uses each tile and drops
    it).  Q: (N_q, d), K: (N_k, d), L: (N_q,)."""
    scale = 1 / math.sqrt(Q.shape[1])
    P = np.empty((len(Q), len(K)), dtype=np.result_type(Q, K, L))
    for i in range(0, len(Q), B_r):
        Q_i, L_i = Q[i : i + B_r], L[i : i + B_r]  # (B_r, d), (B_r,)
        for j in range(0, len(K), B_c):
            S_ij = scale * (Q_i @ K[j : j + B_c].T)  # (B_r, B_c)
            P[i : i + B_r, j : j + B_c] = np.exp(S_ij - L_i[:, None])
    return P


def flash1_backward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, O: np.ndarray,
    l: np.ndarray, m: np.ndarray, dO: np.ndarray, B_r: int, B_c: int,
    visible: Predicate | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FlashAttention's backward (Dao et al. 2022, Algorithm 4, without
    dropout), one head: it keeps the forward's m and l (not L), and
    every step reads O_i to recompute D_i and reads and writes dQ_i.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v), O and dO: (N_q, d_v),
    l, m: (N_q,) as :func:`flash1_forward` leaves them in HBM (every
    row sees a key); visible: a mask predicate, or None
    -> dQ, dK, dV shaped like Q, K, V.
    """
    N_q, N_k, scale = len(Q), len(K), 1 / math.sqrt(Q.shape[1])
    dQ, dK, dV = (np.zeros_like(X) for X in (Q, K, V))  # 0 in HBM
    for j in range(0, N_k, B_c):  # outer loop over key blocks
        K_j, V_j = K[j : j + B_c], V[j : j + B_c]  # load K_j, V_j
        dK_j, dV_j = np.zeros_like(K_j), np.zeros_like(V_j)  # on chip
        for i in range(0, N_q, B_r):  # inner loop over query blocks
            Q_i, O_i = Q[i : i + B_r], O[i : i + B_r]  # load Q_i, O_i,
            dO_i, dQ_i = dO[i : i + B_r], dQ[i : i + B_r]  # dO_i, dQ_i,
            l_i, m_i = l[i : i + B_r], m[i : i + B_r]  # l_i, m_i
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            if visible is not None:  # masked entries: P_ij = 0 there
                seen = visible(np.arange(i, i + len(Q_i))[:, None],
                               np.arange(j, j + len(K_j)), N_q, N_k)
                S_ij = np.where(seen, S_ij, -np.inf)
            P_ij = np.exp(S_ij - m_i[:, None]) / l_i[:, None]  # m and l
            dV_j += P_ij.T @ dO_i  # (B_c, d_v)
            dP_ij = dO_i @ V_j.T  # (B_r, B_c)
            D_i = np.sum(dO_i * O_i, axis=1)  # (B_r,): at every step
            dS_ij = P_ij * (dP_ij - D_i[:, None])  # (B_r, B_c)
            dQ[i : i + B_r] = dQ_i + scale * (dS_ij @ K_j)  # write dQ_i
            dK_j += scale * (dS_ij.T @ Q_i)  # (B_c, d)
        dK[j : j + B_c], dV[j : j + B_c] = dK_j, dV_j  # write, once
    return dQ, dK, dV


def flash2_backward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, O: np.ndarray,
    L: np.ndarray, dO: np.ndarray, B_r: int, B_c: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FlashAttention-2 backward (Dao 2023, Algorithm 2), one head: P is
    recomputed from L, not stored.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v), O and dO: (N_q, d_v),
    L: (N_q,) from :func:`flash2_forward` -> dQ, dK, dV shaped like Q, K, V.
    """
    N_q, N_k, scale = len(Q), len(K), 1 / math.sqrt(Q.shape[1])
    D, dK, dV = (np.empty_like(X) for X in (L, K, V))  # in HBM
    for i in range(0, N_q, B_r):  # D_i = rowsum(dO_i * O_i), to HBM
        D[i : i + B_r] = np.sum(dO[i : i + B_r] * O[i : i + B_r], axis=1)
    dQ = np.zeros_like(Q)  # initialise dQ = 0 in HBM
    for j in range(0, N_k, B_c):  # outer loop over key blocks
        K_j, V_j = K[j : j + B_c], V[j : j + B_c]  # load K_j, V_j
        dK_j, dV_j = np.zeros_like(K_j), np.zeros_like(V_j)  # on chip
        for i in range(0, N_q, B_r):  # inner loop over query blocks
            Q_i, dO_i = Q[i : i + B_r], dO[i : i + B_r]  # load Q_i, dO_i,
            L_i, D_i = L[i : i + B_r], D[i : i + B_r]  # L_i, D_i
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            P_ij = np.exp(S_ij - L_i[:, None])  # (B_r, B_c): from L_i
            dV_j += P_ij.T @ dO_i  # (B_c, d_v)
            dP_ij = dO_i @ V_j.T  # (B_r, B_c)
            dS_ij = P_ij * (dP_ij - D_i[:, None])  # (B_r, B_c)
            dQ[i : i + B_r] += scale * (dS_ij @ K_j)  # read, add, write
            dK_j += scale * (dS_ij.T @ Q_i)  # (B_c, d)
        dK[j : j + B_c], dV[j : j + B_c] = dK_j, dV_j  # write, once
    return dQ, dK, dV


def two_pass_backward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, O: np.ndarray,
    L: np.ndarray, dO: np.ndarray, B_r: int, B_c: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The backward in two passes (the Triton tutorial's schedule), one
    head: pass 1 keeps K_j, V_j on chip and writes dK_j, dV_j; pass 2
    keeps Q_i on chip and writes dQ_i.  Each block of every output is
    written once, by one program (no atomic adds), at the price of
    recomputing S_ij, P_ij and dP_ij a second time.

    Shapes as :func:`flash2_backward`.
    """
    N_q, N_k, scale = len(Q), len(K), 1 / math.sqrt(Q.shape[1])
    D, dQ, dK, dV = (np.empty_like(X) for X in (L, Q, K, V))  # in HBM
    for i in range(0, N_q, B_r):  # D_i = rowsum(dO_i * O_i), to HBM
        D[i : i + B_r] = np.sum(dO[i : i + B_r] * O[i : i + B_r], axis=1)
    for j in range(0, N_k, B_c):  # pass 1: K_j, V_j stay on chip
        K_j, V_j = K[j : j + B_c], V[j : j + B_c]  # load K_j, V_j
        dK_j, dV_j = np.zeros_like(K_j), np.zeros_like(V_j)  # on chip
        for i in range(0, N_q, B_r):  # every Q_i streams by; no dQ_i
            Q_i, dO_i = Q[i : i + B_r], dO[i : i + B_r]  # load Q_i, dO_i,
            L_i, D_i = L[i : i + B_r], D[i : i + B_r]  # L_i, D_i
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            P_ij = np.exp(S_ij - L_i[:, None])  # (B_r, B_c): from L_i
            dV_j += P_ij.T @ dO_i  # (B_c, d_v)
            dP_ij = dO_i @ V_j.T  # (B_r, B_c)
            dS_ij = P_ij * (dP_ij - D_i[:, None])  # (B_r, B_c)
            dK_j += scale * (dS_ij.T @ Q_i)  # (B_c, d)
        dK[j : j + B_c], dV[j : j + B_c] = dK_j, dV_j  # write, once
    for i in range(0, N_q, B_r):  # pass 2: Q_i stays on chip
        Q_i, dO_i = Q[i : i + B_r], dO[i : i + B_r]  # load Q_i, dO_i,
        L_i, D_i = L[i : i + B_r], D[i : i + B_r]  # L_i, D_i
        dQ_i = np.zeros_like(Q_i)  # on chip: (B_r, d)
        for j in range(0, N_k, B_c):  # every K_j, V_j streams by
            K_j, V_j = K[j : j + B_c], V[j : j + B_c]  # load K_j, V_j
            S_ij = scale * (Q_i @ K_j.T)  # recomputed a second time
            P_ij = np.exp(S_ij - L_i[:, None])  # (B_r, B_c)
            dP_ij = dO_i @ V_j.T  # recomputed a second time
            dS_ij = P_ij * (dP_ij - D_i[:, None])  # (B_r, B_c)
            dQ_i += scale * (dS_ij @ K_j)  # (B_r, d)
        dQ[i : i + B_r] = dQ_i  # written once, by this program alone
    return dQ, dK, dV


# --- dropout, never stored: each tile's mask drawn from its position ---


def flash2_dropout_forward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, p_drop: float,
    seed: int, B_r: int, B_c: int, head: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2's forward with dropout on P (Dao et al. 2022,
    Algorithm 2, in FlashAttention-2's loop order), one head: tile
    (i, j) keeps entry (r, c) when a counter-based generator keyed by
    ``seed`` says so at (head, r, c); the mask Z is never stored.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O = (P * Z / (1 - p_drop))
    V: (N_q, d_v) and L: (N_q,), the logsumexp as without dropout.
    """
    N_q, N_k, d_v = len(Q), len(K), V.shape[1]
    scale = 1 / math.sqrt(Q.shape[1])  # tau
    O = np.empty_like(Q, shape=(N_q, d_v))  # in HBM, like Q: (N_q, d_v)
    L = np.empty_like(Q, shape=N_q)  # in HBM: (N_q,)
    for i in range(0, N_q, B_r):  # outer loop over query blocks
        Q_i = Q[i : i + B_r]  # load Q_i: (B_r, d)
        rows = np.arange(i, i + len(Q_i))[:, None]  # (B_r, 1): queries
        O_i = np.zeros((len(Q_i), d_v), Q.dtype)  # on chip: (B_r, d_v)
        l_i = np.zeros(len(Q_i), Q.dtype)  # (B_r,): running sum
        m_i = np.full(len(Q_i), -np.inf, Q.dtype)  # (B_r,): running max
        for j in range(0, N_k, B_c):  # inner loop over key blocks
            K_j, V_j = K[j : j + B_c], V[j : j + B_c]  # load K_j, V_j
            cols = np.arange(j, j + len(K_j))  # (B_c,): the keys
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            m_new = np.maximum(m_i, S_ij.max(axis=1))  # (B_r,)
            P_ij = np.exp(S_ij - m_new[:, None])  # (B_r, B_c): P~_ij
            alpha = np.exp(m_i - m_new)  # (B_r,)
            l_i = alpha * l_i + P_ij.sum(axis=1)  # every entry counts
            Z_ij = dropout_keep(seed, head, rows, cols, p_drop)  # drawn
            O_i = alpha[:, None] * O_i + (P_ij * Z_ij) @ V_j  # kept only
            m_i = m_new
        O[i : i + B_r] = O_i / (l_i[:, None] * (1 - p_drop))  # write O_i
        L[i : i + B_r] = m_i + np.log(l_i)  # write L_i, for backward
    return O, L


def flash2_dropout_backward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, O: np.ndarray,
    L: np.ndarray, dO: np.ndarray, p_drop: float, seed: int,
    B_r: int, B_c: int, head: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The backward of :func:`flash2_dropout_forward` (Dao et al. 2022,
    Algorithm 4's dropout, in FlashAttention-2's order), one head: each
    tile's mask Z_ij is drawn again from its position, bit for bit the
    forward's.  D_i = rowsum(dO_i * O_i) still holds (O is the dropped
    output).  Shapes as :func:`flash2_backward`.
    """
    N_q, N_k, scale = len(Q), len(K), 1 / math.sqrt(Q.shape[1])
    D, dK, dV = (np.empty_like(X) for X in (L, K, V))  # in HBM
    for i in range(0, N_q, B_r):  # D_i = rowsum(dO_i * O_i), to HBM
        D[i : i + B_r] = np.sum(dO[i : i + B_r] * O[i : i + B_r], axis=1)
    dQ = np.zeros_like(Q)  # initialise dQ = 0 in HBM
    for j in range(0, N_k, B_c):  # outer loop over key blocks
        K_j, V_j = K[j : j + B_c], V[j : j + B_c]  # load K_j, V_j
        cols = np.arange(j, j + len(K_j))  # (B_c,): the keys
        dK_j, dV_j = np.zeros_like(K_j), np.zeros_like(V_j)  # on chip
        for i in range(0, N_q, B_r):  # inner loop over query blocks
            Q_i, dO_i = Q[i : i + B_r], dO[i : i + B_r]  # load Q_i, dO_i,
            L_i, D_i = L[i : i + B_r], D[i : i + B_r]  # L_i, D_i
            rows = np.arange(i, i + len(Q_i))[:, None]  # (B_r, 1)
            Z_ij = dropout_keep(seed, head, rows, cols, p_drop)  # again
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            P_ij = np.exp(S_ij - L_i[:, None])  # (B_r, B_c): from L_i
            dV_j += (P_ij * Z_ij).T @ dO_i / (1 - p_drop)  # (B_c, d_v)
            dP_ij = (dO_i @ V_j.T) * Z_ij / (1 - p_drop)  # through Z
            dS_ij = P_ij * (dP_ij - D_i[:, None])  # (B_r, B_c)
            dQ[i : i + B_r] += scale * (dS_ij @ K_j)  # read, add, write
            dK_j += scale * (dS_ij.T @ Q_i)  # (B_c, d)
        dK[j : j + B_c], dV[j : j + B_c] = dK_j, dV_j  # write, once
    return dQ, dK, dV


# --- decoding and grouped-query attention ------------------------------


def split_kv_decode(
    q: np.ndarray, K: np.ndarray, V: np.ndarray, n_splits: int, B_c: int
) -> np.ndarray:
    """Attention of the query rows q (a few, usually one) over K, V split
    into ``n_splits`` shares, each attended by its own program, merged.

    q: (n_q, d), K: (N, d), V: (N, d_v) -> O: (n_q, d_v).
    """
    n_q, d_v, size = len(q), V.shape[1], -(-len(K) // n_splits)
    parts = [flash2_forward(q, K[s : s + size], V[s : s + size], n_q, B_c)
             for s in range(0, len(K), size)]  # one program each: O_s, L_s
    # (O_s, L_s) is the partial state m = L_s, l = 1, acc = O_s: merge
    # them all into the empty state m = -inf, l = 0, acc = 0
    state = (np.full(n_q, -np.inf, q.dtype), np.zeros(n_q, q.dtype),
             np.zeros((n_q, d_v), q.dtype))
    for O_s, L_s in parts:  # read O_s, L_s from HBM
        state = merge_states(state, (L_s, np.ones(n_q, q.dtype), O_s))
    _, l, acc = state
    O = np.asarray(acc / l[:, None], like=q)  # write O to HBM: (n_q, d_v)
    return O


def paged_kv_decode(
    q: np.ndarray, K_cache: np.ndarray, V_cache: np.ndarray,
    table: np.ndarray, N: int, n_splits: int,
) -> np.ndarray:
    """Split-KV decoding over a paged KV cache (vLLM's PagedAttention,
    Kwon et al. 2023), one sequence, one head: its keys t P ... t P + P - 1
    are page table[t] of the pool; its T = ceil(N / P) pages are cut into
    ``n_splits`` runs of ceil(T / n_splits) pages, one program each.

    q: (n_q, d), K_cache: (n_pages, P, d), V_cache: (n_pages, P, d_v),
    table: (>= T,) page ids, N: the sequence's length > 0
    -> O: (n_q, d_v).
    """
    n_q, d_v, P = len(q), V_cache.shape[2], K_cache.shape[1]
    T = -(-N // P)  # the pages that hold the N keys
    per_split = -(-T // n_splits)  # pages per split
    empty = (np.full(n_q, -np.inf, q.dtype), np.zeros(n_q, q.dtype),
             np.zeros((n_q, d_v), q.dtype))  # m, l, acc: nothing seen
    splits = []
    for s in range(0, T, per_split):  # one program per split
        state = empty
        for t in range(s, min(s + per_split, T)):  # its pages, in order
            rows = min(P, N - t * P)  # the last page may be part full
            K_t = K_cache[table[t]][:rows]  # page table[t]: (rows, d)
            V_t = V_cache[table[t]][:rows]  # (rows, d_v)
            O_t, L_t = flash2_forward(q, K_t, V_t, n_q, P)  # one tile
            state = merge_states(state, (L_t, np.ones(n_q, q.dtype), O_t))
        splits.append(state)  # the split's O_s = acc / l, L_s = m + log l
    state = empty
    for split in splits:  # the combine: merge the splits' states
        state = merge_states(state, split)
    _, l, acc = state
    return acc / l[:, None]  # O: (n_q, d_v)


def grouped_query_attention(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray
) -> np.ndarray:
    """Grouped-query attention (Ainslie et al. 2023): query head h
    attends with K/V head h // g, g = h_q / h_kv (h_kv = 1: multi-query
    attention).

    Q: (h_q, N_q, d), K: (h_kv, N_k, d), V: (h_kv, N_k, d_v)
    -> O: (h_q, N_q, d_v).
    """
    g = Q.shape[0] // K.shape[0]  # query heads per K/V head
    assert g * K.shape[0] == Q.shape[0], "h_q must be a multiple of h_kv"
    O = [standard_attention(Q[h], K[h // g], V[h // g])
         for h in range(len(Q))]
    return np.stack(O)  # (h_q, N_q, d_v)
