"""Checkers for the exercises of the Precision chapter (book/precision.md).

check_round_significant  ``round_significant(x, p)``: x rounded to p significant bits (ties to
                         even), the rounding every format of the chapter does
check_pairwise_sum       ``pairwise_sum_bf16(x)``: a sum in a bfloat16 accumulator, as a tree
                         (the two halves' sums added), every addition rounded
check_keep_float32       ``smallest_float32_set(error_ratio)``: the smallest set of quantities
                         kept in float32 (the rest float16) for which ``error_ratio`` meets
                         the 2x rule, on the chapter's kernel and on made-up ratios
check_fa3_rule           ``assert_fa3_rule(out, plain, ref, dtype)``: flash-attn's rule as
                         FlashAttention-3's tests write it (2x plain's error plus an absolute
                         allowance), which must pass :func:`good_kernel` and catch
                         :func:`suspect_kernel`
check_rotation           ``rotate(Q, K, rng)``: Q K^T unchanged, and the FP8 error drops

The kernels and inputs the exercises hand out are here too (:func:`suspect_kernel`,
:func:`good_kernel`, :func:`exercise_inputs`).

Over 500 lines (about 700): one checker per exercise, whose cases and diagnoses are code;
the mistakes each must catch are data, in mistakes/precision.py.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from flashlib.book.exercises import Feedback, LearnerError, call_learner, checker, fmt, names
from flashlib.core.accuracy import error_stats
from flashlib.studies.precision import (
    Casts,
    flash2_forward_with_casts,
    fp8_attention,
    random_inputs,
    round_to,
    spacing,
    standard_attention_with_casts,
)

__all__ = [
    "check_round_significant",
    "check_pairwise_sum",
    "check_keep_float32",
    "check_fa3_rule",
    "check_rotation",
    "exercise_inputs",
    "good_kernel",
    "suspect_kernel",
    "QUANTITIES",
    "KEEP_DTYPE",
    "MADE_UP",
    "RULE",
    "tiled_error_ratio",
]

BF16 = "bfloat16"
#: The quantities of :func:`check_keep_float32`: each kept in float32 or in KEEP_DTYPE.
QUANTITIES = ("S", "P", "acc", "m", "l", "O")
#: The 16-bit format of :func:`check_keep_float32` (the chapter's budget is bfloat16's).
KEEP_DTYPE = "float16"
_B_C = 64


def exercise_inputs(n: int = 512, d: int = 32, seed: int = 0, scale: float = 1.0,
                    outlier: float = 0.0, dtype: str = BF16
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V for the exercises: (n, d) standard normal entries times ``scale`` (plus
    outliers), rounded to ``dtype`` (held in float64 arrays)."""
    Q, K, V = random_inputs(n, d, np.random.default_rng(seed), scale=scale, outlier=outlier)
    return round_to(Q, dtype), round_to(K, dtype), round_to(V, dtype)


