"""The numerically stable softmax: subtract the row maximum before exponentiating.

:func:`safe_softmax` is the algorithm; :func:`softmax` the library version (any axis,
validated, masked ``-inf`` entries and all-``-inf`` rows handled).
"""

from __future__ import annotations

import numpy as np

from flashlib._validate import check_softmax_input

__all__ = ["safe_softmax", "softmax"]


def safe_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax of each row of x: (..., n), the maximum subtracted first so no exp overflows."""
    m = np.max(x, axis=-1, keepdims=True)  # (..., 1): the row maximum
    e = np.exp(x - m)  # (..., n): every exponent is <= 0, so every term is <= 1
    return e / np.sum(e, axis=-1, keepdims=True)


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
    with np.errstate(over="ignore"):  # x - m <= 0 may overflow to -inf (x near -finfo.max)
        e = np.exp(x - m)
    total = e.sum(axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)
