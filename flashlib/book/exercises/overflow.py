"""Checkers for the exercises of the overflow chapter (book/overflow.md).

check_stable_softmax      ``softmax(x)`` along the last axis: finite, exact, dtype-preserving
check_overflow_threshold  the largest ``x`` of a dtype with finite ``exp(x)``
check_score_bytes         ``score_bytes(n, dtype)``: bytes of one (n, n) score matrix
check_scale_keeps_dtype   ``scale(s, d)`` = ``s / sqrt(d)`` without promoting to float64
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import Feedback, call_learner, checker, fmt, names, warned
from flashlib.fast.softmax import softmax
from flashlib.studies.overflow import exp_overflow_threshold

__all__ = [
    "check_stable_softmax",
    "check_overflow_threshold",
    "check_score_bytes",
    "check_scale_keeps_dtype",
]

_TOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12}


def _reference_softmax(x: np.ndarray) -> np.ndarray:
    """flashlib's stable softmax along the last axis, computed in float64."""
    return softmax(np.asarray(x, dtype=np.float64), axis=-1)


@checker("stable softmax",
         forbid=names("flashlib.fast.softmax.softmax", "flashlib.algorithms.safe_softmax"))
def check_stable_softmax(fb: Feedback, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    """Check a learner's ``softmax(x)`` along the last axis: finite, exact, dtype-preserving."""
    over = ("exp of a large logit overflows to inf and inf/inf is NaN: subtract the max first, "
            "exp(x - max(x))")
    under = ("every exp(x) underflows to 0 and 0/0 is NaN: subtract the max first, so the "
             "largest term is exp(0) = 1")
    cases = [
        ("x = [1, 2, 3]", np.array([1.0, 2.0, 3.0]), over),
        ("x = [1000, 0]", np.array([1000.0, 0.0]), over),
        ("x = [-1000, -1000]", np.array([-1000.0, -1000.0]), under),
        ("x = [0, -inf] (a masked score)", np.array([0.0, -np.inf]),
         "exp(-inf) = 0 is fine, but -inf - (-inf) is NaN: subtract the max, not each value"),
        ("float32 x = [100, 0]", np.array([100.0, 0.0], dtype=np.float32), over),
        ("float16 x = [20, 0, -20]", np.array([20.0, 0.0, -20.0], dtype=np.float16), over),
        ("a batch of rows [[1, 2, 3], [1000, 0, -1000]]",
         np.array([[1.0, 2.0, 3.0], [1000.0, 0.0, -1000.0]]),
         over + " (per row: max(axis=-1, keepdims=True))"),
        ("a single value x = [5]", np.array([5.0]), over),
    ]
    for name, x, hint in cases:
        with fb.case(name):
            got, warns = call_learner(fn, x.copy())
            got = np.asarray(got)
            want = _reference_softmax(x)
            if got.shape != x.shape:
                fb.fail(f"{name}: output shape {got.shape}, expected {x.shape} (same as x)")
            elif np.isnan(got).any():
                fb.fail(f"your softmax returns NaN for {name} ({fmt(got)}): {hint}")
            elif got.dtype != x.dtype:
                fb.fail(f"{name}: returns {got.dtype} for a {x.dtype} input; keep the input's "
                        "dtype (a float64 scalar or array in the computation promotes it)")
            elif got.ndim == 2 and not np.allclose(got.sum(axis=-1), 1.0, atol=1e-6):
                fb.fail(f"{name}: rows sum to {fmt(got.sum(axis=-1))}, not 1: normalise "
                        "along the last axis (max and sum with axis=-1, keepdims=True)")
            elif (err := float(np.max(np.abs(got.astype(np.float64) - want)))) > _TOL[x.dtype]:
                fb.fail(f"{name}: got {fmt(got)}, expected {fmt(want)} (max error "
                        f"{err:.2g} > {_TOL[x.dtype]:g})")
            elif warns:
                fb.fail(f"{name}: right answer, but {warned(warns[0])}: a stable "
                        "softmax never computes exp of a positive number")
            else:
                fb.ok(f"{name}: correct")


@checker("overflow threshold",
         forbid=names("flashlib.studies.overflow.exp_overflow_threshold"))
def check_overflow_threshold(fb: Feedback, answer: float | Callable[[Any], float],
                             dtype: Any = np.float16) -> None:
    """Check the largest ``x`` of ``dtype`` with finite ``exp(x)``.

    ``answer`` is a number (checked for ``dtype``) or a function ``threshold(dtype)`` (checked
    for float16, float32 and float64).
    """
    if callable(answer):
        dtypes = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)]
    else:
        dtypes = [np.dtype(dtype)]
    for dt in dtypes:
        with fb.case(str(dt)):
            got = call_learner(answer, dt)[0] if callable(answer) else answer
            try:
                value = float(got)
            except (TypeError, ValueError):
                fb.fail(f"{dt}: expected a number, got {got!r}")
                continue
            want = exp_overflow_threshold(dt)
            x = np.array(value, dtype=dt)[()]
            note = ""
            if float(x) != value:
                note = f" ({value!r} is not a {dt} value; it rounds to {float(x)!r})"
            with np.errstate(over="ignore"):
                finite = bool(np.isfinite(np.exp(x)))
                up = np.nextafter(x, dt.type(np.inf))
                next_finite = bool(np.isfinite(np.exp(up)))
            if float(x) == want:
                fb.ok(f"{dt}: {want!r} is right: exp gives {np.exp(x)!r}, the next {dt} value "
                      f"{float(up)!r} overflows{note}")
            elif not finite:
                fb.fail(f"{dt}: too large{note}: exp({float(x)!r}) is inf in {dt}. "
                        f"log(finfo.max) rounded to {dt} can land just above the threshold; "
                        "step down with np.nextafter until exp is finite")
            elif next_finite:
                fb.fail(f"{dt}: too small{note}: exp({float(x)!r}) is finite, but so is exp of "
                        f"the next {dt} value {float(up)!r}; the threshold is higher "
                        "(compare np.log(np.finfo(dtype).max))")
            else:
                fb.fail(f"{dt}: {float(x)!r} is not the threshold {want!r}{note}")


