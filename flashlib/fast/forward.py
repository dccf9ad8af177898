"""FlashAttention-2 forward, the fast library version: :func:`flash_attention`.

The teaching function is :func:`flashlib.algorithms.flash2_forward` (one head, no mask, as the
paper writes it); this is its library twin, with every trick described below.

For each block of ``B_r`` query rows the kernel streams over the key/value blocks of ``B_c`` rows,
keeping only the running row maximum ``m_i``, the running sum ``l_i`` and the unnormalised output
``acc`` (Dao 2023, Section 3.1).  The division by ``l_i`` happens once, at the end, and only the
logsumexp ``lse = m + log(l)`` is kept for the backward pass.  No ``(n_q, n_k)`` array is ever
built: beyond inputs and outputs the memory is one copy of K and O(n) state (O(n d) in all)
plus a group's few ``(B_r, B_c)`` tiles per worker thread (at most :data:`TILE_BYTES` of
them, or one tile if that is larger), whatever block sizes are asked for (a tile is
``min(block, n)`` on each side).

The tricks GPU kernels use, applied here (the optimisation-ladder chapter measures each one):

- the softmax scale and ``log2(e)`` are folded into Q, so that the cheaper ``exp2`` replaces
  ``exp`` and no ``(B_r, B_c)`` tile is ever multiplied by the scale;
- K^T is laid out once as contiguous ``(d + 1, B_c)`` tiles, the layout the matmul reads fastest
  (a slice of one long ``(d + 1, n_k)`` row has a large, often power-of-two, stride);
- every BLAS call is one the matrix library runs near its peak: OpenBLAS multiplies products
  of up to 100**3 multiply-adds with small-matrix kernels that skip packing the operands, so
  each tile's products are cut into calls of 64 query rows (:func:`flashlib.fast.tiles.
  blas_matmul`); and several tiles go through each numpy call, so that the Python statements
  between the calls cost little: up to GROUP_TILES query blocks of a head (a taller block of
  rows, which also streams K and V past a quarter as often) and as many heads as fit
  :data:`TILE_BYTES`, each (head, query block) tile its own BLAS call, with preallocated tiles
  and ``out=``;
- conditional rescaling: the running maximum ``m_i`` is only updated when a tile's row sum of
  ``exp2(s - m_i)`` gets large, not whenever it grows.  Until then ``m_i`` is a constant, so
  ``s - m_i`` comes straight out of the ``Q K^T`` matmul: Q gets a column ``-m_i`` and K^T a row
  of ones, and the max/subtract passes over the tile disappear.  A row sum that grew too large
  but stayed finite moves ``m_i`` up by a power of two (no second matmul); only an overflow
  sends the tile through the exact step;
- the row sums of a tile are a matrix-vector product with ones, ``P @ 1``, which BLAS computes
  several times faster than ``P.sum(axis=-1)``;
- no large-logit cliff: numpy's float32 ``exp2`` is 10 to 200 times slower on arguments whose
  result is not a normal number (below -126: subnormal or zero; ``-inf``), and matmuls and
  in-place updates on subnormal numbers are several times slower too.  Scores are clamped at
  -63 (a term of at most 2**-63 against a row sum of at least 1/2: far below rounding), but
  only where a Cauchy-Schwarz bound on the scores says they can fall that low and a tile's
  minimum says they do, so ordinary logits pay nothing; masked entries are zeroed after the
  exponential instead of being set to ``-inf`` before it;
- key blocks that the causal mask hides entirely are skipped, and a mask is applied only to
  tiles that straddle the diagonal or hold masked entries;
- query blocks are independent (FlashAttention-2's parallelism over the sequence): the groups
  run on a pool of threads, as many as the BLAS thread limit (flashlib.core.threads).
"""

from __future__ import annotations

import math

import numpy as np

