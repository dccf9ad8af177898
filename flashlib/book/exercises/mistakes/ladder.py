"""The optimisation ladder's declared mistakes (flashlib.book.exercises.ladder)."""

from __future__ import annotations

import numpy as np

from flashlib.book.exercises.ladder import (
    check_causal_tiles,
    check_needs_rescale,
    check_pv_and_rowsum,
    check_scores_base2,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes, learner_copy
from flashlib.core import masks
from flashlib.core.constants import LOG2E

# a learner's copy: the library's own causal_tiles is refused in the causal-tiles exercise
_causal_tiles = learner_copy(masks.causal_tiles)


# ---- 5.1 scores in base 2 --------------------------------------------------------------------

def constant_after_the_matmul(q, k, scale):  # right values at ordinary sizes: overflow tells
    return (q @ k.T) * q.dtype.type(scale * LOG2E)


def no_log2e(q, k, scale):
    return (q * q.dtype.type(scale)) @ k.T


def promoted(q, k, scale):
    return (q * np.float64(scale * LOG2E)) @ k.T


declare_mistakes(
    check_scores_base2,
    Mistake("the constant after the matmul", (constant_after_the_matmul,),
            ("multiplied after the matmul", "ok float32 q (5, 4)")),
    Mistake("no log2(e)", (no_log2e,), ("log2(e)",)),
    Mistake("promoted to float64", (promoted,), ("promote",)),
)


# ---- 5.2 P V and the row sum in one matmul ---------------------------------------------------

def _ones_column(p, v, dtype=None):
    ones = np.ones(v.shape[:-1] + (1,), v.dtype if dtype is None else dtype)
    out = p @ np.concatenate([v, ones], axis=-1)
    return out[..., :-1], out[..., -1]


def float64_ones(p, v):
    return _ones_column(p, v, np.float64)


def swapped(p, v):
    return _ones_column(p, v)[::-1]


def a_separate_sum(p, v):
    return p @ v, p.sum(-1)


def np_sum(p, v):
    return p @ v, np.sum(p, axis=-1)


def two_products(p, v):
    return p @ v, (p @ np.ones((p.shape[-1], 1)))[..., 0]


declare_mistakes(
    check_pv_and_rowsum,
    Mistake("a float64 ones column", (float64_ones,), ("ones column is float64",)),
    Mistake("(l, O)", (swapped,), ("pv has shape (4,), expected (4, 3)",)),
    # right values, but not from one matmul: a separate sum, or a second product
    Mistake("a separate sum", (a_separate_sum,), ("sum over p",)),
    Mistake("np.sum", (np_sum,), ("sum over p",)),
    Mistake("two products", (two_products,), ("2 matrix products",)),
)


# ---- 5.3 when to rescale ---------------------------------------------------------------------

def non_strict(m, t, th):
    return t >= m + th


def nan_based(m, t, th):  # m_tile - m_old gives NaN (and a warning) for -inf rows
    return (t - m) > th


declare_mistakes(
    check_needs_rescale,
    Mistake("not strict", (non_strict,), ("strict",)),
    Mistake("a difference of -inf", (nan_based,), ("numpy warned", "invalid value")),
)


# ---- 5.4 causal tiles ------------------------------------------------------------------------

def every_tile(n, bq, bk):
    return -(-n // bq) * -(-n // bk), 0


def no_mask(n, bq, bk):
    return _causal_tiles(n, n, bq, bk)[0], 0


declare_mistakes(
    check_causal_tiles,
    Mistake("every tile computed", (every_tile,), ("skip",)),
    Mistake("no tile masked", (no_mask,), ("top-right",)),
)
