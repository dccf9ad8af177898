"""Checkers for the Introduction's exercises (book/intro.md).

Each checker runs the learner's function on several cases, never raises because of the
learner's code, and returns a :class:`flashlib.book.exercises.Feedback` naming what went wrong.

check_attention_flops      ``flops(n_q, n_k, d, d_v)`` of the two matrix products of attention
check_attention_shapes     ``shapes(q_shape, k_shape, v_shape)`` of S, P, O and lse
check_standard_traffic     ``traffic(n_q, n_k, d, d_v)``: elements Algorithm 0 moves to and
                           from HBM
check_reference_attention  ``attention(q, k, v)`` -> (O, lse): softmax(q k^T / sqrt(d)) v and
                           each row's logsumexp, in numpy
check_balanced_block       ``balanced_block(peak, bandwidth, itemsize)``: the query block B_r at
                           which FlashAttention's memory term equals its compute term

A wrong number is diagnosed by the formula it matches on *every* case (a count of only
``S = Q K^T`` equals half the right count whenever d = d_v, so one square case cannot tell it
from counting multiply-adds): the cases include d != d_v and n_q != n_k, and all but one have
every term of the counts different (at n_q = n_k = d = d_v = 1 every term is 1, and leaving
out the read of S cannot be told from leaving out the write of O).
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
    "check_balanced_block",
]

Sizes = tuple[int, int, int, int]
#: (n_q, n_k, d, d_v) cases of the counting exercises. In all but the realistic square one
#: the five terms of the traffic (n_q d, n_k d, n_k d_v, n_q n_k, n_q d_v) differ from each
#: other, so each left-out or doubled term gives its own count.
COUNT_CASES: list[Sizes] = [(1, 3, 5, 4), (2, 1, 7, 3), (1024, 1024, 64, 64), (100, 300, 64, 32),
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

    def reads(n_q: int, n_k: int, d: int, d_v: int) -> int:  # Q, K, S, P, V
        return qkv(n_q, n_k, d, d_v) + 2 * s(n_q, n_k, d, d_v)

    def writes(n_q: int, n_k: int, d: int, d_v: int) -> int:  # S, P, O
        return 2 * s(n_q, n_k, d, d_v) + o(n_q, n_k, d, d_v)

    _check_count(fb, fn, "elements", want, {
        "that counts the n_q x n_k matrices three times: one of their four transfers is "
        "missing, most often the read of S in step 2 (S is written in step 1 and read back "
        "in step 2; P is written in step 2 and read back in step 3)":
            lambda *a: qkv(*a) + o(*a) + 3 * s(*a),
        "that counts the n_q x n_k matrices twice; S and P are each written once AND read "
        "back once: 4 n_q n_k": lambda *a: qkv(*a) + o(*a) + 2 * s(*a),
        "that counts only the n_q x n_k matrices; Q, K, V are read and O written too":
            lambda *a: 4 * s(*a),
        "that leaves out writing O (n_q d_v elements) in step 3":
            lambda *a: qkv(*a) + 4 * s(*a),
        "that leaves out reading Q (n_q d elements) in step 1":
            lambda n_q, n_k, d, d_v: want(n_q, n_k, d, d_v) - n_q * d,
        "that leaves out reading K (n_k d elements) in step 1":
            lambda n_q, n_k, d, d_v: want(n_q, n_k, d, d_v) - n_k * d,
        "that leaves out reading V (n_k d_v elements) in step 3":
            lambda n_q, n_k, d, d_v: want(n_q, n_k, d, d_v) - n_k * d_v,
        "that counts only the reads; S and P are written (steps 1 and 2) and O too (step 3)":
            reads,
        "that counts only the writes; Q, K, S, P and V are read too": writes,
        "that reads V with width d; V and O have width d_v":
            lambda n_q, n_k, d, d_v: n_q * d + 2 * n_k * d + n_q * d_v + 4 * n_q * n_k,
        "that writes O with width d; O has V's width d_v":
            lambda n_q, n_k, d, d_v: want(n_q, n_k, d, d_v) - n_q * d_v + n_q * d,
        "that assumes n_k = n_q; K and V have n_k rows, S and P are n_q x n_k":
            lambda n_q, n_k, d, d_v: want(n_q, n_q, d, d_v),
        "that counts bytes of float32; count elements": lambda *a: 4 * want(*a),
        "that counts bytes of float16; count elements": lambda *a: 2 * want(*a),
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


def _scores64(q: np.ndarray, k: np.ndarray, scale: float | None = None) -> np.ndarray:
    """The scaled scores in float64 (scale 1/sqrt(d) by default)."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    return (q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64)) * scale


def _lse64(s: np.ndarray, axis: int = -1) -> np.ndarray:
    """The logsumexp of ``s`` along ``axis``, in float64, without overflow."""
    m = s.max(axis=axis, keepdims=True)
    return np.squeeze(m + np.log(np.exp(s - m).sum(axis=axis, keepdims=True)), axis=axis)