from flashlib.core import threads as pool
from flashlib.core.checks import check_flag, check_float_dtype, check_int
from flashlib.core.constants import BLOCK_K, BLOCK_Q, LN2, LOG2E, compute_dtype
from flashlib.core.masks import key_stop
from flashlib.core.problem import Problem, check_no_overflow, check_problem, results_are_finite
from flashlib.fast.bounded import BoundedGroup, unshifted_ok
from flashlib.fast.dropout import check_dropout, dropout_forward
from flashlib.fast.precise import exact_attention, forward_in_float64, in_float64
from flashlib.fast.row_group import HEADROOM, STALE_LIMIT, Hiding, RowGroup, Tiles
from flashlib.fast.tiles import (
    GROUP_TILES,
    TILE_BYTES,
    exp_floor,
    max_row_norm,
    slow_below,
    transposed_tiles,
)

__all__ = ["flash_attention", "run_forward", "workspace_bytes", "unshifted_ok", "STALE_LIMIT",
           "HEADROOM"]


def workspace_bytes(n_q: int, n_k: int, d: int, dtype: object, *, d_v: int | None = None,
                    batch: int = 1, block_k: int = BLOCK_K) -> int:
    """Bytes of the arrays :func:`flash_attention` allocates whose size grows with n.

    For ``batch`` heads of q: (n_q, d), k: (n_k, d), v: (n_k, d_v) (``d_v = d`` by default) in
    ``dtype``, in the running-statistics dtype :func:`compute_dtype`: the tiles of K^T with a
    row of ones, (d + 1) x B_c each, ceil(n_k / B_c) of them (B_c = min(block_k, n_k)), and
    ``lse``, one value per query row; for float16 inputs also the float32 copy of V.  Not
    counted: the output, and the tiles, whose size depends only on the block sizes: a group's
    few (B_r, B_c) tiles per worker thread (:data:`TILE_BYTES` of them, or one tile),
    B_r = min(block_q, n_q).
    """
    dt = check_float_dtype(dtype, "dtype")
    n_q, n_k, d, batch = (check_int(value, name, minimum=0) for name, value in
                          (("n_q", n_q), ("n_k", n_k), ("d", d), ("batch", batch)))
    d_v = d if d_v is None else check_int(d_v, "d_v", minimum=0)
    b_c = min(check_int(block_k, "block_k", minimum=1), n_k)
    work = compute_dtype(dt)
    key_columns = -(-n_k // b_c) * b_c if b_c else 0  # n_k rounded up to whole tiles
    elements = (d + 1) * key_columns + n_q  # K^T tiles and lse
    if work != dt:
        elements += n_k * d_v  # v.astype(float32)
    return int(batch) * int(elements) * work.itemsize


def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    causal: bool | str = False,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    return_lse: bool = False,
    window: tuple[int | None, int | None] | None = None,
    key_lengths: np.ndarray | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Exact attention in the FlashAttention-2 loop order, never building an (n_q, n_k) array.

    Shapes, grouped-query heads (K and V are not copied per query head), block_q, block_k,
    causal, mask, window, key_lengths, scale and return_lse: the options of
    :mod:`flashlib.fast`, said once there.  Key blocks that the causal mask, the window or
    the padding hide entirely are skipped.
    Threads: query blocks run in parallel on as many threads as the BLAS thread limit, when
    the problem and each thread's tiles are large enough for threads to pay (see
    flashlib.core.threads; ``threadpoolctl.threadpool_limits(1)`` makes this single-threaded, and
    without threadpoolctl it is); the result does not depend on the thread count.
    Extra memory beyond inputs and output: O(n d) (:func:`workspace_bytes`) plus a group's
    few B_r x B_c tiles (:data:`TILE_BYTES`, or one tile if larger) per thread.
    Accuracy first: scores too large for the float32 tiles to stay within flash-attn's rule
    (twice plain attention's error) are computed in float64 and rounded once
    (:mod:`flashlib.fast.precise`); values that overflow the unnormalised accumulator are
    recomputed in natural units with V scaled by a power of two; results beyond the dtype's
    range raise ValueError.
    dropout_p, seed: dropout on P, never stored (:mod:`flashlib.fast.dropout`): p in [0, 1),
    p > 0 needs an integer seed in [0, 2**64), which the backward call must repeat.
    """
    return_lse = check_flag(return_lse, "return_lse")
    dropout_p, seed = check_dropout(dropout_p, seed)
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale,
                      blocks=(block_q, block_k), window=window, key_lengths=key_lengths,
                      gqa=True)
    if not dropout_p:
        o, lse = run_forward(p)
    elif forward_in_float64(p):  # large scores: in float64, rounded once (fast.precise)
        o, lse = dropout_forward(in_float64(p), dropout_p, seed)
        with np.errstate(over="ignore", under="ignore"):
            o, lse = o.astype(p.dtype), lse.astype(compute_dtype(p.dtype))
        check_no_overflow(p.dtype, o, stats=lse)
    else:
        o, lse = dropout_forward(p, dropout_p, seed)
    o = p.unflatten(o)
    return (o, p.unflatten(lse)) if return_lse else o


def run_forward(p: Problem, workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """o (B, n_q, d_v) and lse (B, n_q) of a validated problem, with the overflow fallback;
    ``workers`` threads (default: :func:`flashlib.core.threads.worker_count`).  Scores too
    large for the float32 tiles to stay within flash-attn's accuracy rule are computed in
    float64 and rounded once (:mod:`flashlib.fast.precise`)."""
    if forward_in_float64(p):
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            o, lse = exact_attention(in_float64(p).repeat_kv())
            o, lse = o.astype(p.dtype), lse.astype(compute_dtype(p.dtype))  # inf: refused
        check_no_overflow(p.dtype, o, stats=lse)
        return o, lse
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        o, lse = _forward(p, base2=True, workers=workers)
        if not results_are_finite(o, stats=lse):  # rare: huge scores or values, see the docstring
            o, lse = _forward(p, base2=False, workers=workers)
    check_no_overflow(p.dtype, o, stats=lse)
    return o, lse


def _forward(p: Problem, base2: bool, workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The tiled forward of a validated problem: o (B, n_q, d_v) in q's dtype and lse (B, n_q).

    base2: fold scale * log2(e) into Q and use exp2 (the fast path).  False: fold the scale
    alone and use exp, with V divided by a power of two 2^e >= max|v| (exact) and the output
    multiplied back, so that neither the base-2 scores nor the accumulator can overflow.
    workers: threads over the (head group, query block) items (default: the BLAS limit).
    """
    block_q, block_k = p.block_q, p.block_k
    dtype = compute_dtype(p.dtype)
    n_b, n_q, n_k, d, d_v = p.q.shape[0], p.n_q, p.n_k, p.q.shape[-1], p.v.shape[-1]
    v_max = float(max(np.max(p.v, initial=0.0), -np.min(p.v, initial=0.0)))
    if base2:
        q_scale, exp, v, v_exp = dtype.type(float(p.scale) * LOG2E), np.exp2, p.v, 0
    else:
        v_exp = int(np.frexp(v_max)[1])  # 2**v_exp > max|v|
        q_scale, exp, v = p.scale, np.exp, np.ldexp(p.v.astype(dtype), -v_exp)
        v_max = float(np.ldexp(v_max, -v_exp))
    v = v.astype(dtype, copy=False)
    b_r, b_c = min(block_q, n_q), min(block_k, n_k)  # tiles never exceed the problem

    k_tiles = transposed_tiles(p.k, b_c, dtype)  # [K^T; 1]: one O(n d) copy of K

    # Can a score fall low enough for the slow paths?  |s - m_i| <= 2 max|q_i| max|k_j|
    # (Cauchy-Schwarz), plus the up to log2(n_k) + 1 + HEADROOM by which a moved-up m_i can
    # exceed the row maximum.  If so, tiles whose minimum is below the floor are clamped.
    s_max = abs(float(q_scale)) * max_row_norm(p.q) * max_row_norm(p.k) * (1 + 1e-3)
    bound = 2 * s_max + math.log2(n_k + 1) + 2 + HEADROOM * (1 if base2 else LN2)
    clamp = not bound < -slow_below(dtype, exp)
    # Bounded scores (the usual case: |s| <= 63 in base 2) need no running maximum at all.
    unshifted = base2 and unshifted_ok(s_max, n_k, v_max, dtype)

    # A group: up to GROUP_TILES query blocks (rows_per_group) of `group` heads, their tiles
    # within TILE_BYTES (at least one tile).
    tile_bytes = max(1, b_r * b_c * dtype.itemsize)
    tiles = max(1, min(-(-n_q // b_r) if n_q else 1, GROUP_TILES, TILE_BYTES // tile_bytes))
    rows_per_group = max(1, tiles * b_r)
    group = max(1, min(n_b, TILE_BYTES // (tiles * tile_bytes)))
    g_kv = p.kv_group  # grouped-query attention: a group of heads shares one K/V head
    if g_kv > 1:
        group = max(c for c in range(1, min(group, g_kv) + 1) if g_kv % c == 0)
    o = np.empty((n_b, n_q, d_v), dtype=p.dtype)
    lse = np.empty((n_b, n_q), dtype=dtype)
    # Work items: (first head, last head, first query row); the groups that see the most keys
    # first, so that the threads finish together.
    items = [(h0, min(h0 + group, n_b), i0) for i0 in range(0, n_q, rows_per_group)
             for h0 in range(0, n_b, group)]
    items.sort(key=lambda it: -key_stop(it[2], min(it[2] + rows_per_group, n_q), n_k,
                                        p.offset))

    def setup() -> Tiles:
        rows = rows_per_group
        return Tiles(
            q_aug=np.empty((group, rows, d + 1), dtype=dtype),
            s=np.empty((group, rows, b_c), dtype=dtype),
            s_t=(np.empty((group, b_c, rows), dtype=dtype)
                 if group * rows * b_c * dtype.itemsize <= TILE_BYTES else None),
            pv=np.empty((group, rows, d_v), dtype=dtype),
            rows=np.empty((group, rows, 1), dtype=dtype),
            ones=np.ones((b_c, 1), dtype=dtype),
            ones_t=np.ones((1, b_c), dtype=dtype),
            floors=np.full((group, rows, b_c), exp_floor(dtype, exp)) if clamp else None,
        )

    def work(buf: Tiles, item: tuple[int, int, int]) -> None:
        h0, h1, i0 = item
        i1 = min(i0 + rows_per_group, n_q)
        kv = slice(h0, h1) if g_kv == 1 else slice(h0 // g_kv, h0 // g_kv + 1)  # broadcast
        hide = Hiding(p.offset, p.lo, None if p.key_lengths is None else p.key_lengths[h0:h1],
                      None if p.bands is None else p.bands[h0:h1], p.mask, slice(h0, h1))
        if unshifted:  # Q rows contiguous, in q_aug's memory
            q_i = buf.q_aug.reshape(-1)[: (h1 - h0) * (i1 - i0) * d].reshape(
                h1 - h0, i1 - i0, d)
            np.multiply(p.q[h0:h1, i0:i1], q_scale, out=q_i)
            acc, l_i = BoundedGroup(q_i, k_tiles[kv], v[kv], buf).run(i0, b_r, hide)
            m_i = 0
        else:
            q_i = buf.q_aug[: h1 - h0, : i1 - i0]
            np.multiply(p.q[h0:h1, i0:i1], q_scale, out=q_i[..., :d])
            rows_state = RowGroup(q_i, k_tiles[kv], v[kv], buf, exp, clamp, v_max)
            acc, l_i, m_i = rows_state.run(i0, b_r, hide)
        seen = l_i > 0  # False for rows that see no key: output 0, lse -inf
        inv = np.reciprocal(l_i, out=np.zeros_like(l_i), where=seen)  # 1 / l_i, per row
        if v_exp or o.dtype != acc.dtype:
            acc *= inv[..., None]
            if v_exp:
                acc = np.ldexp(acc, v_exp)  # undo the scaling of V (exact)
            o[h0:h1, i0:i1] = acc
        else:  # straight into the output
            np.multiply(acc, inv[..., None], out=o[h0:h1, i0:i1])
        lse_i = lse[h0:h1, i0:i1]
        lse_i.fill(-np.inf)
        if base2:
            np.log2(l_i, out=lse_i, where=seen)
            lse_i += m_i
            lse_i *= LN2  # back from base 2 to natural log
        else:
            np.log(l_i, out=lse_i, where=seen)
            lse_i += m_i

    work_size = float(n_b) * n_q * n_k * (d + d_v)
    threads = pool.workers_for(work_size, len(items), workers,
                               tile=group * rows_per_group * b_c)
    pool.run_items(work, items, threads, setup)
    return o, lse
