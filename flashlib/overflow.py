"""Where ``exp`` overflows, and why softmax subtracts the maximum first.

The Overflow chapter finds, by computation, the largest ``x`` whose ``exp`` is still finite in a
floating-point format (and the smallest whose ``exp`` is still non-zero), shows the deliberately
unstable :func:`naive_softmax` turning large logits into NaN, and counts the three passes over
the scores that the safe softmax needs (``max``, ``exp``-and-sum, divide).  The stable softmax
itself is :func:`flashlib.softmax`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from flashlib._validate import check_float_dtype

__all__ = [
    "representable_bisect",
    "exp_overflow_threshold",
    "exp_underflow_threshold",
    "naive_softmax",
    "call_capturing_warnings",
    "PassRecord",
    "safe_softmax_passes",
]

_INT_FOR_FLOAT = {2: np.int16, 4: np.int32, 8: np.int64}


def _to_ordered(x: float, dt: np.dtype) -> int:
    """Map a float of ``dt`` to an integer that increases with the float's value."""
    bits = int(np.array(x, dtype=dt).view(_INT_FOR_FLOAT[dt.itemsize]))
    if bits >= 0:
        return bits
    sign_cleared = bits & np.iinfo(_INT_FOR_FLOAT[dt.itemsize]).max
    return -sign_cleared


def _from_ordered(k: int, dt: np.dtype) -> np.floating:
    """Inverse of :func:`_to_ordered` (``-0.0`` comes back as ``+0.0``)."""
    int_t = _INT_FOR_FLOAT[dt.itemsize]
    bits = k if k >= 0 else (-k) | int(np.iinfo(int_t).min)
    return np.array(bits, dtype=int_t).view(dt)[()]


def representable_bisect(
    predicate: Callable[[np.floating], bool], lo: float, hi: float, dtype: Any
) -> np.floating:
    """The largest value ``x`` of ``dtype`` in ``[lo, hi]`` with ``predicate(x)`` true.

    ``predicate`` must be true at ``lo``, false at ``hi`` and switch once in between.  The
    bisection runs over the *representable* values (their bit patterns, ordered), so it ends
    after at most ``8 * itemsize`` steps on two neighbouring floats.
    """
    dt = check_float_dtype(dtype, "dtype")
    a, b = _to_ordered(lo, dt), _to_ordered(hi, dt)
    if not predicate(_from_ordered(a, dt)) or predicate(_from_ordered(b, dt)):
        raise ValueError("predicate must be true at lo and false at hi")
    while b - a > 1:
        mid = (a + b) // 2
        if predicate(_from_ordered(mid, dt)):
            a = mid
        else:
            b = mid
    return _from_ordered(a, dt)


def _exp_in(dt: np.dtype, x: np.floating) -> np.floating:
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(np.array(x, dtype=dt))[()]


def exp_overflow_threshold(dtype: Any) -> float:
    """The largest ``x`` representable in ``dtype`` whose ``np.exp`` in ``dtype`` is finite.

    Found by bisection over the representable values between 0 and ``finfo.max`` (exp(0) is
    finite, exp(finfo.max) is not); ``log(finfo.max)`` is where it should land, and the tests
    check that it does.
    """
    dt = check_float_dtype(dtype, "dtype")
    x = representable_bisect(
        lambda t: bool(np.isfinite(_exp_in(dt, t))), 0.0, float(np.finfo(dt).max), dt
    )
    return float(x)


def exp_underflow_threshold(dtype: Any) -> float:
    """The smallest (most negative) ``x`` of ``dtype`` whose ``np.exp`` in ``dtype`` is not 0.

    Below it every ``exp`` rounds to zero (subnormal results still count as non-zero).
    """
    dt = check_float_dtype(dtype, "dtype")
    # Bisect on -x: "exp(-t) == 0" is false at t = 0 and true at t = finfo.max.
    t = representable_bisect(
        lambda s: bool(_exp_in(dt, -s) != 0), 0.0, float(np.finfo(dt).max), dt
    )
    return float(-t)


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


def call_capturing_warnings(
    fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> tuple[Any, list[str]]:
    """Run ``fn(*args, **kwargs)`` and return ``(result, messages)`` of the warnings it raised.

    Every warning is recorded (``simplefilter("always")``), formatted as ``"Category: text"``;
    numpy's error state is left as it is (by default overflow and invalid values warn, underflow
    is silent).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [f"{w.category.__name__}: {w.message}" for w in caught]


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
