"""The Precision chapter's checkers (flashlib.book.exercises.precision) accept a right answer
and report a crash; the common wrong answers, each named in one line, are declared in
flashlib/book/exercises/mistakes/precision.py (tests/book/exercises/test_declared_mistakes.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from flashlib.book.exercises import NOT_ATTEMPTED
from flashlib.book.exercises import precision as ex
from flashlib.book.exercises.mistakes import precision as _precision_mistakes
from flashlib.studies.precision import random_hadamard, round_to
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


def test_round_significant_right():
    fb = ex.check_round_significant(significant)
    assert fb.passed, text(fb)
    assert "7 fraction bits stored, 8 significant" in text(fb)
    # np.round rounds half to even too
    assert ex.check_round_significant(lambda x, p: significant(x, p, rule=np.round)).passed


# ---- a sum in bfloat16, as a tree -----------------------------------------------------------

def tree(x, split=lambda n: n // 2, dtype="bfloat16"):
    if len(x) == 1:
        return float(x[0])
    h = split(len(x))
    return float(round_to(tree(x[:h], split, dtype) + tree(x[h:], split, dtype), dtype))


def test_pairwise_sum_right():
    fb = ex.check_pairwise_sum(tree)
    assert fb.passed, text(fb)
    assert "410 (exact: 410); one term after another gives 32" in text(fb)
    assert ex.check_pairwise_sum(lambda x: np.float32(tree(x))).passed  # a numpy scalar


# ---- what must stay float32 -----------------------------------------------------------------

def smallest_set(error_ratio):
    for k in range(len(ex.QUANTITIES) + 1):
        for names in itertools.combinations(ex.QUANTITIES, k):
            if error_ratio(set(names)) <= 2:
                return set(names)
    return None


def test_keep_float32_right():
    fb = ex.check_keep_float32(smallest_set)
    assert fb.passed, text(fb)
    assert "the chapter's kernel (float16, n = 512): {'acc', 'l'}" in text(fb)
    assert "no choice meets: None, no set meets the rule (64 calls of" in text(fb)
    assert "acc alone in float16: error" in text(fb)
    # a list of the names is a set too
    assert ex.check_keep_float32(lambda f: (lambda s: None if s is None else sorted(s))(
        smallest_set(f))).passed


def test_the_chapters_kernel_needs_l_and_acc_alone():
    """The smallest set for the chapter's kernel is {acc, l} and no other set of two or
    fewer: what the solution says; each made-up ratio is monotone (keeping more never raises
    it), as the exercise says."""
    sets = ex._subsets()
    few = [s for s in sets if len(s) <= 2]
    assert [s for s in few if ex.tiled_error_ratio(set(s)) <= ex.RULE] == [{"acc", "l"}]
    for _, ratio in ex.MADE_UP:
        assert all(ratio(s | {q}) <= ratio(s) for s in sets for q in ex.QUANTITIES)


# ---- flash-attn's rule, with FlashAttention-3's allowance ----------------------------------

fa3_rule = learner_copy(_precision_mistakes._fa3_rule)  # the declared mutant


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


# ---- the Hadamard rotation ------------------------------------------------------------------

def rotate(Q, K, rng):
    M = random_hadamard(Q.shape[1], rng)
    return Q @ M, K @ M


def test_rotation_right():
    fb = ex.check_rotation(rotate)
    assert fb.passed, text(fb)
    assert "Q K^T unchanged; FP8 RMSE" in text(fb)

