"""Checkers for the exercises of the overflow chapter (book/overflow.md).

check_stable_softmax      ``softmax(x)`` along the last axis: finite, exact, dtype-preserving,
                          zeros for a row that is entirely -inf
check_overflow_threshold  the largest ``x`` of a dtype with finite ``exp(x)``: float16, float32,
                          float64 and bfloat16 (ml_dtypes)
check_score_bytes         ``score_bytes(n, dtype)``: bytes of one (n, n) score matrix
check_row_stats           ``row_stats(s)`` -> (m, l): the safe softmax's row maximum and sum,
                          in ``s``'s own dtype
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import (
    Feedback,
    call_learner,
    checker,
    fmt,
    names,
    shape_problem,
    warned,
)
from flashlib.fast.softmax import softmax
from flashlib.studies.overflow import exp_overflow_threshold

__all__ = [
    "check_stable_softmax",
    "check_overflow_threshold",
    "check_score_bytes",
    "check_row_stats",
]

_TOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12}


def _reference_softmax(x: np.ndarray) -> np.ndarray:
    """flashlib's stable softmax along the last axis, computed in float64."""
    return softmax(np.asarray(x, dtype=np.float64), axis=-1)


def _all_neg_inf_hint(warns: list[str]) -> str:
    """Why a row that is entirely -inf came out NaN, from numpy's warning: the subtraction
    x - m with m = -inf (the algorithm box as it stands), or the division 0 / 0 after the
    maximum was replaced."""
    said = " ".join(warns)
    if "subtract" in said:
        return ("its maximum m is -inf, and x - m = -inf - (-inf) is NaN. Where m is -inf "
                "use 0 instead (every term is then exp(-inf) = 0) and return zeros for that row")
    if "divide" in said:
        return ("its terms exp(x - m) are all 0 and so is their sum l: 0 / 0 is NaN. Divide "
                "only where l > 0 and leave zeros elsewhere")
    return ("a query that may see no key must get zeros: handle m = -inf (x - m is NaN) "
            "and l = 0 (0 / 0 is NaN)")


@checker("stable softmax",
         forbid=names("flashlib.fast.softmax.softmax", "flashlib.algorithms.safe_softmax",
                      "flashlib.studies.overflow.safe_softmax_passes"))
