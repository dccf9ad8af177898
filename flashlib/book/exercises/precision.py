"""Checkers for the exercises of the Precision chapter (book/precision.md).

check_round_to        ``round_to(x, dtype)``: the nearest bfloat16/float16/float8 value, float64
check_bf16_dot        ``dot_bf16(x, y)``: a dot product with a bfloat16 accumulator
check_keep_float32    which quantities must stay float32 (the rest bfloat16) for the 2x rule
check_rule_helper     ``assert_within_2x(out, plain, ref)``: flash-attn's rule as an assertion,
                      which must pass :func:`good_kernel` and catch :func:`suspect_kernel`
check_rotation        ``rotate(Q, K, rng)``: Q K^T unchanged, and the FP8 error drops

The kernels and inputs the exercises hand out are here too (:func:`suspect_kernel`,
:func:`good_kernel`, :func:`exercise_inputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from flashlib.book.exercises import Feedback, LearnerError, call_learner, checker, fmt
from flashlib.core.accuracy import error_stats
from flashlib.studies.precision import (
    Casts,
    as_dtype,
    dot,
    flash2_forward_with_casts,
    fp8_attention,
    random_inputs,
    round_to,
    standard_attention_with_casts,
)

__all__ = [
    "check_round_to",
    "check_bf16_dot",
    "check_keep_float32",
    "check_rule_helper",
    "check_rotation",
    "exercise_inputs",
    "good_kernel",
    "suspect_kernel",
    "QUANTITIES",
]

BF16 = "bfloat16"
#: The quantities of :func:`check_keep_float32`: each kept in float32 or in bfloat16.
QUANTITIES = ("S", "P", "acc", "m", "l", "O")
_B_C = 64


def exercise_inputs(n: int = 512, d: int = 32, seed: int = 0, scale: float = 1.0,
                    outlier: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V for the exercises: (n, d) standard normal entries times ``scale`` (plus
    outliers), rounded to bfloat16 (held in float64 arrays)."""
    Q, K, V = random_inputs(n, d, np.random.default_rng(seed), scale=scale, outlier=outlier)
    return round_to(Q, BF16), round_to(K, BF16), round_to(V, BF16)


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


