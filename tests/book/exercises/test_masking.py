"""The checkers of the masking chapter (flashlib.book.exercises.masking) accept a right answer,
survive a crashing or unattempted one, and refuse the library's functions; the common wrong
ones are declared in flashlib/book/exercises/mistakes/masking.py
(tests/book/exercises/test_declared_mistakes.py)."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.algorithms import masked_flash_forward
from flashlib.book.exercises import NOT_ATTEMPTED, variants
from flashlib.book.exercises import masking as mx
from flashlib.core.masks import band_tile_class
from flashlib.studies.masking import blind_row_problem, stored_guard_forward
from tests.helpers import (
    assert_fails_with,
    book_solution,
    crashing,
    learner_copy,
    max_err,
    not_attempted,
    reference_attention,
    text,
    torch,
    torch_attention,
)

# What a learner who copied the library's code hands in (the library's own functions are
# refused where the exercise asks for them: test_library_functions_are_refused)
band_tile_class = learner_copy(band_tile_class)
masked_flash_forward = learner_copy(masked_flash_forward)

ALL = [mx.check_tile_class, mx.check_blind_rows, mx.check_guarded_forward,
       mx.check_window_size, mx.check_tile_keep]


@pytest.mark.parametrize("check", ALL)
def test_not_attempted_and_crashing(check):
    assert text(check(not_attempted)).count(NOT_ATTEMPTED) == 1
    assert_fails_with(check(crashing), "ValueError: oops")


# ---- tile class ------------------------------------------------------------------------------

TILE_SOLUTION = book_solution("masking", "ex-masking-tile-class")["tile_class"]


def with_start(i0, i1, j0, j1, lo, hi, start, stop):
    """A right answer written another way: the library's band on the keys from start."""
    first = max(j0, start)
    if first >= j1:
        return "empty"
    got = band_tile_class(i0, i1, first, j1, lo, hi, stop)
    return "partial" if got == "full" and first > j0 else got


def test_tile_class_right():
    assert mx.check_tile_class(TILE_SOLUTION).passed, text(mx.check_tile_class(TILE_SOLUTION))
    assert mx.check_tile_class(with_start).passed


def test_tile_class_library_function_is_not_the_answer():
    """The student edition shows band_tile_class (the deep dive): it answers padding on the
    right only, and its 7 arguments do not fit (issue 25; the 8-argument wrapper's mistake is
    declared in flashlib/book/exercises/mistakes/masking.py)."""
    assert_fails_with(mx.check_tile_class(band_tile_class), "TypeError")


# ---- blind rows -----------------------------------------------------------------------------

def blind(n_q, n_k, d_v, rows=None, o=0.0, lse=-np.inf):
    rows = list(range(max(n_q - n_k, 0))) if rows is None else rows(n_q, n_k)
    return rows, np.full((len(rows), d_v), o), np.full(len(rows), lse)


def test_blind_rows():
    assert mx.check_blind_rows(blind).passed


# ---- find the NaN ---------------------------------------------------------------------------

def guarded(Q, K, V, mask, B_r, B_c):
    return masked_flash_forward(Q, K, V, lambda i, j, n_q, n_k: mask[i, j], B_r, B_c)


GUARDED_SOLUTION = book_solution("masking", "ex-masking-find-the-nan")["guarded_forward"]


def test_guarded_forward():
    for answer in (guarded, GUARDED_SOLUTION):
        assert mx.check_guarded_forward(answer).passed, text(mx.check_guarded_forward(answer))


def test_guard_stored_in_m_is_caught():
    """Issue 23: storing the guard's 0 into m_i passes every all-masked-tile case; the row
    blind in one tile whose scores in the next lie near -800 catches it, and names it."""
    fb = mx.check_guarded_forward(stored_guard_forward)
    assert_fails_with(fb, "stored the guard's 0 in m_i", "rows [1]", "rows [9, 10]")
    assert text(fb).count("  x  ") == 2, text(fb)


@pytest.mark.parametrize(("score", "dtype"), [(-800.0, np.float64), (-1000.0, np.float64),
                                              (-100.0, np.float32)])
def test_guarded_solution_on_rows_blind_in_one_tile(score, dtype):
    """The book's solution of 6.3 agrees with the reference and torch on rows blind in one
    tile that see keys with scores far below 0 in the next (issue 23's "done when")."""
    Q, K, V, mask = blind_row_problem(shift=score, dtype=dtype)
    O, L = GUARDED_SOLUTION(Q, K, V, mask, 5, 4)
    ref, ref_lse = reference_attention(Q, K, V, mask=mask)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert max_err(O, ref) <= tol
    sees = mask.any(axis=1)
    assert np.isneginf(L[~sees]).all()
    assert np.max(np.abs(L[sees] - ref_lse[sees])) <= tol * abs(score)
    if torch is not None:
        t = torch_attention(*(torch.from_numpy(x.astype(np.float64)) for x in (Q, K, V)),
                            mask=mask).numpy()
        assert max_err(O[sees], t[sees]) <= tol


# ---- window_size ----------------------------------------------------------------------------

def test_window_size():
    assert mx.check_window_size(lambda W: (W - 1, W - 1)).passed  # the book's variant
    with variants.as_student("s1"):  # another variant: the book's answer fails
        assert not mx.check_window_size(lambda W: (W - 1, W - 1)).passed


def test_library_functions_are_refused():
    """An answer that is, or calls, the library's function is refused, with the reason."""
    from flashlib.core import masks

    assert_fails_with(mx.check_tile_class(masks.band_tile_class), "refused", "band_tile_class")
    assert_fails_with(mx.check_tile_class(
        lambda i0, i1, j0, j1, lo, hi, start, stop: masks.band_tile_class(i0, i1, j0, j1, lo,
                                                                          hi, stop)),
        "refused", "your code calls flashlib's `band_tile_class`")


# ---- a tile's dropout mask (6.5) ---------------------------------------------------------------

KEEP_SOLUTION = book_solution("masking", "ex-masking-tile-keep")["tile_keep"]


def test_tile_keep_solution_passes_and_the_library_is_refused():
    from flashlib.core.philox import dropout_keep

    assert mx.check_tile_keep(KEEP_SOLUTION).passed, text(mx.check_tile_keep(KEEP_SOLUTION))
    assert_fails_with(mx.check_tile_keep(
        lambda seed, offset, head, i0, i1, j0, j1, p: dropout_keep(
            seed, head, np.arange(i0, i1)[:, None], np.arange(j0, j1), p, offset)),
        "refused", "dropout_keep")
