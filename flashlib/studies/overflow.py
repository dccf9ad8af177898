"""Where ``exp`` overflows, and why softmax subtracts the maximum first.

The Overflow chapter finds, by computation, the largest ``x`` whose ``exp`` is still finite in a
floating-point format (and the smallest whose ``exp`` is still non-zero), shows the deliberately
unstable :func:`naive_softmax` turning large logits into NaN, and counts the three passes over
the scores that the safe softmax needs (``max``, ``exp``-and-sum, divide).  The stable softmax
itself is :func:`flashlib.algorithms.safe_softmax` (the library version
:func:`flashlib.softmax`).

The chapter's deep dive on numpy 2's promotion rules: ``s / np.sqrt(d)`` with a float32 ``s``
is float64, because ``np.sqrt(d)`` is a float64 *numpy scalar* and numpy 2 no longer treats
numpy scalars as "weak" (NEP 50): :func:`scale_scores_promoting` and the fix,
:func:`scale_scores`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from flashlib.core.checks import check_float_dtype, check_int
from flashlib.core.constants import LN2

__all__ = [
    "exp_overflow_threshold",
    "exp_underflow_threshold",
    "naive_softmax",
    "PassRecord",
    "safe_softmax_passes",
    "scale_scores_promoting",
    "scale_scores",
]


def _exp_in(x: np.floating) -> np.floating:
    """``np.exp(x)`` in x's own dtype, overflow and underflow silent."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(x)


def exp_overflow_threshold(dtype: Any) -> float:
    """The largest ``x`` representable in ``dtype`` whose ``np.exp`` in ``dtype`` is finite.

    ``log(finfo.max)``, rounded to ``dtype``, is where it should be; rounding can land one value
    too high or too low, so walk from there over the neighbouring representable values
    (``np.nextafter``) until ``exp(x)`` is finite and ``exp`` of the next value is not.
    """
    dt = check_float_dtype(dtype, "dtype")
    up, down = dt.type(np.inf), dt.type(-np.inf)
    x = np.log(np.finfo(dt).max)  # a scalar of dtype dt
    while not np.isfinite(_exp_in(x)):
        x = np.nextafter(x, down)
    while np.isfinite(_exp_in(np.nextafter(x, up))):
        x = np.nextafter(x, up)
    return float(x)


def exp_underflow_threshold(dtype: Any) -> float:
    """The smallest (most negative) ``x`` of ``dtype`` whose ``np.exp`` in ``dtype`` is not 0.

    Below it every ``exp`` rounds to zero (subnormal results still count as non-zero).  The
    same walk as :func:`exp_overflow_threshold`, from ``log(tiny / 2) = log(tiny) - ln 2``
    (``tiny``: the smallest subnormal; half of it is where rounding to zero begins).
    """
    dt = check_float_dtype(dtype, "dtype")
    up, down = dt.type(np.inf), dt.type(-np.inf)
    x = np.log(np.finfo(dt).smallest_subnormal) - dt.type(LN2)
    while _exp_in(x) == 0:
        x = np.nextafter(x, up)
    while _exp_in(np.nextafter(x, down)) != 0:
        x = np.nextafter(x, down)
    return float(x)


def naive_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax straight from the definition, ``exp(x) / sum(exp(x))`` -- deliberately UNSTABLE.

    x: (..., n) floating array.  For large logits ``exp`` overflows to ``inf`` and ``inf / inf``
    gives NaN, with numpy's ``RuntimeWarning``s; for very negative logits every ``exp`` is 0 and
    ``0 / 0`` gives NaN.  It exists to be broken in the Overflow chapter; use
    :func:`flashlib.softmax`.
    """
    x = np.asarray(x)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


class PassRecord(NamedTuple):
    """One pass over the scores: what it computes, elements read and elements written."""

    name: str
    reads: int
    writes: int


def safe_softmax_passes(x: np.ndarray) -> tuple[np.ndarray, list[PassRecord]]:
    """The max-subtracted softmax of ``x`` (..., n) along the last axis, pass by pass.

    Returns the softmax and one :class:`PassRecord` per pass over the ``x.size`` scores:
    1. ``m = max(x)`` reads every score;
    2. ``e = exp(x - m)`` and ``l = sum(e)`` read every score and write ``e``;
    3. ``p = e / l`` reads ``e`` and writes ``p``.
    The three passes are why a plain softmax cannot be fused into one sweep over the keys.
    """
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have shape (..., n) with n >= 1, got {x.shape}")
    size = x.size
    passes = []
    m = x.max(axis=-1, keepdims=True)
    passes.append(PassRecord("max", size, 0))
    e = np.exp(x - m)
    l = e.sum(axis=-1, keepdims=True)  # noqa: E741  (the paper's name)
    passes.append(PassRecord("exp and sum", size, size))
    p = e / l
    passes.append(PassRecord("divide", size, size))
    return p, passes


def scale_scores_promoting(s: np.ndarray, d: int) -> np.ndarray:
    """``s / np.sqrt(d)`` -- the pitfall: for float32 (or float16) ``s`` the result is float64.

    ``np.sqrt(d)`` of a Python int is a ``np.float64`` scalar, and under NEP 50 (numpy >= 2)
    numpy scalars keep their dtype in mixed operations, so the division promotes ``s``.
    """
    return s / np.sqrt(d)


def scale_scores(s: np.ndarray, d: int) -> np.ndarray:
    """``s / sqrt(d)`` keeping ``s``'s dtype: ``sqrt(d)`` is cast to ``s.dtype`` first.

    The same division as :func:`scale_scores_promoting`, so timing the two isolates the cost of
    the promotion.  (flashlib's attention functions multiply by ``scale = 1/sqrt(d)`` cast the
    same way.)
    """
    s = np.asarray(s)
    if not np.issubdtype(s.dtype, np.floating):
        raise TypeError(f"s must be a floating-point array, got dtype {s.dtype}")
    d = check_int(d, "d", minimum=1)
    return s / s.dtype.type(np.sqrt(d))