def _pair(got: Any, o_shape: tuple[int, ...], lse_shape: tuple[int, ...]
          ) -> tuple[np.ndarray, np.ndarray] | str:
    """The learner's ``(O, lse)`` as two arrays, or one line saying why it is not a pair."""
    if not isinstance(got, tuple | list):
        if np.shape(got) == o_shape:
            return "you returned O alone: return the pair (O, lse)"
        return f"expected the pair (O, lse), got {type(got).__name__}"
    if len(got) != 2:
        return f"expected the pair (O, lse), got {len(got)} values"
    first, second = (np.asarray(x) for x in got)
    if first.shape == lse_shape and second.shape == o_shape and o_shape != lse_shape:
        return "you returned (lse, O): return (O, lse), in this order"
    return first, second


def _output_problem(q: np.ndarray, k: np.ndarray, v: np.ndarray, got: np.ndarray,
                    want: np.ndarray, caught: list[str], tol: float) -> str | None:
    """What is wrong with the learner's O (None if it matches ``want`` in the right dtype)."""
    problem = shape_problem(got, want.shape, "O")
    if problem:
        return problem
    if not np.issubdtype(got.dtype, np.number) or not np.all(np.isfinite(got)):
        return (f"NaN/inf in O ({'; '.join(caught) or 'exp overflow'}): subtract each row's "
                "own maximum before np.exp, s - s.max(axis=-1, keepdims=True)")
    if np.allclose(got, want, atol=tol, rtol=tol):
        if got.dtype != want.dtype:
            return (f"right values but O is {got.dtype}, expected {want.dtype}; np.sqrt(d) "
                    "is a float64 scalar: use q.dtype.type(np.sqrt(d))")
        return None
    if np.allclose(got, naive_attention(q, k, v, scale=1.0), atol=tol, rtol=tol):
        return "you forgot the scale 1/sqrt(d)"
    if np.allclose(got, naive_attention(q, k, v, scale=1 / q.shape[-1]), atol=tol, rtol=tol):
        return "you scaled by 1/d; the scale is 1/sqrt(d)"
    lost = _row_stats_without_keepdims(q, k, v)
    if lost is not None and np.allclose(got, lost, atol=1e-4, rtol=1e-4):
        return (f"each row's max and sum lost their axis (shape {q.shape[:-1]}); on square "
                "scores they broadcast along the wrong axis without an error. Keep it: "
                "keepdims=True, or [..., None]")
    if np.allclose(got, softmax(_scores64(q, k), axis=-2) @ v, atol=1e-4, rtol=1e-4):
        return "the softmax runs over the wrong axis; normalise each row (over the keys, axis=-1)"
    err_max = float(np.max(np.abs(got.astype(np.float64) - want)))
    return f"O: max |difference| {err_max:.3g} from naive_attention"


def _lse_problem(q: np.ndarray, k: np.ndarray, got: np.ndarray, tol: float) -> str | None:
    """What is wrong with the learner's lse (None if it is each row's logsumexp of the scaled
    scores, in q's dtype)."""
    if got.shape == (*q.shape[:-2], k.shape[-2]) and k.shape[-2] != q.shape[-2]:
        return (f"lse has shape {got.shape}, one number per key: sum over the keys "
                f"(axis=-1) for one number per query row, shape {q.shape[:-1]}")
    problem = shape_problem(got, q.shape[:-1], "lse")
    if problem:
        return f"{problem} (one number per query row)"
    if not np.issubdtype(got.dtype, np.number) or not np.all(np.isfinite(got)):
        return ("lse has inf or NaN: log(sum(exp(s))) overflows for large scores. Compute it "
                "from the shifted sum: L = m + log(l), m the row maximum, l = sum(exp(s - m))")
    s64 = _scores64(q, k)
    want = _lse64(s64)

    def close(x: np.ndarray) -> bool:
        return bool(np.allclose(got, x, atol=tol * 10, rtol=tol))

    if close(want):
        if got.dtype != q.dtype:
            return (f"right values but lse is {got.dtype}, expected {q.dtype}: keep q's "
                    "dtype (a float64 scalar or array in the computation promotes it)")
        return None
    m = s64.max(axis=-1)
    if close(want - m):
        return ("lse is log(l), the logsumexp of the shifted scores s - m: add the maximum "
                "back, L = m + log(l)")
    if close(m):
        return "lse is the row maximum m alone: L = m + log(l)"
    if close(_lse64(_scores64(q, k, scale=1.0))):
        return "lse of the unscaled scores q k^T: take it of s = q k^T / sqrt(d)"
    if close(want / np.log(2)):
        return "lse in base 2; the logsumexp uses the natural log (np.log)"
    if q.shape[-2] == k.shape[-2] and close(_lse64(s64, axis=-2)):
        return "lse over the wrong axis: sum over the keys (axis=-1), one number per query row"
    err_max = float(np.max(np.abs(got.astype(np.float64) - want)))
    return f"lse: max |difference| {err_max:.3g} from log(sum(exp(s))) of each row"


@checker("reference attention",
         forbid=names(ATTENTION))
