"""The overflow chapter's declared mistakes (flashlib.book.exercises.overflow)."""

from __future__ import annotations

import numpy as np

from flashlib.book.exercises.overflow import (
    check_overflow_threshold,
    check_row_stats,
    check_score_bytes,
    check_stable_softmax,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes


def _right_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), x.dtype.type(0), m)
    e = np.exp(x - m)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


# ---- 2.1 stable softmax ----------------------------------------------------------------------

def naive_softmax(x):
    return np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)


def global_sum(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum()


def promoting(x):
    return _right_softmax(x.astype(np.float64))


def max_fixed_only(x):  # m repaired, but l = 0 and 0 / 0 is NaN
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), x.dtype.type(0), m)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def clamped(x):  # -inf replaced by the most negative finite number: a uniform row
    return _right_softmax(np.maximum(x, np.finfo(x.dtype).min))


def the_algorithm_box(x):  # the chapter's safe_softmax: NaN on a row of -inf
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def repaired_afterwards(x):
    with np.errstate(invalid="warn"):
        return np.nan_to_num(the_algorithm_box(x))


declare_mistakes(
    check_stable_softmax,
    Mistake("no max subtracted", (naive_softmax,),
            ("returns NaN for x = [1000, 0]", "subtract the max first", "underflows to 0")),
    Mistake("one sum over the whole array", (global_sum,), ("normalise along the last axis",)),
    Mistake("computed in float64", (promoting,), ("returns float64 for a float32 input",)),
    Mistake("NaN on a row of -inf", (the_algorithm_box,),
            ("returns NaN for x = [-inf, -inf]", "-inf - (-inf) is NaN",
             "Where m is -inf use 0")),
    Mistake("0 / 0 on a row of -inf", (max_fixed_only,), ("0 / 0 is NaN",
                                                          "Divide only where l > 0")),
    Mistake("a uniform row for no key", (clamped,),
            ("return zeros for it", "not a distribution over keys it may not see")),
    Mistake("NaN repaired afterwards", (repaired_afterwards,),
            ("right answer, but numpy warned", "repairing it afterwards still warns")),
)


# ---- 2.2 overflow threshold ------------------------------------------------------------------

def _right_threshold(dtype):
    import ml_dtypes

    dt = np.dtype(dtype)
    x = dt.type(np.log(float(ml_dtypes.finfo(dt).max)))
    with np.errstate(over="ignore"):
        while not np.isfinite(np.exp(x)):
            x = np.nextafter(x, dt.type(-np.inf))
        while np.isfinite(np.exp(np.nextafter(x, dt.type(np.inf)))):
            x = np.nextafter(x, dt.type(np.inf))
    return float(x)


def log_of_max_in_the_format(dtype):
    import ml_dtypes

    return float(np.log(np.asarray(ml_dtypes.finfo(dtype).max, dtype=dtype)))


def printed_thresholds(dtype):  # the three thresholds the chapter prints, hard-coded
    printed = {"float16": 11.0859375, "float32": 88.72283172607422,
               "float64": 709.782712893384}
    return printed.get(np.dtype(dtype).name, printed["float32"])


def numpy_finfo(dtype):
    if np.dtype(dtype).name != "bfloat16":
        return _right_threshold(dtype)
    return float(np.log(np.finfo(dtype).max))


declare_mistakes(
    check_overflow_threshold,
    Mistake("log of float16's max, rounded up", (float(np.log(np.finfo(np.float16).max)),),
            ("too large", "is inf in float16")),
    Mistake("too small", (11.0,), ("too small",)),
    Mistake("log of the max in the format", (log_of_max_in_the_format,),
            ("float16: too large",)),
    Mistake("not a number", ("eleven",), ("expected a number",)),
    Mistake("the printed thresholds, hard-coded", (printed_thresholds,),
            ("88.72283172607422 is not a bfloat16 value",)),
    Mistake("numpy's finfo on bfloat16", (numpy_finfo,),
            ("np.finfo does not know bfloat16: ml_dtypes.finfo knows every format",)),
)


# ---- 2.3 bytes of S --------------------------------------------------------------------------

def elements(n, dtype):
    return n * n


def four_bytes(n, dtype):
    return n * n * 4


def bits(n, dtype):
    return 8 * n * n * np.dtype(dtype).itemsize


def s_and_p(n, dtype):
    return 2 * n * n * np.dtype(dtype).itemsize


def one_row(n, dtype):
    return n * np.dtype(dtype).itemsize


def itemsize_of_the_argument(n, dtype):
    return n * n * dtype.itemsize


declare_mistakes(
    check_score_bytes,
    Mistake("the number of elements", (elements,), ("number of elements",)),
    Mistake("always 4 bytes", (four_bytes,), ("assumes 4 bytes",)),
    Mistake("in bits", (bits,), ("in bits",)),
    Mistake("S and P together", (s_and_p,), ("S and P together",)),
    Mistake("one row", (one_row,), ("one row",)),
    Mistake("dtype.itemsize of a string", (itemsize_of_the_argument,), ("np.dtype(dtype)",)),
)


# ---- 2.4 row statistics in the input's dtype -------------------------------------------------

def _row_stats(s, *, m_dtype="s", l_dtype="s", m_start=-np.inf, shift="final"):
    """Exercise 2.4's function, right by default, with its usual mistakes by keyword."""
    dtype_of = {"s": s.dtype, "default": None}
    m = np.full(s.shape[0], m_start, dtype=dtype_of[m_dtype])  # pass 1
    for j in range(s.shape[1]):
        m = np.maximum(m, s[:, j])
    l = np.zeros(s.shape[0], dtype=dtype_of[l_dtype])  # pass 2
    running = np.full(s.shape[0], -np.inf, dtype=s.dtype)
    for j in range(s.shape[1]):
        running = np.maximum(running, s[:, j])
        shifted_by = {"final": m, "none": 0, "running": running}[shift]
        with np.errstate(over="ignore"):
            l = l + np.exp(s[:, j] - shifted_by)
    return m, l


def the_starter(s):  # np.full and np.zeros without a dtype
    return _row_stats(s, m_dtype="default", l_dtype="default")


def l_in_float64(s):
    return _row_stats(s, l_dtype="default")


def m_starts_at_0(s):
    return _row_stats(s, m_start=0.0)


def not_shifted(s):
    return _row_stats(s, shift="none")


def shifted_by_the_running_max(s):
    return _row_stats(s, shift="running")


def trailing_axis(s):
    return tuple(x[:, None] for x in _row_stats(s))


def m_only(s):
    return _row_stats(s)[0]


def in_place(s):
    s -= s.max(axis=-1, keepdims=True)
    return _row_stats(s)


declare_mistakes(
    check_row_stats,
    Mistake("the starter (float64 m and l)", (the_starter,),
            ("m and l are float64 for a float32 s", "np.full, np.zeros", "dtype=s.dtype")),
    Mistake("l in float64", (l_in_float64,), ("but l is float64 for a float32 s",)),
    Mistake("m starts at 0", (m_starts_at_0,), ("m starts at 0", "start it at -inf")),
    Mistake("exp(s) not shifted", (not_shifted,), ("l sums exp(s), not exp(s - m)",)),
    Mistake("shifted by the running max", (shifted_by_the_running_max,),
            ("the maximum found so far", "pass 2 needs the final m")),
    Mistake("a trailing axis of 1", (trailing_axis,), ("drop the trailing axis of 1",)),
    Mistake("m only", (m_only,), ("expected the pair (m, l)",)),
    Mistake("changes its input", (in_place,), ("changed its input s",)),
)
