"""Online softmax: the one-pass running (max, sum) and the merge of partial attention states.

Milakov & Gimelshein (2018) keep a running maximum ``m`` and a running sum ``l`` of
``exp(x - m)``; when a new value raises the maximum, the old sum is rescaled by
``exp(m_old - m_new)``.  FlashAttention carries one more quantity per row, the unnormalised
output ``acc = sum_j exp(s_j - m) v_j``, and two such partial states merge exactly, in any order
and in any tree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from flashlib._validate import check_int

__all__ = [
    "SoftmaxState",
    "TraceStep",
    "PartialAttention",
    "softmax_state_init",
    "online_softmax_update",
    "online_softmax",
    "two_pass_softmax_state",
    "partial_attention",
    "partial_blocks",
    "merge_partials",
    "finalize_partial",
    "merge_in_order",
    "merge_random_tree",
]


class SoftmaxState(NamedTuple):
    """Running softmax statistics of a stream (or of each row of a batch of streams).

    m: (...,) running maximum; ``-inf`` before any value.
    l: (...,) running sum of ``exp(x - m)``; ``0`` before any value.
    """

    m: np.ndarray
    l: np.ndarray  # noqa: E741  (the paper's name)


class TraceStep(NamedTuple):
    """One step of :func:`online_softmax` with ``trace=True``.

    ``k`` counts the values seen so far, ``x_k`` is the block just read, ``m_k`` and ``l_k`` the
    state after it, and ``rescale = exp(m_{k-1} - m_k)`` the factor the old sum was multiplied by
    (1 when the maximum did not change).
    """

    k: int
    x_k: np.ndarray
    m_k: np.ndarray
    l_k: np.ndarray
    rescale: np.ndarray


class PartialAttention(NamedTuple):
    """Attention over a subset of the keys, kept unnormalised so that subsets can be merged.

    m:   (..., n_q)       row maximum of the scores seen
    l:   (..., n_q)       ``sum_j exp(s_ij - m_i)``
    acc: (..., n_q, d_v)  ``sum_j exp(s_ij - m_i) v_j``
    """

    m: np.ndarray
    l: np.ndarray  # noqa: E741
    acc: np.ndarray


def _as_float(x: np.ndarray | float, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.bool_ or not np.issubdtype(x.dtype, np.number):
        raise TypeError(f"{name} must be a real floating-point array, got dtype {x.dtype}")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    return x


def _exp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``exp(a - b)`` with ``exp(-inf - (-inf))`` defined as 0 (an empty state contributes 0)."""
    with np.errstate(invalid="ignore"):
        diff = a - b
    return np.exp(np.where(np.isnan(diff), -np.inf, diff))


def softmax_state_init(
    shape: tuple[int, ...] = (), dtype: np.dtype | type = np.float64
) -> SoftmaxState:
    """The empty state: ``m = -inf``, ``l = 0``, of the given batch ``shape``."""
    return SoftmaxState(np.full(shape, -np.inf, dtype=dtype), np.zeros(shape, dtype=dtype))


def online_softmax_update(state: SoftmaxState, x: np.ndarray | float) -> SoftmaxState:
    """Fold one value, or a block of values along the last axis, into ``state``.

    state: SoftmaxState with m, l of shape (...,)
    x:     a scalar / shape (...,) for one value per stream, or (..., b) for a block of b values.

    ``m_new = max(m, max(x))`` and ``l_new = l * exp(m - m_new) + sum(exp(x - m_new))``.
    """
    x = _as_float(x, "x")
    m, l = np.asarray(state.m), np.asarray(state.l)  # noqa: E741
    if x.ndim == m.ndim:
        x = x[..., None]
    if x.shape[:-1] != m.shape:
        raise ValueError(
            f"x must have shape {m.shape} (one value) or {m.shape + ('b',)} (a block), "
            f"got {x.shape}"
        )
    if x.shape[-1] == 0:
        return SoftmaxState(m.copy(), l.copy())
    dtype = np.result_type(m.dtype, x.dtype)
    m_new = np.maximum(m, x.max(axis=-1)).astype(dtype, copy=False)
    l_new = l * _exp_diff(m, m_new) + _exp_diff(x, m_new[..., None]).sum(axis=-1)
    return SoftmaxState(m_new, l_new.astype(dtype, copy=False))


def online_softmax(
    x: np.ndarray, *, block: int = 1, trace: bool = False
) -> SoftmaxState | tuple[SoftmaxState, list[TraceStep]]:
    """One pass over ``x`` (..., n) in blocks of ``block`` values; returns the final (m, l).

    With ``trace=True`` also returns the list of :class:`TraceStep` (one per block), which the
    Online softmax chapter prints and plots.
    """
    x = _as_float(x, "x")
    if x.ndim == 0:
        raise ValueError("x must have at least one axis (..., n), got a scalar")
    block = check_int(block, "block", minimum=1)
    state = softmax_state_init(x.shape[:-1], x.dtype)
    steps: list[TraceStep] = []
    n = x.shape[-1]
    for start in range(0, n, block):
        x_k = x[..., start : start + block]
        new = online_softmax_update(state, x_k)
        if trace:
            steps.append(
                TraceStep(min(start + block, n), x_k.copy(), new.m, new.l,
                          _exp_diff(state.m, new.m))
            )
        state = new
    return (state, steps) if trace else state


