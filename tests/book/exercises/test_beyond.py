"""The checkers of the chapter "Beyond FlashAttention-1" (flashlib.book.exercises.beyond)
accept a right answer, survive a crashing or unattempted one, and refuse the library's
functions; the common wrong ones are declared in flashlib/book/exercises/mistakes/beyond.py
(tests/book/exercises/test_declared_mistakes.py)."""

from __future__ import annotations

import numpy as np

from flashlib import flash_attention
from flashlib.book.exercises import NOT_ATTEMPTED
from flashlib.book.exercises import beyond as bx
from flashlib.book.exercises.mistakes import beyond as _beyond_mistakes
from flashlib.fast.decoding import decode_attention
from tests.helpers import assert_fails_with, crashing, learner_copy, not_attempted, text


def common(check):
    assert check(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(check(crashing), "your function raised")


def test_kv_grad():
    def right(x, h_kv):  # the book's variant: K tiled (np.tile), heads on axis -3
        *lead, h_q, n, c = x.shape
        return x.reshape(*lead, h_q // h_kv, h_kv, n, c).sum(axis=-4)

    assert bx.check_kv_grad(right).passed
    common(bx.check_kv_grad)


def _split_kv(q, K, V, n_splits, merge="lse"):
    size = -(-len(K) // n_splits)
    outs, lses = zip(*(flash_attention(q, K[s:s + size], V[s:s + size], return_lse=True)
                       for s in range(0, len(K), size)), strict=True)
    O, L = np.stack(outs), np.stack(lses)  # (S, n_q, d_v), (S, n_q)
    if merge == "mean":
        return O.mean(axis=0)
    if merge == "raw":
        w = np.exp(L)
        return (w[..., None] * O).sum(0) / w.sum(0)[:, None]
    L_all = np.logaddexp.reduce(L, axis=0)
    return (np.exp(L - L_all)[..., None] * O).sum(axis=0)


def test_split_kv():
    fb = bx.check_split_kv(_split_kv)
    assert fb.passed, text(fb)
    common(bx.check_split_kv)


def test_split_kv_refuses_the_library_shortcuts():
    """Issue 25: the page imports flash_attention and decode_attention; an answer that lets
    them do the split (or skips it: a declared mistake) is refused by name, and the names are
    restored after."""

    def library(q, K, V, n_splits):
        return decode_attention(q, K, V, n_splits=n_splits)

    assert_fails_with(bx.check_split_kv(library), "you called decode_attention")
    assert globals()["flash_attention"] is bx.LIBRARY_ATTENTION["flash_attention"]
    assert globals()["decode_attention"] is bx.LIBRARY_ATTENTION["decode_attention"]


_gqa = learner_copy(_beyond_mistakes._gqa)  # the declared mutant


def test_grouped_query():
    fb = bx.check_grouped_query(_gqa)
    assert fb.passed, text(fb)
    assert_fails_with(bx.check_grouped_query(lambda q, k, v: flash_attention(q, k, v)),
                      "you called flash_attention")
    assert globals()["flash_attention"] is bx.LIBRARY_ATTENTION["flash_attention"]
    common(bx.check_grouped_query)


def test_grouped_query_refuses_the_library_function_passed_as_the_answer():
    """A forbid rule lets some calls through inside an answer, never the library function
    itself as the answer: flash_attention and decode_attention take grouped-query heads, so
    passing either as ``gqa`` would pass (the student edition imports both)."""
    import flashlib
    from flashlib.book.exercises.beyond import check_grouped_query
    from flashlib.fast.decoding import decode_attention

    for fn in (flashlib.flash_attention, decode_attention):
        fb = check_grouped_query(fn)
        assert not fb.passed
        assert f"refused: you passed flashlib's `{fn.__name__}`" in str(fb)