def check_stable_softmax(fb: Feedback, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    """Check a learner's ``softmax(x)`` along the last axis: finite, exact, dtype-preserving,
    and zeros for a row that is entirely -inf (a query that may attend to no key)."""
    over = ("exp of a large logit overflows to inf and inf/inf is NaN: subtract the max first, "
            "exp(x - max(x))")
    under = ("every exp(x) underflows to 0 and 0/0 is NaN: subtract the max first, so the "
             "largest term is exp(0) = 1")
    ninf = np.inf
    cases = [
        ("x = [1, 2, 3]", np.array([1.0, 2.0, 3.0]), over),
        ("x = [1000, 0]", np.array([1000.0, 0.0]), over),
        ("x = [-1000, -1000]", np.array([-1000.0, -1000.0]), under),
        ("x = [0, -inf] (a masked score)", np.array([0.0, -ninf]),
         "exp(-inf) = 0 is fine, but -inf - (-inf) is NaN: subtract the max, not each value"),
        ("float32 x = [100, 0]", np.array([100.0, 0.0], dtype=np.float32), over),
        ("float16 x = [20, 0, -20]", np.array([20.0, 0.0, -20.0], dtype=np.float16), over),
        ("a batch of rows [[1, 2, 3], [1000, 0, -1000]]",
         np.array([[1.0, 2.0, 3.0], [1000.0, 0.0, -1000.0]]),
         over + " (per row: max(axis=-1, keepdims=True))"),
        ("a single value x = [5]", np.array([5.0]), over),
        ("x = [-inf, -inf] (a query that may see no key)", np.array([-ninf, -ninf]), None),
        ("float32 batch [[0, 1, 2], [-inf, -inf, -inf]] (the second row sees no key)",
         np.array([[0.0, 1.0, 2.0], [-ninf, -ninf, -ninf]], dtype=np.float32), None),
    ]
    for name, x, hint in cases:
        blind = np.all(np.isneginf(x), axis=-1)  # rows that see no key
        with fb.case(name):
            got, warns = call_learner(fn, x.copy())
            got = np.asarray(got)
            want = _reference_softmax(x)
            if got.shape != x.shape:
                fb.fail(f"{name}: output shape {got.shape}, expected {x.shape} (same as x)")
            elif np.isnan(got).any():
                why = hint if hint is not None else (
                    "a row that is entirely -inf gives NaN: " + _all_neg_inf_hint(warns))
                fb.fail(f"your softmax returns NaN for {name} ({fmt(got)}): {why}")
            elif got.dtype != x.dtype:
                fb.fail(f"{name}: returns {got.dtype} for a {x.dtype} input; keep the input's "
                        "dtype (a float64 scalar or array in the computation promotes it)")
            elif blind.any() and not np.allclose(got[blind], 0.0):
                fb.fail(f"{name}: a row that is entirely -inf gives {fmt(got[blind])}; a query "
                        "that may see no key attends to nothing: return zeros for it, not "
                        "a distribution over keys it may not see")
            elif got.ndim == 2 and not np.allclose(got.sum(axis=-1), want.sum(axis=-1),
                                                   atol=1e-6):
                fb.fail(f"{name}: rows sum to {fmt(got.sum(axis=-1))}, not 1: normalise "
                        "along the last axis (max and sum with axis=-1, keepdims=True)")
            elif (err := float(np.max(np.abs(got.astype(np.float64) - want)))) > _TOL[x.dtype]:
                fb.fail(f"{name}: got {fmt(got)}, expected {fmt(want)} (max error "
                        f"{err:.2g} > {_TOL[x.dtype]:g})")
            elif warns:
                advice = ("compute no NaN on the way: repairing it afterwards still warns"
                          if blind.any() else
                          "a stable softmax never computes exp of a positive number")
                fb.fail(f"{name}: right answer, but {warned(warns[0])}: {advice}")
            else:
                fb.ok(f"{name}: correct")


def _bfloat16() -> np.dtype | None:
    """numpy's dtype for bfloat16 (from ml_dtypes), None when ml_dtypes is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def _threshold(dt: np.dtype) -> float:
    """The largest x of ``dt`` with finite exp(x): flashlib's walk for numpy's formats, the
    same walk from ml_dtypes' finfo for bfloat16 (which the library function refuses)."""
    if dt != _bfloat16():
        return exp_overflow_threshold(dt)
    import ml_dtypes

    up, down = dt.type(np.inf), dt.type(-np.inf)
    x = dt.type(np.log(float(ml_dtypes.finfo(dt).max)))
    with np.errstate(over="ignore"):
        while not np.isfinite(np.exp(x)):
            x = np.nextafter(x, down)
        while np.isfinite(np.exp(np.nextafter(x, up))):
            x = np.nextafter(x, up)
    return float(x)


@checker("overflow threshold",
         forbid=names("flashlib.studies.overflow.exp_overflow_threshold"))
def check_overflow_threshold(fb: Feedback, answer: float | Callable[[Any], float],
                             dtype: Any = np.float16) -> None:
    """Check the largest ``x`` of ``dtype`` with finite ``exp(x)``.

    ``answer`` is a number (checked for ``dtype``) or a function ``threshold(dtype)`` (checked
    for float16, float32, float64 and, where ml_dtypes is installed, bfloat16). The number
    must be a value of the format: one that merely rounds to the threshold is refused (it is
    how a float32 threshold would pass for bfloat16).
    """
    if callable(answer):
        dtypes = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)]
        bf16 = _bfloat16()
        if bf16 is None:
            fb.ok("bfloat16 not checked: it needs the ml_dtypes package (pip install ml-dtypes)")
        else:
            dtypes.append(bf16)
    else:
        dtypes = [np.dtype(dtype)]
    for dt in dtypes:
        hint = ("(np.finfo does not know bfloat16: ml_dtypes.finfo knows every format)"
                if dt.name == "bfloat16" else "")
        with fb.case(str(dt), hint=hint):
            got = call_learner(answer, dt)[0] if callable(answer) else answer
            try:
                value = float(got)
            except (TypeError, ValueError):
                fb.fail(f"{dt}: expected a number, got {got!r}")
                continue
            want = _threshold(dt)
            x = np.array(value, dtype=dt)[()]
            with np.errstate(over="ignore"):
                finite = bool(np.isfinite(np.exp(x)))
                up = np.nextafter(x, dt.type(np.inf))
                next_finite = bool(np.isfinite(np.exp(up)))
            if float(x) != value and np.isfinite(value):
                fb.fail(f"{dt}: {value!r} is not a {dt} value: "
                        f"the threshold is one of the format's own values; walk over them "
                        f"with np.nextafter in {dt}")
            elif float(x) == want:
                fb.ok(f"{dt}: {want!r} is right: exp gives {np.exp(x)!r}, the next {dt} value "
                      f"{float(up)!r} overflows")
            elif not finite:
                fb.fail(f"{dt}: too large: exp({float(x)!r}) is inf in {dt}. "
                        f"log(finfo.max) rounded to {dt} can land just above the threshold; "
                        "step down with np.nextafter until exp is finite")
            elif next_finite:
                fb.fail(f"{dt}: too small: exp({float(x)!r}) is finite, but so is exp of "
                        f"the next {dt} value {float(up)!r}; the threshold is higher "
                        "(compare np.log of the format's largest number)")
            else:
                fb.fail(f"{dt}: {float(x)!r} is not the threshold")


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


