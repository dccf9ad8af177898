"""Accuracy first: when the fast float32 tiles would be less accurate than plain attention, the
fast paths compute in float64 instead.

The fast forward and backward fold ``scale * log2(e)`` into Q and let the row maximum (forward)
or the logsumexp (backward) ride in the tile matmul as an extra column, ``[Q_i, -m_i] @ [K_j^T;
1] = S_ij - m_i``.  That is free, and exact enough while the scores are small; but the float32
dot product that forms ``S_ij - m_i`` rounds at the size of ``S_ij`` itself.  Plain attention
rounds there too, yet it subtracts the row maximum *after* the matmul, from the same rounded
numbers, so that its largest terms come out exact (``exp(S_max - m) = 1``); the backward's
``exp(S_ij - lse_i)``, with ``lse_i`` from the forward, has no such luck.  Measured (``python -m
flashlib.bench accuracy``, December 2026): the backward's dV error reached 12 times plain
float32's at scores 30 times the usual, 1,100 times at 3,000 times, and a wrong answer (dV
8.6e9 for an exact 4.0) with ``scale=1e8``; the forward stayed within 2x up to q 60 times the
usual and reached 23 times plain's error at scores around 300 with d = 16.

So each pass bounds its scores first (Cauchy-Schwarz: ``|S_ij| <= scale max|q_i| max|k_j|``,
O(n d) to compute) and, above a limit, computes the whole pass in float64 and rounds the result
once: the error is then the rounding alone, below plain attention's.  The limits are measured
(the sweep of :mod:`flashlib.bench.accuracy`, float32 and float16, 1 x 1 blocks and the default
tile, every mask): below them the float32 tiles stayed within flash-attn's rule everywhere,
with room.  Ordinary inputs (N(0, 1) q and k at d = 64: a bound of about 22 in base 2) and the
benchmark's 30 times larger logits in the forward stay on the float32 path; nothing is paid
where nothing is lost.  The backward in float64 recomputes P from the scores alone, not from
the caller's rounded ``lse`` (a float32 ``lse`` of 1e8 is off by up to 4, and ``exp(4)`` is
not a rounding error).

The float64 route is :func:`exact_attention`: blocks of query rows against all the keys, each
row's softmax taken against its own maximum as plain attention takes it (``S - m`` from the
same rounded numbers, so that even scores of 1e38 give the exact hard maximum), and the
backward from the same P in the same pass, so nothing is recomputed that must agree with
something rounded elsewhere.  It holds a block of rows' scores, ``(B, rows, n_k)`` within
:data:`ROW_BLOCK_BYTES`: O(n) memory per head, never (n_q, n_k).
"""

from __future__ import annotations

import numpy as np

from flashlib.core.constants import LOG2E
from flashlib.core.masks import band_hides
from flashlib.core.problem import Problem
from flashlib.fast.tiles import hidden_entries, max_row_norm

__all__ = ["FORWARD_FLOAT64_ABOVE", "BACKWARD_FLOAT64_ABOVE", "score_bound", "in_float64",
           "forward_in_float64", "backward_in_float64", "exact_attention", "ROW_BLOCK_BYTES"]

#: The forward computes in float64 when its bound on the base-2 scores exceeds this.  Measured:
#: the float32 forward stayed within 0.9 of flash-attn's bound (2 err(plain) + 1e-5) up to q 60
#: times the usual (bounds of 1,000 to 1,300), and failed at 300 times; the benchmark's x30
#: logits have a bound of about 670 (d = 64; 785 at d = 128), and stay in float32.
FORWARD_FLOAT64_ABOVE = 2.0**10

#: The backward computes in float64 when its bound on the base-2 scores, or the largest |lse|
#: in base 2, exceeds this.  Measured: float32 and float16 stayed within 0.8 of the bound up to
#: bounds of about 40 (|lse| of about 20); N(0, 1) inputs have bounds of 22 (d = 64) to 26
#: (d = 128) at n = 4096, and stay in float32.
BACKWARD_FLOAT64_ABOVE = 32.0


def score_bound(p: Problem) -> float:
    """A bound on every base-2 score ``|scale * log2(e) * q_i . k_j|`` of the problem (inf
    when the rows' squared norms overflow float32: then the scores are huge anyway)."""
    return abs(float(p.scale)) * LOG2E * max_row_norm(p.q) * max_row_norm(p.k)


