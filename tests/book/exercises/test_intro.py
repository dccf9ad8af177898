"""Checkers of the Introduction's exercises (flashlib/book/exercises/intro.py)."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.book import site
from flashlib.book.exercises import ON_THE_SITE, broadcast_hint, shape_problem
from flashlib.book.exercises.intro import (
    COUNT_CASES,
    check_attention_flops,
    check_attention_shapes,
    check_balanced_block,
    check_reference_attention,
    check_standard_traffic,
)
from tests.helpers import assert_fails_with, not_attempted


def test_flops():
    assert check_attention_flops(lambda n_q, n_k, d, d_v: 2 * n_q * n_k * (d + d_v)).passed
    half = check_attention_flops(lambda n_q, n_k, d, d_v: n_q * n_k * (d + d_v))
    assert not half.passed and "multiply-add" in str(half)
    only_s = check_attention_flops(lambda n_q, n_k, d, d_v: 2 * n_q * n_k * d)
    assert not only_s.passed and "O = P v" in str(only_s)
    # on square cases (d = d_v) only S is exactly half the answer, like counting multiply-adds:
    # the diagnosis comes from the formula that matches every case
    assert "multiply-add" not in str(only_s), str(only_s)
    assert str(only_s).count("only S = q k^T") == len(only_s.problems) == 5
    assert "not attempted" in str(check_attention_flops(not_attempted))
    assert "raised" in str(check_attention_flops(lambda *a: 1 / 0))


def shapes(q, k, v):
    return {"S": (*q[:-1], k[-2]), "P": (*q[:-1], k[-2]), "O": (*q[:-1], v[-1]), "lse": q[:-1]}


def test_shapes():
    assert check_attention_shapes(shapes).passed
    swapped = check_attention_shapes(
        lambda q, k, v: shapes(q, k, v) | {"S": (*q[:-2], k[-2], q[-2])}
    )
    assert not swapped.passed and "rows are queries" in str(swapped)
    d_not_dv = check_attention_shapes(lambda q, k, v: shapes(q, k, v) | {"O": q})
    assert not d_not_dv.passed and "d_v" in str(d_not_dv)
    lse1 = check_attention_shapes(lambda q, k, v: shapes(q, k, v) | {"lse": (*q[:-1], 1)})
    assert not lse1.passed and "trailing 1" in str(lse1)
    assert "not attempted" in str(check_attention_shapes(not_attempted))


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
    no_scale = check_reference_attention(lambda q, k, v: attention(q, k, v, scale=1.0))
    assert not no_scale.passed and "1/sqrt(d)" in str(no_scale)
    unstable = check_reference_attention(lambda q, k, v: attention(q, k, v, stable=False))
    assert not unstable.passed and "maximum" in str(unstable)
    wrong_axis = check_reference_attention(lambda q, k, v: attention(q, k, v, axis=-2))
    assert not wrong_axis.passed and "wrong axis" in str(wrong_axis)
    promoted = check_reference_attention(
        lambda q, k, v: attention(q, k, v, scale=1 / np.sqrt(q.shape[-1]))
    )
    assert not promoted.passed and "float64" in str(promoted)
    assert "not attempted" in str(check_reference_attention(not_attempted))


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda q, k, v: attention(q, k, v)[0], "you returned O alone"),
    (lambda q, k, v: attention(q, k, v)[::-1], "you returned (lse, O)"),
    (lambda q, k, v: (*attention(q, k, v), 0), "got 3 values"),
    (lambda q, k, v: attention(q, k, v, lse="log l"), "add the maximum back, L = m + log(l)"),
    (lambda q, k, v: attention(q, k, v, lse="m"), "the row maximum m alone"),
    (lambda q, k, v: attention(q, k, v, lse="naive"), "log(sum(exp(s))) overflows"),
    (lambda q, k, v: attention(q, k, v, lse="base 2"), "lse in base 2"),
    (lambda q, k, v: attention(q, k, v, lse="float64"), "lse is float64, expected float32"),
    (lambda q, k, v: (attention(q, k, v)[0], attention(q, k, v)[1][..., None]),
     "drop the trailing axis of 1"),
    (lambda q, k, v: (attention(q, k, v)[0],
                      attention(q * q.dtype.type(np.sqrt(q.shape[-1])), k, v)[1]),
     "lse of the unscaled scores"),
])
def test_reference_attention_names_each_lse_mistake(answer, phrase):
    """Exercise 1.4 asks for (O, lse): each usual mistake about the pair or the logsumexp gets
    its own diagnosis."""
    assert_fails_with(check_reference_attention(answer), phrase)


def test_reference_attention_lse_over_the_keys():
    """The logsumexp over the wrong axis: a shape message on ragged scores, and on square
    scores (where the shape is right) the values."""
    def wrong_axis(q, k, v):
        o = attention(q, k, v)[0]
        s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / np.sqrt(q.shape[-1]))
        m = s.max(axis=-2, keepdims=True)
        return o, (m + np.log(np.exp(s - m).sum(axis=-2, keepdims=True)))[..., 0, :]

    fb = check_reference_attention(wrong_axis)
    assert_fails_with(fb, "one number per key", "lse over the wrong axis")


def right_traffic(n_q, n_k, d, d_v):
    return n_q * d + n_k * d + n_k * d_v + 4 * n_q * n_k + n_q * d_v


def test_standard_traffic():
    assert check_standard_traffic(right_traffic).passed
    assert "expected a number" in str(check_standard_traffic(lambda *a: "many"))
    assert "not attempted" in str(check_standard_traffic(not_attempted))


@pytest.mark.parametrize(("answer", "phrase"), [
    # issue 24: the read of S in step 2 left out was blamed on the write of O (every term is
    # 1 at n_q = n_k = d = d_v = 1)
    (lambda n_q, n_k, d, d_v: right_traffic(n_q, n_k, d, d_v) - n_q * n_k,
     "most often the read of S in step 2"),
    (lambda n_q, n_k, d, d_v: right_traffic(n_q, n_k, d, d_v) - 2 * n_q * n_k,
     "read back once"),
    (lambda n_q, n_k, d, d_v: 4 * n_q * n_k, "Q, K, V are read"),
    (lambda n_q, n_k, d, d_v: right_traffic(n_q, n_k, d, d_v) - n_q * d_v, "writing O"),
    (lambda n_q, n_k, d, d_v: right_traffic(n_q, n_k, d, d_v) - n_q * d, "reading Q"),
    (lambda n_q, n_k, d, d_v: right_traffic(n_q, n_k, d, d_v) - n_k * d, "reading K"),
    (lambda n_q, n_k, d, d_v: right_traffic(n_q, n_k, d, d_v) - n_k * d_v, "reading V"),
    (lambda n_q, n_k, d, d_v: n_q * d + n_k * d + n_k * d_v + 2 * n_q * n_k,
     "only the reads"),
    (lambda n_q, n_k, d, d_v: 2 * n_q * n_k + n_q * d_v, "only the writes"),
    (lambda n_q, n_k, d, d_v: n_q * d + 2 * n_k * d + n_q * d_v + 4 * n_q * n_k,
     "reads V with width d"),
    (lambda n_q, n_k, d, d_v: right_traffic(n_q, n_k, d, d_v) - n_q * d_v + n_q * d,
     "writes O with width d"),
    (lambda n_q, n_k, d, d_v: right_traffic(n_q, n_q, d, d_v), "assumes n_k = n_q"),
    (lambda *a: 4 * right_traffic(*a), "bytes of float32"),
    (lambda *a: 2 * right_traffic(*a), "bytes of float16"),
])
def test_standard_traffic_names_each_mistake(answer, phrase):
    """Each mistake gets its own diagnosis on every case where it is wrong (a width or a
    length mixed up is right on square cases): the ragged cases have the terms of the count
    different from each other, so no mistake looks like another."""
    fb = check_standard_traffic(answer)
    assert_fails_with(fb, phrase)
    assert all(phrase in problem for problem in fb.problems), str(fb)


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


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda p, w, i: i * p / (4 * w), "counts only K"),
    (lambda p, w, i: i * p / w, "multiply-adds"),
    (lambda p, w, i: p / (2 * w), "leaves out itemsize"),
    (lambda p, w, i: p / w, "the ridge point"),
    (lambda p, w, i: 2 * w / (i * p), "upside down"),
    (lambda p, w, i: 208, "set the two terms equal"),
])
def test_balanced_block_names_each_mistake(answer, phrase):
    """Each mistake of exercise 1.5 gets its own diagnosis, and no failure prints the right
    value (the exercise is a derivation: the values would give the formula away)."""
    fb = check_balanced_block(answer)
    assert_fails_with(fb, phrase)
    assert "expected" not in str(fb)


def test_shape_mistakes_are_explained():
    def no_keepdims(q, k, v):
        s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / np.sqrt(q.shape[-1]))
        p = np.exp(s - s.max(axis=-1))
        return p / p.sum(axis=-1) @ v, np.log(p.sum(axis=-1))

    fb = check_reference_attention(no_keepdims)
    text = str(fb)
    assert not fb.passed and "could not be broadcast" not in text
    assert "keepdims=True" in text and "shape mismatch" in text
    # the square case broadcasts silently: diagnosed from the values
    assert "lost their axis" in text or "own maximum" in text
    transposed = check_reference_attention(
        lambda q, k, v: (attention(q, k, v)[0].swapaxes(-1, -2), attention(q, k, v)[1]))
    assert "shape" in str(transposed) and not transposed.passed
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
