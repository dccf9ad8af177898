"""Checkers for the exercises of the online-softmax chapter (book/online-softmax.md).

check_online_update         ``update(m, l, xs) -> (m_new, l_new)``: one step reading a block
                            of values at once, in base 2 (exp2)
check_merge                 ``merge(a, b) -> (m, l, o)`` of two partial attention states
                            handed over normalised (``o = acc / l``)
check_empty_partial         ``empty(n_q, d_v)``, the identity element of the merge
check_merge_counterexample  two states on which :func:`merge_forgetting_acc_rescale` is wrong
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import (
    MERGES,
    Feedback,
    LearnerError,
    call_learner,
    checker,
    fmt,
    names,
    warned,
)
from flashlib.fast.online import (
    PartialAttention,
    finalize_partial,
    merge_partials,
    partial_attention,
)

__all__ = [
    "STREAM_LENGTH",
    "STREAM_BLOCK",
    "check_online_update",
    "check_merge",
    "check_empty_partial",
    "merge_forgetting_acc_rescale",
    "check_merge_counterexample",
]

STREAM_LENGTH = 1000
#: The values :func:`check_online_update` hands over at once in its stream.
STREAM_BLOCK = 16
"""How many values :func:`check_online_update` folds the learner's update over (the chapter
quotes it)."""


def _as_pair(result: Any) -> tuple[float, float]:
    """The learner's ``(m_new, l_new)`` as floats, or a LearnerError."""
    try:
        m, l = result  # noqa: E741
        return float(m), float(l)
    except (TypeError, ValueError):
        raise LearnerError(f"return a pair (m_new, l_new), got {result!r}") from None


@checker("online softmax update",
         forbid=names("flashlib.algorithms.online_update",
                      "flashlib.fast.online.online_softmax_update",
                      "flashlib.fast.online.online_softmax",
                      "flashlib.fast.online.two_pass_softmax_state"))
