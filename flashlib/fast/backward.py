"""FlashAttention backward: recompute each tile of S and P instead of storing them.

The forward pass keeps only the output ``O`` and the logsumexp ``lse``.  Backward rebuilds
``P_ij = exp(S_ij - lse_i)`` one tile at a time from ``Q_i``, ``K_j`` and ``lse_i`` (a form of
selective gradient checkpointing, Dao et al. 2022, Section 3.1), with
``D_i = rowsum(dO_i * O_i)`` replacing the row sums of ``dP * P``.  The loop order is
FlashAttention-2's: outer over key/value blocks, so ``dK_j`` and ``dV_j`` accumulate in "SRAM",
inner over query blocks, adding into ``dQ``.

The teaching functions are :func:`flashlib.algorithms.flash2_backward` (one head, no mask, as
the paper writes it) and :func:`flashlib.algorithms.two_pass_backward` (the Triton tutorial's
schedule); :func:`flash_attention_backward` is the library version (batched, masked,
validated), with the forward's lessons (:mod:`flashlib.fast.forward`):

- ``c = scale * log2(e)`` folded into Q, as the forward folds it (so that a scale the forward
  could use cannot overflow here either), and ``-lse_i`` (base 2) riding in the matmul as an
  extra row of Q^T, laid out as contiguous ``(d + 1, B_r)`` tiles: ``[K_j, 1] @ [c Q_i^T;
  -lse_i] = S_ij^T - lse_i``, so ``P_ij^T`` is one ``exp2`` of the matmul's output; the tiles
  are transposed, (B_c, B_r), so that the query block's operand, shared by the group's key
  blocks, is the right one of the products (it stays in the L1 cache while BLAS streams the
  key blocks' rows: in cache the products ran at 164 GFLOP/s against 138 as ``[c Q_i, -lse_i]
  @ [K_j^T; 1]``; the whole step 2 to 3% faster in a loop on its own, the backward 3.5%
  faster in two interleaved runs and within 2% either way in four others, on a busy machine,
  at n = 4096, d = 64);
- likewise ``[V_j, 1] @ [dO_i^T; -D_i] = dP_ij^T - D_i``, so ``dS_ij^T`` is one
  multiplication;
- every BLAS call one the matrix library runs near its peak, as in the forward: each tile's
  five products cut into calls of 64 rows (:func:`flashlib.fast.tiles.blas_matmul`), and
  several tiles per numpy call: up to GROUP_TILES key blocks of a head stay put (K, V,
  dK, dV) while the query blocks stream past them, which reads Q, dO and dQ a quarter as
  often, each (key block, query block) tile its own BLAS calls, and dQ's share added key block
  by key block into the query block's rows of dQ, which stay in the L1 cache (2% faster than
  summing the shares over the key blocks first and adding the sum: one pass and one temporary
  array fewer; dQ's share as one product dS_i (B_r, C B_c) @ K (C B_c, d) over the group, on
  OpenBLAS's general path, ran 10 to 30% slower than the 64-row calls, in 32-row calls of
  two key blocks 15% slower); no operand is a transposed right one (OpenBLAS's small-matrix
  kernels refuse it: the general path, 60% slower);
- preallocated tiles and ``out=`` everywhere; the softmax scale of dQ and dK folded into
  ``[dO, -D]`` (so into dS), not applied at the end;
- scores clamped where they could make ``exp2`` or the matmuls meet subnormal numbers (the
  forward's large-logit cliff), masked entries zeroed after the exponential;
- causal tile skipping in both loops: each key block starts at the first query block that may
  see it (and the forward's loop stops at the last key block a query block may see);
- threads: heads (or, for fewer heads than threads, key groups, each part with its own dQ,
  summed in a fixed order) run on as many threads as the BLAS thread limit.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from flashlib.core import threads as pool
from flashlib.core.constants import BLOCK_K, BLOCK_Q, LOG2E, compute_dtype
from flashlib.core.masks import band_hides
from flashlib.core.problem import (
    Problem,
    check_backward_problem,
    check_no_overflow,
    results_are_finite,
)
from flashlib.fast.dropout import check_dropout, dropout_backward, dropout_forward
from flashlib.fast.precise import backward_in_float64, exact_attention, in_float64
from flashlib.fast.tiles import (
    GROUP_TILES,
    TILE_BYTES,
    TileCall,
    exp_floor,
    hidden_entries,
    keys_seen,
    max_row_norm,
    slow_below,
)

__all__ = ["flash_attention_backward"]


def _first_query_block(j0: int, offset: int | None, block_q: int) -> int:
    """Start of the first query block that may see key ``j0`` (row i sees j if j <= i + offset)."""
    if offset is None:
        return 0
    first_row = max(0, j0 - offset)
    return first_row - first_row % block_q


def flash_attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    do: np.ndarray,
    *,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    causal: bool | str = False,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    key_lengths: np.ndarray | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dq, dk, dv) of ``sum(do * o)`` where ``o, lse = flash_attention(...,
    return_lse=True)``, recomputing P tile by tile; P is never stored or passed in.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v), o and do: (..., n_q, d_v),
    lse: (..., n_q). Options must match the forward call (:mod:`flashlib.fast`'s options);
    block sizes need not (default BLOCK_Q x BLOCK_K, honoured as given; a tile is min(block, n)
    on each side). Returns arrays of q's dtype. Scores too large for the float32 tiles to stay
    within flash-attn's rule (a bound on |S| or |lse| above
    :data:`flashlib.fast.precise.BACKWARD_FLOAT64_ABOVE`, base 2) are computed in float64 from
    P recomputed with each row's own maximum (o and lse are then not read). Threads: as many as
    the BLAS thread limit (see :func:`flashlib.flash_attention`); split over heads the result
    does not depend on their number, split over key blocks (fewer heads than threads) it does
    by rounding only, and only on the caller's BLAS limit, never on what other Python threads
    are doing.
    o, lse: required arrays (None is refused by name).
    Extra memory beyond inputs and outputs: O(n d) ([Q, -lse], [dO, -D] in the compute
    dtype, one dQ per part for a split over key blocks) plus a group's few B_r x B_c tiles per
    thread (S and P, dP and dS for up to GROUP_TILES key blocks, within TILE_BYTES, or one
    tile each if larger; the group's [K, 1] and [V, 1]), never (n_q, n_k).
    Grouped-query attention as in :func:`flashlib.flash_attention` (k, v with h_kv heads, h_q
    a multiple): dk, dv have k's shape, each summed over the query heads of its group (K and
    V are repeated per query head while the gradients are computed).
    dropout_p, seed: the forward's (:mod:`flashlib.fast.dropout` redraws its mask).
    """
    dropout_p, seed = check_dropout(dropout_p, seed)
    p, do, o, lse = check_backward_problem(
        q, k, v, do, o=o, lse=lse, causal=causal, mask=mask, scale=scale,
        blocks=(block_q, block_k), window=window, key_lengths=key_lengths, gqa=True)
    if dropout_p and backward_in_float64(p, lse):  # large scores: float64 (fast.precise)
        p64, do64 = in_float64(p), do.astype(np.float64)
        o64, lse64 = dropout_forward(p64, dropout_p, seed)
        grads = dropout_backward(p64, o64, lse64, do64, dropout_p, seed)
        with np.errstate(over="ignore", under="ignore"):
            grads = tuple(x.astype(p.dtype) for x in grads)
        check_no_overflow(p.dtype, *grads)
        return grads
    if dropout_p:
        return dropout_backward(p, o, lse, do, dropout_p, seed)
    g, p = p, p.repeat_kv()  # grouped-query attention: one K/V copy per query head
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        grads = None
        if not backward_in_float64(p, lse):
            grads = _backward(p, o, lse, do)
        if grads is None or not results_are_finite(*grads):
            # large scores (or an overflow): float64, from the float64 forward's own o and lse
            grads = _backward_float64(p, do)
            check_no_overflow(p.dtype, *grads)  # (finite grads are not checked twice)
        dq, dk, dv = p.unflatten(grads[0]), g.sum_kv(grads[1]), g.sum_kv(grads[2])
        grads = tuple(x.astype(p.dtype, copy=False) for x in (dq, dk, dv))
    if p.dtype.itemsize < 4:  # float16 gradients beyond its range: refused, not inf
        check_no_overflow(p.dtype, *grads)
    return grads


