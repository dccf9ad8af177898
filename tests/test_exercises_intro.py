"""Checkers of the Introduction's exercises (flashlib/book/exercises/intro.py)."""

from __future__ import annotations

import numpy as np

from flashlib.book.exercises.intro import (
    check_attention_flops,
    check_attention_shapes,
    check_reference_attention,
)


def not_attempted(*args):
    raise NotImplementedError


def test_flops():
    assert check_attention_flops(lambda n_q, n_k, d, d_v: 2 * n_q * n_k * (d + d_v)).passed
    half = check_attention_flops(lambda n_q, n_k, d, d_v: n_q * n_k * (d + d_v))
    assert not half.passed and "multiply-add" in str(half)
    only_s = check_attention_flops(lambda n_q, n_k, d, d_v: 2 * n_q * n_k * d)
    assert not only_s.passed and "O = P v" in str(only_s)
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
