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
from typing import NamedTuple

import numpy as np

from flashlib.core import threads as pool
from flashlib.core.checks import check_flag, check_float_dtype, check_int
from flashlib.core.constants import BLOCK_K, BLOCK_Q, LN2, LOG2E, compute_dtype
from flashlib.core.masks import band_hides, key_range, key_stop
from flashlib.core.problem import Problem, check_no_overflow, check_problem, results_are_finite
from flashlib.fast.dropout import check_dropout, dropout_forward
from flashlib.fast.tiles import (
    GROUP_TILES,
    SHORT_ROWS,
    TILE_BYTES,
    TileCall,
    exp_floor,
    hidden_parts,
    max_row_norm,
    row_max,
    rows_seeing,
    slow_below,
    split_rows,
    transposed_tiles,
)

__all__ = ["flash_attention", "run_forward", "workspace_bytes", "unshifted_ok", "STALE_LIMIT",
           "HEADROOM"]


#: Conditional rescaling: a tile computed against a stale running maximum m_i is accepted while
#: each row's sum of exp2(s - m_i) stays at most 2**16.  Then every term is at most 2**16, far
#: from float32's overflow at 2**128, and the result equals the always-rescaled one up to
#: rounding.  A larger finite sum moves m_i up by the power of two just above it (acc and l_i
#: are scaled by its inverse, exactly); an overflow to inf sends the tile through the exact
#: step, which updates m_i from the tile's maximum and rescales the accumulator.
STALE_LIMIT = 2.0**16


#: When a row sum exceeds STALE_LIMIT, m_i moves up past the row maximum by this much more (base
#: 2): the row's terms are then at most 2**-HEADROOM, so that large logits, whose maximum keeps
#: growing, cross the limit again less often.  The terms stay far above the clamping floor
#: (2**-63 in float32), so nothing that matters is clamped.
HEADROOM = 16


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


class _Tiles(NamedTuple):
    """One worker's buffers for a group of up to G heads x R query rows (R: up to GROUP_TILES
    query blocks; sliced to the group's size)."""

    q_aug: np.ndarray  # (G, R, d + 1): [Q_i * scale * log2(e), -m_i]
    s: np.ndarray  # (G, R, B_c): the score tiles, then P~ in place
    s_t: np.ndarray | None  # (G, B_c, R): S^T of a first tile, and the tiles transposed for
    #                         row maxima (None when one tile exceeds TILE_BYTES)
    pv: np.ndarray  # (G, R, d_v): one key block's P~ V
    rows: np.ndarray  # (G, R, 1): one key block's row sums
    ones: np.ndarray  # (B_c, 1)
    ones_t: np.ndarray  # (1, B_c)
    floors: np.ndarray | None  # (G, R, B_c) of the clamping floor, when clamping may be


class _Views(NamedTuple):
    """The rows [r0, r1) of a group's buffers and running statistics, w keys wide."""

    s: np.ndarray  # (G, r1 - r0, w)
    s_t: np.ndarray | None  # (G, w, r1 - r0)
    q_i: np.ndarray  # (G, r1 - r0, d + 1)
    m_i: np.ndarray  # (G, r1 - r0)
    l_i: np.ndarray
    acc: np.ndarray  # (G, r1 - r0, d_v)
    pv: np.ndarray
    rows: np.ndarray  # (G, r1 - r0, 1)
    l_tile: np.ndarray  # (G, r1 - r0): rows[..., 0]
    qk: TileCall  # q_i @ k_j -> s
    qk_exact: TileCall  # q_i[..., :d] @ k_j[:, :d] -> s
    pv_call: TileCall  # s @ v_j -> pv


