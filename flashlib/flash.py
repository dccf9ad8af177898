"""FlashAttention-2 forward: outer loop over query blocks, an unnormalised accumulator per block.

:func:`flash2_forward` is the algorithm as the paper writes it (one head, no mask);
:func:`flash_attention` is the fast library version described below.

For each block of ``B_r`` query rows the kernel streams over the key/value blocks of ``B_c`` rows,
keeping only the running row maximum ``m_i``, the running sum ``l_i`` and the unnormalised output
``acc`` (Dao 2023, Section 3.1).  The division by ``l_i`` happens once, at the end, and only the
logsumexp ``lse = m + log(l)`` is kept for the backward pass.  No ``(n_q, n_k)`` array is ever
built: beyond inputs and outputs the memory is one copy of K and O(n) state (O(n d) in all)
plus one ``(B_r, B_c)`` tile per head, whatever block sizes are asked for (a tile is
``min(block, n)`` on each side).

The tricks GPU kernels use, applied here (the optimisation-ladder chapter measures each one):

- the softmax scale and ``log2(e)`` are folded into Q, so that the cheaper ``exp2`` replaces
  ``exp`` and no ``(B_r, B_c)`` tile is ever multiplied by the scale;
- every head is processed by the same batched matmul, with preallocated tiles and ``out=``;
- conditional rescaling: the running maximum ``m_i`` is only updated when a tile's row sum of
  ``exp2(s - m_i)`` gets large, not whenever it grows.  Until then ``m_i`` is a constant, so
  ``s - m_i`` comes straight out of the ``Q K^T`` matmul: Q gets a column ``-m_i`` and K^T a row
  of ones, and the max/subtract passes over the tile disappear;
- the row sums of a tile are a matrix-vector product with ones, ``P @ 1``, which BLAS computes
  several times faster than ``P.sum(axis=-1)``;
- key blocks that the causal mask hides entirely are skipped, and a mask is applied only to
  tiles that straddle the diagonal or hold masked entries.  (Only those tiles meet ``-inf``,
  on which numpy's float32 ``exp2`` takes a slow path.)
"""

from __future__ import annotations

import math

import numpy as np

from flashlib._validate import (
    Problem,
    check_float_dtype,
    check_int,
    check_no_overflow,
    check_problem,
    results_are_finite,
)
from flashlib.constants import BLOCK_K, BLOCK_Q, LN2, LOG2E, compute_dtype
from flashlib.hbm import PLAIN, Memory
from flashlib.masks import hide_above_diagonal, key_stop, straddles_diagonal, tile_mask

__all__ = ["flash2_forward", "flash_attention", "workspace_bytes", "STALE_LIMIT"]

#: Conditional rescaling: a tile computed against a stale running maximum m_i is accepted while
#: each row's sum of exp2(s - m_i) stays at most 2**16.  Then every term is at most 2**16, far
#: from float32's overflow at 2**128, and the result equals the always-rescaled one up to
#: rounding.  A larger sum (a new maximum much above m_i, or an overflow to inf) sends the tile
#: through the exact step, which updates m_i and rescales the accumulator.  The price: acc may
#: hold values up to 2**16 times larger than with exact rescaling, so in float32 max |v| must
#: stay below about 5e33 / n_k instead of 3e38 / n_k.
STALE_LIMIT = 2.0**16