def good_kernel(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """FlashAttention-2 in bfloat16 (key blocks of 64), kept as FlashAttention-2 keeps it."""
    return flash2_forward_with_casts(Q, K, V, _B_C, Casts.flash(BF16))


def suspect_kernel(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Another bfloat16 FlashAttention-2 kernel.  It looks right and its output looks close
    to the reference.  Is it?"""
    # the bug: the accumulator was allocated like Q (np.zeros_like(Q_i)), so it is bfloat16
    return flash2_forward_with_casts(Q, K, V, _B_C, Casts.flash(BF16).replace(acc=BF16))


def _reference(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    return standard_attention_with_casts(Q, K, V, Casts.exact())


def _plain(Q: np.ndarray, K: np.ndarray, V: np.ndarray, dtype: str = BF16) -> np.ndarray:
    return standard_attention_with_casts(Q, K, V, Casts.plain(dtype))


def _values(got: Any, shape: tuple[int, ...], label: str) -> tuple[np.ndarray, np.dtype]:
    """The learner's array as float64, and its dtype; LearnerError when it is not one."""
    arr = np.asarray(got)
    try:
        values = arr.astype(np.float64)
    except (TypeError, ValueError) as err:
        raise LearnerError(f"expected an array of numbers, got {type(got).__name__}") from err
    if values.shape != shape:
        raise LearnerError(f"the result has shape {values.shape}, expected {shape}")
    return values, arr.dtype


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


# ---- rounding to p significant bits ---------------------------------------------------------

def _round_significant(x: np.ndarray, p: int) -> np.ndarray:
    """x rounded to p significant bits, ties to even: x = f 2**e with 0.5 <= |f| < 1, so
    f 2**p has p bits before the point; np.rint rounds it half to even."""
    f, e = np.frexp(x)
    return np.ldexp(np.rint(np.ldexp(f, p)), e - p)


def _rounded_by(x: np.ndarray, p: int, rule: Callable[[np.ndarray], np.ndarray]
                ) -> np.ndarray:
    """x with its p-bit significand rounded by ``rule`` (np.trunc, np.floor, ...)."""
    f, e = np.frexp(x)
    return np.ldexp(rule(np.ldexp(f, p)), e - p)


def _away(y: np.ndarray) -> np.ndarray:
    return np.sign(y) * np.floor(np.abs(y) + 0.5)


def _significant_cases() -> list[tuple[str, np.ndarray, int]]:
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(200) * 3
    ties = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 2 + 2.0**-7,
                     1.5 + 2.0**-8, 3 * 2.0**-9])
    return [
        ("p = 8 (bfloat16), 200 normal values", normal, 8),
        ("p = 8, ties: x = " + fmt(ties), ties, 8),
        ("p = 11 (float16), values between 1000 and 1001", 1000 + rng.random(50), 11),
        ("p = 4 (float8_e4m3fn), 200 normal values", normal, 4),
        ("p = 3 (float8_e5m2), 200 normal values", normal, 3),
        ("p = 8, x = [0, 1e30, -3e-30, 2**-140]", np.array([0.0, 1e30, -3e-30, 2.0**-140]), 8),
        ("p = 24 (float32), 200 normal values", normal, 24),
        ("p = 1, x = [3, 5, 6, -7]", np.array([3.0, 5.0, 6.0, -7.0]), 1),
    ]


@checker("rounding to p significant bits",
         forbid=names("flashlib.studies.precision.round_to",
                      "flashlib.studies.precision.saturate_to",
                      "flashlib.studies.precision.quantize"))
def check_round_significant(fb: Feedback, fn: Callable[[np.ndarray, int], np.ndarray]
                            ) -> None:
    """Check ``round_significant(x, p)``: each value of x rounded to the nearest number with
    ``p`` significant bits (ties to even), whatever its exponent, as a float64 array; with
    p = 8 that is bfloat16's rounding (for values in its normal range)."""
    for label, x, p in _significant_cases():
        with fb.case(label) as case:
            got, _ = call_learner(fn, x.copy(), p)
            values, dtype = _values(got, x.shape, "")
            want = _round_significant(x, p)
            if _same(values, want):
                if dtype != np.float64:
                    fb.fail(f"{label}: right values, but a {dtype} array: return float64, "
                            "or every later operation rounds again")
                else:
                    fb.ok(f"{label}: correct")
                continue
            case.failed = True
            if _same(values, x):
                hint = "x comes back unchanged"
            elif np.isnan(values).any() and not np.isnan(x).any():
                k = int(np.argmax(np.isnan(values)))
                hint = (f"x = {float(x[k])!r} gives NaN" + (": log2(0) is -inf; np.frexp gives "
                        "(0.0, 0) for 0" if x[k] == 0 else ""))
            elif p > 1 and _same(values, _round_significant(x, p - 1)):
                hint = ("that keeps p - 1 significant bits: p counts the implicit leading 1 "
                        "(bfloat16: 7 fraction bits, 8 significant); np.frexp's f is in "
                        "[0.5, 1), so f * 2**p has p bits before the point")
            elif _same(values, _round_significant(x, p + 1)):
                hint = ("that keeps p + 1 significant bits: np.frexp's f is in [0.5, 1), so "
                        "scale it by 2**p, not 2**(p + 1)")
            elif _same(values, _rounded_by(x, p, np.trunc)):
                hint = "rounds toward zero (np.trunc, int()): round to nearest, ties to even"
            elif _same(values, _rounded_by(x, p, np.floor)):
                hint = "rounds down (np.floor): round to nearest, ties to even"
            elif _same(values, _rounded_by(x, p, _away)) or _same(
                    values, _rounded_by(x, p, lambda y: np.floor(y + 0.5))):
                hint = ("rounds to nearest, but a tie goes up or away from zero: ties go to "
                        "the even neighbour (np.rint or np.round do that)")
            elif _same(values, np.round(x, p)):
                hint = "that rounds to p decimal places: round to p significant *bits*"
            else:
                k = int(np.argmax(~np.isclose(values, want, rtol=0, atol=0, equal_nan=True)))
                hint = (f"x = {float(x[k])!r} gives {float(values[k])!r}, the nearest number "
                        f"with {p} significant bits is {float(want[k])!r}")
            fb.fail(f"{label}: {hint}")
        if case.failed:
            return
    x = _significant_cases()[0][1]
    if _same(_round_significant(x, 8), round_to(x, BF16)):
        fb.ok("with p = 8 it equals bfloat16's rounding (ml_dtypes) on normal values: "
              "7 fraction bits stored, 8 significant")


