"""Input checks shared by every attention function.

Each check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong value or
shape) with a message that names the argument and says what was expected.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class Problem(NamedTuple):
    """The validated inputs of one attention call, flattened to a single leading batch axis.

    q: (B, n_q, d)   k: (B, n_k, d)   v: (B, n_k, d_v)   with B = prod(batch_shape)
    mask: None, or a boolean view broadcast to batch_shape + (n_q, n_k) (no copy is made)
    offset: None (not causal) or the causal diagonal: row i sees keys j <= i + offset
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    batch_shape: tuple[int, ...]
    dtype: np.dtype
    scale: np.floating
    mask: np.ndarray | None
    offset: int | None

    @property
    def n_q(self) -> int:
        return self.q.shape[-2]

    @property
    def n_k(self) -> int:
        return self.k.shape[-2]

    def unflatten(self, x: np.ndarray) -> np.ndarray:
        """Reshape (B, ...) back to batch_shape + (...)."""
        return x.reshape(self.batch_shape + x.shape[1:])


def as_float_array(x: object, name: str) -> np.ndarray:
    """``x`` as an ndarray of float16/32/64, or a TypeError naming ``name``."""
    if isinstance(x, np.ndarray):
        arr = x
    else:
        try:
            arr = np.asarray(x)
        except Exception as exc:  # pragma: no cover - exotic inputs
            raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}") from exc
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype (float16, float32 or float64), got {arr.dtype}"
        )
    return arr


def check_float_dtype(dtype: object, name: str = "dtype") -> np.dtype:
    """``dtype`` (a string, a type or a ``np.dtype``) as one of :data:`FLOAT_DTYPES`, or a
    TypeError naming ``name`` (integers, booleans, ``longdouble`` and non-dtypes are refused)."""
    try:
        dt = np.dtype(dtype)
    except TypeError as err:
        raise TypeError(
            f"{name} must be float16, float32 or float64, got {dtype!r}"
        ) from err
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


def check_block(value: object, name: str) -> int:
    """A block size (tile side): a positive integer, honoured as given.  A tile is
    ``min(block, n)`` on each side, so a block larger than the problem costs nothing extra."""
    return check_int(value, name, minimum=1)


def check_finite(x: np.ndarray, name: str) -> None:
    """Refuse NaN and infinities, which would otherwise turn into NaN outputs."""
    if not np.isfinite(x).all():
        raise ValueError(f"{name} must contain only finite values (found NaN or inf)")


def causal_offset(causal: object, n_q: int, n_k: int) -> int | None:
    """The causal diagonal: row ``i`` may see key ``j`` when ``j <= i + offset``.

    ``False`` -> None (no causal mask); ``True`` or ``"top_left"`` -> 0 (PyTorch SDPA's
    ``is_causal``); ``"bottom_right"`` -> ``n_k - n_q`` (flash-attn >= 2.1).
    """
    if isinstance(causal, np.bool_):
        causal = bool(causal)
    if causal is False or causal is None:
        return None
    if causal is True or (isinstance(causal, str) and causal == "top_left"):
        return 0
    if isinstance(causal, str) and causal == "bottom_right":
        return n_k - n_q
    raise ValueError(
        f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}"
    )


def check_mask(mask: object, target: tuple[int, ...]) -> np.ndarray | None:
    """A boolean mask broadcast (as a view) to ``target = batch_shape + (n_q, n_k)``."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(
            f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}"
        )
    try:
        shape = np.broadcast_shapes(mask.shape, target)
    except ValueError:
        shape = None
    if shape != target:
        raise ValueError(
            f"mask of shape {mask.shape} is not broadcastable to (..., n_q, n_k) = {target}"
        )
    return np.broadcast_to(mask, target)


def check_scale(scale: object, d: int, dtype: np.dtype) -> np.floating:
    """The softmax scale as a scalar of the input dtype (default ``1/sqrt(d)``).

    Keeping it in the input dtype matters under NEP 50: a float64 numpy scalar would silently
    promote a float32 score matrix to float64.
    """
    if scale is None:
        return dtype.type(1.0 / np.sqrt(d)) if d > 0 else dtype.type(1.0)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.number)):
        raise TypeError(f"scale must be a real number or None, got {scale!r}")
    with np.errstate(over="ignore"):
        cast = dtype.type(scale)
    if not np.isfinite(cast):
        raise ValueError(f"scale must be finite in {dtype}, got {scale}")
    return cast


def check_problem(
    q: object,
    k: object,
    v: object,
    *,
    causal: object = False,
    mask: object = None,
    scale: object = None,
) -> Problem:
    """Validate ``q: (..., n_q, d)``, ``k: (..., n_k, d)``, ``v: (..., n_k, d_v)`` and options."""
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim < 2:
            raise ValueError(
                f"{name} must have at least 2 dimensions (..., n, d), got shape {x.shape}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            "q, k and v must have equal leading (batch, head) dimensions, got "
            f"q {q.shape[:-2]}, k {k.shape[:-2]}, v {v.shape[:-2]}"
        )
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k must have the same last dimension d as q: q is (..., n_q, {q.shape[-1]}), "
            f"k is {k.shape}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v must have as many rows as k (n_k = {k.shape[-2]}), got v of shape {v.shape}"
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_finite(x, name)
    batch_shape = q.shape[:-2]
    n_q, d = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    b = int(np.prod(batch_shape, dtype=np.int64))
    return Problem(
        q=q.reshape(b, n_q, d),
        k=k.reshape(b, n_k, d),
        v=v.reshape(b, n_k, d_v),
        batch_shape=batch_shape,
        dtype=q.dtype,
        scale=check_scale(scale, d, q.dtype),
        mask=check_mask(mask, batch_shape + (n_q, n_k)),
        offset=causal_offset(causal, n_q, n_k),
    )


def check_like(x: object, name: str, shape: tuple[int, ...], dtype: np.dtype | None) -> np.ndarray:
    """An extra array argument (``o``, ``do``, ``lse``) of an exact shape (and dtype if given)."""
    if dtype is None:
        arr = np.asarray(x)
        if not np.issubdtype(arr.dtype, np.floating):
            raise TypeError(f"{name} must be a floating-point array, got dtype {arr.dtype}")
    else:
        arr = as_float_array(x, name)
        if arr.dtype != dtype:
            raise TypeError(f"{name} must have dtype {dtype} (that of q), got {arr.dtype}")
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    return arr
