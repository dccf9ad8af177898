"""The Introduction's declared mistakes (flashlib.book.exercises.intro)."""

from __future__ import annotations

import numpy as np

from flashlib.book.exercises.intro import (
    check_attention_flops,
    check_attention_shapes,
    check_balanced_block,
    check_reference_attention,
    check_standard_traffic,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes

# ---- 1.1 FLOPs -------------------------------------------------------------------------------


def multiply_adds(n_q, n_k, d, d_v):
    return n_q * n_k * (d + d_v)


def only_s(n_q, n_k, d, d_v):
    return 2 * n_q * n_k * d


declare_mistakes(
    check_attention_flops,
    Mistake("multiply-adds, not FLOPs", (multiply_adds,), ("multiply-add",)),
    # on square cases (d = d_v) only S is exactly half the answer, like counting multiply-adds:
    # the diagnosis comes from the formula that matches every case
    Mistake("only S = q k^T", (only_s,), ("O = P v", "only S = q k^T"),
            absent=("multiply-add",), every_problem=True),
)


# ---- 1.2 the standard algorithm's traffic ----------------------------------------------------

def _right_traffic(n_q, n_k, d, d_v):
    return n_q * d + n_k * d + n_k * d_v + 4 * n_q * n_k + n_q * d_v


def no_read_of_s(n_q, n_k, d, d_v):
    return _right_traffic(n_q, n_k, d, d_v) - n_q * n_k


def no_read_back(n_q, n_k, d, d_v):
    return _right_traffic(n_q, n_k, d, d_v) - 2 * n_q * n_k


def only_the_matrices(n_q, n_k, d, d_v):
    return 4 * n_q * n_k


def no_write_of_o(n_q, n_k, d, d_v):
    return _right_traffic(n_q, n_k, d, d_v) - n_q * d_v


def no_read_of_q(n_q, n_k, d, d_v):
    return _right_traffic(n_q, n_k, d, d_v) - n_q * d


def no_read_of_k(n_q, n_k, d, d_v):
    return _right_traffic(n_q, n_k, d, d_v) - n_k * d


def no_read_of_v(n_q, n_k, d, d_v):
    return _right_traffic(n_q, n_k, d, d_v) - n_k * d_v


def only_reads(n_q, n_k, d, d_v):
    return n_q * d + n_k * d + n_k * d_v + 2 * n_q * n_k


def only_writes(n_q, n_k, d, d_v):
    return 2 * n_q * n_k + n_q * d_v


def v_with_width_d(n_q, n_k, d, d_v):
    return n_q * d + 2 * n_k * d + n_q * d_v + 4 * n_q * n_k


def o_with_width_d(n_q, n_k, d, d_v):
    return _right_traffic(n_q, n_k, d, d_v) - n_q * d_v + n_q * d


def n_k_is_n_q(n_q, n_k, d, d_v):
    return _right_traffic(n_q, n_q, d, d_v)


def float32_bytes(*args):
    return 4 * _right_traffic(*args)


def float16_bytes(*args):
    return 2 * _right_traffic(*args)


# Each mistake gets its own diagnosis on every case where it is wrong (a width or a length
# mixed up is right on square cases): the ragged cases have the terms of the count different
# from each other, so no mistake looks like another.  Issue 24: the read of S in step 2 left
# out was blamed on the write of O (every term is 1 at n_q = n_k = d = d_v = 1).
declare_mistakes(check_standard_traffic, *(
    Mistake(name, (fn,), (hint,), every_problem=True) for name, fn, hint in [
        ("the read of S left out", no_read_of_s, "most often the read of S in step 2"),
        ("nothing read back", no_read_back, "read back once"),
        ("only the n x n matrices", only_the_matrices, "Q, K, V are read"),
        ("the write of O left out", no_write_of_o, "writing O"),
        ("the read of Q left out", no_read_of_q, "reading Q"),
        ("the read of K left out", no_read_of_k, "reading K"),
        ("the read of V left out", no_read_of_v, "reading V"),
        ("only the reads", only_reads, "only the reads"),
        ("only the writes", only_writes, "only the writes"),
        ("V with width d", v_with_width_d, "reads V with width d"),
        ("O with width d", o_with_width_d, "writes O with width d"),
        ("n_k = n_q", n_k_is_n_q, "assumes n_k = n_q"),
        ("bytes of float32", float32_bytes, "bytes of float32"),
        ("bytes of float16", float16_bytes, "bytes of float16"),
    ]))


# ---- 1.3 shapes ------------------------------------------------------------------------------

def _shapes(q, k, v):
    return {"S": (*q[:-1], k[-2]), "P": (*q[:-1], k[-2]), "O": (*q[:-1], v[-1]), "lse": q[:-1]}


def s_transposed(q, k, v):
    return _shapes(q, k, v) | {"S": (*q[:-2], k[-2], q[-2])}


def o_like_q(q, k, v):
    return _shapes(q, k, v) | {"O": q}


def lse_with_a_trailing_1(q, k, v):
    return _shapes(q, k, v) | {"lse": (*q[:-1], 1)}


declare_mistakes(
    check_attention_shapes,
    Mistake("S transposed", (s_transposed,), ("rows are queries",)),
    Mistake("O with d, not d_v", (o_like_q,), ("d_v",)),
    Mistake("lse with a trailing 1", (lse_with_a_trailing_1,), ("trailing 1",)),
)


# ---- 1.4 reference attention -----------------------------------------------------------------

def _attention(q, k, v, *, scale=None, stable=True, axis=-1, lse="right"):
    """The exercise's answer, (O, lse), and its usual mistakes (by keyword)."""
    d = q.shape[-1]
    s = (q @ np.swapaxes(k, -1, -2)) * (q.dtype.type(1 / np.sqrt(d)) if scale is None else scale)
    m = s.max(axis=axis, keepdims=True)
    p = np.exp(s - m) if stable else np.exp(s)
    l = p.sum(axis=axis, keepdims=True)
    o = (p / l) @ v
    L = {"right": lambda: m + np.log(l) if stable else np.log(l),
         "log l": lambda: np.log(l),
         "m": lambda: m,
         "naive": lambda: np.log(np.exp(s).sum(axis=axis, keepdims=True)),
         "base 2": lambda: (m + np.log(l)) / np.log(q.dtype.type(2)),
         "float64": lambda: (m + np.log(l)).astype(np.float64)}[lse]()
    return o, L[..., 0]


def unscaled(q, k, v):
    return _attention(q, k, v, scale=1.0)


def unstable(q, k, v):
    return _attention(q, k, v, stable=False)


def unstable_in_float64(q, k, v):
    """No maximum subtracted, the overflow dodged by computing in float64 and casting back:
    right for float32 scores of 100, not for scores past float64's exp (710)."""
    o, L = _attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                      stable=False)
    return o.astype(q.dtype), L.astype(q.dtype)


