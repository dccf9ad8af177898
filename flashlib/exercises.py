"""Checkers for the chapters' exercises.

Each checker takes the learner's function (or answer), runs it on a set of cases including
awkward ones (huge and tiny logits, ``-inf`` scores, the empty state, float16), and returns a
:class:`Feedback` whose text says which case failed and what to try.  A checker never raises
because of the learner's code: exceptions and numpy warnings are caught and reported.

Overflow chapter:        check_stable_softmax, check_overflow_threshold, check_score_bytes,
                         check_scale_keeps_dtype
Online softmax chapter:  check_online_update, check_merge, check_empty_partial,
                         check_merge_counterexample (against merge_forgetting_acc_rescale)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.online import (
    PartialAttention,
    finalize_partial,
    merge_partials,
    partial_attention,
    two_pass_softmax_state,
)
from flashlib.overflow import exp_overflow_threshold
from flashlib.stable_softmax import softmax

__all__ = [
    "Feedback",
    "NotAttempted",
    "call_learner",
    "STREAM_LENGTH",
    "check_stable_softmax",
    "check_overflow_threshold",
    "check_score_bytes",
    "check_scale_keeps_dtype",
    "check_online_update",
    "check_merge",
    "check_empty_partial",
    "merge_forgetting_acc_rescale",
    "check_merge_counterexample",
]


STREAM_LENGTH = 1000
"""How many values :func:`check_online_update` folds the learner's update over (the chapter
quotes it)."""


class Feedback:
    """The result of a checker: ``passed`` plus one line per check, shown as the cell's output."""

    def __init__(self, exercise: str) -> None:
        self.exercise = exercise
        self.passes: list[str] = []
        self.problems: list[str] = []

    def ok(self, message: str) -> None:
        self.passes.append(message)

    def fail(self, message: str) -> None:
        self.problems.append(message)

    @property
    def passed(self) -> bool:
        return not self.problems and bool(self.passes)

    @property
    def messages(self) -> list[str]:
        return self.problems + self.passes

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        head = (f"PASSED {self.exercise}: all {len(self.passes)} checks passed."
                if self.passed else f"NOT YET {self.exercise}:")
        lines = [head]
        lines += [f"  x  {p}" for p in self.problems]
        lines += [f"  ok {p}" for p in self.passes]
        return "\n".join(lines)

    __str__ = __repr__


class NotAttempted(Exception):
    """Raised by :func:`call_learner` when the learner's function still raises
    ``NotImplementedError`` (the exercise cell's placeholder)."""


def call_learner(fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str], str | None]:
    """Run the learner's ``fn(*args)`` for a checker; never lets the learner's error escape.

    Returns ``(result, warnings, error)``: ``warnings`` lists every warning raised during the
    call as ``"Category: message"``, ``error`` is ``"Type: message"`` of an exception (then
    ``result`` is None) or None.  A ``NotImplementedError`` (the exercise not attempted yet)
    raises :class:`NotAttempted` instead, so a checker can stop at once.  Shared by every
    ``flashlib.exercises*`` module.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn(*args)
        except NotImplementedError as err:
            raise NotAttempted from err
        except Exception as err:  # report any error from the learner's code
            return None, [], f"{type(err).__name__}: {err}"
    return result, [f"{w.category.__name__}: {w.message}" for w in caught], None


def _not_attempted(fb: Feedback) -> Feedback:
    fb.fail("not attempted yet: write your code in place of `raise NotImplementedError`")
    return fb


def _fmt(x: Any) -> str:
    return np.array2string(np.asarray(x), precision=4, separator=", ", max_line_width=10_000)


# --------------------------------------------------------------------------------------------
# Overflow chapter
# --------------------------------------------------------------------------------------------

def _reference_softmax(x: np.ndarray) -> np.ndarray:
    """flashlib's stable softmax along the last axis, computed in float64."""
    return softmax(np.asarray(x, dtype=np.float64), axis=-1)


_TOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12}


