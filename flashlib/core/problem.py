"""The validated inputs of one attention call: :func:`check_problem` and its backward twin.

Every library function (``naive_attention``, ``flash_attention``, their backward passes)
validates its arguments once, here, then runs its fast path on a :class:`Problem`: q, k, v
flattened to one leading batch axis, the masks reduced to a band ``i + lo <= j <= i + hi``
(:func:`flashlib.core.masks.band_bounds`; one per sequence when a bottom-right band meets key
padding, :func:`flashlib.core.masks.sequence_bands`), a key length per sequence and an explicit
boolean mask, the scale as a scalar of the compute dtype.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from flashlib.core.checks import (
    as_array,
    as_float_array,
    check_block,
    check_finite,
)
from flashlib.core.constants import compute_dtype
from flashlib.core.masks import sequence_bands
from flashlib.core.sysmem import check_fits_in_memory

__all__ = [
    "Problem",
    "check_problem",
    "check_backward_problem",
    "NOT_PASSED",
    "check_key_lengths",
    "check_mask",
    "check_scale",
    "check_like",
    "results_are_finite",
    "check_no_overflow",
]


class Problem(NamedTuple):
    """The validated inputs of one attention call, flattened to a single leading batch axis.

    q: (B, n_q, d)   k: (B, n_k, d)   v: (B, n_k, d_v)   with B = prod(batch_shape)
    mask: None, or a boolean view broadcast to batch_shape + (n_q, n_k) (no copy is made)
    offset: None (not causal) or the causal diagonal: row i sees keys j <= i + offset (with a
    sliding window, the window's right edge if lower)
    lo: None, or the sliding window's left edge: row i sees keys j >= i + lo
    key_lengths: None, or (B,) ints: sequence b sees keys j < key_lengths[b] (key padding)
    bands: None, or (B, 2) ints: sequence b sees keys i + bands[b, 0] <= j <= i + bands[b, 1]
    (a bottom-right band placed on each sequence's real length); ``offset`` and ``lo`` are then
    the loosest of them, which the fast paths use to skip tiles
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
    bands: np.ndarray | None = None  # (B, 2): each sequence's (lo, hi) when they differ

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


def check_key_lengths(key_lengths: object, batch_shape: tuple[int, ...],
                      n_k: int) -> np.ndarray | None:
    """Per-sequence key lengths (key padding: row i of sequence b sees keys j < length[b]),
    integers in [0, n_k], as a flat (B,) int64 array over ``batch_shape``.

    The lengths index q's *leading* batch axes, as PyTorch's and flash-attn's sequence lengths
    index the batch: a scalar is every sequence's length; shape (B,) gives one length per batch
    element (q's axis 0), the same for each of its heads, even when B equals the number of
    heads; shape (B, H) one per batch element and head; any shape ``batch_shape[:k]`` whose
    axes are 1 or match q's (e.g. (1, H): one length per head).  numpy's broadcasting, which
    aligns the last axes, would read (B,) per head when B == H: it is never used.
    """
    if key_lengths is None:
        return None
    arr = np.asarray(key_lengths)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"key_lengths must be integers (the real keys of each sequence), got "
                        f"dtype {arr.dtype}")
    lead = arr.shape + (1,) * (len(batch_shape) - arr.ndim)  # aligned with q's first axes
    if arr.ndim > len(batch_shape) or any(
            a not in (1, b) for a, b in zip(lead, batch_shape, strict=True)):
        raise ValueError(
            f"key_lengths must index q's leading batch axes {batch_shape}: a scalar, "
            f"({batch_shape[0] if batch_shape else 'B'},) for one length per batch element, "
            f"or a shape batch_shape[:k] with axes of 1 or q's; got shape {arr.shape}")
    arr = np.broadcast_to(arr.reshape(lead), batch_shape)
    if arr.size and (arr.min() < 0 or arr.max() > n_k):
        raise ValueError(f"key_lengths must lie in [0, n_k = {n_k}], got values from "
                         f"{arr.min()} to {arr.max()}")
    return arr.reshape(-1).astype(np.int64)


def check_mask(mask: object, target: tuple[int, ...]) -> np.ndarray | None:
    """A boolean mask broadcast (as a view) to ``target = batch_shape + (n_q, n_k)``."""
    if mask is None:
        return None
    mask = as_array(mask, "mask", "pass a boolean array (True = may attend)")
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
    lengths = check_key_lengths(key_lengths, batch_shape, n_k)
    lo, offset, bands = sequence_bands(causal, window, n_q, n_k, lengths)
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
        bands=bands,
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


#: The default of :func:`check_backward_problem`'s ``o`` and ``lse``: not passed (an explicit
#: None is refused by name, as any argument the caller needs).
NOT_PASSED = object()


def check_backward_problem(
    q: object,
    k: object,
    v: object,
    do: object,
    *,
    o: object = NOT_PASSED,
    lse: object = NOT_PASSED,
    causal: object = False,
    mask: object = None,
    scale: object = None,
    blocks: tuple[object, object] | None = None,
    score_matrices: int = 0,
    window: object = None,
    key_lengths: object = None,
    gqa: bool = False,
) -> tuple[Problem, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Validate a backward call: the forward problem plus ``do`` (and ``o``, ``lse`` when the
    caller takes them: passed, None is refused by name).

    do, o: (..., n_q, d_v) of q's dtype, finite; lse: (..., n_q) floating, no NaN or +inf
    (``-inf`` marks rows that see no key).  Returns ``(problem, do, o, lse)`` with the arrays
    flattened like the problem's: (B, n_q, d_v) and (B, n_q); o and lse None when not passed.
    """
    for name, x in (("o", o), ("lse", lse)):
        if x is None:
            raise TypeError(
                f"{name} must be the {'output' if name == 'o' else 'logsumexp'} array that "
                f"flash_attention(..., return_lse=True) returned, got None")
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale, blocks=blocks,
                      score_matrices=score_matrices, window=window, key_lengths=key_lengths,
                      gqa=gqa)
    b, n_q, d_v = p.q.shape[0], p.n_q, p.v.shape[-1]
    shape = p.batch_shape + (n_q, d_v)
    out: list[np.ndarray | None] = []
    for name, x in (("do", do), ("o", o)):
        if x is NOT_PASSED:
            out.append(None)
            continue
        x = check_like(x, name, shape, p.dtype)
        check_finite(x, name)
        out.append(_flat(x, b, n_q, d_v))
    if lse is NOT_PASSED:
        lse = None
    else:
        lse = check_like(lse, "lse", p.batch_shape + (n_q,), None)
        if np.isnan(lse).any() or np.isposinf(lse).any():
            raise ValueError("lse must not contain NaN or +inf (-inf marks rows that see no key)")
        lse = _flat(lse, b, n_q)
    return p, out[0], out[1], lse


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