def over_the_queries(q, k, v):
    return _attention(q, k, v, axis=-2)


def scale_in_float64(q, k, v):
    return _attention(q, k, v, scale=1 / np.sqrt(q.shape[-1]))


def o_alone(q, k, v):
    return _attention(q, k, v)[0]


def lse_first(q, k, v):
    return _attention(q, k, v)[::-1]


def three_values(q, k, v):
    return (*_attention(q, k, v), 0)


def log_l(q, k, v):
    return _attention(q, k, v, lse="log l")


def m_alone(q, k, v):
    return _attention(q, k, v, lse="m")


def naive_logsumexp(q, k, v):
    return _attention(q, k, v, lse="naive")


def base_2(q, k, v):
    return _attention(q, k, v, lse="base 2")


def lse_in_float64(q, k, v):
    return _attention(q, k, v, lse="float64")


def lse_with_trailing_axis(q, k, v):
    return _attention(q, k, v)[0], _attention(q, k, v)[1][..., None]


def lse_of_unscaled_scores(q, k, v):
    return _attention(q, k, v)[0], _attention(q * q.dtype.type(np.sqrt(q.shape[-1])), k, v)[1]


def lse_over_the_queries(q, k, v):
    o = _attention(q, k, v)[0]
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / np.sqrt(q.shape[-1]))
    m = s.max(axis=-2, keepdims=True)
    return o, (m + np.log(np.exp(s - m).sum(axis=-2, keepdims=True)))[..., 0, :]