def check_stable_softmax(fn: Callable[[np.ndarray], np.ndarray]) -> Feedback:
    """Check a learner's ``softmax(x)`` along the last axis: finite, exact, dtype-preserving."""
    fb = Feedback("stable softmax")
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
    try:
        for name, x, hint in cases:
            got, warns, err = call_learner(fn, x.copy())
            if err:
                fb.fail(f"{name}: your function raised {err}")
                continue
            got = np.asarray(got)
            want = _reference_softmax(x)
            if got.shape != x.shape:
                fb.fail(f"{name}: output shape {got.shape}, expected {x.shape} (same as x)")
                continue
            if np.isnan(got).any():
                fb.fail(f"your softmax returns NaN for {name} ({_fmt(got)}): {hint}")
                continue
            if got.dtype != x.dtype:
                fb.fail(f"{name}: returns {got.dtype} for a {x.dtype} input; keep the input's "
                        "dtype (a float64 scalar or array in the computation promotes it)")
                continue
            if got.ndim == 2 and not np.allclose(got.sum(axis=-1), 1.0, atol=1e-6):
                fb.fail(f"{name}: rows sum to {_fmt(got.sum(axis=-1))}, not 1: normalise "
                        "along the last axis (max and sum with axis=-1, keepdims=True)")
                continue
            tol = _TOL[x.dtype]
            err_max = float(np.max(np.abs(got.astype(np.float64) - want)))
            if err_max > tol:
                fb.fail(f"{name}: got {_fmt(got)}, expected {_fmt(want)} (max error "
                        f"{err_max:.2g} > {tol:g})")
                continue
            if warns:
                fb.fail(f"{name}: right answer, but numpy warned '{warns[0]}': a stable "
                        "softmax never computes exp of a positive number")
                continue
            fb.ok(f"{name}: correct")
    except NotAttempted:
        return _not_attempted(fb)
    return fb


def check_overflow_threshold(answer: float | Callable[[Any], float],
                             dtype: Any = np.float16) -> Feedback:
    """Check the largest ``x`` of ``dtype`` with finite ``exp(x)``.

    ``answer`` is a number (checked for ``dtype``) or a function ``threshold(dtype)`` (checked
    for float16, float32 and float64).
    """
    fb = Feedback("overflow threshold")
    if callable(answer):
        dtypes = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)]
    else:
        dtypes = [np.dtype(dtype)]
    try:
        for dt in dtypes:
            if callable(answer):
                got, _, err = call_learner(answer, dt)
                if err:
                    fb.fail(f"{dt}: your function raised {err}")
                    continue
            else:
                got = answer
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
    except NotAttempted:
        return _not_attempted(fb)
    return fb


def check_score_bytes(fn: Callable[[int, Any], int]) -> Feedback:
    """Check ``score_bytes(n, dtype)``: bytes of one (n, n) score matrix ``S`` in ``dtype``."""
    fb = Feedback("memory of S")
    cases = [(1, "float32"), (1024, "float32"), (1024, np.float16), (3000, np.float64),
             (16384, "float32"), (1000, np.dtype(np.float16))]
    try:
        for n, dt in cases:
            got, _, err = call_learner(fn, n, dt)
            label = f"n = {n}, dtype = {np.dtype(dt)}"
            if err:
                fb.fail(f"{label}: your function raised {err} (dtype may be a string, a type or "
                        "a np.dtype: np.dtype(dtype).itemsize handles all three)")
                continue
            item = np.dtype(dt).itemsize
            want = n * n * item
            try:
                got_i = int(got)
            except (TypeError, ValueError):
                fb.fail(f"{label}: expected a number of bytes, got {got!r}")
                continue
            if got_i == want and float(got) == want:
                fb.ok(f"{label}: {want:,} bytes")
            elif got_i == n * n:
                fb.fail(f"{label}: {got_i:,} is the number of elements; multiply by the "
                        f"itemsize ({item} bytes for {np.dtype(dt)})")
            elif got_i == n * item:
                fb.fail(f"{label}: {got_i:,} is one row; S is n x n")
            elif got_i == 8 * want:
                fb.fail(f"{label}: {got_i:,} is in bits; the question asks for bytes")
            elif got_i == 2 * want:
                fb.fail(f"{label}: {got_i:,} is S and P together (or twice the itemsize); "
                        "count one n x n matrix")
            elif got_i * item == want * 4 or got_i == n * n * 4:
                fb.fail(f"{label}: {got_i:,} assumes 4 bytes per element; {np.dtype(dt)} "
                        f"uses {item}")
            else:
                fb.fail(f"{label}: got {got_i:,}, expected {want:,} = n * n * {item}")
    except NotAttempted:
        return _not_attempted(fb)
    return fb