def _stats64(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The safe softmax's statistics of each row of ``s``, in float64: (m, l)."""
    s64 = s.astype(np.float64)
    m = s64.max(axis=-1)
    return m, np.exp(s64 - m[:, None]).sum(axis=-1)


def _stats_mistake(s: np.ndarray, m: np.ndarray, l: np.ndarray,  # noqa: E741
                   tol: float) -> str | None:
    """What is wrong with the learner's (m, l), the usual mistakes of a column-by-column loop
    named; None if both are right."""
    s64 = s.astype(np.float64)
    m_want, l_want = _stats64(s)

    def close(a: np.ndarray, b: np.ndarray) -> bool:
        with np.errstate(over="ignore", invalid="ignore"):
            return bool(np.allclose(a.astype(np.float64), b, rtol=tol, atol=tol))

    if close(m, m_want) and close(l, l_want):
        return None
    if not close(m, m_want):
        if close(m, np.maximum(m_want, 0.0)):
            return ("m starts at 0, above every score of a row whose scores are all negative: "
                    "start it at -inf, the maximum of no score at all")
        if close(m, s64.min(axis=-1)):
            return "m is each row's minimum: keep the larger value (np.maximum)"
        return "m is not each row's maximum"
    with np.errstate(over="ignore"):
        unshifted = np.exp(s64).sum(axis=-1)
    if close(l, unshifted):
        return "l sums exp(s), not exp(s - m): subtract the row maximum in pass 2"
    running = np.maximum.accumulate(s64, axis=-1)
    if close(l, np.exp(s64 - running).sum(axis=-1)):
        return ("l adds exp(s_j - m) with the maximum found so far; pass 2 needs the final m "
                "of pass 1 (the next chapter shows how one pass can rescale instead)")
    return f"l is {fmt(l)}, expected {fmt(l_want)}"


@checker("row statistics in the input's dtype",
         forbid=names("flashlib.fast.online.two_pass_softmax_state",
                      "flashlib.fast.online.online_softmax"))
def check_row_stats(fb: Feedback, fn: Callable[[np.ndarray], Any]) -> None:
    """Check ``row_stats(s)`` -> ``(m, l)`` for s of shape (rows, n): ``m`` each row's maximum,
    ``l`` each row's sum of ``exp(s - m)``, both of shape (rows,) in ``s``'s own dtype, ``s``
    unchanged."""
    rng = np.random.default_rng(0)
    cases = [
        ("float32 s of shape (3, 5)", rng.standard_normal((3, 5)).astype(np.float32)),
        ("float16 s of shape (2, 4)", (3 * rng.standard_normal((2, 4))).astype(np.float16)),
        ("float64 s of shape (4, 7)", 5 * rng.standard_normal((4, 7))),
        ("float32 rows of negative scores (2, 3)",
         np.array([[-5.0, -1.0, -3.0], [-20.0, -30.0, -25.0]], dtype=np.float32)),
        ("float32 s of one column (3, 1)", np.array([[2.0], [-7.0], [0.5]], dtype=np.float32)),
        ("float64 s of one row (1, 6) with a large score",
         np.array([[800.0, 1.0, -3.0, 799.0, 0.0, 2.0]])),
    ]
    for name, s in cases:
        with fb.case(name):
            s_in = s.copy()
            got, warns = call_learner(fn, s_in)
            if not np.array_equal(s_in, s):
                fb.fail(f"{name}: your function changed its input s; leave it as it is")
                continue
            if not isinstance(got, tuple | list) or len(got) != 2:
                fb.fail(f"{name}: expected the pair (m, l), got {type(got).__name__}")
                continue
            m, l = (np.asarray(x) for x in got)  # noqa: E741
            tol = {np.dtype(np.float16): 4e-3, np.dtype(np.float32): 1e-5}.get(s.dtype, 1e-10)
            problem = next((p for what, x in (("m", m), ("l", l))
                            if (p := shape_problem(x, (s.shape[0],), what))), None)
            if problem is None and not (np.all(np.isfinite(m)) and np.all(np.isfinite(l))):
                problem = (f"m = {fmt(m)}, l = {fmt(l)}: not finite; l adds exp(s - m), "
                           "each term at most 1")
            if problem is None:
                problem = _stats_mistake(s, m, l, tol)
            if problem is None:
                wrong = [what for what, x in (("m", m), ("l", l)) if x.dtype != s.dtype]
                if wrong:
                    names = " and ".join(wrong)
                    dtypes = " and ".join(sorted({str(x.dtype) for x in (m, l)
                                                  if x.dtype != s.dtype}))
                    problem = (f"right values, but {names} {'are' if len(wrong) > 1 else 'is'} "
                               f"{dtypes} for a {s.dtype} s. An array made without a dtype "
                               "(np.full, np.zeros, np.ones, np.empty) is float64, and "
                               "everything computed with it after is promoted: give it "
                               "dtype=s.dtype")
            if problem:
                fb.fail(f"{name}: {problem}")
            elif warns:
                fb.fail(f"{name}: right answer, but {warned(warns[0])}")
            else:
                fb.ok(f"{name}: m and l right, in {s.dtype}")