def no_keepdims(q, k, v):
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / np.sqrt(q.shape[-1]))
    p = np.exp(s - s.max(axis=-1))
    return p / p.sum(axis=-1) @ v, np.log(p.sum(axis=-1))


def o_transposed(q, k, v):
    return _attention(q, k, v)[0].swapaxes(-1, -2), _attention(q, k, v)[1]


declare_mistakes(
    check_reference_attention,
    Mistake("no 1/sqrt(d)", (unscaled,), ("1/sqrt(d)",)),
    Mistake("no maximum subtracted", (unstable,), ("maximum",)),
    Mistake("no maximum, float64 instead", (unstable_in_float64,), ("maximum",)),
    Mistake("softmax over the queries", (over_the_queries,), ("wrong axis",)),
    Mistake("scaled in float64", (scale_in_float64,), ("float64",)),
    # Exercise 1.4 asks for (O, lse): each usual mistake about the pair or the logsumexp
    # gets its own diagnosis
    Mistake("O alone", (o_alone,), ("you returned O alone",)),
    Mistake("(lse, O)", (lse_first,), ("you returned (lse, O)",)),
    Mistake("three values", (three_values,), ("got 3 values",)),
    Mistake("lse = log(l)", (log_l,), ("add the maximum back, L = m + log(l)",)),
    Mistake("lse = m", (m_alone,), ("the row maximum m alone",)),
    Mistake("lse without the maximum", (naive_logsumexp,), ("log(sum(exp(s))) overflows",)),
    Mistake("lse in base 2", (base_2,), ("lse in base 2",)),
    Mistake("lse in float64", (lse_in_float64,), ("lse is float64, expected float32",)),
    Mistake("lse with a trailing axis", (lse_with_trailing_axis,),
            ("drop the trailing axis of 1",)),
    Mistake("lse of the unscaled scores", (lse_of_unscaled_scores,),
            ("lse of the unscaled scores",)),
    # a shape message on ragged scores, and on square scores (where the shape is right) the
    # values
    Mistake("lse over the queries", (lse_over_the_queries,),
            ("one number per key", "lse over the wrong axis")),
    Mistake("no keepdims", (no_keepdims,), ("keepdims=True", "shape mismatch"),
            absent=("could not be broadcast",)),
    Mistake("O transposed", (o_transposed,), ("shape",)),
)


# ---- 1.5 the balanced block ------------------------------------------------------------------

def only_k(p, w, i):
    return i * p / (4 * w)


def multiply_add_flops(p, w, i):
    return i * p / w


def no_itemsize(p, w, i):
    return p / (2 * w)


def ridge_point(p, w, i):
    return p / w


def block_upside_down(p, w, i):
    return 2 * w / (i * p)


def a_number(p, w, i):
    return 208


# Each gets its own diagnosis, and no failure prints the right value (the exercise is a
# derivation: the values would give the formula away).
declare_mistakes(check_balanced_block, *(
    Mistake(name, (fn,), (hint,), absent=("expected",)) for name, fn, hint in [
        ("only K counted", only_k, "counts only K"),
        ("multiply-adds", multiply_add_flops, "multiply-adds"),
        ("no itemsize", no_itemsize, "leaves out itemsize"),
        ("the ridge point", ridge_point, "the ridge point"),
        ("upside down", block_upside_down, "upside down"),
        ("a number", a_number, "set the two terms equal"),
    ]))