def check_scale_keeps_dtype(fn: Callable[[np.ndarray, int], np.ndarray]) -> Feedback:
    """Check ``scale(s, d)`` = ``s / sqrt(d)`` in ``s``'s own dtype, without modifying ``s``."""
    fb = Feedback("scale without promotion")
    rng = np.random.default_rng(0)
    base = rng.standard_normal((4, 6))
    cases = [("float32 s, d = 64", base.astype(np.float32), 64),
             ("float16 s, d = 64", base.astype(np.float16), 64),
             ("float64 s, d = 128", base, 128),
             ("float32 s, d = np.int64(96)", base.astype(np.float32), np.int64(96))]
    try:
        for name, s, d in cases:
            s_in = s.copy()
            got, _, err = call_learner(fn, s_in, d)
            if err:
                fb.fail(f"{name}: your function raised {err}")
                continue
            got = np.asarray(got)
            if not np.array_equal(s_in, s):
                fb.fail(f"{name}: your function changed its input s in place; return a new "
                        "array")
                continue
            if got.dtype != s.dtype:
                fb.fail(f"{name}: returns {got.dtype}, not {s.dtype}: np.sqrt(d) is a "
                        "np.float64 numpy scalar, and under NEP 50 (numpy 2) numpy scalars are "
                        "not 'weak', so it promotes s. Cast it: s.dtype.type(np.sqrt(d))")
                continue
            want = s.astype(np.float64) / np.sqrt(float(d))
            tol = _TOL[s.dtype] * 10
            if got.shape != s.shape or not np.allclose(got, want, rtol=tol, atol=tol):
                fb.fail(f"{name}: values differ from s / sqrt(d) (did you divide by d, or "
                        "by sqrt(d) twice?)")
                continue
            fb.ok(f"{name}: {got.dtype}, values right")
    except NotAttempted:
        return _not_attempted(fb)
    return fb


# --------------------------------------------------------------------------------------------
# Online softmax chapter
# --------------------------------------------------------------------------------------------

def _as_pair(result: Any) -> tuple[float, float]:
    m, l = result  # noqa: E741
    return float(m), float(l)


def check_online_update(fn: Callable[[float, float, float], tuple[float, float]]) -> Feedback:
    """Check ``update(m, l, x) -> (m_new, l_new)``, the one-value online softmax step."""
    fb = Feedback("online softmax update")
    inf = float("inf")
    e = float(np.e)
    cases = [
        ("first value: (m, l) = (-inf, 0), x = 3", (-inf, 0.0, 3.0), (3.0, 1.0)),
        ("x below the max: (m, l) = (2, 1.5), x = 1", (2.0, 1.5, 1.0), (2.0, 1.5 + 1 / e)),
        ("new max: (m, l) = (0, 1), x = 1", (0.0, 1.0, 1.0), (1.0, 1 / e + 1.0)),
        ("huge logits: (m, l) = (1000, 1), x = 1001", (1000.0, 1.0, 1001.0), (1001.0, 1 / e + 1)),
        ("masked score into the empty state: (m, l) = (-inf, 0), x = -inf",
         (-inf, 0.0, -inf), (-inf, 0.0)),
    ]
    try:
        for name, (m, l, x), (m_want, l_want) in cases:  # noqa: E741
            got, warns, err = call_learner(fn, np.float64(m), np.float64(l), np.float64(x))
            if err:
                fb.fail(f"{name}: your function raised {err}")
                continue
            try:
                m_got, l_got = _as_pair(got)
            except (TypeError, ValueError):
                fb.fail(f"{name}: return a pair (m_new, l_new), got {got!r}")
                continue
            if np.isnan(m_got) or np.isnan(l_got):
                hint = ("exp(-inf - (-inf)) is NaN: when m_new is -inf nothing has been seen; "
                        "keep l = 0 (np.where or an if)" if m_want == -inf else
                        "exp overflowed or -inf - (-inf) appeared; compute exp(m - m_new) and "
                        "exp(x - m_new), both <= 1")
                fb.fail(f"{name}: got NaN ({m_got}, {l_got}): {hint}")
                continue
            if m_got != m_want:
                fb.fail(f"{name}: m_new = {m_got}, expected {m_want}: m_new = max(m, x)")
                continue
            if not np.isclose(l_got, l_want, rtol=1e-12, atol=0):
                if np.isclose(l_got, l + np.exp(x - m_want)) and m != m_want:
                    hint = ("you forgot to rescale the old sum when the max changed: "
                            "l_new = l * exp(m - m_new) + exp(x - m_new)")
                elif np.isclose(l_got, l * np.exp(m_want - m) + np.exp(x - m_want)):
                    hint = "the rescale factor is upside down: use exp(m - m_new), which is <= 1"
                elif m_want == m and np.isclose(l_got, l + np.exp(x)):
                    hint = "subtract the running max inside exp: exp(x - m_new)"
                else:
                    hint = "l_new = l * exp(m - m_new) + exp(x - m_new)"
                fb.fail(f"{name}: l_new = {l_got:.6g}, expected {l_want:.6g}: {hint}")
                continue
            if warns:
                fb.fail(f"{name}: right answer, but numpy warned '{warns[0]}'")
                continue
            fb.ok(f"{name}: ({m_want}, {l_want:.6g})")
        if not fb.problems:
            rng = np.random.default_rng(0)
            stream = rng.normal(500.0, 50.0, size=STREAM_LENGTH)
            m, l = -inf, 0.0  # noqa: E741
            label = f"a stream of {STREAM_LENGTH} values around 500"
            broke = False
            for i, x in enumerate(stream):
                got, warns, err = call_learner(fn, np.float64(m), np.float64(l), np.float64(x))
                if err:
                    fb.fail(f"{label}: at value {i} (x = {x:.6g}) your function raised {err}")
                    broke = True
                    break
                try:
                    m, l = _as_pair(got)  # noqa: E741
                except (TypeError, ValueError):
                    fb.fail(f"{label}: at value {i} return a pair (m_new, l_new), got {got!r}")
                    broke = True
                    break
                if warns:
                    fb.fail(f"{label}: at value {i} (x = {x:.6g}) numpy warned '{warns[0]}'")
                    broke = True
                    break
            ref = two_pass_softmax_state(stream)
            if broke:
                pass
            elif m == float(ref.m) and np.isclose(l, float(ref.l), rtol=1e-10):
                fb.ok(f"{label}: same (m, l) as the two-pass result")
            else:
                fb.fail(f"{label}: got ({m:.6g}, "
                        f"{l:.6g}), the two-pass result is ({float(ref.m):.6g}, "
                        f"{float(ref.l):.6g})")
    except NotAttempted:
        return _not_attempted(fb)
    return fb