def in_float64(p: Problem) -> Problem:
    """The same problem in float64 (q, k, v, the scale): what the precise route computes."""
    return p._replace(q=p.q.astype(np.float64), k=p.k.astype(np.float64),
                      v=p.v.astype(np.float64), dtype=np.dtype(np.float64),
                      scale=np.float64(p.scale))


def forward_in_float64(p: Problem) -> bool:
    """Whether :func:`flashlib.flash_attention` computes this problem in float64."""
    return p.dtype != np.float64 and not score_bound(p) <= FORWARD_FLOAT64_ABOVE


def backward_in_float64(p: Problem, lse: np.ndarray) -> bool:
    """Whether :func:`flashlib.flash_attention_backward` computes this problem in float64
    (lse: the forward's logsumexp, natural log, -inf for rows that see no key)."""
    if p.dtype == np.float64:
        return False
    finite = lse[np.isfinite(lse)]
    lse_max = float(np.max(np.abs(finite), initial=0.0)) * LOG2E
    return not max(score_bound(p), lse_max) <= BACKWARD_FLOAT64_ABOVE


#: The scores of a block of query rows (all heads, all keys) take at most this many bytes in
#: :func:`exact_attention` (at least one row).
ROW_BLOCK_BYTES = 1 << 23


def exact_attention(p: Problem, do: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, ...]:
    """Attention of a validated problem (K/V repeated per query head: ``p.repeat_kv()``) in
    its own dtype, by blocks of query rows: ``(o, lse)``, or with ``do`` (B, n_q, d_v) the
    gradients ``(dq, dk, dv)``.  Each row's softmax against its own maximum, as plain
    attention; rows that see no key give o = 0, lse = -inf and no gradient."""
    q, k, v = p.q, p.k, p.v
    n_b, n_q, n_k, d_v = q.shape[0], p.n_q, p.n_k, v.shape[-1]
    scale = q.dtype.type(p.scale)
    rows = max(1, min(n_q, ROW_BLOCK_BYTES // max(1, n_b * n_k * q.itemsize)))
    o = np.zeros((n_b, n_q, d_v), dtype=q.dtype)
    lse = np.full((n_b, n_q), -np.inf, dtype=q.dtype)
    if do is not None:
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for i0 in range(0, n_q, rows):
        i1 = min(i0 + rows, n_q)
        q_i = q[:, i0:i1]
        s = q_i @ k.swapaxes(-1, -2)  # S_i: (B, rows, n_k)
        s *= scale
        hidden = hidden_entries(i0, i1, 0, n_k, band_hides(i0, i1, 0, n_k, p.lo, p.offset),
                                p.offset, p.mask, slice(None), p.lo, p.key_lengths, p.bands)
        if hidden is not None:
            np.copyto(s, -np.inf, where=hidden)
        m = s.max(axis=-1, keepdims=True, initial=-np.inf)
        seen = ~np.isneginf(m)  # rows that see some key
        m[~seen] = 0
        s -= m
        np.exp(s, out=s)  # P~_i, exact 1 at each row's maximum
        l_i = s.sum(axis=-1, keepdims=True)
        s /= np.where(seen, l_i, 1)  # P_i
        o_i = o[:, i0:i1]
        np.matmul(s, v, out=o_i)
        np.log(l_i[..., 0], out=lse[:, i0:i1], where=seen[..., 0])
        lse[:, i0:i1] += np.where(seen[..., 0], m[..., 0], 0)
        if do is None:
            continue
        do_i = do[:, i0:i1]
        dv += s.swapaxes(-1, -2) @ do_i  # P_i^T dO_i
        ds = do_i @ v.swapaxes(-1, -2)  # dP_i
        ds -= np.sum(do_i * o_i, axis=-1, keepdims=True)  # - D_i
        ds *= s  # dS_i = P_i (dP_i - D_i)
        dq[:, i0:i1] = (ds @ k) * scale
        dk += (ds.swapaxes(-1, -2) @ q_i) * scale
    return (o, lse) if do is None else (dq, dk, dv)
