"""Checks of single arguments, shared by every public function: dtypes, integers, arrays.

Each check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong value
or shape) with a message that names the argument and says what was expected.  Arrays may be
anything ``np.asarray`` reads (lists, other byte orders, read-only or broadcast views); masked
arrays and ``np.matrix`` are refused, because their semantics differ from an ndarray's.  The
checks of a whole attention call are :mod:`flashlib.core.problem`'s.
"""

from __future__ import annotations

import sys

import numpy as np

__all__ = [
    "FLOAT_DTYPES",
    "MASKED_HINT_ATTENTION",
    "MASKED_HINT_SCORES",
    "as_array",
    "as_float_array",
    "check_float_dtype",
    "check_int",
    "check_flag",
    "check_block",
    "check_finite",
    "check_order",
    "check_rng",
    "check_shape",
]


FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


#: What to do instead of passing a masked array, per kind of argument.
MASKED_HINT_ATTENTION = (
    "pass its data (np.ma.getdata) and say which keys each query may see with mask= "
    "(True = may attend)"
)


MASKED_HINT_SCORES = "fill the masked entries with -inf instead (np.ma.filled(x, -np.inf))"


def _refuse_array_subclasses(x: object, name: str, masked_hint: str) -> None:
    """Masked arrays and matrices look like arrays but do not behave like them."""
    ma = sys.modules.get("numpy.ma")  # not np.ma: that would import numpy.ma (1 MB) lazily
    if ma is not None and isinstance(x, ma.MaskedArray):
        raise TypeError(f"{name} is a numpy masked array, which is not supported: {masked_hint}")
    if isinstance(x, np.matrix):
        raise TypeError(
            f"{name} is a numpy matrix, which is not supported (its * and reductions differ "
            f"from an ndarray's): pass np.asarray({name})"
        )


def as_array(x: object, name: str, masked_hint: str) -> np.ndarray:
    """``x`` as a plain ndarray (subclasses dropped, big-endian floats made native); None is
    refused by name (numpy would read it as an object array)."""
    if x is None:
        raise TypeError(f"{name} must be an array, got None")
    _refuse_array_subclasses(x, name, masked_hint)
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists, tensors that need .detach(), ...
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}: {exc}") from exc
    if arr.dtype.kind == "f" and not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))  # same values, native byte order
    return arr


def as_float_array(x: object, name: str, masked_hint: str = MASKED_HINT_ATTENTION) -> np.ndarray:
    """``x`` as an ndarray of float16/32/64 (any byte order), or a TypeError naming ``name``.

    Masked arrays and ``np.matrix`` are refused; other ndarray subclasses are viewed as
    ndarrays.
    """
    arr = as_array(x, name, masked_hint)
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype (float16, float32 or float64), got {arr.dtype}"
        )
    return arr


def check_float_dtype(dtype: object, name: str = "dtype") -> np.dtype:
    """``dtype`` (a string, a type or a ``np.dtype``) as one of :data:`FLOAT_DTYPES`, or a
    TypeError naming ``name`` (integers, booleans, ``longdouble``, non-dtypes and None, which
    numpy would read as float64, are refused)."""
    if dtype is None:
        raise TypeError(f"{name} must be float16, float32 or float64, got None")
    try:
        dt = np.dtype(dtype)
    except TypeError as err:
        raise TypeError(
            f"{name} must be float16, float32 or float64, got {dtype!r}"
        ) from err
    if dt.kind == "f" and not dt.isnative:
        dt = dt.newbyteorder("=")  # '>f8' on a little-endian machine: float64
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, float32 or float64, got {dt}")
    return dt


def check_int(value: object, name: str, minimum: int | None = None) -> int:
    """``value`` as a Python int: a Python or numpy integer (``bool`` and floats are refused,
    a TypeError naming ``name``), at least ``minimum`` when given (else a ValueError)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}")
        raise ValueError(f"{name} must be {kind}, got {value}")
    return int(value)


def check_flag(value: object, name: str) -> bool:
    """``value`` as a bool: True or False (numpy's too); anything else, None included, is a
    TypeError naming ``name`` (a truthy string or array would otherwise pass silently)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_block(value: object, name: str) -> int:
    """A block size (tile side): a positive integer, honoured as given.  A tile is
    ``min(block, n)`` on each side, so a block larger than the problem costs nothing extra."""
    return check_int(value, name, minimum=1)


def check_finite(x: np.ndarray, name: str) -> None:
    """Refuse NaN and infinities, which would otherwise turn into NaN outputs."""
    if not np.isfinite(x).all():
        raise ValueError(f"{name} must contain only finite values (found NaN or inf)")


def check_order(order: object, n: int) -> list[int]:
    """A permutation of range(n), as a list of Python ints."""
    try:
        items = list(order)  # type: ignore[call-overload]
    except TypeError as err:
        raise TypeError(f"order must be a sequence of integers, got {order!r}") from err
    if any(isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) for i in items):
        raise TypeError(f"order must be a sequence of integers, got {order!r}")
    items = [int(i) for i in items]
    if sorted(items) != list(range(n)):
        raise ValueError(f"order must be a permutation of range({n}), got {items}")
    return items


def check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator (np.random.default_rng), got {rng!r}")
    return rng


def check_shape(shape: object, name: str = "shape") -> tuple[int, ...]:
    """A shape: a non-negative integer or a tuple of them."""
    items = (shape,) if isinstance(shape, (int, np.integer)) else shape
    if not isinstance(items, (tuple, list)) or any(
        isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0
        for n in items
    ):
        raise ValueError(f"{name} must be a tuple of non-negative integers, got {shape!r}")
    items = tuple(int(n) for n in items)
    if any(n >= 2**63 for n in items):  # numpy's sizes are int64
        raise ValueError(f"{name} must have sizes below 2**63, got {shape!r}")
    return items