def _random_partials(seed: int, n_q: int = 3, d_v: int = 4, block: int = 5,
                     shift: float = 4.0) -> tuple[PartialAttention, PartialAttention,
                                                  np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((n_q, 2 * block))
    # different maxima, and which block holds the larger one alternates between rows
    signs = np.where(np.arange(n_q) % 2 == 0, 1.0, -1.0)
    s[:, block:] += shift * signs[:, None]
    v = rng.standard_normal((2 * block, d_v))
    a = partial_attention(s[:, :block], v[:block])
    b = partial_attention(s[:, block:], v[block:])
    return a, b, s, v


def _as_partial(result: Any) -> PartialAttention:
    m, l, acc = result  # noqa: E741
    return PartialAttention(np.asarray(m, dtype=np.float64), np.asarray(l, dtype=np.float64),
                            np.asarray(acc, dtype=np.float64))


def _empty_partial(n_q: int, d_v: int) -> PartialAttention:
    return PartialAttention(np.full(n_q, -np.inf), np.zeros(n_q), np.zeros((n_q, d_v)))


def _same_partial(p: PartialAttention, q: PartialAttention) -> bool:
    return (p.m.shape == q.m.shape and p.acc.shape == q.acc.shape
            and np.array_equal(p.m, q.m) and np.allclose(p.l, q.l, rtol=1e-12, atol=0)
            and np.allclose(p.acc, q.acc, rtol=1e-12, atol=1e-15))


def check_merge(fn: Callable[[PartialAttention, PartialAttention], Any]) -> Feedback:
    """Check ``merge(a, b) -> (m, l, acc)`` of two partial attention states."""
    fb = Feedback("merge of partial states")
    try:
        a, b, s, v = _random_partials(0)
        whole = partial_attention(s, v)
        got, warns, err = call_learner(fn, a, b)
        if err:
            fb.fail(f"two blocks: your function raised {err}")
            return fb
        try:
            p = _as_partial(got)
        except (TypeError, ValueError):
            fb.fail(f"two blocks: return (m, l, acc) or a PartialAttention, got {type(got)}")
            return fb
        if p.m.shape != whole.m.shape or p.acc.shape != whole.acc.shape:
            fb.fail(f"two blocks: shapes m {p.m.shape}, acc {p.acc.shape}; expected "
                    f"{whole.m.shape}, {whole.acc.shape}")
            return fb
        alpha = np.exp(a.m - whole.m)[:, None]
        beta = np.exp(b.m - whole.m)[:, None]
        if np.isnan(p.m).any() or np.isnan(p.l).any() or np.isnan(p.acc).any():
            fb.fail("two blocks: the merged state contains NaN")
        elif not np.array_equal(p.m, whole.m):
            fb.fail(f"two blocks: m = {_fmt(p.m)}, expected max(m_a, m_b) = {_fmt(whole.m)}")
        elif not np.allclose(p.l, whole.l, rtol=1e-12):
            hint = ("l_a and l_b must be rescaled to the new max: "
                    "l = l_a exp(m_a - m) + l_b exp(m_b - m)")
            if np.allclose(p.l, a.l + b.l):
                hint = "you added l_a + l_b without rescaling: " + hint
            fb.fail(f"two blocks with different maxima: l is wrong; {hint}")
        elif not np.allclose(p.acc, whole.acc, rtol=1e-12):
            if np.allclose(p.acc, a.acc + b.acc):
                hint = ("you forgot to rescale acc: it was computed relative to m_a (or m_b), "
                        "so multiply it by exp(m_a - m) (or exp(m_b - m)) exactly like l")
            elif np.allclose(p.acc, a.acc * alpha + b.acc):
                hint = "acc_b is not rescaled: multiply it by exp(m_b - m)"
            elif np.allclose(p.acc, a.acc + b.acc * beta):
                hint = "acc_a is not rescaled: multiply it by exp(m_a - m)"
            elif np.allclose(p.acc, whole.acc / whole.l[:, None]):
                hint = "keep acc unnormalised: divide by l only at the end (finalize)"
            else:
                hint = "acc = acc_a exp(m_a - m) + acc_b exp(m_b - m)"
            fb.fail(f"two blocks with different maxima: acc is wrong; {hint}")
        elif warns:
            fb.fail(f"two blocks: right answer, but numpy warned '{warns[0]}'")
        else:
            fb.ok("two blocks with different maxima: equals attention over all keys")
        if fb.problems:
            return fb
        got2, _, err = call_learner(fn, b, a)
        if err or not _same_partial(_as_partial(got2), p):
            fb.fail("merge(b, a) differs from merge(a, b): the merge must be symmetric")
        else:
            fb.ok("merge(b, a) == merge(a, b)")
        empty = _empty_partial(*a.acc.shape)
        got3, warns3, err = call_learner(fn, a, empty)
        if err:
            fb.fail(f"merging with the empty state (m=-inf, l=0, acc=0) raised {err}")
        else:
            p3 = _as_partial(got3)
            if np.isnan(p3.l).any() or np.isnan(p3.acc).any():
                fb.fail("merging with the empty state (m=-inf, l=0, acc=0) gives NaN: "
                        "exp(-inf - m) is 0, but -inf - (-inf) is NaN when both are empty")
            elif not _same_partial(p3, a):
                fb.fail("merging with the empty state changed the state; it should be the "
                        "identity")
            else:
                fb.ok("merge(a, empty) == a")
        both_empty, _, err = call_learner(fn, empty, empty)
        if err:
            fb.fail(f"merge(empty, empty) raised {err}")
        else:
            pe = _as_partial(both_empty)
            if np.isnan(pe.l).any() or np.isnan(pe.acc).any():
                fb.fail("merge(empty, empty) gives NaN: guard exp(-inf - (-inf)) (for example "
                        "np.where(m == -inf, 0, exp(m_a - m)))")
            else:
                fb.ok("merge(empty, empty) is empty, no NaN")
        if warns3:
            fb.fail(f"merging with the empty state: numpy warned '{warns3[0]}'")
    except NotAttempted:
        return _not_attempted(fb)
    return fb


def check_empty_partial(fn: Callable[[int, int], Any]) -> Feedback:
    """Check ``empty(n_q, d_v) -> (m, l, acc)``, the identity element of :func:`merge_partials`."""
    fb = Feedback("the empty state")
    try:
        for n_q, d_v in [(3, 4), (1, 1), (5, 2)]:
            got, _, err = call_learner(fn, n_q, d_v)
            label = f"n_q = {n_q}, d_v = {d_v}"
            if err:
                fb.fail(f"{label}: your function raised {err}")
                continue
            try:
                e = _as_partial(got)
            except (TypeError, ValueError):
                fb.fail(f"{label}: return (m, l, acc) or a PartialAttention, got {type(got)}")
                continue
            if e.m.shape != (n_q,) or e.l.shape != (n_q,) or e.acc.shape != (n_q, d_v):
                fb.fail(f"{label}: shapes m {e.m.shape}, l {e.l.shape}, acc {e.acc.shape}; "
                        f"expected ({n_q},), ({n_q},), ({n_q}, {d_v})")
                continue
            rng = np.random.default_rng(n_q)
            # all-negative scores, so a wrong m = 0 shows up
            p = partial_attention(rng.standard_normal((n_q, 6)) - 10.0,
                                  rng.standard_normal((6, d_v)))
            try:  # merge_partials refuses a state with NaN, +inf or a negative l
                with np.errstate(all="ignore"):
                    left, right = merge_partials(e, p), merge_partials(p, e)
            except ValueError:
                left = right = None
            if (e.l != 0).any():
                fb.fail(f"{label}: l = {_fmt(e.l)}; the empty set has no terms, so l = 0")
            elif (e.acc != 0).any():
                fb.fail(f"{label}: acc must be all zeros (no values have been summed)")
            elif not np.all(e.m == -np.inf):
                fb.fail(f"{label}: m = {_fmt(e.m)} is not neutral: merging gives "
                        "m = max(m_p, m) which changes a state whose scores are all below it; "
                        "use -inf, the max of nothing")
            elif left is not None and _same_partial(left, p) and _same_partial(right, p):
                fb.ok(f"{label}: merge(empty, p) == p == merge(p, empty)")
            else:
                fb.fail(f"{label}: merging with your empty state changes p")
    except NotAttempted:
        return _not_attempted(fb)
    return fb


def merge_forgetting_acc_rescale(a: PartialAttention, b: PartialAttention) -> PartialAttention:
    """A BUGGY merge for the find-the-bug exercise: ``l`` is rescaled, ``acc`` is not."""
    m = np.maximum(a.m, b.m)
    alpha, beta = np.exp(a.m - m), np.exp(b.m - m)
    return PartialAttention(m, a.l * alpha + b.l * beta, a.acc + b.acc)


def check_merge_counterexample(a: Any, b: Any) -> Feedback:
    """Check two partial states on which :func:`merge_forgetting_acc_rescale` gives a wrong output.

    ``a`` and ``b`` are (m, l, acc) states over disjoint keys, for example from
    :func:`flashlib.partial_attention`.
    """
    fb = Feedback("counterexample for the buggy merge")
    try:
        pa, pb = _as_partial(a), _as_partial(b)
    except (TypeError, ValueError):
        fb.fail("pass two states (m, l, acc), for example partial_attention(s_block, v_block)")
        return fb
    if pa.m.shape != pb.m.shape or pa.acc.shape != pb.acc.shape:
        fb.fail(f"the two states must describe the same queries: m {pa.m.shape} vs "
                f"{pb.m.shape}, acc {pa.acc.shape} vs {pb.acc.shape}")
        return fb
    if not (np.all(np.isfinite(pa.m)) and np.all(np.isfinite(pb.m))):
        fb.fail("use blocks with at least one unmasked score per row (finite m)")
        return fb
    try:
        with np.errstate(all="ignore"):
            right = finalize_partial(merge_partials(pa, pb))
            wrong = finalize_partial(merge_forgetting_acc_rescale(pa, pb))
    except ValueError as err:  # NaN, +inf or a negative l in a state
        fb.fail(f"these are not valid partial states: {err}")
        return fb
    diff = float(np.max(np.abs(right - wrong)))
    if diff > 1e-6:
        fb.ok(f"the buggy merge is off by up to {diff:.3g}: the block whose max is lower "
              "had its acc added at the wrong scale")
    elif np.array_equal(pa.m, pb.m):
        fb.fail("the outputs agree: both blocks have the same maximum, so both rescale "
                "factors are exp(0) = 1 and the bug is invisible; give one block larger scores")
    else:
        fb.fail(f"the outputs agree to {diff:.2g}: are the values (acc) zero or identical? "
                "Use blocks with different maxima and different values")
    return fb
