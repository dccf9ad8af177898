"""Standard attention, the library way: batched, masked, validated, careful about precision.

The teaching functions are :func:`flashlib.algorithms.standard_attention` and
:func:`flashlib.algorithms.standard_attention_backward` (one head, 2-D arrays, as the papers
write them).  :func:`naive_attention` and :func:`naive_attention_backward` are their library
twins, computed the way a good implementation does it (float32 for float16 inputs, the scale
applied in float32, the output rounded once at the end).  They are the reference every faster
implementation is checked against, and the baseline the book measures.  The forward holds one
n_q x n_k matrix per head: S, overwritten in place by P (a version that kept both would need
twice as much); the backward holds two (P and dP, overwritten by dS).
"""

from __future__ import annotations

import numpy as np

from flashlib.core.checks import check_flag
from flashlib.core.constants import compute_dtype
from flashlib.core.masks import visibility
from flashlib.core.problem import Problem, check_backward_problem, check_no_overflow, check_problem

__all__ = ["naive_attention", "naive_attention_backward"]


def _probabilities(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """P = softmax(scale * Q K^T) with masking, and lse, for the flattened problem.

    Returns P: (B, n_q, n_k) and lse: (B, n_q) (natural log), both in the compute dtype
    (float32 for float16 inputs).  S is computed into the array that becomes P: one n_q x n_k
    matrix per head.
    """
    dtype = compute_dtype(p.dtype)
    q, k = p.q.astype(dtype, copy=False), p.k.astype(dtype, copy=False)
    s = q @ k.swapaxes(-1, -2)  # Q K^T: (B, n_q, n_k), accumulated in the compute dtype
    del q, k  # float32 copies for float16 inputs: free them before the n x n work
    s *= p.scale  # S, in place; the scale is a scalar of the compute dtype: no promotion
    lengths = None if p.key_lengths is None else p.key_lengths.reshape(
        p.batch_shape + (1, 1))
    lo, offset = p.lo, p.offset
    if p.bands is not None:  # a band per sequence: (..., 1, 1) each
        per = p.bands.reshape(p.batch_shape + (1, 1, 2))
        lo = None if lo is None else per[..., 0]
        offset = None if offset is None else per[..., 1]
    visible = visibility(p.n_q, p.n_k, offset, p.mask, lo, lengths)
    if visible is not None:  # (..., n_q, n_k) broadcasts against S in the batch shape
        np.copyto(p.unflatten(s), -np.inf, where=~visible)
    m = s.max(axis=-1, keepdims=True) if p.n_k else np.full(s.shape[:-1] + (1,), -np.inf, dtype)
    empty = np.isneginf(m)  # rows that see no key
    m[empty] = 0
    s -= m  # may overflow to -inf for scores far below the maximum: exp gives 0, as it should
    np.exp(s, out=s)
    l = s.sum(axis=-1, keepdims=True)  # noqa: E741
    s /= np.where(empty, 1, l)
    lse = np.full(l.shape[:-1], -np.inf, dtype=dtype)
    np.log(l[..., 0], out=lse, where=~empty[..., 0])
    lse += m[..., 0]
    return s, lse


def naive_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool | str = False,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    return_lse: bool = False,
    window: tuple[int | None, int | None] | None = None,
    key_lengths: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """``softmax(scale * q @ k^T, masked) @ v``, materialising the (n_q, n_k) scores.

    Shapes, grouped-query heads, causal, mask, window, key_lengths, scale and return_lse:
    the options of :mod:`flashlib.fast`, said once there.  For float16 inputs the scores,
    the softmax and P @ V are computed in float32 and the output is rounded to float16 once,
    at the end.  A problem whose score matrix would not fit in the available memory raises
    MemoryError before allocating it; one whose scores overflow the compute dtype raises
    ValueError.
    """
    return_lse = check_flag(return_lse, "return_lse")
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale, score_matrices=1,
                      window=window, key_lengths=key_lengths, gqa=True).repeat_kv()
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        probs, lse = _probabilities(p)
        o = probs @ p.v.astype(probs.dtype, copy=False)
    with np.errstate(over="ignore", under="ignore"):  # to float16: inf is refused below
        o = p.unflatten(o.astype(p.dtype, copy=False))
    check_no_overflow(p.dtype, o, stats=lse)
    return (o, p.unflatten(lse)) if return_lse else o


def naive_attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    causal: bool | str = False,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    key_lengths: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dq, dk, dv) of ``sum(do * naive_attention(q, k, v))``, storing P.

    do: (..., n_q, d_v); the other options as the forward call's (:mod:`flashlib.fast`).
    With ``dP = dO V^T`` and ``D = rowsum(dO * O) = rowsum(dP * P)``: ``dV = P^T dO``,
    ``dS = P * (dP - D)``, ``dQ = scale dS K``, ``dK = scale dS^T Q``.
    Computed like :func:`naive_attention` (float32 for float16 inputs); returns q's dtype.
    Holds two (n_q, n_k) matrices per head, P and dP (overwritten by dS).  Grouped-query
    attention as in :func:`naive_attention`: dk, dv have k's shape, summed over each group.
    """
    p, do, _, _ = check_backward_problem(q, k, v, do, causal=causal, mask=mask, scale=scale,
                                         score_matrices=2, window=window,
                                         key_lengths=key_lengths, gqa=True)
    g, p = p, p.repeat_kv()
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        probs, _ = _probabilities(p)
        dtype = probs.dtype
        k, v, do = (x.astype(dtype, copy=False) for x in (p.k, p.v, do))
        delta = np.sum(do * (probs @ v), axis=-1, keepdims=True)  # D = rowsum(dO * O)
        dv = probs.swapaxes(-1, -2) @ do  # dV = P^T dO
        ds = do @ v.swapaxes(-1, -2)  # dP = dO V^T, then in place dS = P * (dP - D)
        ds -= delta
        ds *= probs
        dq = ds @ k
        dq *= p.scale
        dk = ds.swapaxes(-1, -2) @ p.q.astype(dtype, copy=False)  # (B, n_k, d)
        dk *= p.scale
    dk, dv = g.sum_kv(dk), g.sum_kv(dv)  # grouped-query attention: sum over each group
    with np.errstate(over="ignore", under="ignore"):  # to float16: inf is refused below
        grads = tuple(x.astype(p.dtype, copy=False) for x in (p.unflatten(dq), dk, dv))
    check_no_overflow(p.dtype, *grads)
    return grads
