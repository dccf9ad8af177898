"""The Precision chapter's checkers (flashlib.book.exercises.precision) accept a right answer,
report a crash, and name the common wrong answers in one line."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from flashlib.book.exercises import NOT_ATTEMPTED
from flashlib.book.exercises import precision as ex
from flashlib.core.accuracy import assert_error_within
from flashlib.studies.precision import hadamard, random_hadamard, round_to
from tests.helpers import assert_fails_with, learner_copy, text

# a learner's copy: the library's own random_hadamard is refused in the rotation exercise
random_hadamard = learner_copy(random_hadamard)


def crashes(*args):
    raise ZeroDivisionError("oops")


ALL = [ex.check_round_significant, ex.check_pairwise_sum, ex.check_keep_float32,
       ex.check_fa3_rule, ex.check_rotation]


@pytest.mark.parametrize("check", ALL, ids=lambda c: c.__name__)
def test_crash_and_not_attempted(check):
    fb = check(crashes)
    assert_fails_with(fb, "your function raised ZeroDivisionError: oops")

    def todo(*args):
        raise NotImplementedError

    assert check(todo).problems == [NOT_ATTEMPTED]


# ---- rounding to p significant bits ---------------------------------------------------------

def significant(x, p, *, bits=0, rule=np.rint):
    f, e = np.frexp(x)
    return np.ldexp(rule(np.ldexp(f, p + bits)), e - p - bits)


def with_log2(x, p):
    e = np.floor(np.log2(np.abs(x)))  # log2(0) = -inf: NaN for x = 0
    return np.rint(x / 2.0**e * 2.0 ** (p - 1)) * 2.0 ** (e - p + 1)


def test_round_significant_right():
    fb = ex.check_round_significant(significant)
    assert fb.passed, text(fb)
    assert "7 fraction bits stored, 8 significant" in text(fb)
    # np.round rounds half to even too
    assert ex.check_round_significant(lambda x, p: significant(x, p, rule=np.round)).passed


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda x, p: significant(x, p, bits=-1), "p counts the implicit leading 1"),
    (lambda x, p: significant(x, p, bits=1), "p + 1 significant bits"),
    (lambda x, p: significant(x, p, rule=np.trunc), "rounds toward zero"),
    (lambda x, p: significant(x, p, rule=np.floor), "rounds down"),
    (lambda x, p: significant(x, p, rule=lambda y: np.floor(y + 0.5)), "ties go to the even"),
    (lambda x, p: significant(x, p, rule=lambda y: np.sign(y) * np.floor(np.abs(y) + 0.5)),
     "ties go to the even"),
    (lambda x, p: np.round(x, p), "p decimal places"),
    (lambda x, p: x, "comes back unchanged"),
    (lambda x, p: significant(x, p).astype(np.float32), "return float64"),
    (lambda x, p: significant(x, p)[:-1], "has shape"),
    (lambda x, p: "x", "expected an array of numbers"),
    (lambda x, p: x.astype(ml_dtypes.bfloat16).astype(np.float64), "the nearest number with"),
])
def test_round_significant_wrong(answer, phrase):
    assert_fails_with(ex.check_round_significant(answer), phrase)


def test_round_significant_zero_through_log2():
    with np.errstate(divide="ignore", invalid="ignore"):
        fb = ex.check_round_significant(with_log2)
    assert_fails_with(fb, "x = 0.0 gives NaN: log2(0) is -inf")


# ---- a sum in bfloat16, as a tree -----------------------------------------------------------

def tree(x, split=lambda n: n // 2, dtype="bfloat16"):
    if len(x) == 1:
        return float(x[0])
    h = split(len(x))
    return float(round_to(tree(x[:h], split, dtype) + tree(x[h:], split, dtype), dtype))


def sequential(x):
    total = 0.0
    for v in x:
        total = float(round_to(total + v, "bfloat16"))
    return total


def neighbours(x):
    level = list(x)
    while len(level) > 1:
        pairs = [float(round_to(a + b, "bfloat16"))
                 for a, b in zip(level[::2], level[1::2], strict=False)]
        level = pairs + (level[-1:] if len(level) % 2 else [])
    return level[0]


def test_pairwise_sum_right():
    fb = ex.check_pairwise_sum(tree)
    assert fb.passed, text(fb)
    assert "410 (exact: 410); one term after another gives 32" in text(fb)
    assert ex.check_pairwise_sum(lambda x: np.float32(tree(x))).passed  # a numpy scalar


@pytest.mark.parametrize(("answer", "phrase"), [
    (sequential, "the sequential sum"),
    (lambda x: tree(x, lambda n: (n + 1) // 2), "split at h = n // 2"),
    (neighbours, "pairs neighbours level by level"),
    (lambda x: float(round_to(np.sum(x), "bfloat16")), "rounded once at the end"),
    (lambda x: float(np.sum(x)), "no rounding"),
    (lambda x: tree(x, dtype="float64"), "no rounding"),
    (lambda x: float(round_to(np.sum(x.astype(np.float32)), "bfloat16")),
     "rounded once at the end"),
    (lambda x: 7.0, "expected"),
    (lambda x: "410", "expected a number"),
    (lambda x: [1.0, 2.0], "expected a number"),
])
def test_pairwise_sum_wrong(answer, phrase):
    assert_fails_with(ex.check_pairwise_sum(answer), phrase)


# ---- what must stay float32 -----------------------------------------------------------------

def test_keep_float32_right():
    for answer in ({"acc", "l"}, ["l", "acc"], lambda: ("acc", "l")):
        fb = ex.check_keep_float32(answer)
        assert fb.passed, text(fb)
    assert "plain float16 attention's" in text(fb)


@pytest.mark.parametrize(("answer", "phrases"), [
    ({"acc"}, ["l in float16", "3 more bits than bfloat16 only delay it"]),
    ({"l"}, ["the accumulator in float16"]),
    (set(), ["l in float16", "the accumulator in float16"]),
    ({"m", "S"}, ["more than 2"]),
    ({"acc", "l", "S", "m"}, ["S, m need not stay float32"]),
    ({"acc", "l", "inputs"}, ["unknown quantities ['inputs']"]),
    ("acc", ["expected a set of names"]),
    (lambda: None, ["expected a set of names"]),
])
def test_keep_float32_wrong(answer, phrases):
    assert_fails_with(ex.check_keep_float32(answer), *phrases)


# ---- flash-attn's rule, with FlashAttention-3's allowance ----------------------------------

def fa3_rule(out, plain, ref, dtype, *, factor=2.0, atol_factor=2.0, combine=np.add,
             rounded=True, metric=np.max):
    err = metric(np.abs(out - ref))
    err_plain = metric(np.abs(plain - ref))
    if rounded:
        trip = round_to(round_to(ref + 0.3, dtype) - 0.3, dtype)
    else:
        trip = ref + 0.3 - 0.3
    atol = atol_factor * np.max(np.abs(trip - ref))
    assert err <= combine(factor * err_plain, atol), f"{err:.3g}"


def test_fa3_rule_right():
    fb = ex.check_fa3_rule(fa3_rule)
    assert fb.passed, text(fb)
    assert "suspect_kernel: error" in text(fb) and "caught" in text(fb)
    assert "the relative rule is lenient" in text(fb)


def test_the_suspect_kernel_is_subtly_wrong():
    """Its error is small in absolute terms (an atol of 3e-2 passes it) but many times plain
    bfloat16 attention's; the good kernel's is below plain's."""
    Q, K, V = ex.exercise_inputs(1024, 32, seed=3)
    ref, plain = ex._reference(Q, K, V), ex._plain(Q, K, V)
    bad = np.max(np.abs(ex.suspect_kernel(Q, K, V) - ref))
    good = np.max(np.abs(ex.good_kernel(Q, K, V) - ref))
    p = np.max(np.abs(plain - ref))
    assert bad < 3e-2 and bad > 3 * (2 * p + ex._fa3_allowance(ref, "bfloat16")) and good < p