def two_pass_softmax_state(x: np.ndarray) -> SoftmaxState:
    """The reference: first pass the maximum, second pass the sum of ``exp(x - m)``."""
    x = _as_float(x, "x")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have shape (..., n) with n >= 1, got {x.shape}")
    m = x.max(axis=-1)
    return SoftmaxState(m, _exp_diff(x, m[..., None]).sum(axis=-1))


def partial_attention(s: np.ndarray, v: np.ndarray) -> PartialAttention:
    """The partial state of one block of keys.

    s: (..., n_q, b)    scores of the block (``-inf`` where masked)
    v: (..., b, d_v)    values of the block
    """
    s = _as_float(s, "s")
    v = _as_float(v, "v")
    if s.ndim < 2 or v.ndim < 2 or s.shape[-1] != v.shape[-2]:
        raise ValueError(f"s (..., n_q, b) and v (..., b, d_v) disagree: {s.shape} vs {v.shape}")
    m = s.max(axis=-1) if s.shape[-1] else np.full(s.shape[:-1], -np.inf, s.dtype)
    p = _exp_diff(s, m[..., None])
    return PartialAttention(m, p.sum(axis=-1), p @ v)


def partial_blocks(s: np.ndarray, v: np.ndarray, block: int) -> list[PartialAttention]:
    """The partial states of consecutive key blocks of ``block`` keys (the last may be shorter).

    s: (..., n_q, n_k) scores, v: (..., n_k, d_v) values; returns one
    :func:`partial_attention` per block ``j:j + block`` of the keys, in order.
    """
    s = _as_float(s, "s")
    v = _as_float(v, "v")
    block = check_int(block, "block", minimum=1)
    if s.ndim < 2 or v.ndim < 2 or s.shape[-1] != v.shape[-2]:
        raise ValueError(
            f"s (..., n_q, n_k) and v (..., n_k, d_v) disagree: {s.shape} vs {v.shape}"
        )
    n_k = s.shape[-1]
    return [partial_attention(s[..., j : j + block], v[..., j : j + block, :])
            for j in range(0, n_k, block)]


def merge_partials(a: PartialAttention, b: PartialAttention) -> PartialAttention:
    """Merge two partial states over disjoint key sets; associative and commutative.

    ``m = max(m_a, m_b)``, ``l = l_a e^(m_a - m) + l_b e^(m_b - m)``, same scaling for ``acc``.
    """
    m = np.maximum(a.m, b.m)
    alpha, beta = _exp_diff(a.m, m), _exp_diff(b.m, m)
    return PartialAttention(
        m, a.l * alpha + b.l * beta, a.acc * alpha[..., None] + b.acc * beta[..., None]
    )


def finalize_partial(p: PartialAttention) -> np.ndarray:
    """The attention output ``acc / l`` (..., n_q, d_v); rows that saw no key give 0."""
    l = p.l[..., None]  # noqa: E741
    return np.divide(p.acc, l, out=np.zeros_like(p.acc), where=l > 0)


def merge_in_order(parts: Sequence[PartialAttention], order: Iterable[int]) -> PartialAttention:
    """Merge ``parts`` left to right in the given ``order`` (a permutation of their indices).

    parts: states over disjoint key blocks, each with m, l: (..., n_q), acc: (..., n_q, d_v).
    ``order`` must name every part exactly once; the result is the state over all their keys.
    """
    order = [int(i) for i in order]
    if not parts:
        raise ValueError("parts must hold at least one PartialAttention")
    if sorted(order) != list(range(len(parts))):
        raise ValueError(f"order must be a permutation of range({len(parts)}), got {order}")
    state = parts[order[0]]
    for i in order[1:]:
        state = merge_partials(state, parts[i])
    return state


def merge_random_tree(
    parts: Sequence[PartialAttention], rng: np.random.Generator
) -> PartialAttention:
    """Merge ``parts`` in a random tree: repeatedly merge two randomly chosen states, in a
    random argument order, until one is left (shapes as in :func:`merge_in_order`)."""
    if not parts:
        raise ValueError("parts must hold at least one PartialAttention")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator (np.random.default_rng), got {rng!r}")
    pool = list(parts)
    while len(pool) > 1:
        i, j = sorted(int(x) for x in rng.choice(len(pool), size=2, replace=False))
        b, a = pool.pop(j), pool.pop(i)
        pool.append(merge_partials(a, b) if rng.random() < 0.5 else merge_partials(b, a))
    return pool[0]