def check_online_update(fb: Feedback,
                        fn: Callable[[float, float, np.ndarray], tuple[float, float]]) -> None:
    """Check ``update(m, l, xs) -> (m_new, l_new)``, the online softmax step that reads a
    block of values ``xs`` (a 1-D array: several values, one, none, or masked -inf) at once,
    as a tile of one score row, in base 2 as GPU kernels keep it: ``l`` is the sum of
    ``2 ** (x - m)`` (exp2)."""
    inf = float("inf")
    e = 2.0  # base 2: l sums 2 ** (x - m)
    cases = [
        ("first block: (m, l) = (-inf, 0), xs = [3, 1]", (-inf, 0.0, [3.0, 1.0]),
         (3.0, 1.0 + e**-2)),
        ("a block below the max: (m, l) = (2, 1.5), xs = [1, 0]", (2.0, 1.5, [1.0, 0.0]),
         (2.0, 1.5 + 1 / e + e**-2)),
        ("a new max in the block: (m, l) = (0, 1), xs = [1, -1]", (0.0, 1.0, [1.0, -1.0]),
         (1.0, 1 / e + 1.0 + e**-2)),
        ("huge logits: (m, l) = (1000, 1), xs = [1001, 999]", (1000.0, 1.0, [1001.0, 999.0]),
         (1001.0, 1 / e + 1 + e**-2)),
        ("a masked score in the block: (m, l) = (0, 1), xs = [-inf, 0]",
         (0.0, 1.0, [-inf, 0.0]), (0.0, 2.0)),
        ("an empty block: (m, l) = (2, 1.5), xs = []", (2.0, 1.5, []), (2.0, 1.5)),
        ("a masked block into the empty state: (m, l) = (-inf, 0), xs = [-inf, -inf]",
         (-inf, 0.0, [-inf, -inf]), (-inf, 0.0)),
    ]
    for name, (m, l, xs), (m_want, l_want) in cases:  # noqa: E741
        x = np.array(xs, dtype=np.float64)
        top = float(np.max(x)) if x.size else -inf
        with fb.case(name):
            got, warns = call_learner(fn, np.float64(m), np.float64(l), x.copy())
            m_got, l_got = _as_pair(got)
            ref = m_want if m_want > -inf else 0.0
            if np.isnan(m_got) or np.isnan(l_got):
                hint = ("exp2(-inf - (-inf)) is NaN: when m_new is -inf nothing has been "
                        "seen; keep l = 0 (np.where or an if)" if m_want == -inf else
                        "exp2 overflowed or -inf - (-inf) appeared; compute exp2(m - m_new) and "
                        "exp2(xs - m_new), all <= 1")
                fb.fail(f"{name}: got NaN ({m_got}, {l_got}): {hint}")
            elif m_got != m_want:
                fb.fail(f"{name}: m_new = {m_got}, expected {m_want}: m_new = max(m, max(xs)) "
                        "(an empty block leaves m as it is)")
            elif not np.isclose(l_got, l_want, rtol=1e-12, atol=0):
                added = float(np.sum(np.exp2(x - ref))) if x.size else 0.0
                base_e = (l * np.exp(m - ref) if m > -inf else 0.0) + (
                    float(np.sum(np.exp(x - ref))) if x.size else 0.0)
                if np.isclose(l_got, base_e):
                    hint = ("that is the sum in base e: keep it in base 2, "
                            "l_new = l * exp2(m - m_new) + sum(exp2(xs - m_new))")
                elif np.isclose(l_got, l + added) and m != m_want:
                    hint = ("you forgot to rescale the old sum when the max changed: "
                            "l_new = l * exp2(m - m_new) + sum(exp2(xs - m_new))")
                elif m > -inf and np.isclose(l_got, l * np.exp2(m_want - m) + added):
                    hint = "the rescale factor is upside down: use exp2(m - m_new), which is <= 1"
                elif x.size and np.isclose(l_got, l * np.exp2(m - ref) + np.exp2(top - ref)):
                    hint = ("add every value of the block, not only its maximum: "
                            "sum(exp2(xs - m_new))")
                elif m_want == m and np.isclose(l_got, l + float(np.sum(np.exp2(x)))):
                    hint = "subtract the running max inside exp: exp2(xs - m_new)"
                else:
                    hint = "l_new = l * exp2(m - m_new) + sum(exp2(xs - m_new))"
                fb.fail(f"{name}: l_new = {l_got:.6g}, expected {l_want:.6g}: {hint}")
            elif warns:
                fb.fail(f"{name}: right answer, but {warned(warns[0])}")
            else:
                fb.ok(f"{name}: ({m_want}, {l_want:.6g})")
    if fb.problems:
        return
    stream = np.random.default_rng(0).normal(500.0, 50.0, size=STREAM_LENGTH)
    label = f"a stream of {STREAM_LENGTH} values around 500, in blocks of {STREAM_BLOCK}"
    m, l = -inf, 0.0  # noqa: E741
    for i in range(0, STREAM_LENGTH, STREAM_BLOCK):
        block = stream[i:i + STREAM_BLOCK]
        with fb.case(f"{label}: at the block from value {i}") as case:
            got, warns = call_learner(fn, np.float64(m), np.float64(l), block.copy())
            m, l = _as_pair(got)  # noqa: E741
            if warns:
                fb.fail(f"{label}: at the block from value {i} {warned(warns[0])}")
        if case.failed or fb.problems:
            return  # stop at the first bad step
    ref_m = float(np.max(stream))
    ref_l = float(np.sum(np.exp2(stream - ref_m)))  # the two-pass result, in base 2
    if m == ref_m and np.isclose(l, ref_l, rtol=1e-10):
        fb.ok(f"{label}: same (m, l) as the two-pass result")
    else:
        fb.fail(f"{label}: got ({m:.6g}, {l:.6g}), the two-pass result is "
                f"({ref_m:.6g}, {ref_l:.6g})")


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
    """The learner's ``(m, l, acc)`` as a float64 PartialAttention, or a LearnerError."""
    try:
        m, l, acc = result  # noqa: E741
        return PartialAttention(np.asarray(m, dtype=np.float64), np.asarray(l, dtype=np.float64),
                                np.asarray(acc, dtype=np.float64))
    except (TypeError, ValueError):
        raise LearnerError(f"return (m, l, acc) or a PartialAttention, got "
                           f"{type(result)}") from None


def _empty_partial(n_q: int, d_v: int) -> PartialAttention:
    return PartialAttention(np.full(n_q, -np.inf), np.zeros(n_q), np.zeros((n_q, d_v)))