def _ifs(out, plain, ref, dtype):
    trip = round_to(round_to(ref + 0.3, dtype) - 0.3, dtype)
    if np.max(np.abs(out - ref)) > 2 * np.max(np.abs(plain - ref)) + 2 * np.max(
            np.abs(trip - ref)):
        raise AssertionError


@pytest.mark.parametrize(("answer", "phrases"), [
    (lambda o, p, r, dt: fa3_rule(o, p, r, dt, atol_factor=0.0),
     ["plain exact", "should pass", "only atol lets a result off by a rounding pass"]),
    (lambda o, p, r, dt: fa3_rule(o, p, r, dt, rounded=False), ["in float64 arithmetic it is 0"]),
    (lambda o, p, r, dt: fa3_rule(o, p, r, dt, combine=np.maximum),
     ["the allowance adds", "not the larger of the two"]),
    (lambda o, p, r, dt: fa3_rule(o, p, r, dt, atol_factor=1.0), ["atol is twice"]),
    (lambda o, p, r, dt: fa3_rule(o, p, r, dt, atol_factor=4.0), ["the allowance is too large"]),
    (lambda o, p, r, dt: fa3_rule(o, p, r, dt, metric=np.mean), ["not the mean"]),
    (_ifs, ["a NaN in the output: passes", "NaN compares False"]),
    (lambda o, p, r, dt: np.testing.assert_allclose(o, r, atol=3e-2),
     ["plain exact", "should pass"]),
    (lambda o, p, r, dt: fa3_rule(o, r, p, dt),  # plain and ref swapped
     ["should"]),
    (lambda o, p, r, dt: None, ["should raise AssertionError"]),
])
def test_fa3_rule_wrong(answer, phrases):
    assert_fails_with(ex.check_fa3_rule(answer), *phrases)


