"""The masking chapter's experiments: rows that see no key, in one tile or in all of them.

A tiled kernel meets a row that sees no key in two ways: the row sees no key at all (the first
rows of a bottom-right causal mask with more queries than keys), or it sees none in one key
tile and some in a later one (the last rows of a query block under a sliding window).  Three
kernels disagree on them: the careless one (no guard: ``exp(-inf - (-inf))`` = NaN), the one
that *stores* the guard's 0 into its running maximum (right until the row's visible scores lie
far below 0), and the right one (:func:`flashlib.algorithms.masked_flash_forward`: the
maximum stays -inf, the 0 is used inside the exponent only).

:data:`BLIND_ROWS`         the demo's shape, mask and blocks (10 queries, 8 keys, window (2, 0)
                           bottom-right, blocks 5 x 4)
:func:`blind_row_problem`  that problem's Q, K, V, with the scores of the second key tile
                           shifted by ``shift`` (far below 0 for the stored guard to fail)
:func:`stored_guard_forward`  the masked forward with the guard stored into m_i (the mistake)
:func:`guard_outcomes`     every kernel's output on the problem, against the reference
:func:`underflow_score`    the score below which exp underflows to 0 in a dtype
:func:`dropout_memory`     what dropout's forward and backward hold beyond their inputs and
                           results, against the bytes of the mask they never store
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from flashlib.algorithms import masked_flash_forward
from flashlib.core.masks import Predicate, dense_mask, sliding_window
from flashlib.core.measure import measure_peak
from flashlib.fast.backward import flash_attention_backward
from flashlib.fast.forward import flash_attention
from flashlib.fast.naive import naive_attention

__all__ = ["BLIND_ROWS", "blind_row_problem", "stored_guard_forward", "guard_outcomes",
           "underflow_score", "dropout_memory"]

#: The blind-row demo: n_q queries, n_k keys, the mask and the blocks.  Under the window (2, 0)
#: aligned bottom-right, query i sees keys i - 4 .. i - 2: queries 0 and 1 see no key, and
#: queries 8 and 9, in the second query block (rows 5-9), see none in the first key tile
#: (keys 0-3) but keys 4-7 in the second.
BLIND_ROWS: dict[str, Any] = {"n_q": 10, "n_k": 8, "d": 4, "d_v": 3, "B_r": 5, "B_c": 4,
                              "window": (2, 0)}


def _demo_mask() -> Predicate:
    return sliding_window(*BLIND_ROWS["window"], align="bottom_right")


def blind_row_problem(shift: float = 0.0, seed: int = 0, dtype: Any = np.float64
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Q (n_q, d), K (n_k, d), V (n_k, d_v) and the boolean mask (n_q, n_k) of
    :data:`BLIND_ROWS`, in ``dtype``.  Q's last column is 1 and K's last column is
    ``shift * sqrt(d)`` on the keys of the second key tile (0 on the others), so that every
    score with those keys is shifted by ``shift``: with ``shift = -800`` the rows that see
    keys only there see scores near -800."""
    p = BLIND_ROWS
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((p["n_q"], p["d"]))
    K = rng.standard_normal((p["n_k"], p["d"]))
    V = rng.standard_normal((p["n_k"], p["d_v"]))
    Q[:, -1] = 1.0
    K[:, -1] = 0.0
    K[p["B_c"]:, -1] = shift * math.sqrt(p["d"])  # times the scale 1 / sqrt(d): shift
    mask = dense_mask(_demo_mask(), p["n_q"], p["n_k"])
    return Q.astype(dtype), K.astype(dtype), V.astype(dtype), mask


def stored_guard_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray,
                         B_r: int, B_c: int) -> tuple[np.ndarray, np.ndarray]:
    """The masked forward with the mistake of storing the guard: where the running maximum is
    -inf it becomes 0 *and stays 0*, so the maximum is max(0, scores seen).  Right unless a
    row's visible scores, all in tiles after one where it saw nothing, lie so far below 0 that
    exp(S - 0) underflows: then l_i = 0, O_i = 0 and L_i = -inf for a row that sees keys.
    mask: (N_q, N_k) boolean."""
    N_q, N_k, d_v = len(Q), len(K), V.shape[1]
    scale = 1 / math.sqrt(Q.shape[1])
    O, L = np.empty((N_q, d_v), Q.dtype), np.empty(N_q, Q.dtype)
    for i in range(0, N_q, B_r):
        Q_i = Q[i : i + B_r]
        O_i = np.zeros((len(Q_i), d_v), Q.dtype)
        l_i = np.zeros(len(Q_i), Q.dtype)
        m_i = np.full(len(Q_i), -np.inf, Q.dtype)
        for j in range(0, N_k, B_c):
            seen = mask[i : i + B_r, j : j + B_c]
            if not seen.any():
                continue
            S_ij = np.where(seen, scale * (Q_i @ K[j : j + B_c].T), -np.inf)
            m_new = np.maximum(m_i, S_ij.max(axis=1))
            m_new = np.where(m_new == -np.inf, 0, m_new)  # stored: the mistake
            P_ij = np.exp(S_ij - m_new[:, None])
            alpha = np.exp(m_i - m_new)
            l_i = alpha * l_i + P_ij.sum(axis=1)
            O_i = alpha[:, None] * O_i + P_ij @ V[j : j + B_c]
            m_i = m_new
        seen_any = l_i > 0
        safe = np.where(seen_any, l_i, 1)
        O[i : i + B_r] = O_i / safe[:, None]
        L[i : i + B_r] = np.where(seen_any, m_i + np.log(safe), -np.inf)
    return O, L


