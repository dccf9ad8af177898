"""Checkers of the Introduction's exercises (flashlib/book/exercises/intro.py)."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.book import site
from flashlib.book.exercises import ON_THE_SITE, broadcast_hint, shape_problem
from flashlib.book.exercises.intro import (
    check_attention_flops,
    check_attention_shapes,
    check_reference_attention,
    check_standard_traffic,
)
from tests.helpers import not_attempted


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


def attention(q, k, v, *, scale=None, stable=True, axis=-1):
    d = q.shape[-1]
    s = (q @ np.swapaxes(k, -1, -2)) * (q.dtype.type(1 / np.sqrt(d)) if scale is None else scale)
    if stable:
        s = s - s.max(axis=axis, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(axis=axis, keepdims=True)) @ v


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


def test_standard_traffic():
    def right(n_q, n_k, d, d_v):
        return n_q * d + n_k * d + n_k * d_v + 4 * n_q * n_k + n_q * d_v

    assert check_standard_traffic(right).passed
    once = check_standard_traffic(lambda n_q, n_k, d, d_v: right(n_q, n_k, d, d_v)
                                  - 2 * n_q * n_k)
    assert not once.passed and "read back once" in str(once)
    only_matrices = check_standard_traffic(lambda n_q, n_k, d, d_v: 4 * n_q * n_k)
    assert "Q, K, V are read" in str(only_matrices)
    no_o = check_standard_traffic(lambda n_q, n_k, d, d_v: right(n_q, n_k, d, d_v) - n_q * d_v)
    assert "writing O" in str(no_o)
    in_bytes = check_standard_traffic(lambda *a: 4 * right(*a))
    assert "bytes" in str(in_bytes)
    assert "expected a number" in str(check_standard_traffic(lambda *a: "many"))
    assert "not attempted" in str(check_standard_traffic(not_attempted))


def test_shape_mistakes_are_explained():
    def no_keepdims(q, k, v):
        s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / np.sqrt(q.shape[-1]))
        p = np.exp(s - s.max(axis=-1))
        return p / p.sum(axis=-1) @ v

    fb = check_reference_attention(no_keepdims)
    text = str(fb)
    assert not fb.passed and "could not be broadcast" not in text
    assert "keepdims=True" in text and "shape mismatch" in text
    # the square case broadcasts silently: diagnosed from the values
    assert "lost their axis" in text or "own maximum" in text
    transposed = check_reference_attention(lambda q, k, v: attention(q, k, v).swapaxes(-1, -2))
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
