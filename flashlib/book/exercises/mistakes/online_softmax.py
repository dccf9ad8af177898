"""The online-softmax chapter's declared mistakes (flashlib.book.exercises.online_softmax)."""

from __future__ import annotations

import numpy as np

from flashlib.book.exercises.online_softmax import (
    check_empty_partial,
    check_merge,
    check_merge_counterexample,
    check_online_update,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes
from flashlib.fast.online import partial_attention

# ---- 3.1 online update (a block of values at once, base 2) --------------------------------


def _top(m, xs):
    return max(m, float(np.max(xs))) if len(xs) else m


def no_rescale(m, l, xs):
    m_new = _top(m, xs)
    return m_new, (l + np.sum(np.exp2(xs - m_new))) if m_new > -np.inf else 0.0


def upside_down(m, l, xs):
    m_new = _top(m, xs)
    if m_new == -np.inf:
        return m_new, 0.0
    return m_new, l * np.exp2(m_new - m) + np.sum(np.exp2(xs - m_new))


def unguarded(m, l, xs):
    m_new = _top(m, xs)
    return m_new, l * np.exp2(m - m_new) + np.sum(np.exp2(xs - m_new))


def max_only(m, l, xs):
    m_new = _top(m, xs)
    if m_new == -np.inf:
        return m_new, 0.0
    return m_new, l * np.exp2(m - m_new) + np.exp2(np.max(xs) - m_new)


def base_e(m, l, xs):  # the chapter's exp, not exp2
    m_new = _top(m, xs)
    if m_new == -np.inf:
        return m_new, 0.0
    return m_new, l * np.exp(m - m_new) + np.sum(np.exp(xs - m_new))


def unchanged(m, l, xs):
    return m, l


def m_only(m, l, xs):
    return m


declare_mistakes(
    check_online_update,
    Mistake("the old sum not rescaled", (no_rescale,), ("forgot to rescale the old sum",)),
    Mistake("the factor upside down", (upside_down,), ("upside down",)),
    Mistake("no guard for -inf", (unguarded,), ("got NaN", "keep l = 0")),
    Mistake("the block's maximum only", (max_only,), ("add every value of the block",)),
    Mistake("base e", (base_e,), ("the sum in base e",)),
    Mistake("nothing updated", (unchanged,), ("m_new = max(m, max(xs))",)),
    Mistake("m only", (m_only,), ("return a pair",)),
)


# ---- 3.2 merge -------------------------------------------------------------------------------

def _merge(a, b):
    """A right merge of ``(m, l, o)`` states (what each mistake below changes one thing of)."""
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = np.maximum(m_a, m_b)
    safe = np.where(np.isneginf(m), 0.0, m)
    x, y = np.exp(m_a - safe), np.exp(m_b - safe)
    l = l_a * x + l_b * y  # noqa: E741
    acc = (l_a * x)[:, None] * o_a + (l_b * y)[:, None] * o_b
    return m, l, np.where((l > 0)[:, None], acc / np.where(l > 0, l, 1.0)[:, None], 0.0)


def merged_as_acc(a, b):  # the chapter's merge_states, on normalised states
    m = np.maximum(a[0], b[0])
    safe = np.where(np.isneginf(m), 0.0, m)
    x, y = np.exp(a[0] - safe), np.exp(b[0] - safe)
    return m, a[1] * x + b[1] * y, a[2] * x[:, None] + b[2] * y[:, None]


def no_l_rescale(a, b):
    m, l, o = _merge(a, b)
    return m, a[1] + b[1], o


def not_divided(a, b):
    m, l, o = _merge(a, b)
    return m, l, o * l[:, None]


def plain_average(a, b):
    m, l, o = _merge(a, b)
    return m, l, (a[2] + b[2]) / 2


def min_max(a, b):
    m, l, o = _merge(a, b)
    return np.minimum(a[0], b[0]), l, o


def unguarded_merge(a, b):
    m = np.maximum(a[0], b[0])
    x, y = np.exp(a[0] - m), np.exp(b[0] - m)
    l = a[1] * x + b[1] * y  # noqa: E741
    return m, l, ((a[1] * x)[:, None] * a[2] + (b[1] * y)[:, None] * b[2]) / l[:, None]


def lopsided(a, b):
    return _merge(a, b) if a[0][0] >= b[0][0] else _merge(a, a)


def asymmetric(a, b):  # right for merge(a, b), wrong for merge(b, a)
    return _merge(a, b) if a[0][0] <= b[0][0] else _merge(a, a)


declare_mistakes(
    check_merge,
    Mistake("o merged as acc", (merged_as_acc,), ("as if it were acc",)),
    Mistake("l not rescaled", (no_l_rescale,), ("added l_a + l_b without rescaling",)),
    Mistake("not divided by l", (not_divided,), ("divide by the merged l",)),
    Mistake("a plain average", (plain_average,), ("weight o_a and o_b",)),
    Mistake("the smaller maximum", (min_max,), ("expected max(m_a, m_b)",)),
    Mistake("no guard for two empty states", (unguarded_merge,),
            ("merge(empty, empty) gives NaN",)),
    Mistake("lopsided", (lopsided,), ("expected max(m_a, m_b)",)),
    Mistake("not symmetric", (asymmetric,), ("the merge must be symmetric",)),
)


# ---- 3.3 the empty state ---------------------------------------------------------------------

def m_zero(n, d):
    return np.zeros(n), np.zeros(n), np.zeros((n, d))


def l_one(n, d):
    return np.full(n, -np.inf), np.ones(n), np.zeros((n, d))


def acc_ones(n, d):
    return np.full(n, -np.inf), np.zeros(n), np.ones((n, d))


def acc_transposed(n, d):
    return np.full(n, -np.inf), np.zeros(n), np.zeros((d, n))


declare_mistakes(
    check_empty_partial,
    Mistake("m = 0", (m_zero,), ("use -inf",)),
    Mistake("l = 1", (l_one,), ("so l = 0",)),
    Mistake("acc of ones", (acc_ones,), ("all zeros",)),
    Mistake("acc transposed", (acc_transposed,), ("shapes",)),
)


# ---- 3.4 a counterexample --------------------------------------------------------------------

_v = np.random.default_rng(0).standard_normal((4, 3))
_a = partial_attention(np.array([[0.0, 1.0]]), _v[:2])

declare_mistakes(
    check_merge_counterexample,
    Mistake("the same maximum", (_a, partial_attention(np.array([[1.0, 0.0]]), _v[2:])),
            ("same maximum",)),
    Mistake("values zero", (partial_attention(np.array([[0.0, 1.0]]), np.zeros((2, 3))),
                            partial_attention(np.array([[5.0, 2.0]]), np.zeros((2, 3)))),
            ("values (acc) zero",)),
    Mistake("not a state", (_a, "b"), ("pass two states",)),
    Mistake("other queries", (_a, partial_attention(np.zeros((2, 2)), _v[:2])),
            ("same queries",)),
)