def _backward_float64(p: Problem, do: np.ndarray) -> tuple[np.ndarray, ...]:
    """The gradients of a validated problem (K/V repeated) computed in float64 and rounded once
    to the compute dtype (inf where they exceed it), from P recomputed with each row's own
    maximum, so that large scores cost no accuracy (:mod:`flashlib.fast.precise`)."""
    grads = exact_attention(in_float64(p), do.astype(np.float64))
    dtype = compute_dtype(p.dtype)
    return tuple(x.astype(dtype) for x in grads)


class _BackwardTiles(NamedTuple):
    """One worker's buffers for a group of up to G heads x C key blocks (C: up to GROUP_TILES
    key blocks of B_c keys; sliced to the group's size).  Tiles are stored transposed, key
    block by key block, (G, C, B_c, B_r), so that each block's products are BLAS calls of
    their own."""

    ka: np.ndarray  # (G, C, B_c, d + 1): [K_j, 1] of the group's key blocks
    va: np.ndarray  # (G, C, B_c, d_v + 1): [V_j, 1]
    s: np.ndarray  # (G, C, B_c, B_r): S^T - lse, then P^T, in place
    dp: np.ndarray  # (G, C, B_c, B_r): dP^T - D, then dS^T, in place
    kv: np.ndarray  # (G, C, max(B_r, B_c), max(d, d_v)): each key block's P^T dO or dS^T Q,
    #                 then its dS K
    floors: np.ndarray | None  # (G, C, B_c, B_r) of the clamping floor, when clamping may be


