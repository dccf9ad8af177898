"""The optimisation ladder: the FlashAttention-2 forward, one CPU trick at a time.

Each rung is a complete, exact attention forward (``causal`` supported, rows that see no key give
0) that adds one trick to the rung before it, and each trick mirrors one a GPU kernel uses:

====  ==========================  ===========================================================
rung  function                    trick (GPU counterpart)
====  ==========================  ===========================================================
 -    :func:`naive_inplace`       baseline: standard attention done as well as numpy can
 0    :func:`rung0_plain`         the paper's loop, one head at a time, ``exp``, fresh arrays
 1    :func:`rung1_exp2`          scale and log2(e) folded into Q once, ``exp2`` (flash-attn
                                  folds the same constant into one FFMA per score before its
                                  ``exp2``; on a CPU the cheapest place for it is Q)
 2    :func:`rung2_buffers`       K^T laid out once, preallocated tiles, ``out=``, in-place
                                  ops (tiles staged in shared memory in the layout the matrix
                                  units read, living in registers, never reallocated)
 3    :func:`rung3_heads`         every head in one batched matmul (the grid over
                                  batch x heads: one thread block per (head, query block))
 4    :func:`rung4_ones_column`   the row sum l rides in P @ [V | 1]: work moved onto the
                                  fastest path, BLAS instead of numpy's reduction (an analogy
                                  only: GPU kernels sum rows in registers, not with a ones
                                  column)
 5    :func:`rung5_lazy_rescale`  conditional rescaling: rescale acc only when the max grows by
                                  more than RESCALE_THRESHOLD (base 2), as FlashAttention-4's
                                  Blackwell kernel does (flash_attn/cute/softmax.py,
                                  ``SoftmaxSm100``, ``rescale_threshold``)
 6    :func:`rung6_stale_max`     the stale max rides in the Q K^T matmul: [Q, -m] @ [K^T; 1],
                                  no max pass; a too-large row sum triggers the exact step
 7    :func:`rung7_kt_tiles`      K^T laid out as contiguous (d + 1, B_c) tiles, not one long
                                  (d + 1, n) array whose slices have a large row stride (a GPU
                                  kernel's TMA/cp.async loads K_j into shared memory as one
                                  tile)
 8    :func:`rung8_no_cliff`      no large-logit cliff: scores that could make exp2 or the
                                  matmuls meet subnormal numbers are clamped at 2**-63, and a
                                  row sum that grew too large moves m_i up by a power of two
                                  instead of redoing the tile (on a GPU, flushing subnormal
                                  results to zero is a compiler option: nvcc's -ftz=true,
                                  implied by --use_fast_math)
 9    :func:`flashlib.flash_attention`  the library version: rung 8 keeping only one O(n d)
                                  copy (of K; row sums as s @ 1 instead of a ones column in
                                  V), skipping hidden causal tiles, masking only the diagonal
                                  ones after the exponential (FlashAttention-2's causal tile
                                  skipping), groups of query blocks and heads per numpy call,
                                  each tile's products BLAS calls of the size the library runs
                                  fastest, and no running maximum at all where a bound on the
                                  scores says exp2 cannot overflow
====  ==========================  ===========================================================

and, timed apart (with the wall clock: the process CPU time adds up the threads' times),

====  ==========================  ===========================================================
 10   :func:`rung10_threads`      rung 9 with its query blocks on every core, a pool of
                                  threads (FlashAttention-2's parallelism over the sequence:
                                  thread blocks over (head, query block))
====  ==========================  ===========================================================

The chapter shows three rungs instead, written in the style of
:func:`flashlib.algorithms.flash2_forward` so that each reads as a diff from it
(:data:`CHAPTER_RUNGS`): :func:`flash2_per_head` (rung 0), :func:`flash2_heads` (every head at
once, base 2) and :func:`flash2_in_matmul` (the row sum and a stale maximum inside the
matmuls); the library is its rung 3 and rung 10 above its rung 4.

The rungs take no explicit ``mask`` (the library's :func:`flashlib.flash_attention` does);
``causal`` rungs before rung 9 apply the causal mask to every tile, skipping none.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np

from flashlib.core.checks import check_block, check_int
from flashlib.core.constants import BLOCK_K, BLOCK_Q, LOG2E, compute_dtype
from flashlib.core.masks import tile_mask, visibility
from flashlib.core.problem import check_problem
from flashlib.fast.forward import STALE_LIMIT, flash_attention, run_forward
from flashlib.fast.tiles import transposed_tiles

__all__ = [
    "CHAPTER_RUNGS",
    "flash2_heads",
    "flash2_in_matmul",
    "flash2_per_head",
    "ones_column",
    "naive_inplace",
    "rung0_plain",
    "rung1_exp2",
    "rung2_buffers",
    "rung3_heads",
    "rung4_ones_column",
    "rung5_lazy_rescale",
    "rung6_stale_max",
    "rung7_kt_tiles",
    "rung8_no_cliff",
    "rung10_threads",
    "cliff_floor",
    "RUNGS",
    "THREADS_RUNG",
    "RESCALE_THRESHOLD",
]


#: Rung 5 rescales acc only when a row's maximum grows by more than this (base-2 units), so
#: the terms exp2(s - m_i) stay at most 2**RESCALE_THRESHOLD: no overflow, the same result up
#: to rounding.
RESCALE_THRESHOLD = 8.0


def _setup(q, k, v, block_q, block_k, causal, scale):
    """Validate, flatten to (B, n, d) and pick the compute dtype (float32 for float16)."""
    p = check_problem(q, k, v, causal=causal, scale=scale)
    return p, check_block(block_q, "block_q"), check_block(block_k, "block_k"), compute_dtype(
        p.dtype
    )


def _finish(p, acc: np.ndarray, l: np.ndarray) -> np.ndarray:  # noqa: E741
    """o = acc / l (0 for rows that saw no key), in q's dtype and shape."""
    seen = l > 0
    o = np.divide(acc, l[..., None], out=np.zeros_like(acc), where=seen[..., None])
    return p.unflatten(o.astype(p.dtype, copy=False))


