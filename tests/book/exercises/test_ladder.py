"""The checkers of the optimisation-ladder chapter (flashlib.book.exercises.ladder) accept a
right answer, survive a crashing or unattempted one, and name each common wrong one (each
mistake below was run to find its diagnosis)."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.book.exercises import NOT_ATTEMPTED
from flashlib.book.exercises import ladder as lx
from flashlib.core.constants import LOG2E
from flashlib.core.masks import causal_tiles
from tests.helpers import assert_fails_with, crashing, learner_copy, not_attempted, text

# a learner's copy: the library's own causal_tiles is refused in the causal-tiles exercise
LIBRARY_CAUSAL_TILES = causal_tiles
causal_tiles = learner_copy(causal_tiles)

ALL = [lx.check_scores_base2, lx.check_pv_and_rowsum, lx.check_needs_rescale,
       lx.check_causal_tiles]


@pytest.mark.parametrize("check", ALL)
def test_not_attempted_and_crashing(check):
    assert text(check(not_attempted)).count(NOT_ATTEMPTED) == 1
    assert_fails_with(check(crashing), "ValueError: oops")


# ---- scores in base 2 -----------------------------------------------------------------------

def test_scores_base2_right():
    assert lx.check_scores_base2(lambda q, k, scale: (q * q.dtype.type(scale * LOG2E)) @ k.T
                                 ).passed
    # folding the constant into k is as good
    assert lx.check_scores_base2(lambda q, k, scale: q @ (k * k.dtype.type(scale * LOG2E)).T
                                 ).passed


def test_scores_base2_constant_after_the_matmul():
    """Right values at ordinary sizes, the right dtype: only the overflow case tells."""
    fb = lx.check_scores_base2(lambda q, k, scale: (q @ k.T) * q.dtype.type(scale * LOG2E))
    assert_fails_with(fb, "multiplied after the matmul")
    assert "ok float32 q (5, 4)" in text(fb)  # right at ordinary sizes


# ---- row sum in the matmul ------------------------------------------------------------------

def ones_column(p, v, dtype=None):
    ones = np.ones(v.shape[:-1] + (1,), v.dtype if dtype is None else dtype)
    out = p @ np.concatenate([v, ones], axis=-1)
    return out[..., :-1], out[..., -1]


def test_pv_and_rowsum_float64_ones_column():
    assert_fails_with(lx.check_pv_and_rowsum(lambda p, v: ones_column(p, v, np.float64)),
                      "ones column is float64")


# ---- the other mistakes of each checker ------------------------------------------------

def test_check_scores_base2():
    from flashlib.book.exercises.ladder import check_scores_base2
    from flashlib.core.constants import LOG2E

    good = check_scores_base2(lambda q, k, s: (q * q.dtype.type(s * LOG2E)) @ k.T)
    assert good.passed, good
    no_log2e = check_scores_base2(lambda q, k, s: (q * q.dtype.type(s)) @ k.T)
    assert not no_log2e.passed and "log2(e)" in str(no_log2e)
    promoted = check_scores_base2(lambda q, k, s: (q * np.float64(s * LOG2E)) @ k.T)
    assert not promoted.passed and "promote" in str(promoted)

    def todo(q, k, s):
        raise NotImplementedError

    assert "not attempted" in str(check_scores_base2(todo))


def test_check_pv_and_rowsum():
    from flashlib.book.exercises.ladder import check_pv_and_rowsum

    def good(p, v):
        out = p @ np.concatenate([v, np.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
        return out[..., :-1], out[..., -1]

    assert check_pv_and_rowsum(good).passed
    swapped = check_pv_and_rowsum(lambda p, v: good(p, v)[::-1])
    assert not swapped.passed
    raising = check_pv_and_rowsum(lambda p, v: 1 / 0)
    assert "ZeroDivisionError" in str(raising)
    # right values, but not from one matmul: a separate sum, or a second product
    two_passes = check_pv_and_rowsum(lambda p, v: (p @ v, p.sum(-1)))
    assert not two_passes.passed and "sum over p" in str(two_passes)
    assert "sum over p" in str(check_pv_and_rowsum(lambda p, v: (p @ v, np.sum(p, axis=-1))))
    two_products = check_pv_and_rowsum(
        lambda p, v: (p @ v, (p @ np.ones((p.shape[-1], 1)))[..., 0]))
    assert not two_products.passed and "2 matrix products" in str(two_products)


def test_check_needs_rescale():
    from flashlib.book.exercises.ladder import check_needs_rescale

    assert check_needs_rescale(lambda m, t, th: t > m + th).passed
    non_strict = check_needs_rescale(lambda m, t, th: t >= m + th)
    assert not non_strict.passed and "strict" in str(non_strict)
    # m_tile - m_old gives NaN (and a warning) for -inf rows
    nan_based = check_needs_rescale(lambda m, t, th: (t - m) > th)
    assert not nan_based.passed
    assert "numpy warned" in str(nan_based) and "invalid value" in str(nan_based)

    def todo(m, t, th):
        raise NotImplementedError

    assert "not attempted" in str(check_needs_rescale(todo))


def test_check_causal_tiles():
    from flashlib.book.exercises.ladder import check_causal_tiles

    assert check_causal_tiles(lambda n, bq, bk: causal_tiles(n, n, bq, bk)[:2]).passed
    everything = check_causal_tiles(lambda n, bq, bk: (-(-n // bq) * -(-n // bk), 0))
    assert not everything.passed and "skip" in str(everything)
    no_mask = check_causal_tiles(lambda n, bq, bk: (causal_tiles(n, n, bq, bk)[0], 0))
    assert not no_mask.passed and "top-right" in str(no_mask)
    assert "ZeroDivisionError" in str(check_causal_tiles(lambda n, bq, bk: 1 / 0))
    assert_fails_with(check_causal_tiles(lambda n, bq, bk: LIBRARY_CAUSAL_TILES(n, n, bq, bk)[:2]),
                      "refused: your code calls flashlib's `causal_tiles`")
