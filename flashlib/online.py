"""Online softmax: the one-pass running (max, sum) and the merge of partial attention states.

Milakov & Gimelshein (2018) keep a running maximum ``m`` and a running sum ``l`` of
``exp(x - m)``; when a new value raises the maximum, the old sum is rescaled by
``exp(m_old - m_new)``.  FlashAttention carries one more quantity per row, the unnormalised
output ``acc = sum_j exp(s_j - m) v_j``, and two such partial states merge exactly, in any order
and in any tree.

:func:`online_update` and :func:`merge_states` are the two steps as the papers write them; the
rest is the library API (batched, validated, with -inf scores for masked entries).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from flashlib._validate import (
    check_float_dtype,
    check_int,
    check_online_update,
    check_order,
    check_partial,
    check_partial_pair,
    check_partials,
    check_rng,
    check_scores,
    check_scores_values,
    check_shape,
)

# The online-softmax API (re-exported by flashlib); the teaching functions online_update and
# merge_states are imported from this module by name.
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


def _exp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``exp(a - b)`` for ``a <= b``, with ``exp(-inf - (-inf))`` defined as 0 (an empty state
    contributes 0); ``a - b`` may overflow to -inf (a near -finfo.max), whose exp is 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = a - b
    return np.exp(np.where(np.isnan(diff), -np.inf, diff))


def softmax_state_init(
    shape: tuple[int, ...] = (), dtype: np.dtype | type = np.float64
) -> SoftmaxState:
    """The empty state: ``m = -inf``, ``l = 0``, of the given batch ``shape`` and float dtype."""
    shape, dtype = check_shape(shape), check_float_dtype(dtype, "dtype")
    return SoftmaxState(np.full(shape, -np.inf, dtype=dtype), np.zeros(shape, dtype=dtype))


def online_softmax_update(state: SoftmaxState, x: np.ndarray | float) -> SoftmaxState:
    """Fold one value, or a block of values along the last axis, into ``state``.

    state: SoftmaxState, or any pair (m, l), with m, l of shape (...,)
    x:     a scalar / shape (...,) for one value per stream, or (..., b) for a block of b values.

    ``m_new = max(m, max(x))`` and ``l_new = l * exp(m - m_new) + sum(exp(x - m_new))``.
    """
    return _update(*check_online_update(state, x))


def _update(m: np.ndarray, l: np.ndarray, x: np.ndarray) -> SoftmaxState:
    """:func:`online_softmax_update` on validated arrays, x: (..., b)."""
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
    x = check_scores(x, "x", min_ndim=1)
    block = check_int(block, "block", minimum=1)
    state = SoftmaxState(np.full(x.shape[:-1], -np.inf, x.dtype), np.zeros(x.shape[:-1], x.dtype))
    steps: list[TraceStep] = []
    n = x.shape[-1]
    for start in range(0, n, block):
        x_k = x[..., start : start + block]
        new = _update(state.m, state.l, x_k)
        if trace:
            steps.append(
                TraceStep(min(start + block, n), x_k.copy(), new.m, new.l,
                          _exp_diff(state.m, new.m))
            )
        state = new
    return (state, steps) if trace else state


def two_pass_softmax_state(x: np.ndarray) -> SoftmaxState:
    """The reference: first pass the maximum, second pass the sum of ``exp(x - m)``."""
    x = check_scores(x, "x", nonempty=True)
    m = x.max(axis=-1)
    return SoftmaxState(m, _exp_diff(x, m[..., None]).sum(axis=-1).astype(x.dtype, copy=False))


def partial_attention(s: np.ndarray, v: np.ndarray) -> PartialAttention:
    """The partial state of one block of keys.

    s: (..., n_q, b)    scores of the block (``-inf`` where masked)
    v: (..., b, d_v)    values of the block
    """
    s, v = check_scores_values(s, v, "b")
    return _partial(s, v)


def _partial(s: np.ndarray, v: np.ndarray) -> PartialAttention:
    """The state (m, l, acc) of one block of keys: s: (..., n_q, b) scores (-inf where masked),
    v: (..., b, d_v) values (validated by :func:`partial_attention`)."""
    m = s.max(axis=-1) if s.shape[-1] else np.full(s.shape[:-1], -np.inf, s.dtype)
    p = _exp_diff(s, m[..., None])
    return PartialAttention(m, p.sum(axis=-1), p @ v)


def partial_blocks(s: np.ndarray, v: np.ndarray, block: int) -> list[PartialAttention]:
    """The partial states of consecutive key blocks of ``block`` keys (the last may be shorter).

    s: (..., n_q, n_k) scores, v: (..., n_k, d_v) values; returns one
    :func:`partial_attention` per block ``j:j + block`` of the keys, in order.
    """
    s, v = check_scores_values(s, v, "n_k")
    block = check_int(block, "block", minimum=1)
    n_k = s.shape[-1]
    return [_partial(s[..., j : j + block], v[..., j : j + block, :])
            for j in range(0, n_k, block)]


def merge_partials(a: PartialAttention, b: PartialAttention) -> PartialAttention:
    """Merge two partial states over disjoint key sets; associative and commutative.

    ``m = max(m_a, m_b)``, ``l = l_a e^(m_a - m) + l_b e^(m_b - m)``, same scaling for ``acc``.
    ``a`` and ``b``: PartialAttention or any (m, l, acc) triples of matching shapes.
    """
    checked_a, checked_b = check_partial_pair(a, b)
    return _merge(_as_partial(a, checked_a), _as_partial(b, checked_b))


def _merge(a: PartialAttention, b: PartialAttention) -> PartialAttention:
    """:func:`merge_partials` on validated states."""
    m = np.maximum(a.m, b.m)
    alpha, beta = _exp_diff(a.m, m), _exp_diff(b.m, m)
    return PartialAttention(
        m, a.l * alpha + b.l * beta, a.acc * alpha[..., None] + b.acc * beta[..., None]
    )


def finalize_partial(p: PartialAttention) -> np.ndarray:
    """The attention output ``acc / l`` (..., n_q, d_v); rows that saw no key give 0.

    p: a PartialAttention or any (m, l, acc) triple.
    """
    _, l, acc = check_partial(p, "p")
    l = l[..., None]
    return np.divide(acc, l, out=np.zeros_like(acc), where=l > 0)


def merge_in_order(parts: Sequence[PartialAttention], order: Iterable[int]) -> PartialAttention:
    """Merge ``parts`` left to right in the given ``order`` (a permutation of their indices).

    parts: states over disjoint key blocks, each with m, l: (..., n_q), acc: (..., n_q, d_v).
    ``order`` must name every part exactly once; the result is the state over all their keys.
    """
    parts = _checked_parts(parts)
    order = check_order(order, len(parts))
    state = parts[order[0]]
    for i in order[1:]:
        state = _merge(state, parts[i])
    return state


def _as_partial(x: object, arrays: tuple[np.ndarray, ...]) -> PartialAttention:
    """The checked ``arrays`` of ``x`` as a PartialAttention: ``x`` itself when it is one."""
    if isinstance(x, PartialAttention) and all(a is b for a, b in zip(arrays, x, strict=True)):
        return x
    return PartialAttention(*arrays)


def _checked_parts(parts: object) -> list[PartialAttention]:
    """The validated states of ``parts`` (any iterable), the PartialAttentions kept as is."""
    if hasattr(parts, "__iter__") and not isinstance(parts, (str, bytes, np.ndarray)):
        parts = list(parts)  # a generator is read once
    checked = check_partials(parts)
    return [_as_partial(x, c) for x, c in zip(parts, checked, strict=True)]


def merge_random_tree(
    parts: Sequence[PartialAttention], rng: np.random.Generator
) -> PartialAttention:
    """Merge ``parts`` in a random tree: repeatedly merge two randomly chosen states, in a
    random argument order, until one is left (shapes as in :func:`merge_in_order`)."""
    pool, rng = _checked_parts(parts), check_rng(rng)
    while len(pool) > 1:
        i, j = sorted(int(x) for x in rng.choice(len(pool), size=2, replace=False))
        b, a = pool.pop(j), pool.pop(i)
        pool.append(_merge(a, b) if rng.random() < 0.5 else _merge(b, a))
    return pool[0]
