"""The Precision chapter's declared mistakes (flashlib.book.exercises.precision)."""

from __future__ import annotations

import functools
import itertools

import ml_dtypes
import numpy as np

from flashlib.book.exercises.precision import (
    QUANTITIES,
    check_fa3_rule,
    check_keep_float32,
    check_pairwise_sum,
    check_rotation,
    check_round_significant,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes, learner_copy
from flashlib.core.accuracy import assert_error_within
from flashlib.studies import precision
from flashlib.studies.precision import hadamard, round_to

# a learner's copy: the library's own random_hadamard is refused in the rotation exercise
_random_hadamard = learner_copy(precision.random_hadamard)


# ---- 8.1 rounding to p significant bits ------------------------------------------------------

def _significant(x, p, *, bits=0, rule=np.rint):
    f, e = np.frexp(x)
    return np.ldexp(rule(np.ldexp(f, p + bits)), e - p - bits)


def _rounded(**mistake):
    return functools.partial(_significant, **mistake)


def _half_up(y):
    return np.floor(y + 0.5)


def _half_away(y):
    return np.sign(y) * np.floor(np.abs(y) + 0.5)


def decimal_places(x, p):
    return np.round(x, p)


def unchanged(x, p):
    return x


def in_float32(x, p):
    return _significant(x, p).astype(np.float32)


def one_short(x, p):
    return _significant(x, p)[:-1]


def a_letter(x, p):
    return "x"


def through_bfloat16(x, p):
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def with_log2(x, p):
    e = np.floor(np.log2(np.abs(x)))  # log2(0) = -inf: NaN for x = 0
    return np.rint(x / 2.0**e * 2.0 ** (p - 1)) * 2.0 ** (e - p + 1)


declare_mistakes(
    check_round_significant,
    Mistake("p fraction bits", (_rounded(bits=-1),), ("p counts the implicit leading 1",)),
    Mistake("p + 1 bits", (_rounded(bits=1),), ("p + 1 significant bits",)),
    Mistake("truncated", (_rounded(rule=np.trunc),), ("rounds toward zero",)),
    Mistake("floor", (_rounded(rule=np.floor),), ("rounds down",)),
    Mistake("ties up", (_rounded(rule=_half_up),), ("ties go to the even",)),
    Mistake("ties away from zero", (_rounded(rule=_half_away),), ("ties go to the even",)),
    Mistake("decimal places", (decimal_places,), ("p decimal places",)),
    Mistake("unchanged", (unchanged,), ("comes back unchanged",)),
    Mistake("float32", (in_float32,), ("return float64",)),
    Mistake("one short", (one_short,), ("has shape",)),
    Mistake("a letter", (a_letter,), ("expected an array of numbers",)),
    Mistake("bfloat16", (through_bfloat16,), ("the nearest number with",)),
    Mistake("log2 of 0", (with_log2,), ("x = 0.0 gives NaN: log2(0) is -inf",)),
)


# ---- 8.2 a sum in bfloat16, as a tree --------------------------------------------------------

def _tree(x, split=lambda n: n // 2, dtype="bfloat16"):
    if len(x) == 1:
        return float(x[0])
    h = split(len(x))
    return float(round_to(_tree(x[:h], split, dtype) + _tree(x[h:], split, dtype), dtype))


def sequential(x):
    total = 0.0
    for v in x:
        total = float(round_to(total + v, "bfloat16"))
    return total


def split_up(x):
    return _tree(x, lambda n: (n + 1) // 2)


def neighbours(x):
    level = list(x)
    while len(level) > 1:
        pairs = [float(round_to(a + b, "bfloat16"))
                 for a, b in zip(level[::2], level[1::2], strict=False)]
        level = pairs + (level[-1:] if len(level) % 2 else [])
    return level[0]


def rounded_at_the_end(x):
    return float(round_to(np.sum(x), "bfloat16"))


def not_rounded(x):
    return float(np.sum(x))


def tree_in_float64(x):
    return _tree(x, dtype="float64")


def float32_rounded_at_the_end(x):
    return float(round_to(np.sum(x.astype(np.float32)), "bfloat16"))


def seven(x):
    return 7.0


def words(x):
    return "410"


def a_list(x):
    return [1.0, 2.0]


declare_mistakes(
    check_pairwise_sum,
    Mistake("sequential", (sequential,), ("the sequential sum",)),
    Mistake("split at (n + 1) // 2", (split_up,), ("split at h = n // 2",)),
    Mistake("neighbours", (neighbours,), ("pairs neighbours level by level",)),
    Mistake("rounded at the end", (rounded_at_the_end,), ("rounded once at the end",)),
    Mistake("not rounded", (not_rounded,), ("no rounding",)),
    Mistake("a tree in float64", (tree_in_float64,), ("no rounding",)),
    Mistake("float32, rounded at the end", (float32_rounded_at_the_end,),
            ("rounded once at the end",)),
    Mistake("a number", (seven,), ("expected",)),
    Mistake("a string", (words,), ("expected a number",)),
    Mistake("a list", (a_list,), ("expected a number",)),
)


# ---- 8.3 the smallest set kept in float32 ----------------------------------------------------

def _search(error_ratio, *, sizes=None, passes=lambda r: r <= 2):
    for k in range(len(QUANTITIES) + 1) if sizes is None else sizes:
        for names in itertools.combinations(QUANTITIES, k):
            if passes(error_ratio(set(names))):
                return set(names)
    return None


def the_chapters_answer(error_ratio):
    return {"l", "acc"}


def first_in_bitmask_order(error_ratio):
    for mask in range(2 ** len(QUANTITIES)):
        names = {q for i, q in enumerate(QUANTITIES) if mask >> i & 1}
        if error_ratio(names) <= 2:
            return names
    return None


def drop_one_by_one(error_ratio):
    kept = set(QUANTITIES)
    if error_ratio(kept) > 2:
        return None
    for q in QUANTITIES:
        if error_ratio(kept - {q}) <= 2:
            kept -= {q}
    return kept


def last_that_passes(error_ratio):
    found = None
    for k in range(len(QUANTITIES) + 1):
        for names in itertools.combinations(QUANTITIES, k):
            if error_ratio(set(names)) <= 2:
                found = set(names)
    return found


def everything_when_none(error_ratio):
    found = _search(error_ratio)
    return set(QUANTITIES) if found is None else found


def asks_a_name(error_ratio):
    for q in QUANTITIES:
        if error_ratio(q) <= 2:
            return {q}
    return None


def asks_the_inputs(error_ratio):
    return _search(lambda names: error_ratio(names | {"Q"}))


def a_string(error_ratio):
    return "acc l"


def an_unknown_name(error_ratio):
    found = _search(error_ratio)
    return None if found is None else found | {"inputs"}


def asks_forever(error_ratio):
    while True:
        error_ratio({"S"})


declare_mistakes(
    check_keep_float32,
    Mistake("the chapter's answer, whatever the ratio", (the_chapters_answer,),
            ("returned {'acc', 'l'}", "never called error_ratio")),
    Mistake("the first set that passes, in bitmask order", (first_in_bitmask_order,),
            ("a set nothing can be removed from is not always the smallest",)),
    Mistake("names dropped one by one", (drop_one_by_one,),
            ("a set nothing can be removed from is not always the smallest",)),
    Mistake("the last set that passes", (last_that_passes,), ("in order of size",)),
    Mistake("< 2 instead of <= 2", (functools.partial(_search, passes=lambda r: r < 2),),
            ("is exactly 2", "*at most* twice")),
    Mistake("from size 1", (functools.partial(_search, sizes=range(1, len(QUANTITIES) + 1)),),
            ("try the empty set first",)),
    Mistake("up to size 5", (functools.partial(_search, sizes=range(len(QUANTITIES))),),
            ("does your search reach the set of all six",)),
    Mistake("everything when nothing passes", (everything_when_none,),
            ("return None when none does",)),
    Mistake("a name for a set", (asks_a_name,), ("error_ratio takes a set of names",)),
    Mistake("an unknown name asked", (asks_the_inputs,), ("unknown quantities ['Q']",)),
    Mistake("a string", (a_string,), ("expected a set of names",)),
    Mistake("an unknown name returned", (an_unknown_name,), ("unknown quantities ['inputs']",)),
    Mistake("asks forever", (asks_forever,), ("ask each once",)),
)


# ---- 8.4 flash-attn's rule, with FlashAttention-3's allowance --------------------------------

def _fa3_rule(out, plain, ref, dtype, *, factor=2.0, atol_factor=2.0, combine=np.add,
              rounded=True, metric=np.max):
    err = metric(np.abs(out - ref))
    err_plain = metric(np.abs(plain - ref))
    if rounded:
        trip = round_to(round_to(ref + 0.3, dtype) - 0.3, dtype)
    else:
        trip = ref + 0.3 - 0.3
    atol = atol_factor * np.max(np.abs(trip - ref))
    assert err <= combine(factor * err_plain, atol), f"{err:.3g}"


def _rule(**mistake):
    return functools.partial(_fa3_rule, **mistake)


def ifs(out, plain, ref, dtype):
    trip = round_to(round_to(ref + 0.3, dtype) - 0.3, dtype)
    if np.max(np.abs(out - ref)) > 2 * np.max(np.abs(plain - ref)) + 2 * np.max(
            np.abs(trip - ref)):
        raise AssertionError


def allclose(out, plain, ref, dtype):
    np.testing.assert_allclose(out, ref, atol=3e-2)


def plain_and_ref_swapped(out, plain, ref, dtype):
    _fa3_rule(out, ref, plain, dtype)


def no_assertion(out, plain, ref, dtype):
    return None


def the_books_helper(out, plain, ref, dtype):
    # assert_error_within (imported by the chapter) is the bare 2x rule with a floor, the
    # larger of the two: not FlashAttention-3's rule
    assert_error_within(out, plain, ref, dtype=ml_dtypes.bfloat16)


def value_error(out, plain, ref, dtype):
    raise ValueError("too big")


declare_mistakes(
    check_fa3_rule,
    Mistake("no atol", (_rule(atol_factor=0.0),),
            ("plain exact", "should pass", "only atol lets a result off by a rounding pass")),
    Mistake("the round trip in float64", (_rule(rounded=False),),
            ("in float64 arithmetic it is 0",)),
    Mistake("the larger of the two", (_rule(combine=np.maximum),),
            ("the allowance adds", "not the larger of the two")),
    Mistake("atol once", (_rule(atol_factor=1.0),), ("atol is twice",)),
    Mistake("atol four times", (_rule(atol_factor=4.0),), ("the allowance is too large",)),
    Mistake("the mean error", (_rule(metric=np.mean),), ("not the mean",)),
    Mistake("an if that NaN passes", (ifs,), ("a NaN in the output: passes",
                                            "NaN compares False")),
    Mistake("a fixed atol", (allclose,), ("plain exact", "should pass")),
    Mistake("plain and ref swapped", (plain_and_ref_swapped,), ("should",)),
    Mistake("no assertion", (no_assertion,), ("should raise AssertionError",)),
    Mistake("the book's helper", (the_books_helper,), ("the allowance adds",)),
    Mistake("another exception", (value_error,), ("raised ValueError: too big",)),
)


# ---- 8.5 the Hadamard rotation ---------------------------------------------------------------

def q_only(Q, K, rng):
    return Q @ _random_hadamard(Q.shape[1], rng), K


def unnormalised(Q, K, rng):
    return Q @ hadamard(Q.shape[1]), K @ hadamard(Q.shape[1])


def signs(Q, K, rng):
    s = rng.choice([-1.0, 1.0], size=Q.shape[1])
    return Q * s, K * s


def not_rotated(Q, K, rng):
    return Q, K


def two_rotations(Q, K, rng):
    return Q @ _random_hadamard(Q.shape[1], rng), K @ _random_hadamard(Q.shape[1], rng)


def q_alone(Q, K, rng):
    return Q


def cut(Q, K, rng):
    return Q[:, :8], K[:, :8]


declare_mistakes(
    check_rotation,
    Mistake("Q only", (q_only,), ("rotate Q and K by the same",)),
    Mistake("not normalised", (unnormalised,), ("d-fold",)),
    Mistake("signs only", (signs,), ("spread each outlier",)),
    Mistake("not rotated", (not_rotated,), ("come back unchanged",)),
    Mistake("two rotations", (two_rotations,), ("the same orthogonal M",)),
    Mistake("Q alone", (q_alone,), ("expected a pair",)),
    Mistake("cut", (cut,), ("shapes",)),
)