def naive_inplace(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool | str = False,
    scale: float | None = None,
) -> np.ndarray:
    """Standard attention as fast as numpy does it: the baseline of every rung.

    One head at a time: the scale folded into Q (O(n d) work, not O(n^2)), S exponentiated in
    place, and the n x d output normalised instead of the n x n matrix.  Stores one
    (n_q, n_k) matrix per head.  q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v).
    """
    p = check_problem(q, k, v, causal=causal, scale=scale)
    dtype = compute_dtype(p.dtype)
    n_q, n_k = p.n_q, p.n_k
    o = np.empty(p.q.shape[:-1] + p.v.shape[-1:], dtype=dtype)
    visible = visibility(n_q, n_k, p.offset, None)  # None when not causal
    hidden = None if visible is None else ~visible
    for b in range(p.q.shape[0]):
        s = (p.q[b].astype(dtype) * dtype.type(p.scale)) @ p.k[b].T.astype(dtype)
        if hidden is not None:
            s[hidden] = -np.inf
        m = s.max(axis=-1, keepdims=True) if n_k else np.zeros((n_q, 1), dtype)
        m[np.isneginf(m)] = 0  # rows that see no key: exp(-inf - 0) = 0, no NaN
        s -= m
        np.exp(s, out=s)
        l = s.sum(axis=-1, keepdims=True)  # noqa: E741
        o[b] = s @ p.v[b].astype(dtype)
        np.divide(o[b], l, out=o[b], where=l > 0)
    return p.unflatten(o.astype(p.dtype, copy=False))