def _same_partial(p: PartialAttention, q: PartialAttention) -> bool:
    return (p.m.shape == q.m.shape and p.acc.shape == q.acc.shape
            and np.array_equal(p.m, q.m) and np.allclose(p.l, q.l, rtol=1e-12, atol=0)
            and np.allclose(p.acc, q.acc, rtol=1e-12, atol=1e-15))


def _shares(p: PartialAttention) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A state as a worker hands it over: ``(m, l, o)``, ``o = acc / l`` (0 where l = 0)."""
    safe = np.where(p.l > 0, p.l, 1.0)
    return p.m.copy(), p.l.copy(), np.where((p.l > 0)[:, None], p.acc / safe[:, None], 0.0)


def _from_shares(result: Any) -> tuple[PartialAttention, np.ndarray]:
    """The learner's ``(m, l, o)`` as the state ``(m, l, acc = o l)``, and ``o``."""
    p = _as_partial(result)
    if p.acc.shape[:1] != p.l.shape:
        raise LearnerError(f"o has shape {p.acc.shape}, l {p.l.shape}: one row of o per row")
    with np.errstate(all="ignore"):
        return PartialAttention(p.m, p.l, p.acc * p.l[:, None]), p.acc


@checker("merge of partial states",
         forbid=names(MERGES))
def check_merge(fb: Feedback, fn: Callable[..., Any]) -> None:
    """Check ``merge(a, b) -> (m, l, o)`` of two partial attention states as workers hand
    them over: ``(m, l, o)`` with the normalised output ``o = acc / l`` (0 for the empty
    state) in place of ``acc``."""
    a, b, s, v = _random_partials(0)
    whole = partial_attention(s, v)
    (_, _, o_a), (_, _, o_b) = _shares(a), _shares(b)
    with fb.case("two blocks"):
        got, warns = call_learner(fn, _shares(a), _shares(b))
        p, o = _from_shares(got)
        alpha = np.exp(a.m - whole.m)[:, None]
        beta = np.exp(b.m - whole.m)[:, None]
        if p.m.shape != whole.m.shape or p.acc.shape != whole.acc.shape:
            fb.fail(f"two blocks: shapes m {p.m.shape}, o {o.shape}; expected "
                    f"{whole.m.shape}, {whole.acc.shape}")
        elif np.isnan(p.m).any() or np.isnan(p.l).any() or np.isnan(o).any():
            fb.fail("two blocks: the merged state contains NaN")
        elif not np.array_equal(p.m, whole.m):
            fb.fail(f"two blocks: m = {fmt(p.m)}, expected max(m_a, m_b) = {fmt(whole.m)}")
        elif not np.allclose(p.l, whole.l, rtol=1e-12):
            hint = ("l_a and l_b must be rescaled to the new max: "
                    "l = l_a exp(m_a - m) + l_b exp(m_b - m)")
            if np.allclose(p.l, a.l + b.l):
                hint = "you added l_a + l_b without rescaling: " + hint
            fb.fail(f"two blocks with different maxima: l is wrong; {hint}")
        elif not np.allclose(p.acc, whole.acc, rtol=1e-12):
            weights = "o = (l_a exp(m_a - m) o_a + l_b exp(m_b - m) o_b) / l"
            if np.allclose(o, alpha * o_a + beta * o_b):
                hint = ("you merged o as if it were acc: o is already divided by its l, so it "
                        f"is an average of o_a and o_b weighted by their rescaled sums: {weights}")
            elif np.allclose(o, o_a + o_b) or np.allclose(o, (o_a + o_b) / 2):
                hint = f"weight o_a and o_b by their shares of the merged sum: {weights}"
            elif np.allclose(o, whole.acc):
                hint = f"that is the unnormalised acc: divide by the merged l, {weights}"
            else:
                hint = weights
            fb.fail(f"two blocks with different maxima: o is wrong; {hint}")
        elif warns:
            fb.fail(f"two blocks: right answer, but {warned(warns[0])}")
        else:
            fb.ok("two blocks with different maxima: equals attention over all keys")
    if fb.problems:
        return
    with fb.case("merge(b, a)"):
        if _same_partial(_from_shares(call_learner(fn, _shares(b), _shares(a))[0])[0], p):
            fb.ok("merge(b, a) == merge(a, b)")
        else:
            fb.fail("merge(b, a) differs from merge(a, b): the merge must be symmetric")
    empty = _empty_partial(*a.acc.shape)
    with fb.case("merging with the empty state (m=-inf, l=0, o=0)"):
        got, warns = call_learner(fn, _shares(a), _shares(empty))
        p3, o3 = _from_shares(got)
        if np.isnan(p3.l).any() or np.isnan(o3).any():
            fb.fail("merging with the empty state (m=-inf, l=0, o=0) gives NaN: "
                    "exp(-inf - m) is 0, but -inf - (-inf) is NaN when both are empty")
        elif not _same_partial(p3, a):
            fb.fail("merging with the empty state changed the state; it should be the "
                    "identity")
        elif warns:
            fb.fail(f"merging with the empty state: {warned(warns[0])}")
        else:
            fb.ok("merge(a, empty) == a")
    with fb.case("merge(empty, empty)"):
        got, warns = call_learner(fn, _shares(empty), _shares(empty))
        pe, oe = _from_shares(got)
        if np.isnan(pe.l).any() or np.isnan(oe).any():
            fb.fail("merge(empty, empty) gives NaN: guard exp(-inf - (-inf)) (for example "
                    "np.where(m == -inf, 0, exp(m_a - m))) and the division by l = 0 "
                    "(o = 0 there)")
        elif warns:
            fb.fail(f"merge(empty, empty): {warned(warns[0])}")
        else:
            fb.ok("merge(empty, empty) is empty, no NaN")


