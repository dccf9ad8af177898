"""Online softmax: the one-pass running (max, sum) and the merge of partial attention states.

Milakov & Gimelshein (2018) keep a running maximum ``m`` and a running sum ``l`` of
``exp(x - m)``; when a new value raises the maximum, the old sum is rescaled by
``exp(m_old - m_new)``.  FlashAttention carries one more quantity per row, the unnormalised
output ``acc = sum_j exp(s_j - m) v_j``, and two such partial states merge exactly, in any order
and in any tree.

The two steps as the papers write them are :func:`flashlib.algorithms.online_update` and
:func:`flashlib.algorithms.merge_states`; this is the library API (batched, validated, with
-inf scores for masked entries).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from flashlib.core.checks import (
    FLOAT_DTYPES,
    MASKED_HINT_SCORES,
    as_array,
    check_finite,
    check_float_dtype,
    check_int,
    check_order,
    check_rng,
    check_shape,
)

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


def _exp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``exp(a - b)`` for ``a <= b``, with ``exp(-inf - (-inf))`` defined as 0 (an empty state
    contributes 0); ``a - b`` may overflow to -inf (a near -finfo.max), whose exp is 0."""
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):  # exp(-800) is 0
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


# --- the checks of the online-softmax API ------------------------------------------------


def check_scores(x: object, name: str, *, min_ndim: int = 0, nonempty: bool = False,
                 finite: bool = False) -> np.ndarray:
    """Scores or values for the online-softmax functions: a real array (integers become
    float64) without NaN or +inf (``-inf`` marks a masked score; with ``finite``, no infinity
    at all), at least ``min_ndim``-D, and with ``nonempty`` at least one value along the last
    axis."""
    arr = as_array(x, name, MASKED_HINT_SCORES)
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.float64)
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a real array (float16, float32, float64 or integer), got dtype "
            f"{arr.dtype}"
        )
    if finite:
        check_finite(arr, name)
    elif np.isnan(arr).any() or np.isposinf(arr).any():
        raise ValueError(f"{name} must not contain NaN or +inf (-inf marks a masked score)")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape "
                         f"{arr.shape}")
    if nonempty and (arr.ndim == 0 or arr.shape[-1] == 0):
        raise ValueError(f"{name} must have shape (..., n) with n >= 1, got {arr.shape}")
    return arr


def _state_parts(state: object, name: str, fields: tuple[str, ...]) -> tuple[Any, ...]:
    if isinstance(state, (str, bytes, np.ndarray)) or not hasattr(state, "__len__"):
        raise TypeError(f"{name} must be a pair/triple ({', '.join(fields)}), got "
                        f"{type(state).__name__}")
    if len(state) != len(fields):
        raise TypeError(f"{name} must hold {len(fields)} arrays ({', '.join(fields)}), got "
                        f"{len(state)}")
    return tuple(state)


def check_softmax_state(state: object, name: str = "state") -> tuple[np.ndarray, np.ndarray]:
    """A running softmax state: any pair ``(m, l)`` (a SoftmaxState, a tuple...) of equal
    shapes, m without NaN or +inf, l finite and >= 0."""
    m, l = _state_parts(state, name, ("m", "l"))
    m = check_scores(m, f"{name}.m")
    l = check_scores(l, f"{name}.l", finite=True)
    if m.shape != l.shape:
        raise ValueError(f"{name}.m and {name}.l must have one shape, got {m.shape} and "
                         f"{l.shape}")
    if (l < 0).any():
        raise ValueError(f"{name}.l must be finite and >= 0 (a sum of exponentials)")
    return m, l


def check_partial(state: object, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A partial attention state: any triple ``(m, l, acc)`` with m, l: (..., n_q) and
    acc: (..., n_q, d_v); m without NaN or +inf, l >= 0 and acc finite."""
    m, l, acc = _state_parts(state, name, ("m", "l", "acc"))
    m, l = check_softmax_state((m, l), name)
    acc = check_scores(acc, f"{name}.acc", min_ndim=1, finite=True)
    if acc.shape[:-1] != m.shape:
        raise ValueError(f"{name}.acc must have shape {m.shape + ('d_v',)} to match "
                         f"{name}.m {m.shape}, got {acc.shape}")
    return m, l, acc


def check_online_update(state: object, x: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A state (m, l) of shape (...,) and x of shape (...,) (one value per stream) or (..., b)
    (a block); returns m, l and x as (..., b)."""
    m, l = check_softmax_state(state)
    x = check_scores(x, "x")
    if x.ndim == m.ndim:
        x = x[..., None]
    if x.shape[:-1] != m.shape:
        raise ValueError(
            f"x must have shape {m.shape} (one value) or {m.shape + ('b',)} (a block), "
            f"got {x.shape}"
        )
    return m, l, x


def check_scores_values(s: object, v: object, n: str = "b") -> tuple[np.ndarray, np.ndarray]:
    """Scores s: (..., n_q, n) (-inf where masked) and finite values v: (..., n, d_v)."""
    s, v = check_scores(s, "s", min_ndim=2), check_scores(v, "v", min_ndim=2, finite=True)
    if s.shape[-1] != v.shape[-2]:
        raise ValueError(
            f"s (..., n_q, {n}) and v (..., {n}, d_v) disagree: {s.shape} vs {v.shape}"
        )
    return s, v


Partial = tuple[np.ndarray, np.ndarray, np.ndarray]


def check_partial_pair(a: object, b: object) -> tuple[Partial, Partial]:
    """Two partial states (m, l, acc) describing the same queries (equal shapes)."""
    a, b = check_partial(a, "a"), check_partial(b, "b")
    if a[2].shape != b[2].shape:
        raise ValueError(f"a and b must describe the same queries: acc {a[2].shape} vs "
                         f"{b[2].shape}")
    return a, b


def check_partials(parts: object) -> list[Partial]:
    """A non-empty list (any iterable) of partial states of one shape, each checked once."""
    if isinstance(parts, (str, bytes, np.ndarray)) or not hasattr(parts, "__iter__"):
        raise TypeError(f"parts must be a list of PartialAttention, got {type(parts).__name__}")
    checked = [check_partial(x, f"parts[{i}]") for i, x in enumerate(parts)]
    if not checked:
        raise ValueError("parts must hold at least one PartialAttention")
    shapes = {x[2].shape for x in checked}
    if len(shapes) > 1:
        raise ValueError(f"parts must describe the same queries, got acc shapes {sorted(shapes)}")
    return checked
