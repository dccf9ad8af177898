"""The checkers of the masking chapter (flashlib.book.exercises.masking) accept a right answer,
survive a crashing or unattempted one, and recognise the common wrong ones."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.algorithms import masked_flash_forward
from flashlib.book.exercises import NOT_ATTEMPTED
from flashlib.book.exercises import masking as mx
from flashlib.core.masks import band_tile_class
from tests.helpers import assert_fails_with, crashing, learner_copy, not_attempted, text

# What a learner who copied the library's code hands in (the library's own functions are
# refused where the exercise asks for them: test_library_functions_are_refused)
band_tile_class = learner_copy(band_tile_class)
masked_flash_forward = learner_copy(masked_flash_forward)

ALL = [mx.check_tile_class, mx.check_blind_rows, mx.check_guarded_forward,
       mx.check_window_size]


@pytest.mark.parametrize("check", ALL)
def test_not_attempted_and_crashing(check):
    assert text(check(not_attempted)).count(NOT_ATTEMPTED) == 1
    assert_fails_with(check(crashing), "ValueError: oops")


# ---- tile class ------------------------------------------------------------------------------

def test_tile_class_right_and_wrong():
    assert mx.check_tile_class(band_tile_class).passed
    assert_fails_with(mx.check_tile_class(
        lambda i0, i1, j0, j1, lo, hi, n: band_tile_class(i0, i1, j0, j1, lo, hi, None)),
        "key length is ignored")
    assert_fails_with(mx.check_tile_class(
        lambda i0, i1, j0, j1, lo, hi, n: band_tile_class(i0, i1 + 1, j0, j1 + 1, lo, hi, n)),
        "off by one")
    never_empty = mx.check_tile_class(
        lambda *a: "partial" if band_tile_class(*a) == "empty" else band_tile_class(*a))
    assert_fails_with(never_empty, "never answer empty")
    assert_fails_with(mx.check_tile_class(lambda *a: "partial"), "tiles wrong")
    assert_fails_with(mx.check_tile_class(lambda *a: 1), "return one of the strings")


# ---- blind rows -----------------------------------------------------------------------------

def blind(n_q, n_k, d_v, rows=None, o=0.0, lse=-np.inf):
    rows = list(range(max(n_q - n_k, 0))) if rows is None else rows(n_q, n_k)
    return rows, np.full((len(rows), d_v), o), np.full(len(rows), lse)


def test_blind_rows():
    assert mx.check_blind_rows(blind).passed
    assert_fails_with(mx.check_blind_rows(lambda a, b, c: blind(a, b, c, lambda n_q, n_k: [])),
                      "top-left")
    assert_fails_with(mx.check_blind_rows(
        lambda a, b, c: blind(a, b, c, lambda n_q, n_k: list(range(n_k, n_q)))), "last rows")
    assert_fails_with(mx.check_blind_rows(
        lambda a, b, c: blind(a, b, c, lambda n_q, n_k: list(range(max(n_q - n_k + 1, 0))))),
        "off by one")
    assert_fails_with(mx.check_blind_rows(lambda a, b, c: blind(a, b, c, o=np.nan)), "NaN")
    assert_fails_with(mx.check_blind_rows(lambda a, b, c: blind(a, b, c, lse=0.0)), "-inf")
    assert_fails_with(mx.check_blind_rows(lambda a, b, c: blind(a, b, c)[:2]), "tuple")


# ---- find the NaN ---------------------------------------------------------------------------

def guarded(Q, K, V, mask, B_r, B_c):
    return masked_flash_forward(Q, K, V, lambda i, j, n_q, n_k: mask[i, j], B_r, B_c)


def final_guard_only(Q, K, V, mask, B_r, B_c):
    """Divides safely at the end but leaves exp(-inf - (-inf)) in the loop."""
    with np.errstate(invalid="ignore", divide="ignore"):
        O, L = mx.careless_forward(Q, K, V, mask, B_r, B_c)
    seen = mask.any(axis=1)
    O[~seen], L[~seen] = 0, -np.inf
    return O, L


def test_guarded_forward():
    assert mx.check_guarded_forward(guarded).passed, text(mx.check_guarded_forward(guarded))
    with np.errstate(invalid="ignore", divide="ignore"):
        careless = mx.check_guarded_forward(mx.careless_forward)
    assert_fails_with(careless, "exp(-inf - (-inf))")
    assert_fails_with(mx.check_guarded_forward(final_guard_only), "rows that do see keys")

    def zero_lse(*args):
        O, L = guarded(*args)
        L[np.isneginf(L)] = 0
        return O, L
    assert_fails_with(mx.check_guarded_forward(zero_lse), "must be -inf")

    def warns(*args):
        np.log(np.zeros(1))
        return guarded(*args)
    assert_fails_with(mx.check_guarded_forward(warns), "numpy warned")


# ---- window_size ----------------------------------------------------------------------------

def test_window_size():
    assert mx.check_window_size(lambda W: (W - 1, 0)).passed
    assert_fails_with(mx.check_window_size(lambda W: (W, 0)), "inclusive")
    assert_fails_with(mx.check_window_size(lambda W: (W - 1, W - 1)), "future keys")
    assert_fails_with(mx.check_window_size(lambda W: (W, W)), "future keys", "inclusive")
    assert_fails_with(mx.check_window_size(lambda W: (W - 2, 0)), "keys, not")
    assert_fails_with(mx.check_window_size(lambda W: W), "pair")


def test_library_functions_are_refused():
    """An answer that is, or calls, the library's function is refused, with the reason."""
    from flashlib.core import masks

    assert_fails_with(mx.check_tile_class(masks.band_tile_class), "refused", "band_tile_class")
    assert_fails_with(mx.check_tile_class(lambda *a: masks.band_tile_class(*a)), "refused",
                      "your code calls flashlib's `band_tile_class`")