@checker("memory of S",
         forbid=names("flashlib.studies.intro.score_matrix_bytes"))
def check_score_bytes(fb: Feedback, fn: Callable[[int, Any], int]) -> None:
    """Check ``score_bytes(n, dtype)``: bytes of one (n, n) score matrix ``S`` in ``dtype``.

    A wrong answer is diagnosed by the formula it matches on *every* case it answered (a
    fixed 4 bytes per element equals "S and P together" for float16 alone, and is right for
    float32), else by the one formula that matches this case alone."""
    cases = [(1, "float32"), (1024, "float32"), (1024, np.float16), (3000, np.float64),
             (16384, "float32"), (1000, np.dtype(np.float16))]
    wrong: dict[str, Callable[[int, int], int]] = {
        "that is the number of elements; multiply by the itemsize "
        "(np.dtype(dtype).itemsize)": lambda n, item: n * n,
        "that assumes 4 bytes per element whatever the dtype; use np.dtype(dtype).itemsize":
            lambda n, item: n * n * 4,
        "that is one row; S is n x n": lambda n, item: n * item,
        "that is in bits; the question asks for bytes": lambda n, item: 8 * n * n * item,
        "that is S and P together (two matrices); count one n x n matrix":
            lambda n, item: 2 * n * n * item,
    }
    answers: dict[tuple[int, Any], int] = {}
    for n, dt in cases:
        label = f"n = {n}, dtype = {np.dtype(dt)}"
        with fb.case(label, hint="(dtype may be a string, a type or a np.dtype: "
                                 "np.dtype(dtype).itemsize handles all three)"):
            got, _ = call_learner(fn, n, dt)
            try:
                answers[n, dt] = int(got)
                if answers[n, dt] != float(got):
                    raise ValueError
            except (TypeError, ValueError, OverflowError):
                answers.pop((n, dt), None)
                fb.fail(f"{label}: expected a whole number of bytes, got {got!r}")
    item_of = {key: np.dtype(key[1]).itemsize for key in answers}
    everywhere = [name for name, formula in wrong.items()
                  if answers and all(formula(n, item_of[n, dt]) == got
                                     for (n, dt), got in answers.items())]
    for (n, dt), got in answers.items():
        label, item = f"n = {n}, dtype = {np.dtype(dt)}", item_of[n, dt]
        want = n * n * item
        if got == want:
            fb.ok(f"{label}: {want:,} bytes")
            continue
        here = [name for name, formula in wrong.items() if formula(n, item) == got]
        reason = (everywhere[0] if everywhere else here[0] if len(here) == 1
                  else f"expected n * n * {item}")
        fb.fail(f"{label}: got {got:,}, expected {want:,}: {reason}")


@checker("scale without promotion",
         forbid=names("flashlib.studies.overflow.scale_scores"))
def check_scale_keeps_dtype(fb: Feedback, fn: Callable[[np.ndarray, int], np.ndarray]) -> None:
    """Check ``scale(s, d)`` = ``s / sqrt(d)`` in ``s``'s own dtype, without modifying ``s``."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((4, 6))
    cases = [("float32 s, d = 64", base.astype(np.float32), 64),
             ("float16 s, d = 64", base.astype(np.float16), 64),
             ("float64 s, d = 128", base, 128),
             ("float32 s, d = np.int64(96)", base.astype(np.float32), np.int64(96))]
    for name, s, d in cases:
        with fb.case(name):
            s_in = s.copy()
            got, _ = call_learner(fn, s_in, d)
            got = np.asarray(got)
            want = s.astype(np.float64) / np.sqrt(float(d))
            tol = _TOL[s.dtype] * 10
            if not np.array_equal(s_in, s):
                fb.fail(f"{name}: your function changed its input s in place; return a new "
                        "array")
            elif got.dtype != s.dtype:
                fb.fail(f"{name}: returns {got.dtype}, not {s.dtype}: np.sqrt(d) is a "
                        "np.float64 numpy scalar, and under NEP 50 (numpy 2) numpy scalars are "
                        "not 'weak', so it promotes s. Cast it: s.dtype.type(np.sqrt(d))")
            elif got.shape != s.shape or not np.allclose(got, want, rtol=tol, atol=tol):
                fb.fail(f"{name}: values differ from s / sqrt(d) (did you divide by d, or "
                        "by sqrt(d) twice?)")
            else:
                fb.ok(f"{name}: {got.dtype}, values right")