def flash2_forward(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int, mem: Memory = PLAIN
) -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2 forward (Dao 2023, Algorithm 1), one head.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v) and the logsumexp L: (N_q,).
    Every HBM access goes through ``mem`` (:mod:`flashlib.hbm`; plain numpy by default).
    """
    N_q, d_v, scale = Q.shape[0], V.shape[1], 1 / math.sqrt(Q.shape[1])
    O, L = mem.empty("O", (N_q, d_v), Q.dtype), mem.empty("L", (N_q,), Q.dtype)  # in HBM
    for i, Q_i in mem.blocks(B_r, Q):  # outer loop: load Q_i to SRAM
        O_i, l_i, m_i = mem.on_chip(  # on chip: unnormalised output, running sum and maximum
            O_i=np.zeros((len(Q_i), d_v), Q.dtype), l_i=np.zeros(len(Q_i), Q.dtype),
            m_i=np.full(len(Q_i), -np.inf, Q.dtype))
        for _, K_j, V_j in mem.blocks(B_c, K, V):  # inner loop: load K_j, V_j to SRAM
            S_ij = scale * (Q_i @ K_j.T)  # (B_r, B_c)
            m_new = np.maximum(m_i, S_ij.max(axis=1))  # (B_r,)
            P_ij = np.exp(S_ij - m_new[:, None])  # (B_r, B_c): P~_ij, unnormalised
            alpha = np.exp(m_i - m_new)  # (B_r,): rescales what was summed against m_i
            l_i = alpha * l_i + P_ij.sum(axis=1)
            O_i = alpha[:, None] * O_i + P_ij @ V_j
            m_i = m_new
        mem.write(O, i, O_i / l_i[:, None])  # the one division, at the end; write O_i
        mem.write(L, i, m_i + np.log(l_i))  # logsumexp, saved for the backward pass
    return O, L


def workspace_bytes(n_q: int, n_k: int, d: int, dtype: object, *, d_v: int | None = None,
                    batch: int = 1) -> int:
    """Bytes of the arrays :func:`flash_attention` allocates whose size grows with n.

    For ``batch`` heads of q: (n_q, d), k: (n_k, d), v: (n_k, d_v) (``d_v = d`` by default) in
    ``dtype``, in the running-statistics dtype :func:`compute_dtype`: ``k_aug``, the
    (d + 1, n_k) copy of K^T with a row of ones, and ``lse``, one value per query row; for
    float16 inputs also the float32 copy of V.  Not counted: the output, and the tiles, whose
    size depends only on the block sizes: one (B_r, B_c) tile per head, B_r = min(block_q, n_q),
    B_c = min(block_k, n_k).
    """
    dt = check_float_dtype(dtype, "dtype")
    n_q, n_k, d, batch = (check_int(value, name, minimum=0) for name, value in
                          (("n_q", n_q), ("n_k", n_k), ("d", d), ("batch", batch)))
    d_v = d if d_v is None else check_int(d_v, "d_v", minimum=0)
    work = compute_dtype(dt)
    elements = (d + 1) * n_k + n_q  # k_aug and lse
    if work != dt:
        elements += n_k * d_v  # v.astype(float32)
    return int(batch) * int(elements) * work.itemsize


def _forward_row_block(
    q_aug: np.ndarray,
    k_aug: np.ndarray,
    v: np.ndarray,
    i0: int,
    block_k: int,
    offset: int | None,
    mask: np.ndarray | None,
    s_buf: np.ndarray,
    ones: np.ndarray,
    exp: np.ufunc = np.exp2,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One query block against all the key blocks it may see.

    q_aug: (B, B_r, d + 1): rows of Q times scale * log2(e) (times scale alone with
    ``exp=np.exp``, the natural-units fallback); the last column is overwritten here with -m_i.
    k_aug: (B, d + 1, n_k): K^T with a last row of ones, so that q_aug @ k_aug = S - m_i.
    v: (B, n_k, d_v).  s_buf: (B, >= B_r, >= B_c) tile buffer.
    ones: (>= B_c, 1): row sums as matrix-vector products, s @ 1 (BLAS beats ``s.sum(-1)``).
    Returns the unnormalised accumulator acc (B, B_r, d_v), l_i and m_i (B, B_r), m_i in the
    units of ``exp`` (base 2 by default).
    """
    n_b, b_r, d = q_aug.shape[0], q_aug.shape[1], q_aug.shape[2] - 1
    i1 = i0 + b_r
    n_k, d_v = v.shape[-2:]
    dtype = q_aug.dtype
    m_i = np.full((n_b, b_r), -np.inf, dtype=dtype)  # running max, base-2 units
    l_i = np.zeros((n_b, b_r), dtype=dtype)  # running sum of exp2(s - m_i)
    acc = np.zeros((n_b, b_r, d_v), dtype=dtype)  # running sum of exp2(s - m_i) v_j
    pv = np.empty_like(acc)  # one tile's P~ V
    stale_ok = False  # True once every m_i is finite: then -m_i may ride in the matmul

    for j0 in range(0, key_stop(i0, i1, n_k, offset), block_k):
        j1 = min(j0 + block_k, n_k)
        s, ones_j = s_buf[:, :b_r, : j1 - j0], ones[: j1 - j0]
        straddles = straddles_diagonal(i0, j1, offset)
        visible = tile_mask(i0, i1, j0, j1, None, mask)  # the explicit mask only
        if visible is not None and not visible.any():
            continue  # an explicit mask hides the whole tile
        if stale_ok and not straddles and visible is None:
            # Fast step: [Q_i, -m_i] @ [K_j^T; 1] = S_ij - m_i, one exp2, one row sum.
            np.matmul(q_aug, k_aug[:, :, j0:j1], out=s)
            with np.errstate(over="ignore"):  # an overflow shows up as l_tile = inf below
                exp(s, out=s)  # P~_ij against the stale m_i, in place
            l_tile = np.matmul(s, ones_j)[..., 0]  # row sums
            if (l_tile <= STALE_LIMIT).all():  # False for inf and NaN too
                l_i += l_tile
                acc += np.matmul(s, v[:, j0:j1], out=pv)
                continue
            # The maximum grew too much for some row: redo this tile with the exact step.

        # Exact step: S_ij, mask, new maximum, rescale the accumulator.
        np.matmul(q_aug[..., :d], k_aug[:, :d, j0:j1], out=s)
        if straddles:
            hide_above_diagonal(s, i0, j0, offset)
        if visible is not None:
            np.copyto(s, -np.inf, where=~visible)
        m_new = np.maximum(m_i, s.max(axis=-1))
        # Rows that have seen no visible key yet keep m = -inf; exponentiate them against 0
        # so that exp2(-inf - (-inf)) never produces a NaN.
        m_ref = np.where(np.isneginf(m_new), 0, m_new)
        s -= m_ref[..., None]
        exp(s, out=s)  # P~_ij, in place
        alpha = exp(m_i - m_ref)  # rescales what was accumulated against the old max
        l_i *= alpha
        l_i += np.matmul(s, ones_j)[..., 0]
        acc *= alpha[..., None]
        acc += np.matmul(s, v[:, j0:j1], out=pv)
        m_i = m_new
        q_aug[..., d] = -m_ref
        stale_ok = not np.isneginf(m_new).any()

    return acc, l_i, m_i


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
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Exact attention in the FlashAttention-2 loop order, never building an (n_q, n_k) array.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) -> o: (..., n_q, d_v), q's dtype.
    block_q, block_k: the tile sizes B_r and B_c (default BLOCK_Q x BLOCK_K, measured: see
    flashlib.constants), honoured as given; a tile is min(block, n) on each side.
    causal: False, True / "top_left" (row i sees j <= i), "bottom_right" (j <= i + n_k - n_q).
    mask: boolean, broadcastable to (..., n_q, n_k); True = may attend.
    scale: defaults to 1/sqrt(d); kept in the compute dtype (float32 for float16 inputs).
    return_lse: also return lse = m + log(l): (..., n_q), natural log, at least float32,
    ``-inf`` for rows that see no key (whose output is 0).
    Extra memory beyond inputs and output: O(n d) (:func:`workspace_bytes`) plus one
    B_r x B_c tile per head.
    Scores whose base-2 form ``scale * log2(e) * q k^T`` overflows (or values that overflow
    the unnormalised accumulator) are recomputed in natural units with V scaled by a power of
    two, giving what :func:`flashlib.naive_attention` gives; scores that overflow the compute
    dtype even so raise ValueError.
    """
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale,
                      blocks=(block_q, block_k))
    with np.errstate(over="ignore", invalid="ignore"):
        o, lse = _forward(p, base2=True)
        if not results_are_finite(o, stats=lse):  # rare: huge scores or values, see the docstring
            o, lse = _forward(p, base2=False)
    check_no_overflow(p.dtype, o, stats=lse)
    o = p.unflatten(o)
    return (o, p.unflatten(lse)) if return_lse else o


def _forward(p: Problem, base2: bool) -> tuple[np.ndarray, np.ndarray]:
    """The tiled forward of a validated problem: o (B, n_q, d_v) in q's dtype and lse (B, n_q).

    base2: fold scale * log2(e) into Q and use exp2 (the fast path).  False: fold the scale
    alone and use exp, with V divided by a power of two 2^e >= max|v| (exact) and the output
    multiplied back, so that neither the base-2 scores nor the accumulator can overflow.
    """
    block_q, block_k = p.block_q, p.block_k
    dtype = compute_dtype(p.dtype)
    n_b, n_q, n_k, d, d_v = p.q.shape[0], p.n_q, p.n_k, p.q.shape[-1], p.v.shape[-1]
    if base2:
        q_scale, exp, v, v_exp = dtype.type(float(p.scale) * LOG2E), np.exp2, p.v, 0
    else:
        v_max = float(np.max(np.abs(p.v), initial=0.0))
        v_exp = int(np.frexp(v_max)[1])  # 2**v_exp > max|v|
        q_scale, exp, v = p.scale, np.exp, np.ldexp(p.v.astype(dtype), -v_exp)

    k_aug = np.empty((n_b, d + 1, n_k), dtype=dtype)  # [K^T; 1]: one O(n d) copy of K
    k_aug[:, :d] = p.k.swapaxes(-1, -2)
    k_aug[:, d] = 1
    v = v.astype(dtype, copy=False)
    b_r, b_c = min(block_q, n_q), min(block_k, n_k)  # tiles never exceed the problem
    q_aug = np.empty((n_b, b_r, d + 1), dtype=dtype)  # [Q_i * scale * log2(e), -m_i]
    s_buf = np.empty((n_b, b_r, b_c), dtype=dtype)  # the (B_r, B_c) tile of every head
    ones = np.ones((b_c, 1), dtype=dtype)

    o = np.empty((n_b, n_q, d_v), dtype=p.dtype)
    lse = np.empty((n_b, n_q), dtype=dtype)
    for i0 in range(0, n_q, block_q):
        i1 = min(i0 + block_q, n_q)
        q_i = q_aug[:, : i1 - i0]
        np.multiply(p.q[:, i0:i1], q_scale, out=q_i[..., :d])
        acc, l_i, m_i = _forward_row_block(
            q_i, k_aug, v, i0, block_k, p.offset, p.mask, s_buf, ones, exp
        )
        seen = l_i > 0  # False for rows that see no key: output 0, lse -inf
        np.divide(acc, l_i[..., None], out=acc, where=seen[..., None])
        if v_exp:
            acc = np.ldexp(acc, v_exp)  # undo the scaling of V (exact)
        o[:, i0:i1] = acc
        lse_i = lse[:, i0:i1]
        lse_i.fill(-np.inf)
        if base2:
            np.log2(l_i, out=lse_i, where=seen)
            lse_i += m_i
            lse_i *= LN2  # back from base 2 to natural log
        else:
            np.log(l_i, out=lse_i, where=seen)
            lse_i += m_i
    return o, lse
