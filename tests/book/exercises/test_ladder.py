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
from tests.helpers import assert_fails_with, crashing, not_attempted, text

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


def test_scores_base2_other_mistakes():
    assert_fails_with(lx.check_scores_base2(lambda q, k, scale: (q * (scale * LOG2E)) @ k.T
                                            if q.dtype == np.float64 else
                                            (q.astype(np.float64) * (scale * LOG2E)) @ k.T),
                      "q's dtype")
    assert_fails_with(lx.check_scores_base2(lambda q, k, scale: (q * q.dtype.type(scale)) @ k.T),
                      "natural-log units")


# ---- row sum in the matmul ------------------------------------------------------------------

def ones_column(p, v, dtype=None):
    ones = np.ones(v.shape[:-1] + (1,), v.dtype if dtype is None else dtype)
    out = p @ np.concatenate([v, ones], axis=-1)
    return out[..., :-1], out[..., -1]


def test_pv_and_rowsum_right():
    assert lx.check_pv_and_rowsum(ones_column).passed


def test_pv_and_rowsum_float64_ones_column():
    assert_fails_with(lx.check_pv_and_rowsum(lambda p, v: ones_column(p, v, np.float64)),
                      "ones column is float64")


def test_pv_and_rowsum_other_mistakes():
    assert_fails_with(lx.check_pv_and_rowsum(lambda p, v: (p @ v, p.sum(-1))),
                      "second pass over the tile")
    assert_fails_with(lx.check_pv_and_rowsum(lambda p, v: (ones_column(p, v)[0],
                                                           ones_column(p, v)[1])),
                      "exactly one")


# ---- when to rescale and causal tiles -------------------------------------------------------

def test_needs_rescale():
    assert lx.check_needs_rescale(lambda m_old, m_tile, t: m_tile > m_old + t).passed
    assert_fails_with(lx.check_needs_rescale(lambda m_old, m_tile, t: m_tile >= m_old + t),
                      "strict")


def test_causal_tiles():
    assert lx.check_causal_tiles(lambda n, b_r, b_c: causal_tiles(n, n, b_r, b_c)[:2]).passed
    assert_fails_with(lx.check_causal_tiles(
        lambda n, b_r, b_c: (causal_tiles(n, n, b_r, b_c)[2], 0)), "you count all")
