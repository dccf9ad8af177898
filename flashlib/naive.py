"""Standard attention, the textbook way: materialise S = Q K^T and P = softmax(S).

This is the reference every faster implementation is checked against, and the baseline the
book measures.  It holds one n_q x n_k matrix per head: S, overwritten in place by P (a version
that kept both would need twice as much).
"""

from __future__ import annotations

import numpy as np

from flashlib._validate import Problem, check_finite, check_like, check_problem
from flashlib.masks import visible_keys

__all__ = ["naive_attention", "naive_attention_backward"]


def _probabilities(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """P = softmax(scale * Q K^T) with masking, and lse, for the flattened problem.

    Returns P: (B, n_q, n_k) in the input dtype and lse: (B, n_q) (natural log).
    """
    s = p.q @ p.k.swapaxes(-1, -2)  # (B, n_q, n_k)
    s *= p.scale  # in place, and the scale has the input dtype: no promotion
    visible = visible_keys(p.n_q, p.n_k, p.offset, p.mask)
    if visible is not None:
        visible = np.broadcast_to(visible, p.batch_shape + (p.n_q, p.n_k))
        s[~visible.reshape(s.shape)] = -np.inf
    m = s.max(axis=-1, keepdims=True) if p.n_k else np.full(s.shape[:-1] + (1,), -np.inf)
    m = m.astype(s.dtype, copy=False)
    empty = np.isneginf(m)  # rows that see no key
    m[empty] = 0
    s -= m
    np.exp(s, out=s)
    l = s.sum(axis=-1, keepdims=True)  # noqa: E741
    s /= np.where(empty, 1, l)
    lse_dtype = np.promote_types(s.dtype, np.float32)
    lse = np.full(l.shape[:-1], -np.inf, dtype=lse_dtype)
    np.log(l[..., 0].astype(lse_dtype), out=lse, where=~empty[..., 0])
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
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """``softmax(scale * q @ k^T, masked) @ v``, computed in the input dtype.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) -> o: (..., n_q, d_v)
    causal: False, True / "top_left" (row i sees j <= i), "bottom_right" (j <= i + n_k - n_q)
    mask: boolean, broadcastable to (..., n_q, n_k); True = may attend.
    scale: defaults to 1/sqrt(d), cast to the input dtype.
    With ``return_lse`` also returns lse: (..., n_q), ``-inf`` for rows that see no key.
    """
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale)
    probs, lse = _probabilities(p)
    o = p.unflatten(probs @ p.v)
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dq, dk, dv) of ``sum(do * naive_attention(q, k, v))``, storing P.

    do: (..., n_q, d_v).  With ``dP = dO V^T`` and ``D = rowsum(dO * O) = rowsum(dP * P)``:
    ``dV = P^T dO``, ``dS = P * (dP - D)``, ``dQ = scale dS K``, ``dK = scale dS^T Q``.
    """
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale)
    do = check_like(do, "do", p.batch_shape + (p.n_q, p.v.shape[-1]), p.dtype)
    check_finite(do, "do")
    do = do.reshape(p.q.shape[0], p.n_q, -1)
    probs, _ = _probabilities(p)
    dv = probs.swapaxes(-1, -2) @ do
    dp = do @ p.v.swapaxes(-1, -2)
    delta = np.sum(dp * probs, axis=-1, keepdims=True)
    ds = probs * (dp - delta)
    ds *= p.scale
    dq = ds @ p.k
    dk = ds.swapaxes(-1, -2) @ p.q
    return p.unflatten(dq), p.unflatten(dk), p.unflatten(dv)
