"""The checkers of the overflow and online-softmax chapters accept a right answer and reject
typical wrong ones, specifically (flashlib.book.exercises.overflow and .online_softmax).  The
wrong answers that only need their hints checked are declared beside the checkers
(flashlib.book.exercises.mistakes.overflow and .online_softmax) and run by
test_declared_mistakes.py; here are the cases that check more than a hint."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.algorithms import merge_states, safe_softmax
from flashlib.book.exercises import online_softmax as ol
from flashlib.book.exercises import overflow as ov
from flashlib.fast.online import PartialAttention, merge_partials, partial_attention
from flashlib.studies.overflow import exp_overflow_threshold, naive_softmax, safe_softmax_passes
from tests.helpers import assert_fails_with, learner_copy, text

ml_dtypes = pytest.importorskip("ml_dtypes")

# What a learner who copied the library's code hands in (the library's own functions are
# refused where the exercise asks for them: test_the_library_itself_is_refused)
LIBRARY_MERGE = merge_partials
merge_partials = learner_copy(merge_partials)
exp_overflow_threshold = learner_copy(exp_overflow_threshold)
safe_softmax = learner_copy(safe_softmax)

# ---- stable softmax -------------------------------------------------------------------------

def good_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), x.dtype.type(0), m)  # a row that sees no key
    e = np.exp(x - m)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def test_stable_softmax_accepts_correct():
    fb = ov.check_stable_softmax(good_softmax)
    assert fb.passed and bool(fb), text(fb)
    assert "PASSED" in text(fb)


def test_stable_softmax_refuses_the_algorithm_box_on_a_row_of_minus_inf():
    """Issue 24/25: the chapter's safe_softmax (the algorithm box) passed all 8 checks although
    it returns NaN on [-inf, -inf]; now that row is checked, with its own diagnosis."""
    fb = ov.check_stable_softmax(safe_softmax)
    assert_fails_with(fb, "returns NaN for x = [-inf, -inf]", "-inf - (-inf) is NaN",
                      "Where m is -inf use 0")
    assert len(fb.problems) == 2  # [-inf, -inf] and the batch with one such row


# ---- overflow threshold ---------------------------------------------------------------------

def threshold(dtype):
    """The exercise's answer: the walk over the format's own values, from ml_dtypes' finfo
    (which knows bfloat16; numpy's does not)."""
    dt = np.dtype(dtype)
    x = dt.type(np.log(float(ml_dtypes.finfo(dt).max)))
    with np.errstate(over="ignore"):
        while not np.isfinite(np.exp(x)):
            x = np.nextafter(x, dt.type(-np.inf))
        while np.isfinite(np.exp(np.nextafter(x, dt.type(np.inf)))):
            x = np.nextafter(x, dt.type(np.inf))
    return float(x)


def test_overflow_threshold_accepts_number_and_function():
    fb = ov.check_overflow_threshold(threshold)
    assert fb.passed, text(fb)
    assert "bfloat16: 88.5 is right" in text(fb)
    assert ov.check_overflow_threshold(exp_overflow_threshold(np.float16)).passed
    assert ov.check_overflow_threshold(88.72283172607422, "float32").passed


def test_overflow_threshold_is_not_answered_by_what_the_chapter_prints_or_imports():
    """Issue 25: the three printed thresholds, hard-coded, passed 2.2; now bfloat16 is asked
    too, a value merely rounding to its threshold is refused, and the library function (which
    knows numpy's formats only) fails there."""
    printed = {"float16": 11.0859375, "float32": 88.72283172607422, "float64": 709.782712893384}
    hard_coded = ov.check_overflow_threshold(lambda dt: printed.get(np.dtype(dt).name,
                                                                    printed["float32"]))
    assert_fails_with(hard_coded, "88.72283172607422 is not a bfloat16 value")
    assert "88.5" not in text(hard_coded)  # the refusal does not say the answer
    assert_fails_with(ov.check_overflow_threshold(exp_overflow_threshold), "bfloat16")


def test_overflow_threshold_without_ml_dtypes_says_bfloat16_is_not_checked(monkeypatch):
    monkeypatch.setattr(ov, "_bfloat16", lambda: None)
    fb = ov.check_overflow_threshold(exp_overflow_threshold)
    assert fb.passed and "bfloat16 not checked" in text(fb)


# ---- memory of S ----------------------------------------------------------------------------

def test_score_bytes():
    """Its mistakes: flashlib.book.exercises.mistakes.overflow (test_declared_mistakes.py)."""
    assert ov.check_score_bytes(lambda n, dt: n * n * np.dtype(dt).itemsize).passed
    # a fixed 4 bytes equals "S and P together" on the float16 cases: diagnosed on every case
    assert "S and P" not in str(ov.check_score_bytes(lambda n, dt: n * n * 4))


# ---- row statistics in the input's dtype ----------------------------------------------------

def row_stats(s, *, m_dtype="s", l_dtype="s", m_start=-np.inf, shift="final"):
    """Exercise 2.4's function, right by default, with its usual mistakes by keyword."""
    dtype_of = {"s": s.dtype, "default": None}
    m = np.full(s.shape[0], m_start, dtype=dtype_of[m_dtype])  # pass 1
    for j in range(s.shape[1]):
        m = np.maximum(m, s[:, j])
    l = np.zeros(s.shape[0], dtype=dtype_of[l_dtype])  # noqa: E741  pass 2
    running = np.full(s.shape[0], -np.inf, dtype=s.dtype)
    for j in range(s.shape[1]):
        running = np.maximum(running, s[:, j])
        shifted_by = {"final": m, "none": 0, "running": running}[shift]
        with np.errstate(over="ignore"):
            l = l + np.exp(s[:, j] - shifted_by)  # noqa: E741
    return m, l


def test_row_stats_accepts_the_fix():
    fb = ov.check_row_stats(row_stats)
    assert fb.passed, text(fb)
    # computed in float64 and cast back: more rounding-safe, still the input's dtype
    assert ov.check_row_stats(lambda s: tuple(x.astype(s.dtype) for x in row_stats(
        s.astype(np.float64)))).passed


def test_row_stats_is_not_answered_by_what_the_chapter_shows():
    """Nothing the overflow chapter imports or shows with one argument passes 2.4."""
    for fn in (safe_softmax, naive_softmax, safe_softmax_passes, exp_overflow_threshold):
        assert not ov.check_row_stats(fn).passed, fn.__name__


# ---- online update --------------------------------------------------------------------------

def good_update(m, l, xs):  # noqa: E741
    if len(xs) == 0:
        return m, l
    m_new = max(m, np.max(xs))
    if m_new == -np.inf:
        return m_new, 0.0
    return m_new, l * np.exp2(m - m_new) + np.sum(np.exp2(xs - m_new))


def test_online_update_accepts_correct():
    fb = ol.check_online_update(good_update)
    assert fb.passed, text(fb)
    assert "two-pass" in text(fb)


def update_failing_on_stream(kind):
    """An update right on the small cases (whose m is at most 2 or at least 1000) that
    misbehaves on the stream of STREAM_LENGTH values around 500."""
    def update(m, l, xs):  # noqa: E741
        if 100 < m < 900:
            if kind == "raise":
                raise ZeroDivisionError("boom on the stream")
            if kind == "none":
                return None
            if kind == "warn":
                np.float64(1e308) * np.float64(10.0)  # RuntimeWarning: overflow
        return good_update(m, l, xs)
    return update


@pytest.mark.parametrize(("kind", "phrase"), [
    ("raise", "your function raised ZeroDivisionError: boom on the stream"),
    ("none", "return a pair (m_new, l_new), got None"),
    ("warn", "numpy warned 'RuntimeWarning: overflow"),
])
def test_online_update_reports_errors_on_the_stream(kind, phrase):
    fb = ol.check_online_update(update_failing_on_stream(kind))
    assert_fails_with(fb, f"a stream of {ol.STREAM_LENGTH} values around 500", phrase)
    assert "first block" in text(fb)  # the small cases passed; only the stream failed
    assert len(fb.problems) == 1  # stops at the first bad step


# ---- merge ----------------------------------------------------------------------------------

def merge_shares(a, b):
    """A right merge of states handed over normalised, (m, l, o = acc / l)."""
    m = np.maximum(a[0], b[0])
    safe = np.where(np.isneginf(m), 0.0, m)
    wa, wb = a[1] * np.exp(a[0] - safe), b[1] * np.exp(b[0] - safe)
    l = wa + wb  # noqa: E741
    o = wa[:, None] * a[2] + wb[:, None] * b[2]
    return m, l, np.where((l > 0)[:, None], o / np.where(l > 0, l, 1.0)[:, None], 0.0)


def test_merge_accepts_a_right_merge_of_normalised_states():
    fb = ol.check_merge(merge_shares)
    assert fb.passed, text(fb)


def test_a_copy_of_the_chapters_merge_states_fails():
    """Issue 35: the merge_states the chapter shows merges (m, l, acc); the exercise's states
    carry o = acc / l, which it merges as if it were acc."""
    from flashlib.book.exercises.registry import learner_copy

    assert_fails_with(ol.check_merge(learner_copy(merge_states)), "as if it were acc")


# ---- empty state ----------------------------------------------------------------------------

def test_empty_partial():
    def good(n_q, d_v):
        return PartialAttention(np.full(n_q, -np.inf), np.zeros(n_q), np.zeros((n_q, d_v)))

    assert ol.check_empty_partial(good).passed


# ---- counterexample -------------------------------------------------------------------------

def test_merge_counterexample():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((4, 3))
    a = partial_attention(np.array([[0.0, 1.0]]), v[:2])
    b = partial_attention(np.array([[5.0, 2.0]]), v[2:])
    assert ol.check_merge_counterexample(a, b).passed


@pytest.mark.parametrize(("checker", "fn"), [
    *[(checker, lambda *args: None)
      for checker in (ov.check_stable_softmax, ol.check_online_update, ol.check_merge,
                      ol.check_empty_partial, ov.check_score_bytes, ov.check_row_stats,
                      ov.check_overflow_threshold)],
    (ov.check_overflow_threshold, lambda dtype: 1 / 0),
    *[(ol.check_online_update, update_failing_on_stream(kind))
      for kind in ("raise", "none", "warn")],
])
def test_checkers_report_without_raising(checker, fn):
    fb = checker(fn)
    assert not fb.passed and "NOT YET" in text(fb)


def test_the_library_itself_is_refused():
    """merge_partials passed 3.2 (issue 25): the library's merge, passed or called, is
    refused with a clear message."""
    assert_fails_with(ol.check_merge(LIBRARY_MERGE), "refused: you passed flashlib's "
                      "`merge_partials`, which computes the answer")
    assert_fails_with(ol.check_merge(lambda a, b: LIBRARY_MERGE(a, b)),
                      "refused: your code calls flashlib's `merge_partials`")
