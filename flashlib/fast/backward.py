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
  could use cannot overflow here either), K^T laid out as contiguous ``(d + 1, B_c)`` tiles,
  and ``-lse_i`` (base 2) riding in the matmul as an extra column of Q: ``[c Q_i, -lse_i] @
  [K_j^T; 1] = S_ij - lse_i``, so ``P_ij`` is one ``exp2`` of the matmul's output;
- likewise ``[dO_i, -D_i] @ [V_j^T; 1] = dP_ij - D_i``, so ``dS_ij`` is one multiplication;
- preallocated tiles and ``out=`` everywhere; the scale of dQ and dK applied once at the end;
- scores clamped where they could make ``exp2`` or the matmuls meet subnormal numbers (the
  forward's large-logit cliff), masked entries zeroed after the exponential;
- causal tile skipping in both loops: each key block starts at the first query block that may
  see it (and the forward's loop stops at the last key block a query block may see);
- threads: heads (or, for fewer heads than threads, key blocks, each part with its own dQ,
  summed in a fixed order) run on as many threads as the BLAS thread limit.
"""

from __future__ import annotations

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
from flashlib.fast.tiles import TILE_BYTES, exp_floor, hidden_entries, max_row_norm, slow_below

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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dq, dk, dv) of ``sum(do * o)`` where ``o, lse = flash_attention(...,
    return_lse=True)``, recomputing P tile by tile; P is never stored or passed in.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v), o and do: (..., n_q, d_v),
    lse: (..., n_q).  Options must match the forward call; block sizes need not (default
    BLOCK_Q x BLOCK_K, honoured as given; a tile is min(block, n) on each side).  Returns
    arrays of q's dtype.  Threads: as many as the BLAS thread limit (see
    :func:`flashlib.flash_attention`); split over heads the result does not depend on their
    number, split over key blocks (fewer heads than threads) it does by rounding only, and
    only on the caller's BLAS limit, never on what other Python threads are doing.
    o, lse: required arrays (None is refused by name).
    Extra memory beyond inputs and outputs: O(n d) ([Q, -lse], [dO, -D] and tiles of K^T and
    V^T in the compute dtype, one dQ per part for a split over key blocks) plus a few
    B_r x B_c tiles per head and thread (S and P, dP and dS), never (n_q, n_k).
    Grouped-query attention as in :func:`flashlib.flash_attention` (k, v with h_kv heads, h_q
    a multiple): dk, dv have k's shape, each summed over the query heads of its group (K and
    V are repeated per query head while the gradients are computed).
    """
    p, do, o, lse = check_backward_problem(
        q, k, v, do, o=o, lse=lse, causal=causal, mask=mask, scale=scale,
        blocks=(block_q, block_k), window=window, key_lengths=key_lengths, gqa=True)
    g, p = p, p.repeat_kv()  # grouped-query attention: one K/V copy per query head
    with np.errstate(over="ignore", invalid="ignore"):
        grads = _backward(p, o, lse, do)
        if not results_are_finite(*grads):  # rare: base-2 scores overflow, see flash_attention
            grads = _backward(p, o, lse, do, base2=False)
    check_no_overflow(p.dtype, *grads)
    dq, dk, dv = p.unflatten(grads[0]), g.sum_kv(grads[1]), g.sum_kv(grads[2])
    return tuple(x.astype(p.dtype, copy=False) for x in (dq, dk, dv))


class _BackwardTiles(NamedTuple):
    """One worker's buffers for a group of up to G heads (sliced to the group's size)."""

    kt: np.ndarray  # (G, d + 1, B_c): [K_j^T; 1] of the current key block
    vt: np.ndarray  # (G, d_v + 1, B_c): [V_j^T; 1]
    s: np.ndarray  # (G, B_r, B_c): S - lse, then P, in place
    dp: np.ndarray  # (G, B_r, B_c): dP - D, then dS, in place
    kv: np.ndarray  # (G, B_c, max(d, d_v)): one tile's P^T dO or dS^T Q
    rows: np.ndarray  # (G, B_r, d): one tile's dS K
    floors: np.ndarray | None  # (G, B_r, B_c) of the clamping floor, when clamping may be needed


def _backward_key_block(
    q_aug: np.ndarray, do_aug: np.ndarray, q: np.ndarray, do: np.ndarray, kt: np.ndarray,
    vt: np.ndarray, k_j: np.ndarray, dq: np.ndarray, dk_j: np.ndarray, dv_j: np.ndarray,
    j0: int, block_q: int, offset: int | None, mask: np.ndarray | None, heads: slice,
    buf: _BackwardTiles, floor: np.floating | None, exp: np.ufunc = np.exp2,
    lo: int | None = None, lengths: np.ndarray | None = None,
    bands: np.ndarray | None = None,
) -> None:
    """dK_j and dV_j of one key block (G heads), adding its share of dQ into ``dq``.

    q_aug: (G, n_q, d + 1) = [scale * log2(e) * Q, -lse * log2(e)] ([scale * Q, -lse] with
    ``exp=np.exp``, the natural-units fallback); do_aug: (G, n_q, d_v + 1) = [dO, -D];
    q: (G, n_q, d) and do: (G, n_q, d_v): Q and dO again, contiguous (BLAS reads the rows of
    q_aug and do_aug, whose stride is d + 1, markedly slower as a product's right operand);
    kt: (G, d + 1, w) = [K_j^T; 1]; vt: (G, d_v + 1, w) = [V_j^T; 1];
    k_j: (G, w, d).  dq (G, n_q, d), dk_j (G, w, d), dv_j (G, w, d_v): accumulated in place,
    dq and dk_j without the softmax scale.  floor: where a tile's S - lse falls below it,
    clamp at it and subtract exp(floor) after the exponential, so that what would have been
    subnormal (slow) is exactly 0 and P keeps an absolute error below exp(floor), 2**-63 in
    float32 (None: no clamping).  lo: the sliding window's left edge (row i sees keys
    j >= i + lo: query blocks past the last row that sees key j1 - 1 are skipped); lengths:
    (G,) key padding of the group, or None.
    """
    n_b, n_q, d = q_aug.shape[0], q_aug.shape[1], q_aug.shape[2] - 1
    w, d_v = kt.shape[-1], vt.shape[-2] - 1
    j1 = j0 + w
    last_row = n_q if lo is None else max(0, min(n_q, j1 - lo))  # rows i <= j1 - 1 - lo
    for i0 in range(_first_query_block(j0, offset, block_q), last_row, block_q):
        i1 = min(i0 + block_q, n_q)
        hidden = hidden_entries(i0, i1, j0, j1, band_hides(i0, i1, j0, j1, lo, offset),
                                offset, mask, heads, lo, lengths, bands)
        if hidden is not None and hidden.all():
            continue
        s, dp = buf.s[:n_b, : i1 - i0, :w], buf.dp[:n_b, : i1 - i0, :w]
        np.matmul(q_aug[:, i0:i1], kt, out=s)  # S_ij - lse_i, base 2
        clamped = floor is not None and s.min() < floor
        if clamped:  # no subnormal numbers, no -inf (against an array: twice as fast)
            np.maximum(s, buf.floors[:n_b, : i1 - i0, :w], out=s)
        p_ij = exp(s, out=s)  # P_ij, recomputed
        if clamped:  # flush: the clamped entries become exactly 0, the others stay normal
            p_ij -= exp(floor)
        if hidden is not None:
            np.copyto(p_ij, 0, where=hidden)
        kv = buf.kv[:n_b, :w]
        dv_j += np.matmul(p_ij.swapaxes(-1, -2), do[:, i0:i1], out=kv[..., :d_v])
        np.matmul(do_aug[:, i0:i1], vt, out=dp)  # dP_ij - D_i
        ds = np.multiply(p_ij, dp, out=dp)  # dS_ij = P_ij * (dP_ij - D_i)
        dk_j += np.matmul(ds.swapaxes(-1, -2), q[:, i0:i1], out=kv[..., :d])
        dq[:, i0:i1] += np.matmul(ds, k_j, out=buf.rows[:n_b, : i1 - i0])


def _backward(
    p: Problem, o: np.ndarray, lse: np.ndarray, do: np.ndarray, base2: bool = True,
    workers: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tiled backward of a validated problem; o, do: (B, n_q, d_v), lse: (B, n_q).
    Returns dq, dk, dv in the compute dtype.  base2: fold scale * log2(e) into Q and use exp2
    (the fast path); False: fold the scale alone and use exp, for scores whose base-2 form
    overflows.  workers: threads (default: the BLAS limit)."""
    block_q, block_k = p.block_q, p.block_k
    n_b, n_q, n_k, d, d_v = p.q.shape[0], p.n_q, p.n_k, p.q.shape[-1], p.v.shape[-1]
    dtype = compute_dtype(p.dtype)
    b_r, b_c = min(block_q, n_q), min(block_k, n_k)
    c = dtype.type(float(p.scale) * (LOG2E if base2 else 1.0))  # folded into Q
    units = LOG2E if base2 else 1.0  # lse in the units of exp
    exp = np.exp2 if base2 else np.exp

    # [Q, -lse * log2(e)] and [dO, -D], D = rowsum(dO * O).  Rows that saw no key (lse = -inf)
    # get dO = D = 0, so whatever P they recompute adds nothing.
    empty = np.isneginf(lse)
    q_aug = np.empty((n_b, n_q, d + 1), dtype=dtype)
    np.multiply(p.q, c, out=q_aug[..., :d])  # as the forward: a q * scale it could use
    bias = q_aug[..., d]
    np.multiply(lse, -units, out=bias, casting="unsafe")
    bias[empty] = -np.inf  # clamped below, then multiplied by dO = 0
    do_aug = np.empty((n_b, n_q, d_v + 1), dtype=dtype)
    do_aug[..., :d_v] = do
    do_aug[..., d_v] = np.einsum("...i,...i->...", do, o, dtype=dtype)
    do_aug[..., d_v] *= -1
    if empty.any():
        do_aug[empty] = 0
    q, k = p.q.astype(dtype, copy=False), p.k.astype(dtype, copy=False)
    do = do.astype(dtype, copy=False)
    if empty.any():
        do = do.copy()  # rows that saw no key: dO = 0, as in do_aug
        do[empty] = 0

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
    n_tiles = -(-n_k // b_c) if b_c else 0
    work_size = float(n_b) * n_q * n_k * (d + d_v)
    group = max(1, min(TILE_BYTES // max(1, b_r * b_c * dtype.itemsize), n_b))
    tile = b_r * b_c
    workers = pool.workers_for(work_size, n_b * max(n_tiles, 1), workers,
                                   tile=group * tile)
    # Split the heads into groups (a group's tiles fit TILE_BYTES), at least one per worker
    # while each worker's tiles stay large enough (MIN_THREAD_TILE twice over: the result then
    # does not depend on the thread count); else keep the heads together and split the key
    # blocks, round-robin, each part adding into its own dQ (summed in a fixed order).
    size, parts = group, 1
    if workers > 1:
        if n_b >= workers and (n_b // workers) * tile >= 2 * pool.MIN_THREAD_TILE:
            size = min(group, n_b // workers)
        else:
            parts = max(1, min(-(-workers // -(-n_b // group)), n_tiles))
    heads = [(h0, min(h0 + size, n_b)) for h0 in range(0, n_b, size)]
    dq_parts = [dq] + [np.zeros_like(dq) for _ in range(parts - 1)]
    items = [(h0, h1, part) for part in range(parts) for h0, h1 in heads]
    mid = max(d, d_v)

    def setup() -> _BackwardTiles:
        kt = np.empty((size, d + 1, b_c), dtype=dtype)
        vt = np.empty((size, d_v + 1, b_c), dtype=dtype)
        kt[:, d] = 1
        vt[:, d_v] = 1
        return _BackwardTiles(
            kt=kt,
            vt=vt,
            s=np.empty((size, b_r, b_c), dtype=dtype),
            dp=np.empty((size, b_r, b_c), dtype=dtype),
            kv=np.empty((size, b_c, mid), dtype=dtype),
            rows=np.empty((size, b_r, d), dtype=dtype),
            floors=np.full((size, b_r, b_c), floor) if clamp else None,
        )

    def work(buf: _BackwardTiles, item: tuple[int, int, int]) -> None:
        h0, h1, part = item
        g = slice(h0, h1)
        for t in range(part, n_tiles, parts):
            j0, j1 = t * b_c, min(t * b_c + b_c, n_k)
            # K_j^T and V_j^T laid out once per key block: they stay put while the inner loop
            # streams the query blocks past them
            kt, vt = buf.kt[: h1 - h0, :, : j1 - j0], buf.vt[: h1 - h0, :, : j1 - j0]
            kt[:, :d] = p.k[g, j0:j1].swapaxes(-1, -2)
            vt[:, :d_v] = p.v[g, j0:j1].swapaxes(-1, -2)
            dk_j, dv_j = dk[g, j0:j1], dv[g, j0:j1]
            dk_j.fill(0)
            dv_j.fill(0)
            _backward_key_block(
                q_aug[g], do_aug[g], q[g], do[g], kt, vt, k[g, j0:j1],
                dq_parts[part][g], dk_j, dv_j, j0, block_q, p.offset, p.mask, g, buf,
                floor if clamp else None, exp, p.lo,
                None if p.key_lengths is None else p.key_lengths[g],
                None if p.bands is None else p.bands[g])

    pool.run_items(work, items, workers, setup)
    for extra in dq_parts[1:]:
        dq += extra
    dq *= p.scale
    dk *= p.scale
    return dq, dk, dv