class _Calls(NamedTuple):
    """Key blocks [c0, c1) of a group against a query block of r rows: the tiles, the group's
    accumulators of those key blocks, and the BLAS calls into the tiles (TileCall: split into
    calls of the size BLAS runs fastest, laid out once), with every operand that stays put
    already laid out for them (TileCall.left, .right): the loop pays one numpy call per
    product and lays out only the query block's rows."""

    s: np.ndarray  # (G, c1 - c0, w, r)
    dp: np.ndarray
    dk_j: np.ndarray  # (G, c1 - c0, w, d)
    dv_j: np.ndarray  # (G, c1 - c0, w, d_v)
    score: TileCall  # [K_j, 1] @ [Q_i^T; -lse_i] -> s
    dscore: TileCall  # [V_j, 1] @ [dO_i^T; -D_i] -> dp
    dv: TileCall  # P_ij^T dO_i -> a free tile (dp's, before dP)
    dk: TileCall  # dS_ij^T Q_i -> a free tile (s's, after dS)
    dq: TileCall  # dS_ij K_j -> a free tile (s's), per key block
    ka: np.ndarray  # [K_j, 1], laid out for score
    va: np.ndarray  # [V_j, 1], laid out for dscore
    p_t: np.ndarray  # P_ij^T (s), laid out for dv
    ds_t: np.ndarray  # dS_ij^T (dp), laid out for dk
    ds: np.ndarray  # dS_ij (a view of dp), laid out for dq
    k_j: np.ndarray  # K_j, laid out for dq
    dq_parts: tuple[np.ndarray, ...]  # (G, r, d) each: dq's output, key block by key block


def _calls(buf: _BackwardTiles, ka: np.ndarray, va: np.ndarray, k_j: np.ndarray,
           dk_j: np.ndarray, dv_j: np.ndarray, c0: int, c1: int, r: int) -> _Calls:
    n_b, w, d, d_v = ka.shape[0], ka.shape[-2], ka.shape[-1] - 1, va.shape[-1] - 1
    s, dp = buf.s[:n_b, c0:c1, :w, :r], buf.dp[:n_b, c0:c1, :w, :r]
    b_c, b_r = buf.s.shape[-2:]
    c = c1 - c0

    def inside(tiles: np.ndarray, rows: int, cols: int) -> np.ndarray:
        # (n_b, c, rows, cols) in the first rows * cols entries of each key block's tile
        flat = tiles[:n_b, c0:c1].reshape(n_b, c, b_c * b_r)
        return flat[..., : rows * cols].reshape(n_b, c, rows, cols)

    if max(d, d_v) <= min(b_r, b_c):
        # each product into a tile that is free at the time: P^T dO into dP's (before dP),
        # dS^T Q and dS K into P's (after dS = P * (dP - D)), so that the group's tiles and
        # operands take 256 KiB less of the L2 cache (d = 64: 1 to 2% faster than a buffer
        # of their own)
        out_dv, out_dk, out_dq = inside(buf.dp, w, d_v), inside(buf.s, w, d), inside(buf.s, r, d)
    else:
        kv = buf.kv[:n_b, c0:c1]
        out_dv, out_dk, out_dq = kv[:, :, :w, :d_v], kv[:, :, :w, :d], kv[:, :, :r, :d]
    score, dscore = TileCall(s, d + 1), TileCall(dp, d_v + 1)
    dv, dk, dq = TileCall(out_dv, r), TileCall(out_dk, r), TileCall(out_dq, w)
    return _Calls(s, dp, dk_j[:, c0:c1], dv_j[:, c0:c1], score, dscore, dv, dk, dq,
                  score.left(ka[:, c0:c1]), dscore.left(va[:, c0:c1]), dv.left(s),
                  dk.left(dp), dq.left(dp.swapaxes(-1, -2)), dq.right(k_j[:, c0:c1]),
                  tuple(out_dq[:, t] for t in range(c)))