def _plain(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    return standard_attention_with_casts(Q, K, V, Casts.plain(BF16))


# ---- round_to -------------------------------------------------------------------------------

def _toward_zero(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded toward zero in ``dtype`` (what truncating the low bits gives)."""
    dt = as_dtype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        r = x.astype(dt)
        step = np.nextafter(r, np.zeros_like(r))
        r = np.where(np.abs(r.astype(np.float64)) > np.abs(x), step, r)
        return r.astype(np.float64)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


@checker("round_to")
def check_round_to(fb: Feedback, fn: Callable[[np.ndarray, str], np.ndarray]) -> None:
    """Check ``round_to(x, dtype)``: x rounded to the nearest value of ``dtype`` (ties to even),
    returned as a float64 array, for bfloat16, float16 and both float8 formats."""
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(200) * 3
    cases = [
        ("bfloat16, 200 normal values", normal, "bfloat16"),
        ("bfloat16, values between 1 and 2", 1 + rng.random(200), "bfloat16"),
        ("float16, 200 normal values", normal, "float16"),
        ("float8_e4m3fn, 200 normal values", normal, "float8_e4m3fn"),
        ("float8_e5m2, 200 normal values", normal, "float8_e5m2"),
        ("float8_e4m3fn, x = [500, -1000, 448]", np.array([500.0, -1000.0, 448.0]),
         "float8_e4m3fn"),
        ("float16, x = [1e6, 65504, 1e-9]", np.array([1e6, 65504.0, 1e-9]), "float16"),
    ]
    for label, x, dtype in cases:
        with fb.case(label):
            got, _ = call_learner(fn, x.copy(), dtype)
            want = round_to(x, dtype)
            arr = np.asarray(got)
            try:
                values = arr.astype(np.float64)
            except (TypeError, ValueError):
                fb.fail(f"{label}: expected an array of numbers, got {type(got).__name__}")
                continue
            if values.shape != x.shape:
                fb.fail(f"{label}: result has shape {values.shape}, expected {x.shape}")
            elif _same(values, want) and arr.dtype != np.float64:
                fb.fail(f"{label}: right values, but a {arr.dtype} array: return float64 "
                        "(.astype(np.float64)), or every later operation rounds again")
            elif _same(values, want):
                fb.ok(f"{label}: correct")
            elif _same(values, x):
                fb.fail(f"{label}: x comes back unchanged: cast to the dtype and back, "
                        "x.astype(dtype).astype(np.float64)")
            elif dtype == "bfloat16" and _same(values, round_to(x, "float16")):
                fb.fail(f"{label}: that is float16, not bfloat16 (same 16 bits, but 8 exponent "
                        "and 7 fraction bits instead of 5 and 10: ml_dtypes.bfloat16)")
            elif dtype == "float8_e4m3fn" and _same(values, round_to(
                    np.clip(x, -448.0, 448.0), dtype)) and not _same(values, want):
                fb.fail(f"{label}: 500 gives {values[0]:g}, a saturating cast; round_to is "
                        "the plain cast, which gives NaN (float8_e4m3fn has no inf)")
            elif _same(values, _toward_zero(x, dtype)):
                fb.fail(f"{label}: rounds toward zero (truncates the low bits); hardware "
                        "rounds to nearest, ties to even")
            else:
                k = int(np.argmax(~np.isclose(values, want, rtol=0, atol=0, equal_nan=True)))
                fb.fail(f"{label}: x = {float(x[k])!r} gives {float(values[k])!r}, the "
                        f"nearest {dtype} value is {float(want[k])!r}")


# ---- a bfloat16 accumulator -----------------------------------------------------------------

def _sequential(terms: Iterable[float], dtype: str) -> float:
    total = 0.0
    for t in terms:
        total = float(round_to(total + t, dtype))
    return total


@checker("dot product with a bfloat16 accumulator")
def check_bf16_dot(fb: Feedback, fn: Callable[[np.ndarray, np.ndarray], float]) -> None:
    """Check ``dot_bf16(x, y)``: each product exact, each addition rounded to bfloat16, one
    term after another from 0."""
    rng = np.random.default_rng(1)
    cases = [
        ("x = 4096 x 0.1, y = ones", np.full(4096, 0.1), np.ones(4096)),
        ("x, y: 1000 normal values", rng.standard_normal(1000), rng.standard_normal(1000)),
        ("x, y: 2000 positive values", rng.random(2000), rng.random(2000)),
        ("x = [1, 2**-9, 2**-9], y = ones", np.array([1.0, 2.0**-9, 2.0**-9]), np.ones(3)),
    ]
    for label, x, y in cases:
        with fb.case(label):
            got, _ = call_learner(fn, x.copy(), y.copy())
            try:
                if isinstance(got, (str, bytes)):
                    raise TypeError(got)
                value = float(np.asarray(got, dtype=np.float64))
            except (TypeError, ValueError):
                fb.fail(f"{label}: expected a number, got {got!r}")
                continue
            want = dot(x, y, BF16)
            exact = float(np.dot(x, y))
            if value == want:
                fb.ok(f"{label}: {want:g}" + (f" (the exact sum is {exact:g})"
                                               if abs(exact - want) > 1 else ""))
            elif value == float(round_to(exact, BF16)):
                fb.fail(f"{label}: {value:g} is the exact dot product rounded once at the end; "
                        f"a bfloat16 accumulator rounds after every addition (expected {want:g})")
            elif abs(value - exact) <= 1e-9 * max(1.0, abs(exact)):
                fb.fail(f"{label}: {value:g} is the exact dot product: round the running sum "
                        "to bfloat16 after every addition")
            elif value == float(round_to(np.dot(x.astype(np.float32), y.astype(np.float32)),
                                         BF16)) or value == float(round_to(np.dot(
                                             round_to(x, BF16), round_to(y, BF16)), BF16)):
                fb.fail(f"{label}: {value:g} is a float32 accumulation rounded once (what "
                        "np.dot or @ on bfloat16 arrays does); round after every addition "
                        f"(expected {want:g})")
            elif value == _sequential(round_to(x * y, BF16), BF16):
                fb.fail(f"{label}: you round each product too; products are exact (they fit "
                        f"in float32), only the additions round (expected {want:g})")
            else:
                fb.fail(f"{label}: got {value:g}, expected {want:g}")


# ---- what must stay float32 -----------------------------------------------------------------

_WHY = {
    "l": ("l in bfloat16: once the running sum is large, each new exp(s - m) is below half a "
          "bfloat16 spacing and is lost (like 4096 x 0.1 summing to 32)"),
    "acc": ("the accumulator in bfloat16: each P V contribution is small next to the running "
            "sum and is rounded away, block after block"),
}


def _keep_cases() -> list[tuple[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    return [("n = 512, d = 32", exercise_inputs(512, 32, seed=0)),
            ("n = 256, d = 32, inputs x 3", exercise_inputs(256, 32, seed=1, scale=3.0))]


def _casts_keeping(names: set[str]) -> Casts:
    return Casts.everything(BF16).replace(**{q: "float32" for q in names})


def _ratio(names: set[str], inputs: tuple[np.ndarray, np.ndarray, np.ndarray]) -> float:
    Q, K, V = inputs
    ref = _reference(Q, K, V)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        O = flash2_forward_with_casts(Q, K, V, _B_C, _casts_keeping(names))
    err, plain = error_stats(O, ref).max, error_stats(_plain(Q, K, V), ref).max
    return err / plain if np.isfinite(err) else float("inf")


@checker("which quantities must stay float32")
def check_keep_float32(fb: Feedback, answer: Iterable[str] | Callable[[], Iterable[str]]) -> None:
    """Check a choice of the quantities kept in float32 (the others in bfloat16, the inputs in
    bfloat16): the smallest set for which tiled attention meets the 2x rule against plain
    bfloat16 attention.  ``answer``: names among ``QUANTITIES`` (or a function returning them).
    """
    if callable(answer):
        answer, _ = call_learner(answer)
    if isinstance(answer, str) or not isinstance(answer, Iterable):
        raise LearnerError(f"expected a set of names among {', '.join(QUANTITIES)}, got "
                           f"{answer!r}")
    names = set(answer)
    unknown = sorted(str(q) for q in names - set(QUANTITIES))
    if unknown:
        raise LearnerError(f"unknown quantities {unknown}: choose among "
                           f"{', '.join(QUANTITIES)}")
    passed_all = True
    for label, inputs in _keep_cases():
        r = _ratio(names, inputs)
        if r <= 2:
            fb.ok(f"{label}: error {r:.2g} x plain bfloat16 attention's (rule: at most 2)")
            continue
        passed_all = False
        missing = [q for q in ("l", "acc") if q not in names]
        why = "; ".join(_WHY[q] for q in missing) or "keep more in float32"
        fb.fail(f"{label}: error {r:.3g} x plain bfloat16 attention's, more than 2: {why}")
    if passed_all:
        cases = _keep_cases()
        spare = [q for q in sorted(names) if all(_ratio(names - {q}, c) <= 2 for _, c in cases)]
        if spare:
            fb.fail(f"the rule holds, but {', '.join(spare)} need not stay float32: with "
                    f"{'it' if len(spare) == 1 else 'each'} in bfloat16 the error is still "
                    "within 2x plain attention's (the question asks what *must* stay float32)")


# ---- the 2x rule as an assertion ------------------------------------------------------------

def _raises(fn: Callable[..., Any], out: np.ndarray, plain: np.ndarray, ref: np.ndarray) -> bool:
    """True when the learner's helper raised AssertionError; other errors are reported."""
    try:
        call_learner(fn, out.copy(), plain.copy(), ref.copy())
    except LearnerError as err:
        if isinstance(err.__cause__, AssertionError):
            return True
        raise
    return False


def _rule_cases() -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, bool, str]]:
    """(label, out, plain, ref, must raise, hint when the helper gets it wrong)."""
    rng = np.random.default_rng(2)
    # multiples of 2**-10: every sum and difference below is exact, so "exactly 2x" is
    ref = rng.integers(-2048, 2048, size=(64, 16)) / 1024
    e = 2.0**-10 * rng.choice([-1.0, 1.0], size=(64, 16))
    plain = ref + e
    spike = ref.copy()
    spike[5, 3] += 3 * 2.0**-10  # one entry 3x plain's error, the rest exact
    nan = ref + 0.5 * e
    nan[0, 0] = np.nan
    return [
        ("error 1.5x plain's", ref + 1.5 * e, plain, ref, False,
         "an error within twice plain's must pass"),
        ("error 2.5x plain's, same sign as plain's", ref + 2.5 * e, plain, ref, True,
         "compare each with the reference: max|out - ref| <= 2 max|plain - ref|"),
        ("error exactly 2x plain's", ref + 2 * e, plain, ref, False,
         "the rule is <= 2x: equality passes"),
        ("error 2.5x plain's, opposite sign", ref - 2.5 * e, plain, ref, True,
         "the error is max|out - ref| (absolute values)"),
        ("one entry 3x plain's error, the rest exact", spike, plain, ref, True,
         "the rule uses the largest error, np.max(np.abs(out - ref)), not the mean"),
        ("a NaN in the output", nan, plain, ref, True,
         "NaN compares False: write `assert err <= 2 * err_plain`, which a NaN fails"),
        ("out = plain", plain.copy(), plain, ref, False, "plain itself passes (1x)"),
    ]


