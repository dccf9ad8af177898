"""flash-attn's accuracy rule, as one helper: judge a kernel against plain attention.

A low-precision kernel cannot match a float64 reference exactly, and an absolute tolerance
(``atol=1e-3``) says nothing about whether its error is reasonable.  flash-attn's own tests
judge it relatively: compute a float32 (here float64) reference, compute the same attention
the plain way in the *same* low precision (standard attention as PyTorch runs it), and accept
the kernel when

    err(kernel) <= factor * err(plain) ,   factor = 2,  both errors against the reference,

with ``err`` the largest absolute difference.  :func:`assert_error_within` is that rule; the
book's own low-precision tests and the Precision chapter use it.

The floor.  When the plain implementation happens to be (almost) exact, ``2 * err(plain)`` is
tighter than any rounding of the result allows, so the bound is ``max(factor * err(plain),
floor)``.  :func:`error_floor` gives the floor these tests use, made explicit:

- a result stored in a dtype cannot be closer to the exact value than rounding it, half an ulp
  ``eps / 2 * |o|``; the floor is a few such roundings of an O(1) output: ``1e-6`` for float32
  (about 8 eps: float32 results come out of long float32 sums), ``1e-3`` for float16 (about
  one eps: two roundings of a value in [1, 2)), one ``eps`` for any other dtype (bfloat16,
  float8: ``ml_dtypes`` needed);
- times ``max(1, max|reference|)``: outputs above 1 have proportionally wider ulps;
- and at least ``eps * max(1, logit_max) * max(1, max|reference|)``: rounding a logit ``s`` to
  the dtype moves it by ``eps/2 * |s|``, which moves the output by up to that times ``max|v|``.

Pass ``floor=0.0`` for the bare rule, or a number for a floor of your own.

Needs numpy only (``ml_dtypes`` only to name a bfloat16 or float8 dtype).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "ErrorStats",
    "RuleCheck",
    "FLOOR",
    "error_stats",
    "error_floor",
    "assert_error_within",
]

#: The floor of an O(1) output in float32 and float16 (see the module docstring); any other
#: dtype's floor is its machine epsilon.
FLOOR = {np.dtype(np.float32): 1e-6, np.dtype(np.float16): 1e-3}

_METRICS = ("max", "rms")


class ErrorStats(NamedTuple):
    """The error of an array against a reference: the largest and the root-mean-square
    absolute difference (both 0.0 for empty arrays)."""

    max: float
    rms: float


class RuleCheck(NamedTuple):
    """What :func:`assert_error_within` compared: ``err <= bound = max(factor * plain, floor)``."""

    err: float
    plain: float
    floor: float
    bound: float

    @property
    def ratio(self) -> float:
        """``err / plain`` (``inf`` when plain is exact and err is not, 0.0 when both are)."""
        return _ratio(self.err, self.plain)


def _as_float64(x: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be an array of numbers, got {type(x).__name__}") from exc
    if arr.dtype.kind not in "fiu" and arr.dtype.kind != "V":
        raise TypeError(f"{name} must be an array of floats, got dtype {arr.dtype}")
    return arr.astype(np.float64)  # bfloat16/float8 arrays (kind "V") convert exactly


def error_stats(out: Any, ref: Any) -> ErrorStats:
    """Max and RMS of ``|out - ref|``, computed in float64.

    out, ref: arrays of the same shape (any float dtype, bfloat16 and float8 included).
    NaN or inf in ``out`` gives an infinite or NaN error, never a warning.
    """
    a, b = _as_float64(out, "out"), _as_float64(ref, "ref")
    if a.shape != b.shape:
        raise ValueError(f"out and ref must have the same shape, got {a.shape} and {b.shape}")
    if a.size == 0:
        return ErrorStats(0.0, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - b)
        return ErrorStats(float(np.max(diff)), float(np.sqrt(np.mean(diff * diff))))


def _eps(dtype: Any) -> tuple[np.dtype, float]:
    """(np.dtype, machine epsilon) of a float16/32/64 dtype, or of a bfloat16/float8 dtype
    when ml_dtypes is installed; TypeError naming ``dtype`` otherwise."""
    try:
        dt = np.dtype(dtype)
        if dt.kind == "f":
            return dt, float(np.finfo(dt).eps)
    except TypeError:
        dt = None
    try:
        import ml_dtypes
    except ImportError as exc:
        raise TypeError(f"dtype must be float16, float32 or float64, got {dtype!r} "
                        "(bfloat16 and float8 need ml_dtypes: pip install ml_dtypes)") from exc
    try:
        dt = np.dtype(dtype)
        return dt, float(ml_dtypes.finfo(dt).eps)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype!r}") from exc


def error_floor(dtype: Any, ref: Any, logit_max: float = 1.0) -> float:
    """The floor of the rule for results in ``dtype`` (see the module docstring):
    ``max(FLOOR[dtype] * max(1, max|ref|), eps * max(1, logit_max) * max(1, max|ref|))``.

    ref: the float64 reference output; logit_max: the largest ``|scale * q k^T|``.
    """
    dt, eps = _eps(dtype)
    r = _as_float64(ref, "ref")
    ref_max = float(np.max(np.abs(r))) if r.size else 0.0
    if not np.isfinite(ref_max):
        raise ValueError("ref must be finite")
    grow = max(1.0, ref_max)
    return max(FLOOR.get(dt, eps) * grow, eps * max(1.0, float(logit_max)) * grow)


def _ratio(err: float, plain: float) -> float:
    if plain > 0:
        return err / plain
    return 0.0 if err == 0 else float("inf")


def _metric(metric: str) -> int:
    if metric not in _METRICS:
        raise ValueError(f"metric must be 'max' or 'rms', got {metric!r}")
    return _METRICS.index(metric)


def assert_error_within(
    out: Any,
    baseline: Any,
    ref: Any,
    *,
    factor: float = 2.0,
    floor: float | None = None,
    dtype: Any = None,
    logit_max: float = 1.0,
    metric: str = "max",
    label: str = "",
) -> RuleCheck:
    """flash-attn's rule: ``err(out) <= max(factor * err(baseline), floor)``, or AssertionError.

    out: the kernel's result; baseline: plain attention computed in the same low precision;
    ref: the float32/float64 reference (all three of one shape, e.g. (..., n_q, d_v)).
    floor: ``None`` for :func:`error_floor` of ``dtype`` (default: out's dtype), ``0.0`` for
    the bare rule, or a number.  The error must also be finite.
    Returns the :class:`RuleCheck` (err, plain, floor, bound) when the rule holds.
    """
    if not isinstance(factor, (int, float, np.floating, np.integer)) or not factor > 0:
        raise ValueError(f"factor must be a positive number, got {factor!r}")
    k = _metric(metric)
    err = error_stats(out, ref)[k]
    plain = error_stats(baseline, ref)[k]
    if floor is None:
        floor = error_floor(np.asarray(out).dtype if dtype is None else dtype, ref, logit_max)
    elif not np.isfinite(floor) or floor < 0:
        raise ValueError(f"floor must be a non-negative number or None, got {floor!r}")
    bound = max(float(factor) * plain, float(floor))
    check = RuleCheck(err, plain, float(floor), bound)
    if not (err <= bound):  # also catches a NaN error
        where = f"{label}: " if label else ""
        raise AssertionError(
            f"{where}{metric} error {err:.3g} > bound {bound:.3g} = max({factor:g} x plain "
            f"{plain:.3g}, floor {float(floor):.3g})")
    return check
