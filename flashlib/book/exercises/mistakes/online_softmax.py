"""The online-softmax chapter's declared mistakes (flashlib.book.exercises.online_softmax)."""

from __future__ import annotations

import numpy as np

from flashlib.book.exercises.online_softmax import (
    check_empty_partial,
    check_merge,
    check_merge_counterexample,
    check_online_update,
    merge_forgetting_acc_rescale,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes
from flashlib.fast.online import PartialAttention, partial_attention

# ---- 3.1 online update (a block of values at once) -------------------------------------------


def _top(m, xs):
    return max(m, float(np.max(xs))) if len(xs) else m


def no_rescale(m, l, xs):
    m_new = _top(m, xs)
    return m_new, (l + np.sum(np.exp(xs - m_new))) if m_new > -np.inf else 0.0


def upside_down(m, l, xs):
    m_new = _top(m, xs)
    if m_new == -np.inf:
        return m_new, 0.0
    return m_new, l * np.exp(m_new - m) + np.sum(np.exp(xs - m_new))


def unguarded(m, l, xs):
    m_new = _top(m, xs)
    return m_new, l * np.exp(m - m_new) + np.sum(np.exp(xs - m_new))


def max_only(m, l, xs):
    m_new = _top(m, xs)
    if m_new == -np.inf:
        return m_new, 0.0
    return m_new, l * np.exp(m - m_new) + np.exp(np.max(xs) - m_new)


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
    Mistake("nothing updated", (unchanged,), ("m_new = max(m, max(xs))",)),
    Mistake("m only", (m_only,), ("return a pair",)),
)


# ---- 3.2 merge -------------------------------------------------------------------------------

def _merge(a, b):
    """A right merge (what each mistake below changes one thing of)."""
    m = np.maximum(a.m, b.m)
    safe = np.where(np.isneginf(m), 0.0, m)
    x, y = np.exp(a.m - safe), np.exp(b.m - safe)
    return PartialAttention(m, a.l * x + b.l * y, a.acc * x[:, None] + b.acc * y[:, None])


def no_l_rescale(a, b):
    p = _merge(a, b)
    return p.m, a.l + b.l, p.acc


def half_rescaled(a, b):
    p = _merge(a, b)
    return p.m, p.l, a.acc * np.exp(a.m - p.m)[:, None] + b.acc


def normalised(a, b):
    p = _merge(a, b)
    return p.m, p.l, p.acc / p.l[:, None]


def min_max(a, b):
    p = _merge(a, b)
    return np.minimum(a.m, b.m), p.l, p.acc


def unguarded_merge(a, b):
    m = np.maximum(a.m, b.m)
    x, y = np.exp(a.m - m), np.exp(b.m - m)
    return m, a.l * x + b.l * y, a.acc * x[:, None] + b.acc * y[:, None]


def lopsided(a, b):
    return _merge(a, b) if a.m[0] >= b.m[0] else _merge(a, a)


def asymmetric(a, b):  # right for merge(a, b), wrong for merge(b, a)
    return _merge(a, b) if a.m[0] <= b.m[0] else _merge(a, a)


declare_mistakes(
    check_merge,
    Mistake("acc not rescaled", (merge_forgetting_acc_rescale,), ("forgot to rescale acc",)),
    Mistake("l not rescaled", (no_l_rescale,), ("added l_a + l_b without rescaling",)),
    Mistake("acc_b not rescaled", (half_rescaled,), ("acc_b is not rescaled",)),
    Mistake("acc normalised", (normalised,), ("keep acc unnormalised",)),
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