@checker("flash-attn's 2x rule as an assertion")
def check_rule_helper(fb: Feedback, fn: Callable[[np.ndarray, np.ndarray, np.ndarray], Any]
                      ) -> None:
    """Check ``assert_within_2x(out, plain, ref)``: raises AssertionError exactly when
    ``max|out - ref| > 2 max|plain - ref|``; then that it passes :func:`good_kernel` and
    catches :func:`suspect_kernel`."""
    for label, out, plain, ref, must_raise, hint in _rule_cases():
        with fb.case(label):
            raised = _raises(fn, out, plain, ref)
            if raised == must_raise:
                fb.ok(f"{label}: {'raises' if raised else 'passes'}")
            else:
                fb.fail(f"{label}: {'raises' if raised else 'passes'}, it should "
                        f"{'raise AssertionError' if must_raise else 'pass'}: {hint}")
    Q, K, V = exercise_inputs(512, 32, seed=3)
    ref, plain = _reference(Q, K, V), _plain(Q, K, V)
    for label, kernel, must_raise in (("good_kernel", good_kernel, False),
                                      ("suspect_kernel", suspect_kernel, True)):
        with fb.case(label):
            out = kernel(Q, K, V)
            ratio = error_stats(out, ref).max / error_stats(plain, ref).max
            raised = _raises(fn, out, plain, ref)
            if raised == must_raise:
                fb.ok(f"{label}: error {ratio:.2g} x plain's, "
                      f"{'caught' if raised else 'passes'}")
            else:
                fb.fail(f"{label}: error {ratio:.2g} x plain's, but your helper "
                        f"{'raises' if raised else 'lets it pass'}")


# ---- the Hadamard rotation ------------------------------------------------------------------

def _fp8_error(Q: np.ndarray, K: np.ndarray, V: np.ndarray, ref: np.ndarray) -> float:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return error_stats(fp8_attention(Q, K, V, block_scaling=False), ref).rms


@checker("Hadamard rotation")
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
