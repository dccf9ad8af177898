"""Input checks shared by every public function: each validates its arguments once, here, then
runs its fast path.

Each check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong value or
shape) with a message that names the argument and says what was expected; the naive functions'
memory check raises ``MemoryError`` before allocating.  Arrays may be anything ``np.asarray``
reads (lists, other byte orders, read-only or broadcast views); masked arrays and ``np.matrix``
are refused, because their semantics differ from an ndarray's.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, NamedTuple

import numpy as np

from flashlib.constants import compute_dtype

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class Problem(NamedTuple):
    """The validated inputs of one attention call, flattened to a single leading batch axis.

    q: (B, n_q, d)   k: (B, n_k, d)   v: (B, n_k, d_v)   with B = prod(batch_shape)
    mask: None, or a boolean view broadcast to batch_shape + (n_q, n_k) (no copy is made)
    offset: None (not causal) or the causal diagonal: row i sees keys j <= i + offset (with a
    sliding window, the window's right edge if lower)
    lo: None, or the sliding window's left edge: row i sees keys j >= i + lo
    key_lengths: None, or (B,) ints: sequence b sees keys j < key_lengths[b] (key padding)
    scale: the softmax scale as a scalar of the compute dtype (float32 for float16 inputs)
    block_q, block_k: the tile sizes B_r and B_c (None for the untiled naive functions)
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    batch_shape: tuple[int, ...]
    dtype: np.dtype
    scale: np.floating
    mask: np.ndarray | None
    offset: int | None
    block_q: int | None = None
    block_k: int | None = None
    lo: int | None = None  # sliding window: row i sees keys j >= i + lo (None: no bound)
    key_lengths: np.ndarray | None = None  # (B,) key padding: sequence b sees keys j < len[b]
    kv_group: int = 1  # grouped-query attention: query heads per K/V head (k, v: (B / g, ...))

    @property
    def n_q(self) -> int:
        return self.q.shape[-2]

    @property
    def n_k(self) -> int:
        return self.k.shape[-2]

    def unflatten(self, x: np.ndarray) -> np.ndarray:
        """Reshape (B, ...) back to batch_shape + (...)."""
        return x.reshape(self.batch_shape + x.shape[1:])

    def repeat_kv(self) -> Problem:
        """The same problem with each K/V head repeated for its ``kv_group`` query heads (a
        copy; the reference functions and the backward use it)."""
        if self.kv_group == 1:
            return self
        g = self.kv_group
        return self._replace(k=np.repeat(self.k, g, axis=0), v=np.repeat(self.v, g, axis=0),
                             kv_group=1)

    def sum_kv(self, x: np.ndarray) -> np.ndarray:
        """A gradient (B, n_k, c) of the repeated K or V summed over each group of query
        heads, in k's batch shape: batch_shape[:-1] + (h_kv, n_k, c)."""
        g = self.kv_group
        if g == 1:
            return self.unflatten(x)
        x = x.reshape((x.shape[0] // g, g) + x.shape[1:]).sum(axis=1)
        return x.reshape(self.batch_shape[:-1] + (self.batch_shape[-1] // g,) + x.shape[1:])


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


def _as_array(x: object, name: str, masked_hint: str) -> np.ndarray:
    """``x`` as a plain ndarray (subclasses dropped, big-endian floats made native)."""
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
    arr = _as_array(x, name, masked_hint)
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


def check_window(window: object) -> tuple[int | None, int | None] | None:
    """A sliding window ``(left, right)``: each a non-negative integer or None (no bound)."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a pair (left, right) of non-negative integers "
                        f"or None, got {window!r}")
    left, right = (None if w is None else check_int(w, f"window[{a}]", minimum=0)
                   for a, w in enumerate(window))
    return left, right


def band_bounds(causal: object, window: object, n_q: int,
                n_k: int) -> tuple[int | None, int | None]:
    """(lo, hi): row i sees keys i + lo <= j <= i + hi (None: no bound), the causal mask AND
    the sliding window ``(left, right)``, bottom-right aligned as flash-attn's ``window_size``:
    lo = n_k - n_q - left, hi = min(causal offset, n_k - n_q + right)."""
    hi = causal_offset(causal, n_q, n_k)
    checked = check_window(window)
    if checked is None:
        return None, hi
    left, right = checked
    diagonal = n_k - n_q
    lo = None if left is None else diagonal - left
    if right is not None:
        hi = diagonal + right if hi is None else min(hi, diagonal + right)
    return lo, hi


def check_key_lengths(key_lengths: object, batch_shape: tuple[int, ...],
                      n_k: int) -> np.ndarray | None:
    """Per-sequence key lengths (key padding: row i of sequence b sees keys j < length[b]),
    integers in [0, n_k] broadcastable to ``batch_shape``, as a flat (B,) int64 array."""
    if key_lengths is None:
        return None
    arr = np.asarray(key_lengths)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"key_lengths must be integers (the real keys of each sequence), got "
                        f"dtype {arr.dtype}")
    try:
        arr = np.broadcast_to(arr, batch_shape)
    except ValueError:
        raise ValueError(f"key_lengths must be broadcastable to the batch shape {batch_shape} "
                         f"of q, got shape {arr.shape}") from None
    if arr.size and (arr.min() < 0 or arr.max() > n_k):
        raise ValueError(f"key_lengths must lie in [0, n_k = {n_k}], got values from "
                         f"{arr.min()} to {arr.max()}")
    return arr.reshape(-1).astype(np.int64)


def check_mask(mask: object, target: tuple[int, ...]) -> np.ndarray | None:
    """A boolean mask broadcast (as a view) to ``target = batch_shape + (n_q, n_k)``."""
    if mask is None:
        return None
    mask = _as_array(mask, "mask", "pass a boolean array (True = may attend)")
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
    """The softmax scale as a scalar of the compute dtype (default ``1/sqrt(d)``).

    The compute dtype is float32 for float16 inputs (the scale is not rounded to float16: with
    d = 59 that alone would cost 4.6e-4 of relative error), else the input dtype; a float64
    numpy scalar would silently promote a float32 score matrix to float64 (NEP 50).  ``scale``
    must be a real number (int, float or a numpy real scalar) whose magnitude the compute dtype
    can represent; complex numbers and booleans are refused.
    """
    work = compute_dtype(dtype)
    if scale is None:
        return work.type(1.0 / math.sqrt(d)) if d > 0 else work.type(1.0)
    if isinstance(scale, np.ndarray) and scale.ndim == 0:
        scale = scale[()]  # a 0-d array: its scalar
    if isinstance(scale, (bool, np.bool_)) or not isinstance(
        scale, (int, float, np.integer, np.floating)
    ):
        raise TypeError(
            f"scale must be a real number (int, float or numpy real scalar) or None, "
            f"got {scale!r} of type {type(scale).__name__}"
        )
    try:
        value = float(scale)
    except OverflowError:  # an int beyond float64, e.g. 10**400
        value = math.inf
    limit = float(np.finfo(work).max)
    if not math.isfinite(value) or abs(value) > limit:
        raise ValueError(
            f"scale must be a finite number of magnitude at most {limit:.6g} (the largest "
            f"{work} value, the precision {dtype} inputs are computed in), got {scale!r}"
        )
    return work.type(value)


def _flat(x: np.ndarray, b: int, *tail: int) -> np.ndarray:
    """``x`` reshaped to (b, *tail); explicit sizes, so zero-size arrays reshape too."""
    return x.reshape((b, *tail))


def check_problem(
    q: object,
    k: object,
    v: object,
    *,
    causal: object = False,
    mask: object = None,
    scale: object = None,
    blocks: tuple[object, object] | None = None,
    score_matrices: int = 0,
    window: object = None,
    key_lengths: object = None,
    gqa: bool = False,
) -> Problem:
    """Validate ``q: (..., n_q, d)``, ``k: (..., n_k, d)``, ``v: (..., n_k, d_v)`` and options.

    gqa: the caller supports grouped-query attention: k and v may have fewer heads (axis -3)
    than q, h_q a multiple of h_kv (:func:`_kv_group`); query head h uses K/V head h // g.

    blocks: ``(block_q, block_k)`` of a tiled function, checked with :func:`check_block`.
    score_matrices: how many (n_q, n_k) arrays per head the caller will hold at once (the naive
    functions); the problem is refused with a MemoryError, before anything is allocated, when
    they would not fit in the available memory (:func:`check_fits_in_memory`).
    """
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
    kv_group = _kv_group(q.shape, k.shape, v.shape) if gqa else 1
    if kv_group == 1 and not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
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
    b = math.prod(batch_shape)
    checked_mask = check_mask(mask, batch_shape + (n_q, n_k))
    lo, offset = band_bounds(causal, window, n_q, n_k)
    lengths = check_key_lengths(key_lengths, batch_shape, n_k)
    checked_scale = check_scale(scale, d, q.dtype)
    if blocks is not None:
        blocks = (check_block(blocks[0], "block_q"), check_block(blocks[1], "block_k"))
    b_kv = b // kv_group
    if score_matrices:
        per_score = score_matrices * compute_dtype(q.dtype).itemsize
        if checked_mask is not None or offset is not None or lo is not None or (
                lengths is not None):
            per_score += 1  # the boolean visibility matrix
        check_fits_in_memory(b * n_q * n_k * per_score,
                             f"{score_matrices} score matrices of {batch_shape + (n_q, n_k)}")
    return Problem(
        q=_flat(q, b, n_q, d),
        k=_flat(k, b_kv, n_k, d),
        v=_flat(v, b_kv, n_k, d_v),
        batch_shape=batch_shape,
        dtype=q.dtype,
        scale=checked_scale,
        mask=checked_mask,
        offset=offset,
        block_q=None if blocks is None else blocks[0],
        block_k=None if blocks is None else blocks[1],
        lo=lo,
        key_lengths=lengths,
        kv_group=kv_group,
    )


def _kv_group(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> int:
    """Query heads per K/V head for q: (..., h_q, n_q, d), k: (..., h_kv, n_k, d) and
    v: (..., h_kv, n_k, d_v) (grouped-query attention; h_kv = 1 is multi-query attention);
    1 when the leading dimensions are equal or do not have that form (the caller's check
    then explains), a ValueError when h_q is not a multiple of h_kv."""
    if not (len(q) == len(k) == len(v) >= 3 and q[:-3] == k[:-3] == v[:-3]
            and k[-3] == v[-3] != q[-3]):
        return 1
    h_q, h_kv = q[-3], k[-3]
    if h_q == 0:
        return 1  # no query heads: the equal-dimensions check explains
    if h_kv == 0 or h_q % h_kv:
        raise ValueError(
            f"k and v have {h_kv} heads (axis -3) and q has {h_q}: for grouped-query "
            f"attention the number of query heads must be a multiple of the number of K/V "
            f"heads, got k {k} and q {q}"
        )
    return h_q // h_kv


def check_like(x: object, name: str, shape: tuple[int, ...], dtype: np.dtype | None) -> np.ndarray:
    """An extra array argument (``o``, ``do``, ``lse``) of an exact shape (and dtype if given)."""
    arr = as_float_array(x, name)
    if dtype is not None and arr.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype} (that of q), got {arr.dtype}")
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    return arr


def check_backward_problem(
    q: object,
    k: object,
    v: object,
    do: object,
    *,
    o: object = None,
    lse: object = None,
    causal: object = False,
    mask: object = None,
    scale: object = None,
    blocks: tuple[object, object] | None = None,
    score_matrices: int = 0,
    window: object = None,
    key_lengths: object = None,
    gqa: bool = False,
) -> tuple[Problem, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Validate a backward call: the forward problem plus ``do`` (and ``o``, ``lse`` when given).

    do, o: (..., n_q, d_v) of q's dtype, finite; lse: (..., n_q) floating, no NaN or +inf
    (``-inf`` marks rows that see no key).  Returns ``(problem, do, o, lse)`` with the arrays
    flattened like the problem's: (B, n_q, d_v) and (B, n_q).
    """
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale, blocks=blocks,
                      score_matrices=score_matrices, window=window, key_lengths=key_lengths,
                      gqa=gqa)
    b, n_q, d_v = p.q.shape[0], p.n_q, p.v.shape[-1]
    shape = p.batch_shape + (n_q, d_v)
    out: list[np.ndarray | None] = []
    for name, x in (("do", do), ("o", o)):
        if name == "o" and x is None:
            out.append(None)
            continue
        x = check_like(x, name, shape, p.dtype)
        check_finite(x, name)
        out.append(_flat(x, b, n_q, d_v))
    if lse is not None:
        lse = check_like(lse, "lse", p.batch_shape + (n_q,), None)
        if np.isnan(lse).any() or np.isposinf(lse).any():
            raise ValueError("lse must not contain NaN or +inf (-inf marks rows that see no key)")
        lse = _flat(lse, b, n_q)
    return p, out[0], out[1], lse


# --- memory ---------------------------------------------------------------------------------

#: When set (bytes), the memory the naive functions may ask for, instead of the available
#: memory the operating system reports (see :func:`available_memory`).
MEMORY_LIMIT: int | None = None


def available_memory() -> int | None:
    """Bytes of memory a new allocation can use without swapping, or None when unknown.

    :data:`MEMORY_LIMIT` if set; else Linux's ``MemAvailable`` (/proc/meminfo), else the
    physical memory ``os.sysconf`` reports (macOS and other POSIX systems); else None.
    """
    if MEMORY_LIMIT is not None:
        return int(MEMORY_LIMIT)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_in_memory(nbytes: int, what: str) -> None:
    """Refuse, before allocating, arrays of ``nbytes`` that exceed :func:`available_memory`."""
    limit = available_memory()
    if limit is not None and nbytes > limit:
        raise MemoryError(
            f"this problem needs {nbytes:,} bytes ({nbytes / 2**30:,.1f} GiB) for {what}, "
            f"more than the {limit:,} bytes ({limit / 2**30:,.1f} GiB) of memory available; "
            "use flash_attention (O(n) memory) or a smaller problem"
        )


# --- results --------------------------------------------------------------------------------

def results_are_finite(*arrays: np.ndarray, stats: np.ndarray | None = None) -> bool:
    """True when every array is finite and ``stats`` (an lse or a row maximum, where ``-inf``
    marks a row that sees no key) holds no NaN or +inf."""
    return all(bool(np.isfinite(x).all()) for x in arrays) and (
        stats is None or bool((stats < np.inf).all()))


def check_no_overflow(dtype: np.dtype, *arrays: np.ndarray,
                      stats: np.ndarray | None = None) -> None:
    """A clear ValueError instead of a NaN/inf result when the computation overflowed."""
    if not results_are_finite(*arrays, stats=stats):
        raise ValueError(
            f"attention overflowed {compute_dtype(dtype)}: the scores scale * q @ k^T, or the "
            "values v (or, in a backward pass, do and the gradients), exceed its range; "
            "make q, k, v or scale smaller"
        )


# --- online softmax -------------------------------------------------------------------------

def check_scores(x: object, name: str, *, min_ndim: int = 0, nonempty: bool = False,
                 finite: bool = False) -> np.ndarray:
    """Scores or values for the online-softmax functions: a real array (integers become
    float64) without NaN or +inf (``-inf`` marks a masked score; with ``finite``, no infinity
    at all), at least ``min_ndim``-D, and with ``nonempty`` at least one value along the last
    axis."""
    arr = _as_array(x, name, MASKED_HINT_SCORES)
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.float64)
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a real array (float16, float32, float64 or integer), got dtype "
            f"{arr.dtype}"
        )
    if finite:
        check_finite(arr, name)
    elif np.isnan(arr).any() or np.isposinf(arr).any():
        raise ValueError(f"{name} must not contain NaN or +inf (-inf marks a masked score)")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape "
                         f"{arr.shape}")
    if nonempty and (arr.ndim == 0 or arr.shape[-1] == 0):
        raise ValueError(f"{name} must have shape (..., n) with n >= 1, got {arr.shape}")
    return arr


def _state_parts(state: object, name: str, fields: tuple[str, ...]) -> tuple[Any, ...]:
    if isinstance(state, (str, bytes, np.ndarray)) or not hasattr(state, "__len__"):
        raise TypeError(f"{name} must be a pair/triple ({', '.join(fields)}), got "
                        f"{type(state).__name__}")
    if len(state) != len(fields):
        raise TypeError(f"{name} must hold {len(fields)} arrays ({', '.join(fields)}), got "
                        f"{len(state)}")
    return tuple(state)


def check_softmax_state(state: object, name: str = "state") -> tuple[np.ndarray, np.ndarray]:
    """A running softmax state: any pair ``(m, l)`` (a SoftmaxState, a tuple...) of equal
    shapes, m without NaN or +inf, l finite and >= 0."""
    m, l = _state_parts(state, name, ("m", "l"))
    m = check_scores(m, f"{name}.m")
    l = check_scores(l, f"{name}.l", finite=True)
    if m.shape != l.shape:
        raise ValueError(f"{name}.m and {name}.l must have one shape, got {m.shape} and "
                         f"{l.shape}")
    if (l < 0).any():
        raise ValueError(f"{name}.l must be finite and >= 0 (a sum of exponentials)")
    return m, l


def check_partial(state: object, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A partial attention state: any triple ``(m, l, acc)`` with m, l: (..., n_q) and
    acc: (..., n_q, d_v); m without NaN or +inf, l >= 0 and acc finite."""
    m, l, acc = _state_parts(state, name, ("m", "l", "acc"))
    m, l = check_softmax_state((m, l), name)
    acc = check_scores(acc, f"{name}.acc", min_ndim=1, finite=True)
    if acc.shape[:-1] != m.shape:
        raise ValueError(f"{name}.acc must have shape {m.shape + ('d_v',)} to match "
                         f"{name}.m {m.shape}, got {acc.shape}")
    return m, l, acc


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


def check_online_update(state: object, x: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A state (m, l) of shape (...,) and x of shape (...,) (one value per stream) or (..., b)
    (a block); returns m, l and x as (..., b)."""
    m, l = check_softmax_state(state)
    x = check_scores(x, "x")
    if x.ndim == m.ndim:
        x = x[..., None]
    if x.shape[:-1] != m.shape:
        raise ValueError(
            f"x must have shape {m.shape} (one value) or {m.shape + ('b',)} (a block), "
            f"got {x.shape}"
        )
    return m, l, x


def check_scores_values(s: object, v: object, n: str = "b") -> tuple[np.ndarray, np.ndarray]:
    """Scores s: (..., n_q, n) (-inf where masked) and finite values v: (..., n, d_v)."""
    s, v = check_scores(s, "s", min_ndim=2), check_scores(v, "v", min_ndim=2, finite=True)
    if s.shape[-1] != v.shape[-2]:
        raise ValueError(
            f"s (..., n_q, {n}) and v (..., {n}, d_v) disagree: {s.shape} vs {v.shape}"
        )
    return s, v


Partial = tuple[np.ndarray, np.ndarray, np.ndarray]


def check_partial_pair(a: object, b: object) -> tuple[Partial, Partial]:
    """Two partial states (m, l, acc) describing the same queries (equal shapes)."""
    a, b = check_partial(a, "a"), check_partial(b, "b")
    if a[2].shape != b[2].shape:
        raise ValueError(f"a and b must describe the same queries: acc {a[2].shape} vs "
                         f"{b[2].shape}")
    return a, b


def check_partials(parts: object) -> list[Partial]:
    """A non-empty list (any iterable) of partial states of one shape, each checked once."""
    if isinstance(parts, (str, bytes, np.ndarray)) or not hasattr(parts, "__iter__"):
        raise TypeError(f"parts must be a list of PartialAttention, got {type(parts).__name__}")
    checked = [check_partial(x, f"parts[{i}]") for i, x in enumerate(parts)]
    if not checked:
        raise ValueError("parts must hold at least one PartialAttention")
    shapes = {x[2].shape for x in checked}
    if len(shapes) > 1:
        raise ValueError(f"parts must describe the same queries, got acc shapes {sorted(shapes)}")
    return checked


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
    return tuple(int(n) for n in items)
