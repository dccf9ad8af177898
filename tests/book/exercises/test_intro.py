"""Checkers of the Introduction's exercises (flashlib/book/exercises/intro.py); the mistakes
whose hints are all a test checks are declared in flashlib/book/exercises/mistakes/intro.py
(tests/book/exercises/test_declared_mistakes.py)."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.book import site
from flashlib.book.exercises import ON_THE_SITE, broadcast_hint, shape_problem
from flashlib.book.exercises.intro import (
    COUNT_CASES,
    check_attention_flops,
    check_balanced_block,
    check_reference_attention,
    check_standard_traffic,
)
from tests.helpers import not_attempted


def test_flops():
    """The mistakes: flashlib.book.exercises.mistakes.intro (test_declared_mistakes.py)."""
    assert check_attention_flops(lambda n_q, n_k, d, d_v: 2 * n_q * n_k * (d + d_v)).passed
    only_s = check_attention_flops(lambda n_q, n_k, d, d_v: 2 * n_q * n_k * d)
    assert str(only_s).count("only S = q k^T") == len(only_s.problems) == 5
    assert "not attempted" in str(check_attention_flops(not_attempted))
    assert "raised" in str(check_attention_flops(lambda *a: 1 / 0))


def attention(q, k, v, *, scale=None, stable=True, axis=-1, lse="right"):
    """The exercise's answer, (O, lse), and its usual mistakes (by keyword)."""
    d = q.shape[-1]
    s = (q @ np.swapaxes(k, -1, -2)) * (q.dtype.type(1 / np.sqrt(d)) if scale is None else scale)
    m = s.max(axis=axis, keepdims=True)
    p = np.exp(s - m) if stable else np.exp(s)
    l = p.sum(axis=axis, keepdims=True)  # noqa: E741
    o = (p / l) @ v
    L = {"right": lambda: m + np.log(l) if stable else np.log(l),
         "log l": lambda: np.log(l),
         "m": lambda: m,
         "naive": lambda: np.log(np.exp(s).sum(axis=axis, keepdims=True)),
         "base 2": lambda: (m + np.log(l)) / np.log(q.dtype.type(2)),
         "float64": lambda: (m + np.log(l)).astype(np.float64)}[lse]()
    return o, L[..., 0]


def test_reference_attention():
    assert check_reference_attention(attention).passed, str(check_reference_attention(attention))
    assert "not attempted" in str(check_reference_attention(not_attempted))


def right_traffic(n_q, n_k, d, d_v):
    return n_q * d + n_k * d + n_k * d_v + 4 * n_q * n_k + n_q * d_v


def test_standard_traffic():
    assert check_standard_traffic(right_traffic).passed
    assert "expected a number" in str(check_standard_traffic(lambda *a: "many"))
    assert "not attempted" in str(check_standard_traffic(not_attempted))


def test_count_cases_tell_every_term_apart():
    """Issue 24: in every case but the realistic square one, the five terms of the traffic
    differ, so leaving out any one of them gives a count of its own."""
    ragged = [c for c in COUNT_CASES if len(set(c)) == 4]
    assert len(ragged) == len(COUNT_CASES) - 1
    for n_q, n_k, d, d_v in ragged:
        terms = [n_q * d, n_k * d, n_k * d_v, n_q * n_k, n_q * d_v]
        assert len(set(terms)) == len(terms), (n_q, n_k, d, d_v)


def right_block(peak, bandwidth, itemsize):
    return itemsize * peak / (2 * bandwidth)


def test_balanced_block():
    assert check_balanced_block(right_block).passed
    assert check_balanced_block(lambda p, w, i: np.float64(right_block(p, w, i))).passed
    assert "expected a number" in str(check_balanced_block(lambda *a: "big"))
    assert "expected a number" in str(check_balanced_block(lambda *a: True))
    assert "not attempted" in str(check_balanced_block(not_attempted))
    assert "raised" in str(check_balanced_block(lambda *a: 1 / 0))


def test_shape_mistakes_are_explained():
    def no_keepdims(q, k, v):
        s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / np.sqrt(q.shape[-1]))
        p = np.exp(s - s.max(axis=-1))
        return p / p.sum(axis=-1) @ v, np.log(p.sum(axis=-1))

    text = str(check_reference_attention(no_keepdims))
    # the square case broadcasts silently: diagnosed from the values
    assert "lost their axis" in text or "own maximum" in text
    assert shape_problem(np.ones(4), (4, 1)).endswith("(keepdims=True, or [:, None])")
    assert "swapped" in shape_problem((2, 3, 5), (2, 5, 3))
    assert "leading" in shape_problem((5, 3), (2, 5, 3))
    assert shape_problem((2, 5, 3), (2, 5, 3)) is None
    assert broadcast_hint("something else") is None
    try:
        np.ones((4, 8)) @ np.ones((4, 8))
    except ValueError as err:
        assert "transpose" in broadcast_hint(str(err))


def test_no_verdict_on_the_website(monkeypatch):
    """While the book is built, a checker's output is one neutral line: no verdict, no hint."""
    monkeypatch.setenv(site.STATIC_ENV, "1")
    for fb in (check_attention_flops(not_attempted), check_reference_attention(attention),
               check_attention_flops(lambda n_q, n_k, d, d_v: 2 * n_q * n_k * d)):
        assert str(fb) == f"{fb.exercise}:\n{ON_THE_SITE}"
    assert check_reference_attention(attention).passed  # the verdict itself is unchanged
    monkeypatch.setenv(site.STATIC_ENV, "0")
    assert "PASSED" in str(check_reference_attention(attention))


@pytest.mark.parametrize("name", ["check_attention_flops", "check_standard_traffic"])
def test_counting_checkers_survive_odd_answers(name):
    import flashlib.book.exercises.intro as intro

    check = getattr(intro, name)
    assert "expected a number" in str(check(lambda *a: None))
    assert "expected a number" in str(check(lambda *a: float("nan")))
    assert "raised" in str(check(lambda *a: [][1]))
