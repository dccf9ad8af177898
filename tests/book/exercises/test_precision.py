"""The Precision chapter's checkers (flashlib.book.exercises.precision) accept a right answer,
report a crash, and name the common wrong answers in one line."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from flashlib.book.exercises import NOT_ATTEMPTED
from flashlib.book.exercises import precision as ex
from flashlib.studies.precision import hadamard, random_hadamard, round_to
from tests.helpers import assert_fails_with, learner_copy, text

# a learner's copy: the library's own random_hadamard is refused in the rotation exercise
random_hadamard = learner_copy(random_hadamard)


def crashes(*args):
    raise ZeroDivisionError("oops")


ALL = [ex.check_round_to, ex.check_bf16_dot, ex.check_keep_float32, ex.check_rule_helper,
       ex.check_rotation]


@pytest.mark.parametrize("check", ALL, ids=lambda c: c.__name__)
def test_crash_and_not_attempted(check):
    fb = check(crashes)
    assert_fails_with(fb, "your function raised ZeroDivisionError: oops")

    def todo(*args):
        raise NotImplementedError

    assert check(todo).problems == [NOT_ATTEMPTED]


# ---- round_to -------------------------------------------------------------------------------

def test_round_to_right():
    fb = ex.check_round_to(lambda x, dt: x.astype(dt).astype(np.float64))
    assert fb.passed, text(fb)


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda x, dt: x.astype(dt), "return float64"),
    (lambda x, dt: x, "comes back unchanged"),
    (lambda x, dt: x.astype(np.float16).astype(np.float64), "that is float16, not bfloat16"),
    (lambda x, dt: np.clip(x, -448, 448).astype(dt).astype(np.float64), "a saturating cast"),
    (lambda x, dt: np.round(x, 2), "the nearest"),
])
def test_round_to_wrong(answer, phrase):
    assert_fails_with(ex.check_round_to(answer), phrase)


def test_round_to_truncation():
    def truncate(x, dt):
        if dt != "bfloat16":
            return x.astype(dt).astype(np.float64)
        bits = x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
        return bits.view(np.float32).astype(np.float64)

    assert_fails_with(ex.check_round_to(truncate), "rounds toward zero")


# ---- a bfloat16 accumulator -----------------------------------------------------------------

def good_dot(x, y):
    total = 0.0
    for a, b in zip(x, y, strict=True):
        total = float(round_to(total + a * b, "bfloat16"))
    return total


def test_bf16_dot_right():
    fb = ex.check_bf16_dot(good_dot)
    assert fb.passed, text(fb)
    assert "32 (the exact sum is 409.6)" in text(fb)


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda x, y: float(round_to(np.dot(x, y), "bfloat16")), "rounded once at the end"),
    (lambda x, y: np.dot(x, y), "is the exact dot product"),
    (lambda x, y: np.dot(x.astype(ml_dtypes.bfloat16), y.astype(ml_dtypes.bfloat16)),
     "rounded once at the end"),
    (lambda x, y: np.sum((x * y).astype(ml_dtypes.bfloat16)), "you round each product too"),
    (lambda x, y: "32", "expected a number, got '32'"),
    (lambda x, y: [1, 2], "expected a number"),
])
def test_bf16_dot_wrong(answer, phrase):
    assert_fails_with(ex.check_bf16_dot(answer), phrase)


def test_bf16_dot_float32_accumulator():
    def f32(x, y):
        total = np.float32(0)
        for a, b in zip(x, y, strict=True):
            total = np.float32(total + np.float32(a) * np.float32(b))
        return float(round_to(total, "bfloat16"))

    assert not ex.check_bf16_dot(f32).passed


# ---- what must stay float32 -----------------------------------------------------------------

def test_keep_float32_right():
    for answer in ({"acc", "l"}, ["l", "acc"], lambda: ("acc", "l")):
        fb = ex.check_keep_float32(answer)
        assert fb.passed, text(fb)


@pytest.mark.parametrize(("answer", "phrases"), [
    ({"acc"}, ["l in bfloat16", "like 4096 x 0.1 summing to 32"]),
    ({"l"}, ["the accumulator in bfloat16"]),
    (set(), ["l in bfloat16", "the accumulator in bfloat16"]),
    ({"m", "S"}, ["more than 2"]),
    ({"acc", "l", "S", "m"}, ["S, m need not stay float32"]),
    ({"acc", "l", "inputs"}, ["unknown quantities ['inputs']"]),
    ("acc", ["expected a set of names"]),
    (lambda: None, ["expected a set of names"]),
])
def test_keep_float32_wrong(answer, phrases):
    assert_fails_with(ex.check_keep_float32(answer), *phrases)


# ---- the 2x rule as an assertion ------------------------------------------------------------

def good_helper(out, plain, ref):
    err = np.max(np.abs(out - ref))
    assert err <= 2 * np.max(np.abs(plain - ref)), err


def test_rule_helper_right():
    fb = ex.check_rule_helper(good_helper)
    assert fb.passed, text(fb)
    assert "suspect_kernel: error" in text(fb) and "caught" in text(fb)


def test_the_suspect_kernel_is_subtly_wrong():
    """Its error is small in absolute terms (an atol of 2e-2 passes it) but several times
    plain bfloat16 attention's; the good kernel's is below plain's."""
    Q, K, V = ex.exercise_inputs(512, 32, seed=3)
    ref, plain = ex._reference(Q, K, V), ex._plain(Q, K, V)
    bad = np.max(np.abs(ex.suspect_kernel(Q, K, V) - ref))
    good = np.max(np.abs(ex.good_kernel(Q, K, V) - ref))
    p = np.max(np.abs(plain - ref))
    assert bad < 2e-2 and bad > 3 * p and good < p


def _ifs(out, plain, ref):
    if np.max(np.abs(out - ref)) > 2 * np.max(np.abs(plain - ref)):
        raise AssertionError


@pytest.mark.parametrize(("answer", "phrases"), [
    (_ifs, ["a NaN in the output: passes", "NaN compares False"]),
    (lambda o, p, r: good_helper(o, r, p),  # baseline and reference swapped
     ["should raise"]),
    (lambda o, p, r: np.testing.assert_allclose(o, r, atol=2e-2),
     ["suspect_kernel: error", "lets it pass"]),
    (lambda o, p, r: good_helper(o, p, p), ["should"]),  # compared with plain, not ref
    (lambda o, p, r: None, ["should raise AssertionError"]),
    (lambda o, p, r: np.mean(np.abs(o - r)) <= 2 * np.mean(np.abs(p - r)) or _fail(),
     ["not the mean"]),
])
def test_rule_helper_wrong(answer, phrases):
    assert_fails_with(ex.check_rule_helper(answer), *phrases)


def _fail():
    raise AssertionError


def test_rule_helper_other_exception():
    def value_error(out, plain, ref):
        raise ValueError("too big")

    assert_fails_with(ex.check_rule_helper(value_error), "raised ValueError: too big")


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
