"""The numerically stable softmax, the library version (the teaching one is
:func:`flashlib.algorithms.safe_softmax`): any axis, validated, masked ``-inf`` entries and
all-``-inf`` rows handled."""

from __future__ import annotations

import numpy as np

from flashlib.core.checks import MASKED_HINT_SCORES, as_float_array, check_int

__all__ = ["softmax"]


def check_softmax_input(x: object, axis: object) -> tuple[np.ndarray, int]:
    """:func:`flashlib.softmax`'s arguments: x a float16/32/64 array without NaN or +inf
    (-inf is a masked entry), axis an integer in range."""
    x = as_float_array(x, "x", MASKED_HINT_SCORES)
    axis = check_int(axis, "axis")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for x with {x.ndim} dimensions")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError("x must not contain NaN or +inf")
    return x, int(axis)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``exp(x - max(x)) / sum(exp(x - max(x)))`` along ``axis``; same shape and dtype as ``x``.

    x: (..., n) float16/32/64.  Entries equal to ``-inf`` get probability 0; a slice that is
    entirely ``-inf`` (a row that may attend to nothing) gives all zeros instead of NaN.
    ``+inf`` and NaN entries are refused.
    """
    x, axis = check_softmax_input(x, axis)
    if x.size == 0:
        return x.copy()
    m = x.max(axis=axis, keepdims=True)
    m[np.isneginf(m)] = 0  # an all -inf slice: exp(-inf - 0) = 0, not exp(nan)
    # x - m <= 0 may overflow to -inf (x near -finfo.max); exp(-800) is 0, not an error
    with np.errstate(over="ignore", under="ignore"):
        e = np.exp(x - m)
        total = e.sum(axis=axis, keepdims=True)
        return np.divide(e, total, out=np.zeros_like(e), where=total > 0)