def rung0_plain(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K, causal: bool | str = False, scale: float | None = None,
) -> np.ndarray:
    """Rung 0: the FlashAttention-2 forward as the paper writes it, one head at a time."""
    p, block_q, block_k, dtype = _setup(q, k, v, block_q, block_k, causal, scale)
    n_b, n_q, n_k, d_v = p.q.shape[0], p.n_q, p.n_k, p.v.shape[-1]
    acc_all = np.zeros((n_b, n_q, d_v), dtype=dtype)
    l_all = np.zeros((n_b, n_q), dtype=dtype)
    for b in range(n_b):  # one head at a time
        for i0 in range(0, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            q_i = p.q[b, i0:i1].astype(dtype)
            m_i = np.full(i1 - i0, -np.inf, dtype=dtype)
            l_i = np.zeros(i1 - i0, dtype=dtype)
            acc = np.zeros((i1 - i0, d_v), dtype=dtype)
            for j0 in range(0, n_k, block_k):
                j1 = min(j0 + block_k, n_k)
                s = (q_i @ p.k[b, j0:j1].T.astype(dtype)) * p.scale  # S_ij
                visible = tile_mask(i0, i1, j0, j1, p.offset, None)
                if visible is not None:
                    s = np.where(visible, s, -np.inf)
                m_new = np.maximum(m_i, s.max(axis=-1))
                m_ref = np.where(np.isneginf(m_new), 0, m_new)  # no exp(-inf + inf)
                p_ij = np.exp(s - m_ref[:, None])  # P~_ij
                alpha = np.exp(m_i - m_ref)
                l_i = alpha * l_i + p_ij.sum(axis=-1)
                acc = alpha[:, None] * acc + p_ij @ p.v[b, j0:j1].astype(dtype)
                m_i = m_new
            acc_all[b, i0:i1], l_all[b, i0:i1] = acc, l_i
    return _finish(p, acc_all, l_all)


def rung1_exp2(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K, causal: bool | str = False, scale: float | None = None,
) -> np.ndarray:
    """Rung 1: scale * log2(e) folded into Q once; exp2 instead of exp, no per-tile scaling."""
    p, block_q, block_k, dtype = _setup(q, k, v, block_q, block_k, causal, scale)
    n_b, n_q, n_k, d_v = p.q.shape[0], p.n_q, p.n_k, p.v.shape[-1]
    q2 = p.q.astype(dtype) * dtype.type(float(p.scale) * LOG2E)  # exp(x) = exp2(x log2 e)
    acc_all = np.zeros((n_b, n_q, d_v), dtype=dtype)
    l_all = np.zeros((n_b, n_q), dtype=dtype)
    for b in range(n_b):
        for i0 in range(0, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            m_i = np.full(i1 - i0, -np.inf, dtype=dtype)
            l_i = np.zeros(i1 - i0, dtype=dtype)
            acc = np.zeros((i1 - i0, d_v), dtype=dtype)
            for j0 in range(0, n_k, block_k):
                j1 = min(j0 + block_k, n_k)
                s = q2[b, i0:i1] @ p.k[b, j0:j1].T.astype(dtype)  # base-2 scores
                visible = tile_mask(i0, i1, j0, j1, p.offset, None)
                if visible is not None:
                    s = np.where(visible, s, -np.inf)
                m_new = np.maximum(m_i, s.max(axis=-1))
                m_ref = np.where(np.isneginf(m_new), 0, m_new)
                p_ij = np.exp2(s - m_ref[:, None])
                alpha = np.exp2(m_i - m_ref)
                l_i = alpha * l_i + p_ij.sum(axis=-1)
                acc = alpha[:, None] * acc + p_ij @ p.v[b, j0:j1].astype(dtype)
                m_i = m_new
            acc_all[b, i0:i1], l_all[b, i0:i1] = acc, l_i
    return _finish(p, acc_all, l_all)


def rung2_buffers(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K, causal: bool | str = False, scale: float | None = None,
) -> np.ndarray:
    """Rung 2: K^T copied once into the layout the matmul reads fastest, one preallocated
    tile, matmul with ``out=``, subtract and exp2 in place."""
    p, block_q, block_k, dtype = _setup(q, k, v, block_q, block_k, causal, scale)
    n_b, n_q, n_k, d_v = p.q.shape[0], p.n_q, p.n_k, p.v.shape[-1]
    q2 = p.q.astype(dtype) * dtype.type(float(p.scale) * LOG2E)
    k_t = np.ascontiguousarray(p.k.swapaxes(-1, -2), dtype=dtype)  # (B, d, n_k), a copy
    v = p.v.astype(dtype, copy=False)
    acc_all = np.zeros((n_b, n_q, d_v), dtype=dtype)
    l_all = np.zeros((n_b, n_q), dtype=dtype)
    s_buf = np.empty((min(block_q, n_q), min(block_k, n_k)), dtype=dtype)  # the tile
    pv = np.empty((min(block_q, n_q), d_v), dtype=dtype)
    for b in range(n_b):
        for i0 in range(0, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            m_i = np.full(i1 - i0, -np.inf, dtype=dtype)
            l_i, acc = l_all[b, i0:i1], acc_all[b, i0:i1]  # accumulate in place
            for j0 in range(0, n_k, block_k):
                j1 = min(j0 + block_k, n_k)
                s = np.matmul(q2[b, i0:i1], k_t[b, :, j0:j1], out=s_buf[: i1 - i0, : j1 - j0])
                visible = tile_mask(i0, i1, j0, j1, p.offset, None)
                if visible is not None:
                    np.copyto(s, -np.inf, where=~visible)
                m_new = np.maximum(m_i, s.max(axis=-1))
                m_ref = np.where(np.isneginf(m_new), 0, m_new)
                s -= m_ref[:, None]
                np.exp2(s, out=s)
                alpha = np.exp2(m_i - m_ref)
                l_i *= alpha
                l_i += s.sum(axis=-1)
                acc *= alpha[:, None]
                acc += np.matmul(s, v[b, j0:j1], out=pv[: i1 - i0])
                m_i = m_new
    return _finish(p, acc_all, l_all)


def rung3_heads(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K, causal: bool | str = False, scale: float | None = None,
) -> np.ndarray:
    """Rung 3: rung 2 for every head at once: each numpy call works on a (B, B_r, B_c) tile."""
    p, block_q, block_k, dtype = _setup(q, k, v, block_q, block_k, causal, scale)
    n_b, n_q, n_k, d_v = p.q.shape[0], p.n_q, p.n_k, p.v.shape[-1]
    q2 = p.q.astype(dtype) * dtype.type(float(p.scale) * LOG2E)
    k_t = np.ascontiguousarray(p.k.swapaxes(-1, -2), dtype=dtype)
    v = p.v.astype(dtype, copy=False)
    acc_all = np.zeros((n_b, n_q, d_v), dtype=dtype)
    l_all = np.zeros((n_b, n_q), dtype=dtype)
    s_buf = np.empty((n_b, min(block_q, n_q), min(block_k, n_k)), dtype=dtype)
    pv = np.empty((n_b, min(block_q, n_q), d_v), dtype=dtype)
    for i0 in range(0, n_q, block_q):  # no loop over heads any more
        i1 = min(i0 + block_q, n_q)
        m_i = np.full((n_b, i1 - i0), -np.inf, dtype=dtype)
        l_i, acc = l_all[:, i0:i1], acc_all[:, i0:i1]
        for j0 in range(0, n_k, block_k):
            j1 = min(j0 + block_k, n_k)
            s = np.matmul(q2[:, i0:i1], k_t[:, :, j0:j1], out=s_buf[:, : i1 - i0, : j1 - j0])
            visible = tile_mask(i0, i1, j0, j1, p.offset, None)
            if visible is not None:
                np.copyto(s, -np.inf, where=~visible)
            m_new = np.maximum(m_i, s.max(axis=-1))
            m_ref = np.where(np.isneginf(m_new), 0, m_new)
            s -= m_ref[..., None]
            np.exp2(s, out=s)
            alpha = np.exp2(m_i - m_ref)
            l_i *= alpha
            l_i += s.sum(axis=-1)
            acc *= alpha[..., None]
            acc += np.matmul(s, v[:, j0:j1], out=pv[:, : i1 - i0])
            m_i = m_new
    return _finish(p, acc_all, l_all)


def _with_ones(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """[x | 1]: x (B, n, c) with a last column of ones, (B, n, c + 1), in ``dtype``."""
    out = np.empty(x.shape[:-1] + (x.shape[-1] + 1,), dtype=dtype)
    out[..., :-1] = x
    out[..., -1] = 1
    return out


def rung4_ones_column(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K, causal: bool | str = False, scale: float | None = None,
) -> np.ndarray:
    """Rung 4: P @ [V | 1] gives the tile's P V and its row sums l in one matmul."""
    p, block_q, block_k, dtype = _setup(q, k, v, block_q, block_k, causal, scale)
    n_b, n_q, n_k, d_v = p.q.shape[0], p.n_q, p.n_k, p.v.shape[-1]
    q2 = p.q.astype(dtype) * dtype.type(float(p.scale) * LOG2E)
    k_t = np.ascontiguousarray(p.k.swapaxes(-1, -2), dtype=dtype)
    v1 = _with_ones(p.v, dtype)  # [V | 1]: (B, n_k, d_v + 1)
    acc_all = np.zeros((n_b, n_q, d_v + 1), dtype=dtype)  # [sum P V | l]
    s_buf = np.empty((n_b, min(block_q, n_q), min(block_k, n_k)), dtype=dtype)
    pv = np.empty((n_b, min(block_q, n_q), d_v + 1), dtype=dtype)
    for i0 in range(0, n_q, block_q):
        i1 = min(i0 + block_q, n_q)
        m_i = np.full((n_b, i1 - i0), -np.inf, dtype=dtype)
        acc = acc_all[:, i0:i1]
        for j0 in range(0, n_k, block_k):
            j1 = min(j0 + block_k, n_k)
            s = np.matmul(q2[:, i0:i1], k_t[:, :, j0:j1], out=s_buf[:, : i1 - i0, : j1 - j0])
            visible = tile_mask(i0, i1, j0, j1, p.offset, None)
            if visible is not None:
                np.copyto(s, -np.inf, where=~visible)
            m_new = np.maximum(m_i, s.max(axis=-1))
            m_ref = np.where(np.isneginf(m_new), 0, m_new)
            s -= m_ref[..., None]
            np.exp2(s, out=s)
            acc *= np.exp2(m_i - m_ref)[..., None]  # rescales P V and l together
            acc += np.matmul(s, v1[:, j0:j1], out=pv[:, : i1 - i0])
            m_i = m_new
    return _finish(p, acc_all[..., :d_v], acc_all[..., d_v])


def rung5_lazy_rescale(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K, causal: bool | str = False, scale: float | None = None,
) -> np.ndarray:
    """Rung 5: keep a stale max m_i until a row's max grows by more than RESCALE_THRESHOLD.

    exp2(s - m_i) <= 2**RESCALE_THRESHOLD cannot overflow, and acc / l does not depend on
    which m_i both were computed against: same result up to rounding, fewer rescales.
    """
    p, block_q, block_k, dtype = _setup(q, k, v, block_q, block_k, causal, scale)
    n_b, n_q, n_k, d_v = p.q.shape[0], p.n_q, p.n_k, p.v.shape[-1]
    q2 = p.q.astype(dtype) * dtype.type(float(p.scale) * LOG2E)
    k_t = np.ascontiguousarray(p.k.swapaxes(-1, -2), dtype=dtype)
    v1 = _with_ones(p.v, dtype)
    acc_all = np.zeros((n_b, n_q, d_v + 1), dtype=dtype)
    s_buf = np.empty((n_b, min(block_q, n_q), min(block_k, n_k)), dtype=dtype)
    pv = np.empty((n_b, min(block_q, n_q), d_v + 1), dtype=dtype)
    for i0 in range(0, n_q, block_q):
        i1 = min(i0 + block_q, n_q)
        m_i = np.full((n_b, i1 - i0), -np.inf, dtype=dtype)
        m_ref = np.zeros_like(m_i)  # finite stand-in for m_i while a row has seen no key
        acc = acc_all[:, i0:i1]
        for j0 in range(0, n_k, block_k):
            j1 = min(j0 + block_k, n_k)
            s = np.matmul(q2[:, i0:i1], k_t[:, :, j0:j1], out=s_buf[:, : i1 - i0, : j1 - j0])
            visible = tile_mask(i0, i1, j0, j1, p.offset, None)
            if visible is not None:
                np.copyto(s, -np.inf, where=~visible)
            m_tile = s.max(axis=-1)
            if (m_tile > m_i + RESCALE_THRESHOLD).any():  # only then: a new max, rescale
                m_new = np.maximum(m_i, m_tile)
                m_new_ref = np.where(np.isneginf(m_new), 0, m_new)
                acc *= np.exp2(m_i - m_new_ref)[..., None]
                m_i, m_ref = m_new, m_new_ref
            s -= m_ref[..., None]
            np.exp2(s, out=s)  # every term <= 2**RESCALE_THRESHOLD
            acc += np.matmul(s, v1[:, j0:j1], out=pv[:, : i1 - i0])
    return _finish(p, acc_all[..., :d_v], acc_all[..., d_v])


def rung6_stale_max(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K, causal: bool | str = False, scale: float | None = None,
) -> np.ndarray:
    """Rung 6: [Q_i, -m_i] @ [K_j^T; 1] = S_ij - m_i, so the stale max costs no pass at all.

    No max over the tile either: the row sums l (from the ones column of rung 4) bound every
    term, and a tile whose row sum exceeds STALE_LIMIT (or overflows) is redone exactly,
    against its true maximum.  Masked tiles and the first tile of each block take that
    exact step too.
    """
    p, block_q, block_k, dtype = _setup(q, k, v, block_q, block_k, causal, scale)
    n_b, n_q, n_k, d, d_v = p.q.shape[0], p.n_q, p.n_k, p.q.shape[-1], p.v.shape[-1]
    q_aug = _with_ones(p.q * dtype.type(float(p.scale) * LOG2E), dtype)  # last column: -m_i
    k_aug = np.empty((n_b, d + 1, n_k), dtype=dtype)  # [K^T; 1], laid out like rung 2's K^T
    k_aug[:, :d] = p.k.swapaxes(-1, -2)
    k_aug[:, d] = 1
    v1 = _with_ones(p.v, dtype)
    acc_all = np.zeros((n_b, n_q, d_v + 1), dtype=dtype)
    s_buf = np.empty((n_b, min(block_q, n_q), min(block_k, n_k)), dtype=dtype)
    pv = np.empty((n_b, min(block_q, n_q), d_v + 1), dtype=dtype)
    for i0 in range(0, n_q, block_q):
        i1 = min(i0 + block_q, n_q)
        q_i, acc = q_aug[:, i0:i1], acc_all[:, i0:i1]
        m_i = np.full((n_b, i1 - i0), -np.inf, dtype=dtype)
        for j0 in range(0, n_k, block_k):
            j1 = min(j0 + block_k, n_k)
            s, pv_ij = s_buf[:, : i1 - i0, : j1 - j0], pv[:, : i1 - i0]
            visible = tile_mask(i0, i1, j0, j1, p.offset, None)
            if visible is None and np.isfinite(m_i).all():  # fast step
                np.matmul(q_i, k_aug[:, :, j0:j1], out=s)  # S_ij - m_i
                with np.errstate(over="ignore", invalid="ignore"):  # inf: redone below
                    np.exp2(s, out=s)
                    np.matmul(s, v1[:, j0:j1], out=pv_ij)
                if (pv_ij[..., d_v] <= STALE_LIMIT).all():
                    acc += pv_ij
                    continue
            np.matmul(q_i[..., :d], k_aug[:, :d, j0:j1], out=s)  # exact step
            if visible is not None:
                np.copyto(s, -np.inf, where=~visible)
            m_new = np.maximum(m_i, s.max(axis=-1))
            m_ref = np.where(np.isneginf(m_new), 0, m_new)
            s -= m_ref[..., None]
            np.exp2(s, out=s)
            acc *= np.exp2(m_i - m_ref)[..., None]
            acc += np.matmul(s, v1[:, j0:j1], out=pv_ij)
            m_i = m_new
            q_i[..., d] = -m_ref
    return _finish(p, acc_all[..., :d_v], acc_all[..., d_v])


def rung7_kt_tiles(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K, causal: bool | str = False, scale: float | None = None,
) -> np.ndarray:
    """Rung 7: rung 6 with [K^T; 1] laid out as contiguous (d + 1, B_c) tiles.

    Rung 6 slices its tiles out of one (d + 1, n_k) array: each tile's rows lie n_k floats
    apart (a power of two at the usual n), a stride that makes the Q K^T matmul markedly
    slower than the same product on a contiguous tile.  Same arithmetic, same result.
    """
    p, block_q, block_k, dtype = _setup(q, k, v, block_q, block_k, causal, scale)
    n_b, n_q, n_k, d, d_v = p.q.shape[0], p.n_q, p.n_k, p.q.shape[-1], p.v.shape[-1]
    q_aug = _with_ones(p.q * dtype.type(float(p.scale) * LOG2E), dtype)  # last column: -m_i
    k_tiles = transposed_tiles(p.k, min(block_k, n_k), dtype)  # (B, n_k / B_c, d + 1, B_c)
    v1 = _with_ones(p.v, dtype)
    acc_all = np.zeros((n_b, n_q, d_v + 1), dtype=dtype)
    s_buf = np.empty((n_b, min(block_q, n_q), min(block_k, n_k)), dtype=dtype)
    pv = np.empty((n_b, min(block_q, n_q), d_v + 1), dtype=dtype)
    for i0 in range(0, n_q, block_q):
        i1 = min(i0 + block_q, n_q)
        q_i, acc = q_aug[:, i0:i1], acc_all[:, i0:i1]
        m_i = np.full((n_b, i1 - i0), -np.inf, dtype=dtype)
        for t, j0 in enumerate(range(0, n_k, block_k)):
            j1 = min(j0 + block_k, n_k)
            s, pv_ij = s_buf[:, : i1 - i0, : j1 - j0], pv[:, : i1 - i0]
            k_j = k_tiles[:, t, :, : j1 - j0]  # contiguous: the only change from rung 6
            visible = tile_mask(i0, i1, j0, j1, p.offset, None)
            if visible is None and np.isfinite(m_i).all():  # fast step
                np.matmul(q_i, k_j, out=s)  # S_ij - m_i
                with np.errstate(over="ignore", invalid="ignore"):  # inf: redone below
                    np.exp2(s, out=s)
                    np.matmul(s, v1[:, j0:j1], out=pv_ij)
                if (pv_ij[..., d_v] <= STALE_LIMIT).all():
                    acc += pv_ij
                    continue
            np.matmul(q_i[..., :d], k_j[:, :d], out=s)  # exact step
            if visible is not None:
                np.copyto(s, -np.inf, where=~visible)
            m_new = np.maximum(m_i, s.max(axis=-1))
            m_ref = np.where(np.isneginf(m_new), 0, m_new)
            s -= m_ref[..., None]
            np.exp2(s, out=s)
            acc *= np.exp2(m_i - m_ref)[..., None]
            acc += np.matmul(s, v1[:, j0:j1], out=pv_ij)
            m_i = m_new
            q_i[..., d] = -m_ref
    return _finish(p, acc_all[..., :d_v], acc_all[..., d_v])


def cliff_floor(q: np.ndarray, k: np.ndarray, scale: float, n_k: int,
                dtype: np.dtype) -> float | None:
    """The base-2 floor at which rung 8 (and the library) clamp S - m_i, or None when the
    scores cannot reach it.  The floor is -63 for float32 (half the smallest normal exponent:
    2**-63 times any value stays a normal number); scores reach it only if
    2 scale log2(e) max|q_i| max|k_j| (Cauchy-Schwarz bounds |s| by the product of the
    norms) plus the log2(n_k) + 2 by which a moved-up m_i may exceed the row maximum does."""
    floor = float(np.finfo(dtype).minexp // 2)
    norms = [math.sqrt(float(np.einsum("...i,...i->...", x, x, dtype=dtype).max(initial=0)))
             for x in (q, k)]
    reach = 2 * abs(scale) * LOG2E * norms[0] * norms[1] * (1 + 1e-3) + math.log2(n_k + 1) + 2
    return floor if reach >= -floor else None


def rung8_no_cliff(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K, causal: bool | str = False, scale: float | None = None,
) -> np.ndarray:
    """Rung 8: rung 7 without the large-logit cliff.

    With large logits (scores of standard deviation 30, say) most of a tile's S - m_i lie far
    below -126, where float32 exp2 returns subnormal numbers or 0 on a path 10 to 200 times
    slower, and the matmuls and updates that meet subnormal numbers slow down too.  Where the
    scores can reach it (:func:`cliff_floor`) and a tile's minimum does, S - m_i is clamped at
    -63: a term of 2**-63 instead of a smaller one, far below rounding.  And a row maximum that
    grows past the stale limit no longer costs a second matmul: while the row sums stay finite,
    m_i moves up by the power of two 2**e above them and acc is scaled by 2**-e.
    """
    p, block_q, block_k, dtype = _setup(q, k, v, block_q, block_k, causal, scale)
    n_b, n_q, n_k, d, d_v = p.q.shape[0], p.n_q, p.n_k, p.q.shape[-1], p.v.shape[-1]
    q_aug = _with_ones(p.q * dtype.type(float(p.scale) * LOG2E), dtype)
    k_tiles = transposed_tiles(p.k, min(block_k, n_k), dtype)
    v1 = _with_ones(p.v, dtype)
    floor = cliff_floor(p.q, p.k, float(p.scale), n_k, dtype)  # None: no clamping needed
    acc_all = np.zeros((n_b, n_q, d_v + 1), dtype=dtype)
    s_buf = np.empty((n_b, min(block_q, n_q), min(block_k, n_k)), dtype=dtype)
    pv = np.empty((n_b, min(block_q, n_q), d_v + 1), dtype=dtype)
    for i0 in range(0, n_q, block_q):
        i1 = min(i0 + block_q, n_q)
        q_i, acc = q_aug[:, i0:i1], acc_all[:, i0:i1]
        m_i = np.full((n_b, i1 - i0), -np.inf, dtype=dtype)
        for t, j0 in enumerate(range(0, n_k, block_k)):
            j1 = min(j0 + block_k, n_k)
            s, pv_ij = s_buf[:, : i1 - i0, : j1 - j0], pv[:, : i1 - i0]
            k_j = k_tiles[:, t, :, : j1 - j0]
            visible = tile_mask(i0, i1, j0, j1, p.offset, None)
            if visible is None and np.isfinite(m_i).all():  # fast step
                np.matmul(q_i, k_j, out=s)  # S_ij - m_i
                if floor is not None and s.min() < floor:
                    np.maximum(s, floor, out=s)  # no subnormal numbers from here on
                with np.errstate(over="ignore", invalid="ignore"):  # inf: redone below
                    np.exp2(s, out=s)
                    np.matmul(s, v1[:, j0:j1], out=pv_ij)
                l_tile = pv_ij[..., d_v]
                if (l_tile <= STALE_LIMIT).all():
                    acc += pv_ij
                    continue
                if np.isfinite(pv_ij).all():  # a row sum grew large: move m_i up
                    acc += pv_ij
                    e = np.where(acc[..., d_v] > STALE_LIMIT, np.frexp(acc[..., d_v])[1], 0)
                    m_new = m_i + e.astype(dtype)  # l_i * 2**-e < 1
                    acc *= np.exp2(m_i - m_new)[..., None]  # 2**-e (as m_new was rounded)
                    m_i = m_new
                    q_i[..., d] = -m_i
                    continue
            np.matmul(q_i[..., :d], k_j[:, :d], out=s)  # exact step (an overflow: rare)
            if visible is not None:
                np.copyto(s, -np.inf, where=~visible)
            m_new = np.maximum(m_i, s.max(axis=-1))
            m_ref = np.where(np.isneginf(m_new), 0, m_new)
            s -= m_ref[..., None]
            if floor is not None:
                np.maximum(s, floor, out=s)
            np.exp2(s, out=s)
            acc *= np.exp2(m_i - m_ref)[..., None]
            acc += np.matmul(s, v1[:, j0:j1], out=pv_ij)
            m_i = m_new
            q_i[..., d] = -m_ref
    return _finish(p, acc_all[..., :d_v], acc_all[..., d_v])


def rung10_threads(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K, causal: bool | str = False, scale: float | None = None,
    workers: int | None = None,
) -> np.ndarray:
    """Rung 10: the library forward (rung 9) with its (head group, query block) items on
    ``workers`` threads, default every core (``os.cpu_count()``), BLAS held at one thread
    meanwhile.  numpy releases the GIL inside matmul and large ufunc loops, so the threads run
    in parallel but for the few Python statements between numpy calls.  The result equals
    rung 9's bit for bit.  :func:`flashlib.flash_attention` does the same with as many threads
    as the BLAS thread limit."""
    p = check_problem(q, k, v, causal=causal, scale=scale, blocks=(block_q, block_k))
    n = (os.cpu_count() or 1) if workers is None else check_int(workers, "workers", minimum=1)
    o, _ = run_forward(p, workers=n)
    return p.unflatten(o)


#: The ladder in order: (label, function).  Every function has the signature
#: f(q, k, v, *, block_q, block_k, causal, scale) -> o; the baseline :func:`naive_inplace`
#: (no blocks) is not a rung.
RUNGS: list[tuple[str, Callable[..., np.ndarray]]] = [
    ("0 plain FA2 loop", rung0_plain),
    ("1 exp2, scale in Q", rung1_exp2),
    ("2 K^T once, tile buffers", rung2_buffers),
    ("3 all heads batched", rung3_heads),
    ("4 ones column", rung4_ones_column),
    ("5 lazy rescale", rung5_lazy_rescale),
    ("6 stale max in matmul", rung6_stale_max),
    ("7 K^T in contiguous tiles", rung7_kt_tiles),
    ("8 no large-logit cliff", rung8_no_cliff),
    ("9 flash_attention", flash_attention),
]


#: The rung timed apart, with the wall clock: rung 9 on every core.  Same signature, plus
#: ``workers`` (default: every core).
THREADS_RUNG: tuple[str, Callable[..., np.ndarray]] = ("10 threads", rung10_threads)


# --- the chapter's rungs: flash2_forward, then the two changes that clearly gain -------------
#
# The chapter shows these as diffs from flashlib.algorithms.flash2_forward (same names, same
# shape of loop), and times them beside it; the eleven rungs above stay for
# ``python -m flashlib.bench ladder``, which times every small step.


def flash2_per_head(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`flashlib.algorithms.flash2_forward` on each head of a stack in turn (the
    chapter's rung 0).  Q: (H, N_q, d), K: (H, N_k, d), V: (H, N_k, d_v) -> O: (H, N_q, d_v),
    L: (H, N_q)."""
    from flashlib.algorithms import flash2_forward

    outs = [flash2_forward(Q[h], K[h], V[h], B_r, B_c) for h in range(len(Q))]
    return np.stack([o for o, _ in outs]), np.stack([lse for _, lse in outs])


def ones_column(x: np.ndarray) -> np.ndarray:
    """[x | 1]: x (..., n, c) with a last column of ones, (..., n, c + 1), in x's dtype."""
    return _with_ones(x, x.dtype)


def flash2_heads(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int
) -> tuple[np.ndarray, np.ndarray]:
    """flash2_forward for every head at once, in base 2 (the chapter's rung 1).

    Q: (H, N_q, d), K: (H, N_k, d), V: (H, N_k, d_v) -> O: (H, N_q, d_v)
    and L: (H, N_q), natural log as flash2_forward's.
    """
    N_q, N_k, d_v = Q.shape[-2], K.shape[-2], V.shape[-1]
    scale = 1 / math.sqrt(Q.shape[-1])  # tau
    Q = Q * Q.dtype.type(scale * LOG2E)  # exp(x) = exp2(x log2 e)
    O = np.empty_like(Q, shape=Q.shape[:-1] + (d_v,))  # (H, N_q, d_v)
    L = np.empty_like(Q, shape=Q.shape[:-1])  # (H, N_q)
    for i in range(0, N_q, B_r):  # outer loop over query blocks
        Q_i = Q[:, i : i + B_r]  # load Q_i of every head: (H, B_r, d)
        O_i = np.zeros(Q_i.shape[:-1] + (d_v,), Q.dtype)
        l_i = np.zeros(Q_i.shape[:-1], Q.dtype)  # (H, B_r)
        m_i = np.full(Q_i.shape[:-1], -np.inf, Q.dtype)  # (H, B_r)
        for j in range(0, N_k, B_c):  # inner loop over key blocks
            K_j, V_j = K[:, j : j + B_c], V[:, j : j + B_c]
            S_ij = Q_i @ K_j.swapaxes(1, 2)  # (H, B_r, B_c), base 2
            m_new = np.maximum(m_i, S_ij.max(axis=-1))  # (H, B_r)
            P_ij = np.exp2(S_ij - m_new[..., None])
            alpha = np.exp2(m_i - m_new)
            l_i = alpha * l_i + P_ij.sum(axis=-1)
            O_i = alpha[..., None] * O_i + P_ij @ V_j
            m_i = m_new
        O[:, i : i + B_r] = O_i / l_i[..., None]
        L[:, i : i + B_r] = (m_i + np.log2(l_i)) / LOG2E
    return O, L


def flash2_in_matmul(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int
) -> tuple[np.ndarray, np.ndarray]:
    """flash2_heads with the row sum and a stale maximum inside the
    matmuls (the chapter's rung 2): [Q_i | -m_i] @ [K_j^T; 1] = S_ij - m_i
    and P_ij @ [V_j | 1] = [P_ij V_j | rowsum], so one exp2 is all the
    work left outside them.  m_i stays stale while every row sum stays
    at most STALE_LIMIT; a tile past it (or the first tile of a block) is
    done exactly, against its true maximum.

    Q: (H, N_q, d), K: (H, N_k, d), V: (H, N_k, d_v) -> O: (H, N_q, d_v)
    and L: (H, N_q), as flash2_heads.
    """
    N_q, N_k, d_v = Q.shape[-2], K.shape[-2], V.shape[-1]
    scale = 1 / math.sqrt(Q.shape[-1])  # tau
    Q = ones_column(Q * Q.dtype.type(scale * LOG2E))  # [Q | 1]
    K = ones_column(K).swapaxes(1, 2).copy()  # [K^T; 1]: (H, d + 1, N_k)
    V = ones_column(V)  # [V | 1]: (H, N_k, d_v + 1)
    O = np.empty_like(Q, shape=Q.shape[:-1] + (d_v,))  # (H, N_q, d_v)
    L = np.empty_like(Q, shape=Q.shape[:-1])  # (H, N_q)
    for i in range(0, N_q, B_r):  # outer loop over query blocks
        Q_i = Q[:, i : i + B_r].copy()  # [Q_i | -m_i]: (H, B_r, d + 1)
        O_i = np.zeros(Q_i.shape[:-1] + (d_v + 1,), Q.dtype)  # [O_i | l_i]
        m_i = np.full(Q_i.shape[:-1], -np.inf, Q.dtype)  # (H, B_r)
        for j in range(0, N_k, B_c):  # inner loop over key blocks
            K_j, V_j = K[..., j : j + B_c], V[:, j : j + B_c]
            if np.isfinite(m_i).all():  # stale step: 2 matmuls, 1 exp2
                with np.errstate(over="ignore", invalid="ignore"):
                    PV = np.exp2(Q_i @ K_j) @ V_j  # [P_ij V_j | rowsum]
                if (PV[..., -1] <= STALE_LIMIT).all():  # no overflow
                    O_i += PV
                    continue
            S_ij = Q_i[..., :-1] @ K_j[:, :-1]  # exact step
            m_new = np.maximum(m_i, S_ij.max(axis=-1))  # (H, B_r)
            P_ij = np.exp2(S_ij - m_new[..., None])
            O_i = np.exp2(m_i - m_new)[..., None] * O_i + P_ij @ V_j
            m_i = m_new
            Q_i[..., -1] = -m_i
        l_i = O_i[..., -1]
        O[:, i : i + B_r] = O_i[..., :-1] / l_i[..., None]
        L[:, i : i + B_r] = (m_i + np.log2(l_i)) / LOG2E
    return O, L


#: The chapter's rungs in order, (label, function), each f(Q, K, V, B_r, B_c) -> (O, L);
#: the library's flash_attention is the rung after them.
CHAPTER_RUNGS: list[tuple[str, Callable[..., tuple[np.ndarray, np.ndarray]]]] = [
    ("0 flash2_forward", flash2_per_head),
    ("1 every head, exp2", flash2_heads),
    ("2 work in the matmuls", flash2_in_matmul),
]