@checker("the empty state")
def check_empty_partial(fb: Feedback, fn: Callable[[int, int], Any]) -> None:
    """Check ``empty(n_q, d_v) -> (m, l, acc)``, the identity element of :func:`merge_partials`."""
    for n_q, d_v in [(3, 4), (1, 1), (5, 2)]:
        label = f"n_q = {n_q}, d_v = {d_v}"
        with fb.case(label):
            e = _as_partial(call_learner(fn, n_q, d_v)[0])
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
                fb.fail(f"{label}: l = {fmt(e.l)}; the empty set has no terms, so l = 0")
            elif (e.acc != 0).any():
                fb.fail(f"{label}: acc must be all zeros (no values have been summed)")
            elif not np.all(e.m == -np.inf):
                fb.fail(f"{label}: m = {fmt(e.m)} is not neutral: merging gives "
                        "m = max(m_p, m) which changes a state whose scores are all below it; "
                        "use -inf, the max of nothing")
            elif left is not None and _same_partial(left, p) and _same_partial(right, p):
                fb.ok(f"{label}: merge(empty, p) == p == merge(p, empty)")
            else:
                fb.fail(f"{label}: merging with your empty state changes p")


def merge_forgetting_acc_rescale(a: PartialAttention, b: PartialAttention) -> PartialAttention:
    """Merge two partial states (m, l, acc) over disjoint keys (the find-the-bug exercise)."""
    m = np.maximum(a.m, b.m)
    alpha, beta = np.exp(a.m - m), np.exp(b.m - m)
    return PartialAttention(m, a.l * alpha + b.l * beta, a.acc + b.acc)


@checker("counterexample for the buggy merge")
def check_merge_counterexample(fb: Feedback, a: Any, b: Any) -> None:
    """Check two partial states on which :func:`merge_forgetting_acc_rescale` gives a wrong output.

    ``a`` and ``b`` are (m, l, acc) states over disjoint keys, for example from
    :func:`flashlib.fast.online.partial_attention`.
    """
    try:
        pa, pb = _as_partial(a), _as_partial(b)
    except LearnerError:
        fb.fail("pass two states (m, l, acc), for example partial_attention(s_block, v_block)")
        return
    if pa.m.shape != pb.m.shape or pa.acc.shape != pb.acc.shape:
        fb.fail(f"the two states must describe the same queries: m {pa.m.shape} vs "
                f"{pb.m.shape}, acc {pa.acc.shape} vs {pb.acc.shape}")
        return
    if not (np.all(np.isfinite(pa.m)) and np.all(np.isfinite(pb.m))):
        fb.fail("use blocks with at least one unmasked score per row (finite m)")
        return
    try:
        with np.errstate(all="ignore"):
            right = finalize_partial(merge_partials(pa, pb))
            wrong = finalize_partial(merge_forgetting_acc_rescale(pa, pb))
    except ValueError as err:  # NaN, +inf or a negative l in a state
        fb.fail(f"these are not valid partial states: {err}")
        return
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
