"""The checkers of the optimisation-ladder chapter (flashlib.book.exercises.ladder) accept a
right answer, survive a crashing or unattempted one, and refuse the library's function; each
common wrong one, with the diagnosis found by running it, is declared in
flashlib/book/exercises/mistakes/ladder.py (tests/book/exercises/test_declared_mistakes.py)."""

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


# ---- row sum in the matmul ------------------------------------------------------------------

# ---- the other mistakes of each checker ------------------------------------------------

def test_check_pv_and_rowsum():
    from flashlib.book.exercises.ladder import check_pv_and_rowsum

    def good(p, v):
        out = p @ np.concatenate([v, np.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
        return out[..., :-1], out[..., -1]

    assert check_pv_and_rowsum(good).passed
    assert "ZeroDivisionError" in str(check_pv_and_rowsum(lambda p, v: 1 / 0))


def test_check_needs_rescale():
    from flashlib.book.exercises.ladder import check_needs_rescale

    assert check_needs_rescale(lambda m, t, th: t > m + th).passed


def test_check_causal_tiles():
    from flashlib.book.exercises.ladder import check_causal_tiles

    assert check_causal_tiles(lambda n, bq, bk: causal_tiles(n, n, bq, bk)[:2]).passed
    assert "ZeroDivisionError" in str(check_causal_tiles(lambda n, bq, bk: 1 / 0))
    assert_fails_with(check_causal_tiles(lambda n, bq, bk: LIBRARY_CAUSAL_TILES(n, n, bq, bk)[:2]),
                      "refused: your code calls flashlib's `causal_tiles`")