# ---- a sum in a bfloat16 accumulator, as a tree ---------------------------------------------

def _pairwise(x: np.ndarray, dtype: str, split: Callable[[int], int] = lambda n: n // 2
              ) -> float:
    """The sum of x as a tree: the sums of x[:h] and x[h:] added, rounded to ``dtype``."""
    if len(x) == 1:
        return float(round_to(x[0], dtype))
    h = split(len(x))
    return float(round_to(_pairwise(x[:h], dtype, split) + _pairwise(x[h:], dtype, split),
                          dtype))


def _neighbours(x: np.ndarray, dtype: str) -> float:
    """The sum of x as a tree of neighbours, level by level (an odd last one carried up)."""
    level = [float(v) for v in round_to(x, dtype)]
    while len(level) > 1:
        pairs = [float(round_to(a + b, dtype))
                 for a, b in zip(level[::2], level[1::2], strict=False)]
        level = pairs + (level[-1:] if len(level) % 2 else [])
    return level[0]


def _sequential(terms: Iterable[float], dtype: str) -> float:
    total = 0.0
    for t in terms:
        total = float(round_to(total + t, dtype))
    return total


#: Ten values whose sum differs in every order the checker names (halves split at n // 2 or
#: at (n + 1) // 2, neighbours level by level, one after another, exact).
_TEN = np.array([2.0**-8, 1.0, 2.0**-8, 1.0, 5 * 2.0**-9, 2.0**-7, 5 * 2.0**-9, 2.0**-7,
                 2.0**-8, 5 * 2.0**-9])


def _pairwise_cases() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [
        ("4096 values of 0.1 (in bfloat16)", round_to(np.full(4096, 0.1), BF16)),
        ("1000 normal values", round_to(rng.standard_normal(1000), BF16)),
        ("2000 values between 0 and 1", round_to(rng.random(2000), BF16)),
        ("x = " + fmt(_TEN), _TEN),
        ("x = [3.5]", np.array([3.5])),
        ("x = [1, 2**-8]", np.array([1.0, 2.0**-8])),
    ]


