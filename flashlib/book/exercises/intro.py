"""Checkers for the Introduction's exercises (book/intro.md).

Each checker runs the learner's function on several cases, never raises because of the
learner's code, and returns a :class:`flashlib.book.exercises.Feedback` naming what went wrong.

check_attention_flops      ``flops(n_q, n_k, d, d_v)`` of the two matrix products of attention
check_attention_shapes     ``shapes(q_shape, k_shape, v_shape)`` of S, P, O and lse
check_standard_traffic     ``traffic(n_q, n_k, d, d_v)``: elements Algorithm 0 moves to and
                           from HBM
check_reference_attention  ``attention(q, k, v)`` = softmax(q k^T / sqrt(d)) v in numpy

A wrong number is diagnosed by the formula it matches on *every* case (a count of only
``S = Q K^T`` equals half the right count whenever d = d_v, so one square case cannot tell it
from counting multiply-adds): the cases include d != d_v and n_q != n_k.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import (
    ATTENTION,
    Feedback,
    call_learner,
    checker,
    names,
    shape_problem,
    warned,
)
from flashlib.fast.naive import naive_attention
from flashlib.fast.softmax import softmax
from flashlib.studies.io_model import traffic

__all__ = [
    "check_attention_flops",
    "check_attention_shapes",
    "check_standard_traffic",
    "check_reference_attention",
]

Sizes = tuple[int, int, int, int]
#: (n_q, n_k, d, d_v) cases of the counting exercises: square and not, d = d_v and not.
COUNT_CASES: list[Sizes] = [(1, 1, 1, 1), (4, 4, 2, 2), (1024, 1024, 64, 64), (100, 300, 64, 32),
                            (7, 5, 3, 11)]


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float | np.integer | np.floating) and x == x


def _check_count(fb: Feedback, fn: Callable[..., Any], what: str, want: Callable[..., int],
                 wrong: dict[str, Callable[..., int]]) -> None:
    """The counting idiom: run ``fn`` on every case of COUNT_CASES, then diagnose each wrong
    answer by the ``wrong`` formula (name -> formula) that matches the learner on every case
    where it answered with a number (else one that matches this case alone and no other
    formula does, else the expected formula)."""
    answers: dict[Sizes, Any] = {}
    for sizes in COUNT_CASES:
        with fb.case(_label(sizes)) as case:
            answers[sizes], _ = call_learner(fn, *sizes)
        if case.failed:
            answers.pop(sizes, None)
    numbers = {s: a for s, a in answers.items() if _is_number(a)}
    everywhere = [name for name, formula in wrong.items()
                  if numbers and all(formula(*s) == a for s, a in numbers.items())]
    for sizes, got in answers.items():
        label, expected = _label(sizes), want(*sizes)
        if not _is_number(got):
            fb.fail(f"{label}: expected a number of {what}, got {got!r}")
        elif got == expected:
            fb.ok(f"{label}: {expected:,} {what}")
        elif everywhere:
            fb.fail(f"{label}: got {got:,}, expected {expected:,}: {everywhere[0]}")
        else:
            here = [name for name, formula in wrong.items() if formula(*sizes) == got]
            alone = [name for name in here if sum(
                formula(*sizes) == wrong[name](*sizes) for formula in wrong.values()) == 1]
            reason = alone[0] if alone else "check each term of the formula"
            fb.fail(f"{label}: got {got:,}, expected {expected:,}: {reason}")


def _label(sizes: Sizes) -> str:
    n_q, n_k, d, d_v = sizes
    return f"n_q={n_q}, n_k={n_k}, d={d}, d_v={d_v}"


@checker("FLOPs of attention",
         forbid=names("flashlib.studies.io_model.attention_flops"))
def check_attention_flops(fb: Feedback, fn: Callable[[int, int, int, int], int]) -> None:
    """Check ``flops(n_q, n_k, d, d_v)``: FLOPs of ``S = q k^T`` and ``O = P v`` (2 per FMA)."""
    _check_count(fb, fn, "FLOPs", lambda n_q, n_k, d, d_v: 2 * n_q * n_k * (d + d_v), {
        "that counts multiply-adds; a multiply-add is 2 FLOPs":
            lambda n_q, n_k, d, d_v: n_q * n_k * (d + d_v),
        "that is only S = q k^T; add O = P v (2 n_q n_k d_v)":
            lambda n_q, n_k, d, d_v: 2 * n_q * n_k * d,
        "that is only O = P v; add S = q k^T (2 n_q n_k d)":
            lambda n_q, n_k, d, d_v: 2 * n_q * n_k * d_v,
        "that uses d for both products; P v has output width d_v":
            lambda n_q, n_k, d, d_v: 4 * n_q * n_k * d,
        "that assumes n_k = n_q; S is (n_q, n_k)":
            lambda n_q, n_k, d, d_v: 2 * n_q * n_q * (d + d_v),
    })


@checker("HBM traffic of standard attention",
         forbid=names("flashlib.studies.io_model.traffic", "flashlib.studies.io_model.io_count"))
def check_standard_traffic(fb: Feedback, fn: Callable[[int, int, int, int], int]) -> None:
    """Check ``traffic(n_q, n_k, d, d_v)``: elements Algorithm 0 reads from and writes to HBM
    (:func:`flashlib.studies.io_model.traffic` ``("standard", ...)``, counted from the algorithm's
    own run by the tests)."""

    def want(n_q: int, n_k: int, d: int, d_v: int) -> int:
        return traffic("standard", n_q, n_k, d, d_v=d_v).total

    def s(n_q: int, n_k: int, d: int, d_v: int) -> int:  # one n_q x n_k matrix
        return n_q * n_k

    def qkv(n_q: int, n_k: int, d: int, d_v: int) -> int:  # reading Q, K and V once
        return n_q * d + n_k * d + n_k * d_v

    def o(n_q: int, n_k: int, d: int, d_v: int) -> int:  # writing O once
        return n_q * d_v

    _check_count(fb, fn, "elements", want, {
        "that counts the n_q x n_k matrices twice; S and P are each written once AND read "
        "back once: 4 n_q n_k": lambda *a: qkv(*a) + o(*a) + 2 * s(*a),
        "that counts only the n_q x n_k matrices; Q, K, V are read and O written too":
            lambda *a: 4 * s(*a),
        "that leaves out writing O (n_q d_v elements)": lambda *a: qkv(*a) + 4 * s(*a),
        "that reads V with width d; V and O have width d_v":
            lambda n_q, n_k, d, d_v: n_q * d + 2 * n_k * d + n_q * d_v + 4 * n_q * n_k,
        "that counts bytes of float32; count elements": lambda *a: 4 * want(*a),
    })


def _shape(x: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(s) for s in x)
    except (TypeError, ValueError):
        return None


@checker("shapes of S, P, O and lse",
         forbid=names(ATTENTION))
def check_attention_shapes(fb: Feedback, fn: Callable[..., dict[str, tuple[int, ...]]]) -> None:
    """Check ``shapes(q_shape, k_shape, v_shape)`` -> ``{"S", "P", "O", "lse"}`` shapes."""
    cases = [((2, 8, 1000, 64), (2, 8, 1000, 64), (2, 8, 1000, 64)),
             ((5, 16), (7, 16), (7, 3)),
             ((4, 1, 6, 8), (4, 1, 9, 8), (4, 1, 9, 2))]
    for q, k, v in cases:
        label = f"q {q}, k {k}, v {v}"
        with fb.case(label):
            got, _ = call_learner(fn, q, k, v)
            if not isinstance(got, dict):
                fb.fail(f"{label}: expected a dict with keys 'S', 'P', 'O', 'lse', got {got!r}")
                continue
            lead, n_q, n_k, d_v = q[:-2], q[-2], k[-2], v[-1]
            want = {"S": (*lead, n_q, n_k), "P": (*lead, n_q, n_k), "O": (*lead, n_q, d_v),
                    "lse": (*lead, n_q)}
            wrong = []
            for key, shape in want.items():
                have = _shape(got.get(key)) if key in got else None
                if have == shape:
                    continue
                if key not in got:
                    wrong.append(f"{key} is missing")
                elif key in "SP" and have == (*lead, n_k, n_q) and n_q != n_k:
                    wrong.append(f"{key} {have}: rows are queries, columns keys -> {shape}")
                elif key == "O" and have == (*lead, n_q, q[-1]) and q[-1] != d_v:
                    wrong.append(f"O {have}: O has v's width d_v = {d_v}, not d")
                elif key == "lse" and have == (*lead, n_q, 1):
                    wrong.append(f"lse {have}: one number per query row, no trailing 1")
                elif have is not None and have[-len(shape) + len(lead):] == shape[len(lead):]:
                    wrong.append(f"{key} {have}: keep the leading (batch, heads) dims {lead}")
                else:
                    wrong.append(f"{key}: got {got.get(key)!r}, expected {shape}")
            if wrong:
                fb.fail(f"{label}: " + "; ".join(wrong))
            else:
                fb.ok(f"{label}: S, P {want['S']}, O {want['O']}, lse {want['lse']}")


def _row_stats_without_keepdims(q: np.ndarray, k: np.ndarray, v: np.ndarray
                                ) -> np.ndarray | None:
    """What a softmax whose row max and row sum lost their axis computes on square scores:
    each broadcasts along the wrong axis (no error when n_q = n_k); None for other shapes (numpy
    raises there, and :func:`call_learner` explains it)."""
    if q.shape[-2] != k.shape[-2]:
        return None
    s = (q @ np.swapaxes(k, -1, -2)).astype(np.float64) / np.sqrt(q.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.exp(s - s.max(axis=-1)[..., None, :])
        return (p / p.sum(axis=-1)[..., None, :]) @ v


@checker("reference attention",
         forbid=names(ATTENTION))
def check_reference_attention(
    fb: Feedback, fn: Callable[[np.ndarray, np.ndarray, np.ndarray], Any]
) -> None:
    """Check ``attention(q, k, v)`` = ``softmax(q k^T / sqrt(d)) v`` against flashlib."""
    rng = np.random.default_rng(0)
    for dtype, shape_q, n_k, d_v, spread in [
        (np.float64, (2, 5, 4), 7, 3, 1.0),
        (np.float64, (3, 6), 6, 6, 1.0),
        (np.float32, (2, 8, 16), 8, 16, 1.0),  # square scores: a lost axis broadcasts silently
        (np.float32, (4, 8), 4, 2, 100.0),  # large scores: exp overflows without the max
    ]:
        q = (spread * rng.standard_normal(shape_q)).astype(dtype)
        k = rng.standard_normal((*shape_q[:-2], n_k, shape_q[-1])).astype(dtype)
        v = rng.standard_normal((*shape_q[:-2], n_k, d_v)).astype(dtype)
        label = f"q {q.shape} {np.dtype(dtype)}, k {k.shape}, v {v.shape}" + (
            f", scores up to ~{spread:g}" if spread > 1 else "")
        with fb.case(label):
            got, caught = call_learner(fn, q, k, v)
            got = np.asarray(got)
            want = naive_attention(q, k, v)
            tol = 1e-5 if dtype == np.float32 else 1e-10
            problem = shape_problem(got, want.shape, "the output")
            if problem:
                fb.fail(f"{label}: {problem}")
            elif not np.issubdtype(got.dtype, np.number) or not np.all(np.isfinite(got)):
                fb.fail(f"{label}: NaN/inf in the output ({'; '.join(caught) or 'exp overflow'})"
                        ": subtract each row's own maximum before np.exp, "
                        "s - s.max(axis=-1, keepdims=True)")
            elif np.allclose(got, want, atol=tol, rtol=tol):
                if got.dtype != want.dtype:
                    fb.fail(f"{label}: right values but dtype {got.dtype}, expected {want.dtype}; "
                            "np.sqrt(d) is a float64 scalar: use q.dtype.type(np.sqrt(d))")
                elif caught:
                    fb.fail(f"{label}: right values, but {'; '.join(warned(w) for w in caught)}")
                else:
                    fb.ok(f"{label}: matches flashlib.naive_attention")
            elif np.allclose(got, naive_attention(q, k, v, scale=1.0), atol=tol, rtol=tol):
                fb.fail(f"{label}: you forgot the scale 1/sqrt(d)")
            elif np.allclose(got, naive_attention(q, k, v, scale=1 / q.shape[-1]), atol=tol,
                             rtol=tol):
                fb.fail(f"{label}: you scaled by 1/d; the scale is 1/sqrt(d)")
            elif (lost := _row_stats_without_keepdims(q, k, v)) is not None and np.allclose(
                    got, lost, atol=1e-4, rtol=1e-4):
                fb.fail(f"{label}: each row's max and sum lost their axis (shape {q.shape[:-1]}"
                        f"); on square scores they broadcast along the wrong axis without an "
                        f"error. Keep it: keepdims=True, or [..., None]")
            else:
                s = (q @ np.swapaxes(k, -1, -2)).astype(np.float64) / np.sqrt(q.shape[-1])
                wrong_axis = softmax(s, axis=-2) @ v
                if np.allclose(got, wrong_axis, atol=1e-4, rtol=1e-4):
                    fb.fail(f"{label}: the softmax runs over the wrong axis; normalise each row "
                            "(over the keys, axis=-1)")
                else:
                    err_max = float(np.max(np.abs(got.astype(np.float64) - want)))
                    fb.fail(f"{label}: max |difference| {err_max:.3g} from naive_attention")