class _Whole:
    """A group's whole-tile operands as blocks of rows for BLAS (:func:`split_rows`), laid out
    once: a plain step is then five numpy calls.  ``split`` False when the calls cannot be
    laid out that way (large d, a partial block, V with unusual strides): then the general
    step runs."""

    def __init__(self, buf: _Tiles, q_aug: np.ndarray, k_tiles: np.ndarray,
                 v: np.ndarray) -> None:
        n_b, b_r, b_c, d_v = q_aug.shape[0], q_aug.shape[1], k_tiles.shape[-1], v.shape[-1]
        self.s, self.pv = buf.s[:n_b, :b_r, :b_c], buf.pv[:n_b, :b_r]
        self.rows = buf.rows[:n_b, :b_r]
        qk, pv = TileCall(self.s, q_aug.shape[-1]), TileCall(self.pv, b_c)
        self.split = (qk.mode == pv.mode == "rows" and qk.rows == pv.rows
                      and v.strides[-2:] == (d_v * v.itemsize, v.itemsize))
        if self.split:
            whole_keys = v.shape[-2] // b_c * b_c
            self.q_b, self.s_b, self.pv_b = split_rows(q_aug, qk.rows), qk.blocks, pv.blocks
            self.p_b = split_rows(self.s, qk.rows)
            self.k_b = k_tiles[:, :, None]  # (G, n_k / B_c, 1, d + 1, B_c)
            self.v_b = v[:, :whole_keys].reshape(v.shape[0], -1, 1, b_c, d_v)


def _views(buf: _Tiles, q_aug: np.ndarray, m_all: np.ndarray, l_all: np.ndarray,
           acc_all: np.ndarray, r0: int, r1: int, w: int) -> _Views:
    n_b = q_aug.shape[0]
    s, pv, rows = buf.s[:n_b, r0:r1, :w], buf.pv[:n_b, r0:r1], buf.rows[:n_b, r0:r1]
    q_i = q_aug[:, r0:r1]
    d = q_aug.shape[-1] - 1
    s_t = None if buf.s_t is None else buf.s_t[:n_b, :w, r0:r1]
    return _Views(s, s_t, q_i, m_all[:, r0:r1], l_all[:, r0:r1], acc_all[:, r0:r1], pv, rows,
                  rows[..., 0], TileCall(s, d + 1), TileCall(s, d), TileCall(pv, w))


