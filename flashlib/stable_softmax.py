"""The numerically stable softmax: subtract the row maximum before exponentiating."""

from __future__ import annotations

import numpy as np

from flashlib._validate import as_float_array, check_int

__all__ = ["softmax"]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``exp(x - max(x)) / sum(exp(x - max(x)))`` along ``axis``; same shape and dtype as ``x``.

    x: (..., n) float16/32/64.  Entries equal to ``-inf`` get probability 0; a slice that is
    entirely ``-inf`` (a row that may attend to nothing) gives all zeros instead of NaN.
    ``+inf`` and NaN entries are refused.
    """
    x = as_float_array(x, "x")
    axis = check_int(axis, "axis")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for x with {x.ndim} dimensions")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError("x must not contain NaN or +inf")
    if x.shape[axis] == 0:
        return x.copy()
    m = x.max(axis=axis, keepdims=True)
    m[np.isneginf(m)] = 0  # an all -inf slice: exp(-inf - 0) = 0, not exp(nan)
    e = np.exp(x - m)
    total = e.sum(axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)