def check_reference_attention(
    fb: Feedback, fn: Callable[[np.ndarray, np.ndarray, np.ndarray], Any]
) -> None:
    """Check ``attention(q, k, v)`` -> ``(O, lse)``: ``O = softmax(q k^T / sqrt(d)) v``
    against flashlib, and ``lse`` each row's ``log sum_j exp(s_ij)``, both in q's dtype."""
    rng = np.random.default_rng(0)
    for dtype, shape_q, n_k, d_v, spread in [
        (np.float64, (2, 5, 4), 7, 3, 1.0),
        (np.float64, (3, 6), 6, 6, 1.0),
        (np.float32, (2, 8, 16), 8, 16, 1.0),  # square scores: a lost axis broadcasts silently
        (np.float32, (4, 8), 4, 2, 100.0),  # large scores: exp overflows without the max
        # beyond float64's exp (710): no detour through float64 hides a missing max
        (np.float64, (3, 8), 5, 2, 1000.0),
    ]:
        q = (spread * rng.standard_normal(shape_q)).astype(dtype)
        k = rng.standard_normal((*shape_q[:-2], n_k, shape_q[-1])).astype(dtype)
        v = rng.standard_normal((*shape_q[:-2], n_k, d_v)).astype(dtype)
        label = f"q {q.shape} {np.dtype(dtype)}, k {k.shape}, v {v.shape}" + (
            f", scores up to ~{spread:g}" if spread > 1 else "")
        with fb.case(label):
            got, caught = call_learner(fn, q, k, v)
            want = naive_attention(q, k, v)
            tol = 1e-5 if dtype == np.float32 else 1e-10
            pair = _pair(got, want.shape, q.shape[:-1])
            problem = pair if isinstance(pair, str) else (
                _output_problem(q, k, v, pair[0], want, caught, tol)
                or _lse_problem(q, k, pair[1], tol))
            if problem:
                fb.fail(f"{label}: {problem}")
            elif caught:
                fb.fail(f"{label}: right values, but {'; '.join(warned(w) for w in caught)}")
            else:
                fb.ok(f"{label}: O matches flashlib.naive_attention, lse each row's "
                      "logsumexp")


def _balanced(peak: float, bandwidth: float, itemsize: float) -> float:
    return itemsize * peak / (2 * bandwidth)


#: (peak FLOP/s, bandwidth bytes/s, itemsize) of the balanced-block exercise: the A100 at
#: both ends of the paper's bandwidth range, the H100 SXM, the H200 in FP8, the A100's
#: non-matmul float32 units (io_model.GPUS's figures, cited there).
BALANCE_CASES = [(312e12, 1.5e12, 2), (312e12, 2.0e12, 2), (989e12, 3.35e12, 2),
                 (989e12, 4.8e12, 1), (19.5e12, 1.5e12, 4)]


@checker("balanced block size")
def check_balanced_block(fb: Feedback, fn: Callable[[float, float, int], float]) -> None:
    """Check ``balanced_block(peak, bandwidth, itemsize)``: the query block B_r at which
    FlashAttention-2's memory term (2 n^2 d / B_r elements of K and V, times itemsize, over
    the bandwidth) equals its compute term (4 n^2 d FLOPs over the peak)."""
    wrong: dict[str, Callable[[float, float, float], float]] = {
        "that counts only K; V is read once per block of queries too (2 n^2 d / B_r elements "
        "in all)": lambda p, w, i: i * p / (4 * w),
        "that counts the FLOPs as multiply-adds (2 n^2 d); a multiply-add is 2 FLOPs, "
        "4 n^2 d in all": lambda p, w, i: i * p / w,
        "that leaves out itemsize: the traffic is elements times bytes per element":
            lambda p, w, i: p / (2 * w),
        "that is the ridge point, peak / bandwidth in FLOPs per byte, not a block size":
            lambda p, w, i: p / w,
        "that is upside down: a larger B_r moves fewer bytes, so B_r grows with the peak "
        "and falls with the bandwidth": lambda p, w, i: 2 * w / (i * p),
    }
    answers: dict[tuple[float, float, int], float] = {}
    for case in BALANCE_CASES:
        label = f"peak {case[0]:.3g} FLOP/s, bandwidth {case[1]:.3g} B/s, itemsize {case[2]}"
        with fb.case(label) as c:
            got, _ = call_learner(fn, *case)
            if not _is_number(got) or isinstance(got, bool):
                fb.fail(f"{label}: expected a number, got {got!r}")
            else:
                answers[case] = float(got)
        if c.failed:
            answers.pop(case, None)

    def same(a: float, b: float) -> bool:
        return bool(np.isclose(a, b, rtol=1e-6, atol=0))

    everywhere = [name for name, formula in wrong.items()
                  if answers and all(same(formula(*c), a) for c, a in answers.items())]
    for case, got in answers.items():
        label = f"peak {case[0]:.3g} FLOP/s, bandwidth {case[1]:.3g} B/s, itemsize {case[2]}"
        want = _balanced(*case)
        if same(got, want):
            fb.ok(f"{label}: B_r = {want:.4g}")
            continue
        here = [name for name, formula in wrong.items() if same(formula(*case), got)]
        reason = (everywhere[0] if everywhere else here[0] if len(here) == 1
                  else "set the two terms equal and solve for B_r")
        fb.fail(f"{label}: got {got:.4g}: {reason}")