@checker("a sum in bfloat16, as a tree")
def check_pairwise_sum(fb: Feedback, fn: Callable[[np.ndarray], float]) -> None:
    """Check ``pairwise_sum_bf16(x)``: for one value, that value; else the pairwise sums of
    ``x[: n // 2]`` and ``x[n // 2 :]`` added and rounded to bfloat16 (x: bfloat16 values in
    a float64 vector of length n >= 1).  Then compares its error with the sequential sum's."""
    for label, x in _pairwise_cases():
        with fb.case(label) as case:
            got, _ = call_learner(fn, x.copy())
            if isinstance(got, (str, bytes)) or np.ndim(got) != 0:
                raise LearnerError(f"expected a number, got {got!r}")
            try:
                value = float(np.asarray(got, dtype=np.float64))
            except (TypeError, ValueError) as err:
                raise LearnerError(f"expected a number, got {got!r}") from err
            want = _pairwise(x, BF16)
            if value == want:
                continue
            case.failed = True
            exact = math.fsum(x)
            if len(x) > 2 and value == _sequential(x, BF16) != want:
                hint = ("that is the sequential sum, one term after another: add the sums "
                        "of the two halves instead")
            elif value == _pairwise(x, BF16, lambda n: (n + 1) // 2):
                hint = "split at h = n // 2: the first half is x[: n // 2], the second x[h:]"
            elif value == _neighbours(x, BF16):
                hint = ("that pairs neighbours level by level: a tree too, and as accurate, "
                        "but this exercise adds the sums of the two halves, x[: n // 2] and "
                        "x[n // 2 :]")
            elif value == float(round_to(exact, BF16)) or value == float(
                    round_to(np.sum(x), BF16)):
                hint = "the exact sum rounded once at the end: round after every addition"
            elif abs(value - exact) <= 1e-9 * max(1.0, abs(exact)) or value == _pairwise(
                    x, "float64"):
                hint = "no rounding: round each addition to bfloat16 (round_to)"
            elif value == float(round_to(np.sum(x.astype(np.float32)), BF16)):
                hint = "a float32 sum rounded once: round every addition to bfloat16"
            else:
                hint = f"expected {want!r}"
            fb.fail(f"{label}: got {value!r}: {hint}")
        if case.failed:
            return
    for label, x in _pairwise_cases()[:3]:
        exact, tree, seq = math.fsum(x), _pairwise(x, BF16), _sequential(x, BF16)
        fb.ok(f"{label}: {tree:.6g} (exact: {exact:.6g}); one term after another "
              f"gives {seq:.6g}")


# ---- what must stay float32 -----------------------------------------------------------------

#: flash-attn's rule: kept as chosen, tiled attention's error is at most RULE times plain's.
RULE = 2.0
#: Calls of ``error_ratio`` one search may make (twice the 64 sets there are).
MAX_CALLS = 2 * 2 ** len(QUANTITIES)


@functools.lru_cache(maxsize=1)
def _keep_cases() -> list[tuple[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """One input of n = 512 tokens (d = 32): each set of quantities costs a run of tiled
    attention per input, in the judge, while the student's time runs, and a search may ask
    all 64 sets (a second input, seed 2, gives the same smallest set, at twice the cost)."""
    return [("n = 512, d = 32", exercise_inputs(512, 32, seed=0, dtype=KEEP_DTYPE))]


def _casts_keeping(names: set[str] | frozenset[str]) -> Casts:
    return Casts.everything(KEEP_DTYPE).replace(**{q: "float32" for q in names})


@functools.cache
def _ratio(names: frozenset[str], case: int) -> float:
    """Tiled attention's error with ``names`` kept in float32, over plain float16
    attention's, on :func:`_keep_cases` ``[case]``: computed once per process (a grader
    asks the same few sets for every student)."""
    Q, K, V = _keep_cases()[case][1]
    ref, plain = _keep_reference(case)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        O = flash2_forward_with_casts(Q, K, V, _B_C, _casts_keeping(names))
    err = error_stats(O, ref).max
    return err / plain if np.isfinite(err) else float("inf")


@functools.cache
def _keep_reference(case: int) -> tuple[np.ndarray, float]:
    """The reference output of :func:`_keep_cases` ``[case]``, and plain float16 attention's
    largest error against it."""
    Q, K, V = _keep_cases()[case][1]
    ref = _reference(Q, K, V)
    return ref, error_stats(_plain(Q, K, V, KEEP_DTYPE), ref).max


def _unknown_names(names: Any) -> list[str] | None:
    """The names of ``names`` that are not among QUANTITIES (sorted), or None when ``names``
    is not a collection of strings (a set, frozenset, list or tuple)."""
    if not isinstance(names, (set, frozenset, list, tuple)) or not all(
            isinstance(q, str) for q in names):
        return None
    return sorted(set(names) - set(QUANTITIES))


def _names(names: Any) -> frozenset[str]:
    """The set of quantities an ``error_ratio`` was asked about; TypeError or ValueError (which
    the learner's code sees) for anything but a collection of names among QUANTITIES."""
    unknown = _unknown_names(names)
    if unknown is None:
        raise TypeError(f"error_ratio takes a set of names among {', '.join(QUANTITIES)} "
                        f"(e.g. {{'l', 'S'}}), got {names!r}")
    if unknown:
        raise ValueError(f"error_ratio: unknown quantities {unknown}: choose among "
                         f"{', '.join(QUANTITIES)}")
    return frozenset(names)


def _real(names: frozenset[str]) -> float:
    return max(_ratio(names, case) for case in range(len(_keep_cases())))


def tiled_error_ratio(names: set[str]) -> float:
    """FlashAttention-2's error with the quantities ``names`` (among :data:`QUANTITIES`) kept
    in float32 and everything else, the inputs included, in float16 (:data:`KEEP_DTYPE`),
    over plain float16 attention's error, on an input of n = 512 tokens (d = 32, key blocks
    of 64).  At most :data:`RULE` (2) meets flash-attn's rule."""
    return _real(_names(names))


def _made_up(*passing: str, at: float = 1.5) -> Callable[[frozenset[str]], float]:
    """A made-up error ratio: ``at`` (at most 2: the rule holds) for a set holding all the
    names of one of ``passing`` (each a space-separated set; ``""``: the empty set), minus
    0.05 per further name kept; above 2 otherwise (less the more is kept)."""
    minimal = [frozenset(p.split()) for p in passing]

    def ratio(names: frozenset[str]) -> float:
        extra = [len(names - m) for m in minimal if m <= names]
        if extra:
            return at - 0.05 * min(extra)
        return 2.5 + 8 / (1 + len(names))

    return ratio


#: The error ratios :func:`check_keep_float32` hands the learner's function besides the
#: chapter's kernel's: made up, so that what must stay float32 differs from the chapter's
#: answer (label, ratio).  The last two have two minimal sets of different sizes, where
#: dropping names one at a time, or the first set that passes in another order, stops at
#: the larger.
MADE_UP: list[tuple[str, Callable[[frozenset[str]], float]]] = [
    ("a made-up error ratio where only m matters (exactly 2 with m alone)",
     _made_up("m", at=2.0)),
    ("a made-up error ratio where only acc matters", _made_up("acc")),
    ("a made-up error ratio that needs l, m and acc", _made_up("l m acc")),
    ("a made-up error ratio that everything in float16 meets", _made_up("")),
    ("a made-up error ratio that no choice meets", _made_up()),
    ("a made-up error ratio that needs all six", _made_up(" ".join(QUANTITIES))),
    ("a made-up error ratio met by {S, P} or by {acc, m, l}", _made_up("S P", "acc m l")),
    ("a made-up error ratio met by {l, O} or by {S, P, acc}", _made_up("l O", "S P acc")),
]


def _subsets() -> list[frozenset[str]]:
    return [frozenset(c) for k in range(len(QUANTITIES) + 1)
            for c in itertools.combinations(QUANTITIES, k)]


def _show(names: frozenset[str] | None) -> str:
    if names is None:
        return "None"
    return "{" + ", ".join(repr(q) for q in QUANTITIES if q in names) + "}" if names else (
        "set()")


def _answer(got: Any) -> frozenset[str] | None:
    if got is None:
        return None
    unknown = _unknown_names(got)
    if unknown is None:
        raise LearnerError(f"expected a set of names among {', '.join(QUANTITIES)}, or None "
                           f"when no set meets the rule; got {got!r}")
    if unknown:
        raise LearnerError(f"unknown quantities {unknown}: choose among "
                           f"{', '.join(QUANTITIES)}")
    return frozenset(got)


def _first_passing(ratio: Callable[[frozenset[str]], float]) -> frozenset[str] | None:
    """The first set that meets the rule, trying the sets by size (so a smallest one), or
    None: as few sets asked as the search itself asks (the chapter's kernel's ratio costs
    two runs of tiled attention per set, once per process)."""
    return next((s for s in _subsets() if ratio(s) <= RULE), None)


def _keep_problem(ratio: Callable[[frozenset[str]], float], got: frozenset[str] | None,
                  called: int) -> str | None:
    """What is wrong with ``got`` as the smallest set that ``ratio`` lets pass; None if
    right."""
    best = _first_passing(ratio)
    never = ("; and your function never called error_ratio: the answer must come from it "
             "(the checker hands it other error ratios too)" if called == 0 else "")
    if got is None:
        if best is None:
            return None
        hint = ("does your search reach the set of all six (sizes 0 to "
                "len(QUANTITIES) included)?" if len(best) == len(QUANTITIES) else
                "try every set, smallest first")
        return (f"returned None, but {_show(best)} meets the rule (error_ratio = "
                f"{ratio(best):.3g}): {hint}{never}")
    r = ratio(got)
    if best is None:
        return (f"returned {_show(got)} (error_ratio = {r:.3g}), but no set meets the rule "
                f"here: return None when none does{never}")
    if r > RULE:
        return (f"returned {_show(got)}, whose error_ratio is {r:.3g}, more than 2: it does "
                f"not meet the rule{never}")
    if len(got) == len(best):
        return None
    if not best:
        hint = "keeping nothing in float32 meets the rule: try the empty set first (size 0)"
    elif ratio(best) == RULE:
        hint = (f"error_ratio({_show(best)}) is exactly 2, and the rule is *at most* twice "
                "plain's error (<= 2)")
    elif all(ratio(got - {q}) > RULE for q in got):
        hint = ("nothing can be dropped from your set, yet a smaller set passes: a set "
                "nothing can be removed from is not always the smallest (dropping names one "
                "at a time, or taking the first set that passes in an order not by size, "
                "stops at one); try every set of each size, smallest first")
    else:
        hint = ("try the sets in order of size (itertools.combinations(QUANTITIES, k) for "
                "k = 0, 1, ...) and return the first that passes")
    return (f"returned {_show(got)} ({len(got)} names, error_ratio = {r:.3g}), but "
            f"{_show(best)} meets the rule with {len(best)} (error_ratio = "
            f"{ratio(best):.3g}): {hint}{never}")


def _counting(ratio: Callable[[frozenset[str]], float], asked: list[frozenset[str]]
              ) -> Callable[[set[str]], float]:
    """The ``error_ratio`` handed to the learner's function: ``ratio``, each call's set
    recorded in ``asked`` (at most :data:`MAX_CALLS` calls)."""

    def error_ratio(names: set[str]) -> float:
        if len(asked) >= MAX_CALLS:
            raise RuntimeError(f"error_ratio called {MAX_CALLS} times: there are only "
                               f"{2 ** len(QUANTITIES)} sets, ask each once")
        chosen = _names(names)
        asked.append(chosen)
        return float(ratio(chosen))

    return error_ratio


@checker("which quantities must stay float32")
def check_keep_float32(fb: Feedback, fn: Callable[[Callable[[set[str]], float]], Any]) -> None:
    """Check ``smallest_float32_set(error_ratio)``: given ``error_ratio(names)``, tiled
    attention's error with the quantities ``names`` kept in float32 over plain attention's,
    the smallest set of names among
    :data:`QUANTITIES` for which ``error_ratio(names) <= 2`` (flash-attn's rule), or None
    when there is none.  Run with :func:`tiled_error_ratio` (float16: the chapter's kernel),
    then with the made-up ratios of :data:`MADE_UP`, so that no one answer fits them all."""
    oracles = [("the chapter's kernel (float16, n = 512)", _real), *MADE_UP]
    for label, ratio in oracles:
        with fb.case(label) as case:
            asked: list[frozenset[str]] = []
            got, _ = call_learner(fn, _counting(ratio, asked))
            answer = _answer(got)
            problem = _keep_problem(ratio, answer, len(asked))
            if problem is None and len(asked) >= MAX_CALLS:
                problem = (f"error_ratio was called {MAX_CALLS} times or more: there are only "
                           f"{2 ** len(QUANTITIES)} sets, ask each once")
            if problem is not None:
                case.failed = True
                fb.fail(f"{label}: {problem}")
            else:
                found = ("None, no set meets the rule" if answer is None else
                         f"{_show(answer)}, error_ratio {ratio(answer):.3g}")
                calls = f"{len(asked)} call{'' if len(asked) == 1 else 's'}"
                fb.ok(f"{label}: {found} ({calls} of error_ratio)")
        if case.failed:
            return
    kept = frozenset({"acc", "l"})
    fb.ok("on the chapter's kernel, " + "; ".join(
        f"{q} alone in float16: error {_real(kept - {q}):.3g} x plain's ({_WHY[q]})"
        for q in sorted(kept)))


_WHY = {
    "l": ("once the running sum is large, each new exp(s - m) falls below half a float16 "
          "spacing and is lost; float16's 3 more bits than bfloat16 only delay it"),
    "acc": ("each block's P V contribution is small next to the running sum and is rounded "
            "away, block after block"),
}


# ---- flash-attn's rule as FlashAttention-3's tests write it --------------------------------

def _fa3_allowance(ref: np.ndarray, dtype: str) -> float:
    """FlashAttention-3's absolute allowance: ``2 max|round(round(ref + 0.3) - 0.3) - ref|``,
    every operation rounded to ``dtype`` (``out_ref + 0.3 - 0.3 - out_ref`` in torch)."""
    r2 = round_to(round_to(ref + 0.3, dtype) - 0.3, dtype)
    return 2 * float(np.max(np.abs(r2 - ref)))


def _raises(fn: Callable[..., Any], out: np.ndarray, plain: np.ndarray, ref: np.ndarray,
            dtype: str) -> bool:
    """True when the learner's helper raised AssertionError; other errors are reported."""
    try:
        call_learner(fn, out.copy(), plain.copy(), ref.copy(), dtype)
    except LearnerError as err:
        if isinstance(err.__cause__, AssertionError):
            return True
        raise
    return False


def _rule_cases() -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, bool, str]]:
    """(label, out, plain, ref, must raise, hint when the helper gets it wrong), in bfloat16:
    ``a`` is half the allowance, plain errs by ``p = 4a``."""
    rng = np.random.default_rng(2)
    ref = round_to(rng.uniform(-1, 1, size=(64, 16)), BF16)
    a = _fa3_allowance(ref, BF16) / 2
    p = 4 * a
    e = rng.choice([-1.0, 1.0], size=ref.shape)
    plain = ref + p * e
    spike = ref.copy()
    spike[5, 3] += 2 * p + 4 * a
    nan = ref + 0.5 * p * e
    nan[0, 0] = np.nan
    return [
        ("plain exact, out off by less than the allowance", ref + 0.9 * a * e, ref.copy(), ref,
         False, "plain is exact here, so 2 err(plain) = 0 and only atol lets a result off by "
         "a rounding pass: atol = 2 max|round(round(ref + 0.3) - 0.3) - ref|, each operation "
         "rounded to dtype (in float64 arithmetic it is 0)"),
        ("error 1.5x plain's", ref + 1.5 * p * e, plain, ref, False,
         "an error within twice plain's must pass"),
        ("error 2 err(plain) + atol / 4", ref + (2 * p + 0.5 * a) * e, plain, ref, False,
         "the allowance adds: err <= 2 err(plain) + atol, not the larger of the two"),
        ("error 2 err(plain) + 3 atol / 4", ref + (2 * p + 1.5 * a) * e, plain, ref, False,
         "atol is twice the round trip's error, 2 max|round(round(ref + 0.3) - 0.3) - ref|"),
        ("error 2 err(plain) + 1.5 atol", ref + (2 * p + 3 * a) * e, plain, ref, True,
         "the allowance is too large: atol = 2 max|round(round(ref + 0.3) - 0.3) - ref|, "
         "about one spacing of dtype at the output's size"),
        ("error 3x plain's, opposite sign", ref - 3 * p * e, plain, ref, True,
         "the error is max|out - ref| (absolute values)"),
        ("one entry off by 2 err(plain) + 2 atol, the rest exact", spike, plain, ref, True,
         "the rule uses the largest error, np.max(np.abs(out - ref)), not the mean"),
        ("a NaN in the output", nan, plain, ref, True,
         "NaN compares False: write `assert err <= bound`, which a NaN fails"),
        ("out = plain", plain.copy(), plain, ref, False, "plain itself passes (1x)"),
    ]


@functools.lru_cache(maxsize=1)
def _fa3_kernel_outputs() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """({"good_kernel": out, "suspect_kernel": out}, ref, plain) on bfloat16 inputs, n = 1024,
    d = 32: the same for every student, so computed once per process (each student's function
    gets copies)."""
    Q, K, V = exercise_inputs(1024, 32, seed=3)
    return ({"good_kernel": good_kernel(Q, K, V), "suspect_kernel": suspect_kernel(Q, K, V)},
            _reference(Q, K, V), _plain(Q, K, V))


@functools.lru_cache(maxsize=1)
def _fa3_lenient_outputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, ref, plain): inputs x 4, the accumulator and l in bfloat16 (n = 256, d = 32)."""
    Q, K, V = exercise_inputs(256, 32, seed=1, scale=4.0)
    out = flash2_forward_with_casts(Q, K, V, _B_C, Casts.flash(BF16).replace(acc=BF16, l=BF16))
    return out, _reference(Q, K, V), _plain(Q, K, V)


@checker("flash-attn's rule, with FlashAttention-3's allowance",
         forbid=names("flashlib.core.accuracy.assert_error_within"))
def check_fa3_rule(fb: Feedback, fn: Callable[[np.ndarray, np.ndarray, np.ndarray, str], Any]
                   ) -> None:
    """Check ``assert_fa3_rule(out, plain, ref, dtype)``: raises AssertionError exactly when
    ``max|out - ref| > 2 max|plain - ref| + atol``, ``atol = 2 max|round(round(ref + 0.3) -
    0.3) - ref|`` with every operation rounded to ``dtype``; then that it passes
    :func:`good_kernel` and catches :func:`suspect_kernel` (bfloat16, n = 1024, d = 32)."""
    for label, out, plain, ref, must_raise, hint in _rule_cases():
        with fb.case(label):
            raised = _raises(fn, out, plain, ref, BF16)
            if raised == must_raise:
                fb.ok(f"{label}: {'raises' if raised else 'passes'}")
            else:
                fb.fail(f"{label}: {'raises' if raised else 'passes'}, it should "
                        f"{'raise AssertionError' if must_raise else 'pass'}: {hint}")
                return
    kernels, ref, plain = _fa3_kernel_outputs()
    p = error_stats(plain, ref).max
    for label, must_raise in (("good_kernel", False), ("suspect_kernel", True)):
        with fb.case(label):
            err = error_stats(kernels[label], ref).max
            raised = _raises(fn, kernels[label].copy(), plain.copy(), ref.copy(), BF16)
            if raised == must_raise:
                fb.ok(f"{label}: error {err / p:.2g} x plain's, "
                      f"{'caught' if raised else 'passes'}")
            else:
                fb.fail(f"{label}: error {err / p:.2g} x plain's, but your helper "
                        f"{'raises' if raised else 'lets it pass'}")
    out, ref, plain = _fa3_lenient_outputs()
    label = "inputs x 4, accumulator and l in bfloat16"
    with fb.case(label):
        err, p = error_stats(out, ref).max, error_stats(plain, ref).max
        half = float(spacing(np.max(np.abs(ref)), BF16)) / 2
        if _raises(fn, out.copy(), plain.copy(), ref.copy(), BF16):
            fb.fail(f"{label}: your helper raises, but the rule lets it pass (error "
                    f"{err / p:.2g} x plain's)")
        else:
            fb.ok(f"{label}: passes too, at {err / p:.2g} x plain's error, though it errs "
                  f"{err / half:.2g} times half a bfloat16 spacing of the output: plain "
                  "attention's own error is large here, so the relative rule is lenient")


# ---- the Hadamard rotation ------------------------------------------------------------------

def _fp8_error(Q: np.ndarray, K: np.ndarray, V: np.ndarray, ref: np.ndarray) -> float:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return error_stats(fp8_attention(Q, K, V, block_scaling=False), ref).rms


@checker("Hadamard rotation",
         forbid=names("flashlib.studies.precision.random_hadamard"))
def check_rotation(fb: Feedback, fn: Callable[..., tuple[np.ndarray, np.ndarray]]) -> None:
    """Check ``rotate(Q, K, rng) -> (Q_rot, K_rot)``: the scores Q K^T unchanged, and
    per-tensor FP8 attention of (Q_rot, K_rot, V) more accurate than of (Q, K, V) on inputs
    with outliers."""
    for label, n, d, seed in (("n = 512, d = 64", 512, 64, 3), ("n = 512, d = 128", 512, 128, 5)):
        with fb.case(label):
            Q, K, V = random_inputs(n, d, np.random.default_rng(seed), outlier=10.0)
            got, _ = call_learner(fn, Q.copy(), K.copy(), np.random.default_rng(seed + 100))
            try:
                Q_rot, K_rot = (np.asarray(x, dtype=np.float64) for x in got)
            except (TypeError, ValueError):
                fb.fail(f"{label}: expected a pair (Q_rot, K_rot), got {type(got).__name__}")
                continue
            if Q_rot.shape != Q.shape or K_rot.shape != K.shape:
                fb.fail(f"{label}: shapes {Q_rot.shape}, {K_rot.shape}; expected {Q.shape}, "
                        f"{K.shape}")
                continue
            S = Q @ K.T
            S_rot = Q_rot @ K_rot.T
            tol = 1e-9 * float(np.max(np.abs(S)))
            if np.allclose(Q_rot, Q) and np.allclose(K_rot, K):
                fb.fail(f"{label}: Q and K come back unchanged: multiply both by M = "
                        "diag(signs) H / sqrt(d)")
                continue
            if not float(np.max(np.abs(S_rot - S))) <= tol:
                if np.allclose(K_rot, K):
                    hint = "K is not rotated: rotate Q and K by the same M"
                elif np.allclose(S_rot, d * S, rtol=1e-9, atol=tol):
                    hint = "the scores grew d-fold: divide H by sqrt(d) (H H^T = d I)"
                else:
                    hint = ("use the same orthogonal M for both: (Q M)(K M)^T = Q M M^T K^T "
                            "= Q K^T only when M M^T = I")
                k = np.unravel_index(np.argmax(np.abs(S_rot - S)), S.shape)
                fb.fail(f"{label}: Q K^T changed (entry {tuple(map(int, k))}: "
                        f"{fmt(S[k])} -> {fmt(S_rot[k])}): {hint}")
                continue
            ref = _reference(Q, K, V)
            before, after = _fp8_error(Q, K, V, ref), _fp8_error(Q_rot, K_rot, V, ref)
            if after * 1.2 <= before:
                fb.ok(f"{label}: Q K^T unchanged; FP8 RMSE {before:.2g} -> {after:.2g} "
                      f"({before / after:.2g}x lower)")
            else:
                fb.fail(f"{label}: Q K^T unchanged, but the FP8 RMSE went {before:.2g} -> "
                        f"{after:.2g}: the rotation must spread each outlier over every "
                        "coordinate (a Hadamard matrix does; sign flips or a permutation "
                        "alone do not)")