def test_fa3_rule_the_book_helper_is_another_rule():
    """assert_error_within (imported by the chapter) is the bare 2x rule with a floor, the
    larger of the two: it is not FlashAttention-3's rule, and the checker says so."""
    def book(out, plain, ref, dtype):
        assert_error_within(out, plain, ref, dtype=ml_dtypes.bfloat16)

    assert_fails_with(ex.check_fa3_rule(book), "the allowance adds")


def test_fa3_rule_other_exception():
    def value_error(out, plain, ref, dtype):
        raise ValueError("too big")

    assert_fails_with(ex.check_fa3_rule(value_error), "raised ValueError: too big")


# ---- the Hadamard rotation ------------------------------------------------------------------

def rotate(Q, K, rng):
    M = random_hadamard(Q.shape[1], rng)
    return Q @ M, K @ M


def test_rotation_right():
    fb = ex.check_rotation(rotate)
    assert fb.passed, text(fb)
    assert "Q K^T unchanged; FP8 RMSE" in text(fb)


def _signs(Q, K, rng):
    s = rng.choice([-1.0, 1.0], size=Q.shape[1])
    return Q * s, K * s


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda Q, K, rng: (Q @ random_hadamard(Q.shape[1], rng), K), "rotate Q and K by the same"),
    (lambda Q, K, rng: (Q @ hadamard(Q.shape[1]), K @ hadamard(Q.shape[1])), "d-fold"),
    (_signs, "spread each outlier"),
    (lambda Q, K, rng: (Q, K), "come back unchanged"),
    (lambda Q, K, rng: (Q @ random_hadamard(Q.shape[1], rng),
                        K @ random_hadamard(Q.shape[1], rng)), "the same orthogonal M"),
    (lambda Q, K, rng: Q, "expected a pair"),
    (lambda Q, K, rng: (Q[:, :8], K[:, :8]), "shapes"),
])
def test_rotation_wrong(answer, phrase):
    assert_fails_with(ex.check_rotation(answer), phrase)