def _forward_row_block(
    q_aug: np.ndarray,
    k_tiles: np.ndarray,
    v: np.ndarray,
    i0: int,
    heads: slice,
    offset: int | None,
    mask: np.ndarray | None,
    buf: _Tiles,
    exp: np.ufunc,
    clamp: bool,
    v_bound: float,
    lo: int | None = None,
    lengths: np.ndarray | None = None,
    block_q: int | None = None,
    bands: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A group of query blocks (rows [i0, i0 + R), G heads) against all the key blocks they
    may see.

    q_aug: (G, R, d + 1): rows of Q times scale * log2(e) (times scale alone with
    ``exp=np.exp``, the natural-units fallback); the last column is overwritten here with -m_i.
    k_tiles: (G, n_k / B_c, d + 1, B_c): contiguous tiles of K^T with a last row of ones, so
    that q_aug @ k_tiles[:, t] = S - m_i.  v: (G, n_k, d_v).  heads: the group's heads among
    all of them (for an explicit mask).  buf: this worker's tile buffers.
    clamp: whether scores may fall below the floor of ``exp`` (then tiles whose minimum does
    are clamped to it).  v_bound: max |v|, to tell when the accumulator could overflow.
    lo: the sliding window's left edge (row i sees keys j >= i + lo); lengths: (G,) key
    padding of the group (sequence g sees keys j < lengths[g]), or None; bands: (G, 2), each
    sequence's own band when they differ (lo and offset are then the loosest), or None.
    block_q: the query block B_r (default: all R rows are one block).  The R rows are up to
    GROUP_TILES query blocks: each key block is multiplied with the query blocks that may see
    it (:func:`rows_seeing`), each block's product a BLAS call of its own
    (:func:`blas_matmul`), so that a tall group streams K and V past fewer times without
    making the calls larger.
    Returns the unnormalised accumulator acc (G, R, d_v), l_i and m_i (G, R), m_i in the
    units of ``exp`` (base 2 by default).
    """
    n_b, b_r, d = q_aug.shape[0], q_aug.shape[1], q_aug.shape[2] - 1
    i1 = i0 + b_r
    block_q = b_r if block_q is None else block_q
    n_k, d_v = v.shape[-2:]
    b_c = k_tiles.shape[-1]
    dtype = q_aug.dtype
    floor = exp_floor(dtype, exp)
    acc_limit = float(np.finfo(dtype).max) / 4
    m_all = np.full((n_b, b_r), -np.inf, dtype=dtype)  # running max, base-2 units
    l_all = np.zeros((n_b, b_r), dtype=dtype)  # running sum of exp2(s - m_i)
    acc_all = np.zeros((n_b, b_r, d_v), dtype=dtype)  # running sum of exp2(s - m_i) v_j
    # per query block: True once every m_i of its rows is finite (then -m_i may ride in the
    # matmul: the fast step)
    stale_ok = [False] * -(-b_r // block_q)
    ready = False  # every block's
    fresh = [True] * len(stale_ok)  # per query block: no key block met yet

    # only the key blocks that meet [start, stop): the masks hide every other key (empty tiles)
    start, stop = key_range(i0, i1, n_k, lo, offset,
                            None if lengths is None else int(lengths.max()))
    step = max(b_c, 1)
    views: dict[tuple[int, int, int], _Views] = {}  # (r0, r1, w): that part of the group
    plain = mask is None and lengths is None
    whole = _Whole(buf, q_aug, k_tiles, v)  # the plain steps' operands as BLAS blocks
    for j0 in range(start - start % step, stop, step):
        t, j1 = j0 // step, min(j0 + b_c, n_k)
        r0, r1 = rows_seeing(i0, i1, j0, j1, block_q, lo, offset)
        if r0 >= r1:
            continue  # the band hides this key block from every query block of the group
        w = j1 - j0
        computed = False
        if (ready and plain and whole.split and r1 - r0 == b_r and w == b_c
                and not band_hides(i0, i1, j0, j1, lo, offset)):
            # The plain fast step (every row, a whole key block, nothing hidden), as below.
            s = whole.s
            np.matmul(whole.q_b, whole.k_b[:, t], out=whole.s_b)  # S_ij - m_i
            if clamp:
                np.maximum(s, buf.floors[:n_b, :b_r, :b_c], out=s)
            exp(s, out=s)
            np.matmul(s, buf.ones, out=whole.rows)
            np.matmul(whole.p_b, whole.v_b[:, t], out=whole.pv_b)
            l_tile = whole.rows[..., 0]
            if l_tile.max() <= STALE_LIMIT:
                l_all += l_tile
                acc_all += whole.pv
                continue
            computed = True  # the general step below moves m_i (or redoes the tile exactly)
        vw = views.get((r0, r1, w))
        if vw is None:
            vw = views[r0, r1, w] = _views(buf, q_aug, m_all, l_all, acc_all, r0, r1, w)
        s, s_t, q_i, m_i, l_i, acc, pv, rows, l_tile, qk, qk_exact, pv_call = vw
        k_j, v_j = k_tiles[:, t, :, :w], v[:, j0:j1]
        straddles = band_hides(i0 + r0, i0 + r1, j0, j1, lo, offset)  # a partial tile of the band
        hidden = hidden_parts(i0 + r0, i0 + r1, j0, j1, straddles, block_q, offset, mask,
                              heads, lo, lengths, bands)
        if hidden is None:
            continue  # an explicit mask or the padding hides the whole tile
        blocks = range(r0 // block_q, -(-r1 // block_q))
        if (not hidden and s_t is not None and not ready
                and all(fresh[b] for b in blocks)):
            # First step: the first key block of these query blocks, every entry visible.  The
            # running maximum starts as the tile's row maximum, taken on S^T (keys along the
            # rows), where numpy's max is an elementwise max of contiguous rows: several times
            # faster than reducing the tile's short rows.  P^T goes into P V as a transposed
            # operand, and the row sums are 1^T P^T.
            np.matmul(k_j[:, :d].swapaxes(-1, -2), q_i[..., :d].swapaxes(-1, -2), out=s_t)
            m_new = s_t.max(axis=-2)
            s_t -= m_new[:, None, :]
            if clamp and s_t.min() < floor:
                np.maximum(s_t, floor, out=s_t)
            exp(s_t, out=s_t)  # P~^T
            np.matmul(buf.ones_t[:, :w], s_t, out=l_i[:, None, :])
            acc += pv_call(s_t.swapaxes(-1, -2), v_j)
            m_i[...] = m_new
            q_i[..., d] = -m_new
            for b in blocks:
                fresh[b], stale_ok[b] = False, True
            ready = all(stale_ok)
            continue
        if ready or all(stale_ok[b] for b in blocks):
            # Fast step: [Q_i, -m_i] @ [K_j^T; 1] = S_ij - m_i, one exp2, one row sum.
            if not computed:
                qk(q_i, k_j)
                if clamp:  # no subnormal exp2 results (slow path): one pass
                    np.maximum(s, buf.floors[:n_b, r0:r1, :w], out=s)
                exp(s, out=s)  # P~_ij against the stale m_i, in place (inf on overflow)
                for a, b, h in hidden:
                    np.copyto(s[:, a:b], 0, where=h)
                np.matmul(s, buf.ones[:w], out=rows)  # row sums, l_tile
                pv_call(s, v_j)
            if l_tile.max() <= STALE_LIMIT:  # False for inf and NaN too
                l_i += l_tile
                acc += pv
                continue
            l_new = l_i + l_tile
            if (l_new * v_bound <= acc_limit).all():  # finite, and acc + pv cannot overflow
                # Some row sum grew large: move m_i up by the power of two 2**e > l_i, and by
                # HEADROOM more, so that the next tiles exceed the limit less often.
                acc += pv
                l_i[...] = l_new
                big = np.nonzero(l_i > STALE_LIMIT)  # those rows only (few, usually)
                e = (np.frexp(l_i[big])[1] + HEADROOM).astype(dtype)
                m_old = m_i[big]
                m_new = m_old + (e if exp is np.exp2 else e * dtype.type(LN2))
                alpha = exp(m_old - m_new)  # 2**-e (as m_new was rounded)
                l_i[big] *= alpha
                acc[big] *= alpha[:, None]
                m_i[big] = m_new
                q_i[..., d][big] = -m_new
                continue
            # An overflow: redo this tile with the exact step.

        # Exact step: S_ij, mask, new maximum, rescale the accumulator.
        qk_exact(q_i[..., :d], k_j[:, :d])
        for a, b, h in hidden:
            np.copyto(s[:, a:b], -np.inf, where=h)
        m_new = np.maximum(m_i, row_max(s, buf.s_t if b_c <= SHORT_ROWS else None))
        # Rows that have seen no visible key yet keep m = -inf; exponentiate them against 0
        # so that exp2(-inf - (-inf)) never produces a NaN.
        m_ref = np.where(np.isneginf(m_new), 0, m_new)
        s -= m_ref[..., None]
        if hidden or (clamp and s.min() < floor):
            # -inf and subnormal results take a slow path
            np.maximum(s, floor if buf.floors is None else buf.floors[:n_b, r0:r1, :w], out=s)
        exp(s, out=s)  # P~_ij, in place
        for a, b, h in hidden:
            np.copyto(s[:, a:b], 0, where=h)
        alpha = exp(m_i - m_ref)  # rescales what was accumulated against the old max
        l_i *= alpha
        np.matmul(s, buf.ones[:w], out=rows)
        l_i += l_tile
        acc *= alpha[..., None]
        pv_call(s, v_j)
        acc += pv
        m_i[...] = m_new
        q_i[..., d] = -m_ref
        seen = ~np.isneginf(m_new)
        for b in blocks:
            fresh[b] = False
            stale_ok[b] = bool(seen[:, b * block_q - r0: (b + 1) * block_q - r0].all())
        ready = all(stale_ok)

    return acc_all, l_all, m_all


def unshifted_ok(s_max: float, n_k: int, v_max: float, dtype: np.dtype) -> bool:
    """Whether the forward may skip the running maximum: every base-2 score lies within
    +-``s_max`` (a bound, Cauchy-Schwarz: scale log2(e) max|q_i| max|k_j|), and s_max is at most
    the clamping floor's magnitude (63 in float32), so that exp2(s) is a normal number between
    2**-63 and 2**63, and n_k of them, times max|v| (``v_max``), stay far below overflow."""
    limit = -float(exp_floor(dtype, np.exp2))
    top = math.log2(float(np.finfo(dtype).max) / 4)
    return s_max <= limit and math.log2(max(n_k, 1)) + s_max + math.log2(max(v_max, 1.0)) < top


def _forward_unshifted(
    q_i: np.ndarray,
    k_tiles: np.ndarray,
    v: np.ndarray,
    i0: int,
    heads: slice,
    offset: int | None,
    mask: np.ndarray | None,
    buf: _Tiles,
    lo: int | None = None,
    lengths: np.ndarray | None = None,
    block_q: int | None = None,
    bands: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_forward_row_block` when the scores are bounded (:func:`unshifted_ok`): softmax
    does not depend on a shift of the scores, and the shift by the running maximum only keeps
    exp2 in range, which a bound of 63 (base 2) does already.  So m_i = 0 throughout: no
    maximum, no rescaling, no [Q, -m_i] column (a Q K^T of d, not d + 1, products), no
    checks; P~ = exp2(S), l_i and acc simply add up.

    q_i: (G, R, d), rows of Q times scale * log2(e); k_tiles: (G, n_k / B_c, d + 1, B_c), of
    which the first d rows of each tile are read.  The rest as :func:`_forward_row_block`.
    Returns acc (G, R, d_v) and l_i (G, R), both against m_i = 0.
    """
    n_b, b_r, d = q_i.shape
    i1 = i0 + b_r
    block_q = b_r if block_q is None else block_q
    n_k, d_v = v.shape[-2:]
    b_c = k_tiles.shape[-1]
    dtype = q_i.dtype
    l_all = np.zeros((n_b, b_r), dtype=dtype)
    acc_all = np.zeros((n_b, b_r, d_v), dtype=dtype)
    start, stop = key_range(i0, i1, n_k, lo, offset,
                            None if lengths is None else int(lengths.max()))
    step = max(b_c, 1)
    views: dict[tuple[int, int, int], tuple] = {}  # (r0, r1, w): that part of the group
    # The bulk of the steps (every row of the group, a whole key block, nothing hidden) in as
    # few Python statements as possible: the operands' BLAS blocks laid out once.
    plain = mask is None and lengths is None
    s_all, rows_all, pv_all = buf.s[:n_b, :b_r, :b_c], buf.rows[:n_b, :b_r], buf.pv[:n_b, :b_r]
    qk_all, pv_call_all = TileCall(s_all, d), TileCall(pv_all, b_c)
    whole_keys = n_k // b_c * b_c if b_c else 0
    split = (qk_all.mode == pv_call_all.mode == "rows" and qk_all.rows == pv_call_all.rows
             and v.strides[-2:] == (d_v * v.itemsize, v.itemsize))  # V's key blocks: views
    if split:  # every operand as its blocks of rows, once: a step is five numpy calls
        rows = qk_all.rows
        q_b, s_b = split_rows(q_i, rows), split_rows(s_all, rows)
        k_b = k_tiles[:, :, None, :d]  # (G, n_k / B_c, 1, d, B_c)
        v_b = v[:, :whole_keys].reshape(v.shape[0], -1, 1, b_c, d_v)
    for j0 in range(start - start % step, stop, step):
        t, j1 = j0 // step, min(j0 + b_c, n_k)
        r0, r1 = rows_seeing(i0, i1, j0, j1, block_q, lo, offset)
        if r0 >= r1:
            continue
        straddles = band_hides(i0 + r0, i0 + r1, j0, j1, lo, offset)
        if plain and not straddles and r1 - r0 == b_r and j1 - j0 == b_c:
            if split:
                np.matmul(q_b, k_b[:, t], out=qk_all.blocks)  # S_ij, base 2
                np.exp2(s_all, out=s_all)  # P~_ij = exp2(S_ij - 0)
                np.matmul(s_all, buf.ones, out=rows_all)
                l_all += rows_all[..., 0]
                np.matmul(s_b, v_b[:, t], out=pv_call_all.blocks)
            else:
                qk_all(q_i, k_tiles[:, t, :d])
                np.exp2(s_all, out=s_all)
                np.matmul(s_all, buf.ones, out=rows_all)
                l_all += rows_all[..., 0]
                pv_call_all(s_all, v[:, j0:j1])
            acc_all += pv_all
            continue
        w = j1 - j0
        vw = views.get((r0, r1, w))
        if vw is None:
            s_v, pv_v, rows_v = buf.s[:n_b, r0:r1, :w], buf.pv[:n_b, r0:r1], buf.rows[:n_b, r0:r1]
            vw = views[r0, r1, w] = (s_v, q_i[:, r0:r1], l_all[:, r0:r1], acc_all[:, r0:r1],
                                     pv_v, rows_v, rows_v[..., 0], TileCall(s_v, d),
                                     TileCall(pv_v, w))
        s, q_r, l_i, acc, pv, rows, l_tile, qk, pv_call = vw
        hidden = hidden_parts(i0 + r0, i0 + r1, j0, j1, straddles, block_q, offset, mask,
                              heads, lo, lengths, bands)
        if hidden is None:
            continue
        qk(q_r, k_tiles[:, t, :d, :w])  # S_ij, base 2
        np.exp2(s, out=s)  # P~_ij = exp2(S_ij - 0)
        for a, b, h in hidden:
            np.copyto(s[:, a:b], 0, where=h)
        np.matmul(s, buf.ones[:w], out=rows)
        l_i += l_tile
        acc += pv_call(s, v[:, j0:j1])
    return acc_all, l_all


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

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) -> o: (..., n_q, d_v), q's dtype.
    Grouped-query / multi-query attention: q (..., h_q, n_q, d) with k, v (..., h_kv, n_k, .)
    and h_q a multiple of h_kv; query head h attends with K/V head h // (h_q // h_kv), as
    PyTorch SDPA's ``enable_gqa=True`` does; K and V are not copied per query head.
    block_q, block_k: the tile sizes B_r and B_c (default BLOCK_Q x BLOCK_K, measured: see
    flashlib.core.constants), honoured as given; a tile is min(block, n) on each side.
    causal: False, True / "top_left" (row i sees j <= i), "bottom_right" (j <= i + L - n_q).
    mask: boolean, broadcastable to (..., n_q, n_k); True = may attend.
    window: ``(left, right)``, a sliding window as flash-attn's ``window_size`` (None: no
    bound on that side; a bound of max(n_q, n_k) or more is none): row i sees the keys
    c - left <= j <= c + right around its diagonal key c, the call's one alignment: c = i for
    causal True / "top_left", else c = i + L - n_q (bottom-right, flash-attn's).
    key_lengths: the real keys L of each sequence (default n_k), integers indexing q's leading
    batch axes: a scalar, (B,) one per batch element (q's axis 0, also when B equals the
    number of heads), (B, H), (1, H), ...  Keys j >= L are hidden, and a bottom-right
    diagonal sits on the last real key, so padding changes no output (flash-attn's
    variable-length lengths, ``cache_seqlens``; :data:`flashlib.core.masks.ALIGNMENT_RULES`).
    All masks combine (AND); key blocks that the causal mask, the window or the padding hide
    entirely are skipped.
    scale: defaults to 1/sqrt(d); kept in the compute dtype (float32 for float16 inputs).
    return_lse: also return lse = m + log(l): (..., n_q), natural log, at least float32,
    ``-inf`` for rows that see no key (whose output is 0).
    Threads: query blocks run in parallel on as many threads as the BLAS thread limit, when
    the problem and each thread's tiles are large enough for threads to pay (see
    flashlib.core.threads; ``threadpoolctl.threadpool_limits(1)`` makes this single-threaded, and
    without threadpoolctl it is); the result does not depend on the thread count.
    Extra memory beyond inputs and output: O(n d) (:func:`workspace_bytes`) plus a group's
    few B_r x B_c tiles (:data:`TILE_BYTES`, or one tile if larger) per thread.
    Scores whose base-2 form ``scale * log2(e) * q k^T`` overflows (or values that overflow
    the unnormalised accumulator) are recomputed in natural units with V scaled by a power of
    two, giving what :func:`flashlib.naive_attention` gives; scores that overflow the compute
    dtype even so raise ValueError.
    dropout_p, seed: dropout on P, never stored (:mod:`flashlib.fast.dropout`): p in [0, 1),
    p > 0 needs an integer seed in [0, 2**64), which the backward call must repeat.
    """
    return_lse = check_flag(return_lse, "return_lse")
    dropout_p, seed = check_dropout(dropout_p, seed)
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale,
                      blocks=(block_q, block_k), window=window, key_lengths=key_lengths,
                      gqa=True)
    o, lse = dropout_forward(p, dropout_p, seed) if dropout_p else run_forward(p)
    o = p.unflatten(o)
    return (o, p.unflatten(lse)) if return_lse else o


def run_forward(p: Problem, workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """o (B, n_q, d_v) and lse (B, n_q) of a validated problem, with the overflow fallback;
    ``workers`` threads (default: :func:`flashlib.core.threads.worker_count`)."""
    with np.errstate(over="ignore", invalid="ignore"):
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

    def setup() -> _Tiles:
        rows = rows_per_group
        return _Tiles(
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

    def work(buf: _Tiles, item: tuple[int, int, int]) -> None:
        h0, h1, i0 = item
        i1 = min(i0 + rows_per_group, n_q)
        kv = slice(h0, h1) if g_kv == 1 else slice(h0 // g_kv, h0 // g_kv + 1)  # broadcast
        lengths = None if p.key_lengths is None else p.key_lengths[h0:h1]
        bands = None if p.bands is None else p.bands[h0:h1]
        if unshifted:  # Q rows contiguous, in q_aug's memory
            q_i = buf.q_aug.reshape(-1)[: (h1 - h0) * (i1 - i0) * d].reshape(
                h1 - h0, i1 - i0, d)
            np.multiply(p.q[h0:h1, i0:i1], q_scale, out=q_i)
            acc, l_i = _forward_unshifted(q_i, k_tiles[kv], v[kv], i0, slice(h0, h1),
                                          p.offset, p.mask, buf, p.lo, lengths, b_r, bands)
            m_i = 0
        else:
            q_i = buf.q_aug[: h1 - h0, : i1 - i0]
            np.multiply(p.q[h0:h1, i0:i1], q_scale, out=q_i[..., :d])
            acc, l_i, m_i = _forward_row_block(
                q_i, k_tiles[kv], v[kv], i0, slice(h0, h1), p.offset, p.mask, buf, exp,
                clamp, v_max, p.lo, lengths, b_r, bands)
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
