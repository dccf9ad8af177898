"""The masking chapter's declared mistakes (flashlib.book.exercises.masking)."""

from __future__ import annotations

import numpy as np

from flashlib import algorithms
from flashlib.book.exercises.masking import (
    careless_forward,
    check_blind_rows,
    check_guarded_forward,
    check_tile_class,
    check_tile_keep,
    check_window_size,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes, learner_copy
from flashlib.core import masks
from flashlib.core.philox import philox4x32
from flashlib.studies.masking import stored_guard_forward

# What a learner who copied the library's code has (the library's own functions are refused
# where the exercise asks for them)
_band_tile_class = learner_copy(masks.band_tile_class)
_masked_flash_forward = learner_copy(algorithms.masked_flash_forward)


# ---- 6.1 a tile's class ----------------------------------------------------------------------

def _with_start(i0, i1, j0, j1, lo, hi, start, stop):
    """A right answer: the library's band on the keys from start."""
    first = max(j0, start)
    if first >= j1:
        return "empty"
    got = _band_tile_class(i0, i1, first, j1, lo, hi, stop)
    return "partial" if got == "full" and first > j0 else got


def no_padding(i0, i1, j0, j1, lo, hi, start, stop):
    return _band_tile_class(i0, i1, j0, j1, lo, hi, None)


def no_left_padding(i0, i1, j0, j1, lo, hi, start, stop):  # the deep dive's function
    return _band_tile_class(i0, i1, j0, j1, lo, hi, stop)


def off_by_one_at_start(i0, i1, j0, j1, lo, hi, start, stop):
    return _with_start(i0, i1, j0, j1, lo, hi, start + 1, stop)


def never_partial_for_start(i0, i1, j0, j1, lo, hi, start, stop):
    if max(j0, start) >= j1:
        return "empty"
    return _band_tile_class(i0, i1, max(j0, start), j1, lo, hi, stop)


def off_by_one_at_the_ends(i0, i1, j0, j1, lo, hi, start, stop):
    return _with_start(i0, i1 + 1, j0, j1 + 1, lo, hi, start, stop)


def never_empty(*args):
    return "partial" if _with_start(*args) == "empty" else _with_start(*args)


def never_full(*args):
    return "partial" if _with_start(*args) == "full" else _with_start(*args)


def always_partial(*args):
    return "partial"


def a_number(*args):
    return 1


declare_mistakes(
    check_tile_class,
    Mistake("the padding ignored", (no_padding,), ("the padding is ignored",)),
    Mistake("the left padding ignored", (no_left_padding,), ("left padding is ignored",)),
    Mistake("off by one at start", (off_by_one_at_start,), ("off by one at start",)),
    Mistake("never partial for the padding", (never_partial_for_start,),
            ("partial, never full",)),
    Mistake("off by one at i1 and j1", (off_by_one_at_the_ends,), ("off by one: i1 and j1",)),
    Mistake("never empty", (never_empty,), ("never answer empty",)),
    Mistake("never full", (never_full,), ("never answer full",)),
    Mistake("always partial", (always_partial,), ("tiles wrong",)),
    Mistake("not a string", (a_number,), ("return one of the strings",)),
)


# ---- 6.2 blind rows --------------------------------------------------------------------------

def _blind(n_q, n_k, d_v, rows=None, o=0.0, lse=-np.inf):
    rows = list(range(max(n_q - n_k, 0))) if rows is None else rows(n_q, n_k)
    return rows, np.full((len(rows), d_v), o), np.full(len(rows), lse)


def top_left(n_q, n_k, d_v):
    return _blind(n_q, n_k, d_v, lambda n_q, n_k: [])


def the_last_rows(n_q, n_k, d_v):
    return _blind(n_q, n_k, d_v, lambda n_q, n_k: list(range(n_k, n_q)))


def one_row_too_many(n_q, n_k, d_v):
    return _blind(n_q, n_k, d_v, lambda n_q, n_k: list(range(max(n_q - n_k + 1, 0))))


def nan_output(n_q, n_k, d_v):
    return _blind(n_q, n_k, d_v, o=np.nan)


def lse_zero(n_q, n_k, d_v):
    return _blind(n_q, n_k, d_v, lse=0.0)


def two_values(n_q, n_k, d_v):
    return _blind(n_q, n_k, d_v)[:2]


declare_mistakes(
    check_blind_rows,
    Mistake("top-left alignment", (top_left,), ("top-left",)),
    Mistake("the last rows", (the_last_rows,), ("last rows",)),
    Mistake("one row too many", (one_row_too_many,), ("off by one",)),
    Mistake("NaN output", (nan_output,), ("NaN",)),
    Mistake("lse = 0", (lse_zero,), ("-inf",)),
    Mistake("two values", (two_values,), ("tuple",)),
)


# ---- 6.3 find the NaN ------------------------------------------------------------------------

def _guarded(Q, K, V, mask, B_r, B_c):
    return _masked_flash_forward(Q, K, V, lambda i, j, n_q, n_k: mask[i, j], B_r, B_c)


def final_guard_only(Q, K, V, mask, B_r, B_c):
    """Divides safely at the end but leaves exp(-inf - (-inf)) in the loop."""
    with np.errstate(invalid="ignore", divide="ignore"):
        O, L = careless_forward(Q, K, V, mask, B_r, B_c)
    seen = mask.any(axis=1)
    O[~seen], L[~seen] = 0, -np.inf
    return O, L


def zero_lse(*args):
    O, L = _guarded(*args)
    L[np.isneginf(L)] = 0
    return O, L


def warns(*args):
    np.log(np.zeros(1))
    return _guarded(*args)


declare_mistakes(
    check_guarded_forward,
    Mistake("no guard", (careless_forward,), ("exp(-inf - (-inf))",)),
    Mistake("the final guard only", (final_guard_only,), ("rows that do see keys",)),
    Mistake("lse = 0 for a blind row", (zero_lse,), ("must be -inf",)),
    Mistake("a numpy warning", (warns,), ("numpy warned",)),
    # issue 23: storing the guard's 0 into m_i passes every all-masked-tile case; the row
    # blind in one tile whose scores in the next lie near -800 catches it, and names it
    Mistake("the guard's 0 stored in m_i", (stored_guard_forward,),
            ("stored the guard's 0 in m_i", "rows [1]", "rows [9, 10]")),
)


# ---- 6.4 window_size (the book's variant: 2W - 1 tokens centred on the current one) -------

def w_each_side(W):
    return W, W


def transformers(W):
    return W - 1, 0


def w_keys_back(W):
    return W, 0


def two_short(W):
    return W - 3, W - 1


def one_number(W):
    return W


declare_mistakes(
    check_window_size,
    Mistake("W keys each side", (w_each_side,), ("inclusive",)),
    Mistake("the page's Transformers window", (transformers,), ("hides the keys after",)),
    Mistake("W keys back only", (w_keys_back,), ("inclusive", "hides the keys after")),
    Mistake("two keys short", (two_short,), ("keys before the current one, not",)),
    Mistake("one number", (one_number,), ("pair",)),
)


# ---- 6.5 a tile's dropout mask -----------------------------------------------------------------

def _keep(seed, head, rows, cols, p, offset, key=None):
    """Philox's first word at the counters (rows, cols, head, offset) against p's threshold."""
    key = (seed & 0xFFFFFFFF, seed >> 32) if key is None else key
    word = philox4x32((rows, cols, head, offset), key)[0]
    return word >= np.uint32(int(p * 2**32))


def tile_local(seed, offset, head, i0, i1, j0, j1, p):
    return _keep(seed, head, np.arange(i1 - i0)[:, None], np.arange(j1 - j0), p, offset)


def rows_and_keys_swapped(seed, offset, head, i0, i1, j0, j1, p):
    return _keep(seed, head, np.arange(j0, j1)[None, :], np.arange(i0, i1)[:, None], p,
                 offset)


def keeps_with_probability_p(seed, offset, head, i0, i1, j0, j1, p):
    return ~_keep(seed, head, np.arange(i0, i1)[:, None], np.arange(j0, j1), p, offset)


def low_word_key(seed, offset, head, i0, i1, j0, j1, p):
    return _keep(seed, head, np.arange(i0, i1)[:, None], np.arange(j0, j1), p, offset,
                 key=(seed & 0xFFFFFFFF, 0))


def no_offset(seed, offset, head, i0, i1, j0, j1, p):
    return _keep(seed, head, np.arange(i0, i1)[:, None], np.arange(j0, j1), p, 0)


def no_head(seed, offset, head, i0, i1, j0, j1, p):
    return _keep(seed, 0, np.arange(i0, i1)[:, None], np.arange(j0, j1), p, offset)


def a_stream_generator(seed, offset, head, i0, i1, j0, j1, p):
    return np.random.default_rng(seed).random((i1 - i0, j1 - j0)) >= p


def as_integers(seed, offset, head, i0, i1, j0, j1, p):
    keep = _keep(seed, head, np.arange(i0, i1)[:, None], np.arange(j0, j1), p, offset)
    return keep.astype(np.uint8)


def one_row(seed, offset, head, i0, i1, j0, j1, p):
    return _keep(seed, head, i0, np.arange(j0, j1), p, offset)


declare_mistakes(
    check_tile_keep,
    Mistake("tile-local counters", (tile_local,), ("tile's own indices",)),
    Mistake("rows and keys swapped", (rows_and_keys_swapped,), ("swapped",)),
    Mistake("keeps with probability p", (keeps_with_probability_p,), ("probability p",)),
    Mistake("the seed's low word only", (low_word_key,), ("low 32 bits",)),
    Mistake("no offset", (no_offset,), ("offset is missing",)),
    Mistake("no head", (no_head,), ("head is missing",)),
    Mistake("a stream generator", (a_stream_generator,), ("bits differ from Philox",)),
    Mistake("integers, not booleans", (as_integers,), ("return booleans",)),
    Mistake("one row only", (one_row,), ("shape",)),
)