def _backward_key_group(
    q_t: np.ndarray, do_t: np.ndarray, q: np.ndarray, do: np.ndarray, ka: np.ndarray,
    va: np.ndarray, k_j: np.ndarray, dq: np.ndarray, dk_j: np.ndarray, dv_j: np.ndarray,
    j0: int, block_q: int, offset: int | None, mask: np.ndarray | None, heads: slice,
    buf: _BackwardTiles, floor: np.floating | None, exp: np.ufunc = np.exp2,
    lo: int | None = None, lengths: np.ndarray | None = None,
    bands: np.ndarray | None = None,
) -> None:
    """dK_j and dV_j of a group of key blocks (G heads, C blocks of w keys), adding its share
    of dQ into ``dq``.

    q_t: (G, query blocks, d + 1, B_r) = [scale * log2(e) * Q^T; -lse * log2(e)] per query
    block; do_t: (G, query blocks, d_v + 1, B_r) = scale * [dO^T; -D]; q: (G, n_q, d) and do:
    (G, n_q, d_v): Q and dO (unscaled) as rows; ka: (G, C, w, d + 1) = [K_j, 1] per key block;
    va: (G, C, w, d_v + 1) = [V_j, 1]; k_j: (G, C, w, d). The key blocks are whole (all w = B_c
    keys) when C > 1. dq (G, n_q, d), dk_j (G, C, w, d), dv_j (G, C, w, d_v): dq accumulated in
    place, dk_j and dv_j set (any content on entry is overwritten; dq and dk_j scaled by way of
    do_t). floor: where a tile's S - lse falls below it, clamp at it and subtract exp(floor)
    after the exponential, so that what would have been subnormal (slow) is exactly 0 and P
    keeps an absolute error below exp(floor), 2**-63 in float32 (None: no clamping). lo: the
    sliding window's left edge (row i sees keys j >= i + lo: query blocks past the last row
    that sees the group's last key are skipped); lengths: (G,) key padding of the group, or
    None; bands: (G, 2), each sequence's own band when they differ (lo and offset are then the
    loosest; :func:`hidden_entries`), or None. Each query block meets only the key blocks of
    the group it may see (:func:`keys_seen`), each key block's products BLAS calls of their
    own.
    """
    n_q, c_all, w = q.shape[1], ka.shape[1], ka.shape[2]
    j1 = j0 + c_all * w
    last_row = n_q if lo is None else max(0, min(n_q, j1 - lo))  # rows i <= j1 - 1 - lo
    length = None if lengths is None else int(lengths.max())
    calls: dict[tuple[int, int, int], _Calls] = {}  # (c0, c1, rows)
    fresh = True  # dk_j and dv_j not written yet
    for i0 in range(_first_query_block(j0, offset, block_q), last_row, block_q):
        i1 = min(i0 + block_q, n_q)
        c0, c1 = keys_seen(i0, i1, j0, j1, w, lo, offset, length)
        if c0 >= c1:
            continue
        ja, jb = j0 + c0 * w, j0 + c1 * w
        # hidden entries, as (first key block, last key block + 1, mask broadcastable to
        # (G, blocks, r, w)): under the band alone only the key blocks that straddle its edges
        hidden = []
        if mask is None and lengths is None:
            if band_hides(i0, i1, ja, jb, lo, offset):
                for c in range(c0, c1):
                    jc = j0 + c * w
                    if band_hides(i0, i1, jc, jc + w, lo, offset):
                        h = hidden_entries(i0, i1, jc, jc + w, True, offset, None, heads, lo)
                        hidden.append((c, c + 1, h.swapaxes(-1, -2)[..., None, :, :]))
        else:
            h = hidden_entries(i0, i1, ja, jb, band_hides(i0, i1, ja, jb, lo, offset),
                               offset, mask, heads, lo, lengths, bands)
            if h is not None:
                if h.all():
                    continue
                # (..., r, (c1 - c0) w) -> (..., c1 - c0, w, r): the tiles' layout
                hidden.append((c0, c1, np.moveaxis(h.reshape(h.shape[:-1] + (c1 - c0, w)),
                                                   -3, -1)))
        call = calls.get((c0, c1, i1 - i0))
        if call is None:
            call = calls[c0, c1, i1 - i0] = _calls(buf, ka, va, k_j, dk_j, dv_j, c0, c1,
                                                   i1 - i0)
        s, dp = call.s, call.dp
        mm = call.score
        t = i0 // block_q  # the query block's tile of q_t and do_t
        mm.run(call.ka, mm.right(q_t[:, None, t, :, : i1 - i0]))  # S_ij^T - lse_i, base 2
        clamped = floor is not None and s.min() < floor
        if clamped:  # no subnormal numbers, no -inf (against an array: twice as fast)
            np.maximum(s, buf.floors[: s.shape[0], c0:c1, :w, : i1 - i0], out=s)
        exp(s, out=s)  # P_ij, recomputed
        if clamped:  # flush: the clamped entries become exactly 0, the others stay normal
            s -= exp(floor)
        for ca, cb, h in hidden:
            np.copyto(s[:, ca - c0: cb - c0], 0, where=h)
        dv_c, dk_c = call.dv_j, call.dk_j
        # the first query block that sees every key block of the group writes dK_j and dV_j
        # instead of adding into zeros (one pass over them fewer)
        first = fresh and c1 - c0 == c_all
        if fresh:
            fresh = False
            if not first:
                dk_j.fill(0)
                dv_j.fill(0)
        mm = call.dv
        if first:
            np.copyto(dv_c, mm.run(call.p_t, mm.right(do[:, None, i0:i1])))
        else:
            dv_c += mm.run(call.p_t, mm.right(do[:, None, i0:i1]))
        mm = call.dscore
        mm.run(call.va, mm.right(do_t[:, None, t, :, : i1 - i0]))  # dP_ij^T - D_i
        np.multiply(s, dp, out=dp)  # dS_ij = P_ij * (dP_ij - D_i)
        mm = call.dk
        if first:
            np.copyto(dk_c, mm.run(call.ds_t, mm.right(q[:, None, i0:i1])))
        else:
            dk_c += mm.run(call.ds_t, mm.right(q[:, None, i0:i1]))
        call.dq.run(call.ds, call.k_j)  # each key block's dS_ij K_j
        rows = dq[:, i0:i1]
        for part in call.dq_parts:  # added in turn: the rows of dQ stay in the L1 cache
            rows += part
    if fresh:  # no query block sees the group
        dk_j.fill(0)
        dv_j.fill(0)