def guard_outcomes(shift: float = 0.0, dtype: Any = np.float64) -> dict[str, Any]:
    """Every kernel's (O, L) on :func:`blind_row_problem` (``shift``, ``dtype``): "reference"
    (naive_attention with the dense mask), "no guard" (masked_flash_forward, guard=False),
    "guard stored in m" (:func:`stored_guard_forward`) and "guard in the exponent only"
    (masked_flash_forward).  Also ``mask``, ``blind`` (rows that see no key),
    ``blind_in_first_tile`` (rows that see keys, none of them in the first key tile) and, per
    kernel, ``error``: max |O - O_ref| over the rows that see keys (nan if any is NaN)."""
    p = BLIND_ROWS
    Q, K, V, mask = blind_row_problem(shift, dtype=dtype)
    visible = _demo_mask()
    ref, ref_lse = naive_attention(Q, K, V, mask=mask, return_lse=True)
    with np.errstate(invalid="ignore"):  # the careless kernel computes -inf - (-inf)
        careless = masked_flash_forward(Q, K, V, visible, p["B_r"], p["B_c"], guard=False)
    results = {
        "reference": (ref, ref_lse),
        "no guard": careless,
        "guard stored in m": stored_guard_forward(Q, K, V, mask, p["B_r"], p["B_c"]),
        "guard in the exponent only": masked_flash_forward(Q, K, V, visible, p["B_r"],
                                                           p["B_c"]),
    }
    blind = ~mask.any(axis=1)
    first_tile_blind = ~mask[:, : p["B_c"]].any(axis=1) & ~blind
    sees = ~blind
    error = {}
    for name, (O, _) in results.items():
        diff = np.abs(O[sees].astype(np.float64) - ref[sees].astype(np.float64))
        error[name] = float(np.max(diff)) if np.isfinite(diff).all() else math.nan
    return {"results": results, "mask": mask, "blind": blind,
            "blind_in_first_tile": first_tile_blind, "error": error, "shift": shift,
            "dtype": np.dtype(dtype).name}


def underflow_score(dtype: Any) -> float:
    """The score below which exp rounds to 0 in ``dtype``: log of half the smallest subnormal
    number (about -745.13 in float64, -103.97 in float32).  A tile exponentiated against a
    maximum of 0 loses every score below it."""
    return math.log(float(np.finfo(np.dtype(dtype)).smallest_subnormal)) - math.log(2)


def dropout_memory(n: int, d: int = 32, p_drop: float = 0.1, seed: int = 0,
                   block: int = 64) -> dict[str, int]:
    """Bytes that ``flash_attention(..., dropout_p=p_drop, seed=seed)`` and its backward hold
    beyond their inputs and results (peak traced memory, :func:`measure_peak`), for one head
    of n queries and n keys of width d in float32, tiles ``block`` x ``block``; against
    ``mask_bytes`` = n * n (the mask stored as one byte per entry, as a bool array) and
    ``state_bytes`` = 16 (the seed and the offset, two 64-bit words: what the backward gets
    instead).  Keys: forward, backward, mask_bytes, state_bytes."""
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(4))
    kwargs = {"dropout_p": p_drop, "seed": seed, "block_q": block, "block_k": block}
    (o, lse), forward = measure_peak(flash_attention, q, k, v, return_lse=True, **kwargs)
    grads, backward = measure_peak(flash_attention_backward, q, k, v, o, lse, do, **kwargs)
    return {"forward": forward - o.nbytes - lse.nbytes,
            "backward": backward - sum(g.nbytes for g in grads),
            "mask_bytes": n * n, "state_bytes": 16}