def _page_offset(shape: tuple[int, ...], dtype: np.dtype, offset: int) -> np.ndarray:
    """An uninitialised array of ``shape`` whose data starts ``offset`` bytes past a 4 KiB page
    boundary (offset a multiple of the itemsize, below 4096)."""
    size = math.prod(shape) * dtype.itemsize
    raw = np.empty(size + 8192, dtype=np.uint8)
    start = -raw.ctypes.data % 4096 + offset
    return raw[start: start + size].view(dtype).reshape(shape)


def _query_tiles(x: np.ndarray, b_r: int) -> np.ndarray:
    """x (B, n, c) as contiguous transposed tiles (B, ceil(n / b_r), c, b_r): tile t holds rows
    [t b_r, (t + 1) b_r) of x as columns (the last tile's columns beyond n are left unset)."""
    n_b, n, c = x.shape
    if not b_r:  # no query rows
        return np.empty((n_b, 0, c, 0), dtype=x.dtype)
    tiles = np.empty((n_b, -(-n // b_r), c, b_r), dtype=x.dtype)
    whole = n // b_r
    tiles[:, :whole] = x[:, : whole * b_r].reshape(n_b, whole, b_r, c).swapaxes(-1, -2)
    if whole * b_r < n:
        tiles[:, whole, :, : n - whole * b_r] = x[:, whole * b_r:].swapaxes(-1, -2)
    return tiles


def _backward(
    p: Problem, o: np.ndarray, lse: np.ndarray, do: np.ndarray,
    workers: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tiled backward of a validated problem; o, do: (B, n_q, d_v), lse: (B, n_q).
    Returns dq, dk, dv in the compute dtype: scale * log2(e) folded into Q, exp2 (scores
    whose base-2 form could overflow, or lose accuracy, go to :func:`_backward_float64`
    instead).  workers: threads (default: the BLAS limit)."""
    block_q, block_k = p.block_q, p.block_k
    n_b, n_q, n_k, d, d_v = p.q.shape[0], p.n_q, p.n_k, p.q.shape[-1], p.v.shape[-1]
    dtype = compute_dtype(p.dtype)
    b_r, b_c = min(block_q, n_q), min(block_k, n_k)
    c = dtype.type(float(p.scale) * LOG2E)  # folded into Q
    units = LOG2E  # lse in base 2
    exp = np.exp2

    # [Q, -lse * log2(e)] and scale * [dO, -D], D = rowsum(dO * O): the softmax scale rides in
    # dS = P * scale (dP - D), so that dQ = dS K and dK = dS^T Q come out scaled (two passes
    # over dQ and dK fewer).  Rows that saw no key (lse = -inf) get dO = D = 0, so whatever P
    # they recompute adds nothing.
    empty = np.isneginf(lse)
    q_aug = np.empty((n_b, n_q, d + 1), dtype=dtype)
    np.multiply(p.q, c, out=q_aug[..., :d])  # as the forward: a q * scale it could use
    bias = q_aug[..., d]
    np.multiply(lse, -units, out=bias, casting="unsafe")
    bias[empty] = -np.inf  # clamped below, then multiplied by dO = 0
    do_aug = np.empty((n_b, n_q, d_v + 1), dtype=dtype)
    scale = dtype.type(p.scale)
    np.multiply(do, scale, out=do_aug[..., :d_v], casting="unsafe")
    # D = rowsum(dO * O), accumulated in float64: it is subtracted from dP_ij, of which it is
    # the weighted mean, so its rounding would not cancel (one key: dS = dP - D = 0 exactly)
    do_aug[..., d_v] = np.einsum("...i,...i->...", do, o, dtype=np.float64)
    do_aug[..., d_v] *= -scale
    if empty.any():
        do_aug[empty] = 0
    q, k = p.q.astype(dtype, copy=False), p.k.astype(dtype, copy=False)
    do = do.astype(dtype, copy=False)
    if empty.any():
        do = do.copy()  # rows that saw no key: dO = 0, as in do_aug
        do[empty] = 0
    # ... laid out transposed, query block by query block: (B, query blocks, d + 1, B_r), the
    # right operands of [K_j, 1] @ [c Q_i^T; -lse_i] = S_ij^T - lse_i and of
    # [V_j, 1] @ scale [dO_i^T; -D_i], so that the operand shared by a group's key blocks is
    # the right one (each BLAS call reads it from the L1 cache: the products ran at 164
    # GFLOP/s against 138 the other way round, in cache; 2 to 3% faster in all)
    q_t, do_t = _query_tiles(q_aug, b_r), _query_tiles(do_aug, b_r)
    del q_aug, do_aug

    # S - lse >= -(|S| + |lse|) with |S| <= c max|q| max|k| (Cauchy-Schwarz): clamp only when
    # that can fall below the floor (or some lse is -inf).
    finite = lse[~empty]
    lse_max = float(np.max(np.abs(finite), initial=0.0)) * units
    lowest = abs(float(c)) * max_row_norm(p.q) * max_row_norm(p.k) * (1 + 1e-3) + lse_max + 1
    floor = exp_floor(dtype, exp)
    clamp = empty.any() or not lowest < -slow_below(dtype, exp)

    dq = np.zeros((n_b, n_q, d), dtype=dtype)
    dk = np.empty((n_b, n_k, d), dtype=dtype)
    dv = np.empty((n_b, n_k, d_v), dtype=dtype)
    # Key groups: up to GROUP_TILES whole key blocks (each tile buffer, P and dS, within
    # TILE_BYTES), the last block alone when it is not whole: (first block, blocks).
    whole = n_k // b_c if b_c else 0
    tile_bytes = max(1, b_r * b_c * dtype.itemsize)
    per_group = max(1, min(whole or 1, GROUP_TILES, TILE_BYTES // tile_bytes))
    key_groups = [(t, min(per_group, whole - t)) for t in range(0, whole, per_group)]
    if b_c and n_k > whole * b_c:
        key_groups.append((whole, 1))
    work_size = float(n_b) * n_q * n_k * (d + d_v)
    group = max(1, min(n_b, TILE_BYTES // (per_group * tile_bytes)))
    tile = per_group * b_r * b_c
    workers = pool.workers_for(work_size, n_b * max(len(key_groups), 1), workers,
                               tile=group * tile)
    # Split the heads into groups (a group's tiles fit TILE_BYTES), at least one per worker
    # while each worker's tiles stay large enough (MIN_THREAD_TILE twice over: the result then
    # does not depend on the thread count); else keep the heads together and split the key
    # groups, round-robin, each part adding into its own dQ (summed in a fixed order).
    size, parts = group, 1
    if workers > 1:
        if n_b >= workers and (n_b // workers) * tile >= 2 * pool.MIN_THREAD_TILE:
            size = min(group, n_b // workers)
        else:
            parts = max(1, min(-(-workers // -(-n_b // group)), len(key_groups)))
    heads = [(h0, min(h0 + size, n_b)) for h0 in range(0, n_b, size)]
    dq_parts = [dq] + [np.zeros_like(dq) for _ in range(parts - 1)]
    items = [(h0, h1, part) for part in range(parts) for h0, h1 in heads]
    mid = max(d, d_v)

    def setup() -> _BackwardTiles:
        # each buffer at its own offset from a page boundary (0, 1, 2, 3 KiB), not wherever
        # malloc puts it: tiles that start at the same offset within a page make the products
        # and the passes over them (P * dP, P^T dO) meet 4K aliasing, and where malloc put
        # them changed from call to call (0 to 2% faster here, and steadier)
        ka = _page_offset((size, per_group, b_c, d + 1), dtype, 2048)
        va = _page_offset((size, per_group, b_c, d_v + 1), dtype, 3072)
        ka[..., d] = 1
        va[..., d_v] = 1
        return _BackwardTiles(
            ka=ka,
            va=va,
            s=_page_offset((size, per_group, b_c, b_r), dtype, 0),
            dp=_page_offset((size, per_group, b_c, b_r), dtype, 1024),
            kv=np.empty((size, per_group, max(b_r, b_c), mid) if mid > min(b_r, b_c)
                        else (0, 0, 0, 0), dtype=dtype),
            floors=np.full((size, per_group, b_c, b_r), floor) if clamp else None,
        )

    def work(buf: _BackwardTiles, item: tuple[int, int, int]) -> None:
        h0, h1, part = item
        g, n_g = slice(h0, h1), h1 - h0
        for t, count in key_groups[part::parts]:
            j0 = t * b_c
            w = min(b_c, n_k - j0)  # the key blocks' width (whole blocks when count > 1)
            j1 = j0 + count * w
            # [K_j, 1] and [V_j, 1] laid out once per key group: they stay put while the inner
            # loop streams the query blocks past them
            ka, va = buf.ka[:n_g, :count, :w], buf.va[:n_g, :count, :w]
            ka[..., :d] = p.k[g, j0:j1].reshape(n_g, count, w, d)
            va[..., :d_v] = p.v[g, j0:j1].reshape(n_g, count, w, d_v)
            dk_j = dk[g, j0:j1].reshape(n_g, count, w, d)
            dv_j = dv[g, j0:j1].reshape(n_g, count, w, d_v)
            _backward_key_group(
                q_t[g], do_t[g], q[g], do[g], ka, va, k[g, j0:j1].reshape(n_g, count, w, d),
                dq_parts[part][g], dk_j, dv_j, j0, block_q, p.offset, p.mask, g, buf,
                floor if clamp else None, exp, p.lo,
                None if p.key_lengths is None else p.key_lengths[g],
                None if p.bands is None else p.bands[g])

    pool.run_items(work, items, workers, setup)
    for extra in dq_parts[1:]:
        dq += extra
    return dq, dk, dv
