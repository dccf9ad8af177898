"""Attention dropout that is never stored: the library path of ``flash_attention(...,
dropout_p=..., seed=...)`` and its backward.

Dropout on the attention probabilities: ``O = (P * Z / (1 - p)) V`` with Z a keep-mask of
independent entries, each 1 with probability 1 - p.  FlashAttention (Dao et al. 2022,
Algorithms 2 and 4) keeps only the random generator's state and regenerates each tile's
mask in the backward pass; here each entry's bit is :func:`flashlib.core.philox.dropout_keep`
of (seed, b * H + h, i, j), a pure function of its position, so the forward and the backward
draw the same mask whatever their tiles or threads.  The teaching functions are
:func:`flashlib.algorithms.flash2_dropout_forward` and
:func:`flashlib.algorithms.flash2_dropout_backward` (one head); these are their twins: every
batch shape, the masks (causal, window, key_lengths, mask), grouped-query heads, float16
computed in float32, validated (:func:`check_dropout` for the two new arguments).

The logsumexp returned (``return_lse``) is that of the scores, as without dropout (the
normaliser sums every entry; dropout acts on the normalised P), and D = rowsum(dO * O) still
holds for the dropped output O.  The loops are plain blockwise numpy (all heads of a query or
key block at once), not the no-dropout path's tuned kernels: a tile costs the generator's ten
rounds anyway.  Extra memory: O(n d) (float32 copies of float16 inputs, GQA's K/V repeated
per query head, dQ in the compute dtype for the backward) plus a few (B, B_r, B_c) tiles.
"""

from __future__ import annotations

import numpy as np

from flashlib.core import threads as pool
from flashlib.core.constants import compute_dtype
from flashlib.core.masks import band_hides, key_range
from flashlib.core.philox import dropout_keep
from flashlib.core.problem import Problem, check_no_overflow
from flashlib.fast.tiles import hidden_entries

__all__ = ["check_dropout", "dropout_forward", "dropout_backward", "SEED_LIMIT"]

#: Seeds are the generator's 64-bit key: integers in [0, SEED_LIMIT).
SEED_LIMIT = 2**64


def check_dropout(dropout_p: object, seed: object) -> tuple[float, int | None]:
    """``(p, seed)`` validated: ``dropout_p`` a real number in [0, 1) (not a bool; 1 would
    drop every entry and scale by 1/0), ``seed`` None or an integer in [0, 2**64) (numpy
    integers too, not a bool).  ``dropout_p > 0`` needs a seed: flashlib keeps no global random
    state, and the backward call must pass the forward's seed to draw the same mask.  A seed
    with ``dropout_p = 0`` is accepted and unused (no entry is dropped)."""
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(
            dropout_p, (int, float, np.integer, np.floating)):
        raise TypeError(f"dropout_p must be a real number in [0, 1) (the probability of "
                        f"dropping an entry of P), got {dropout_p!r} of type "
                        f"{type(dropout_p).__name__}")
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:  # NaN fails too
        raise ValueError(f"dropout_p must lie in [0, 1) (the probability of dropping an entry "
                         f"of P), got {dropout_p!r}")
    if seed is not None:
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an integer in [0, 2**64) or None, got {seed!r} of "
                            f"type {type(seed).__name__}")
        if not 0 <= int(seed) < SEED_LIMIT:
            raise ValueError(f"seed must lie in [0, 2**64) (the dropout generator's 64-bit "
                             f"key), got {seed!r}")
        seed = int(seed)
    if p > 0 and seed is None:
        raise ValueError(f"dropout_p = {p} needs a seed (an integer in [0, 2**64)): flashlib "
                         f"keeps no global random state, and the backward call must pass the "
                         f"forward's seed to draw the same dropout mask")
    return p, seed


def _tile_hidden(p: Problem, i0: int, i1: int, j0: int, j1: int) -> np.ndarray | None:
    """The entries of the tile rows [i0, i1) x keys [j0, j1) that no mask lets any head see,
    broadcastable to (B, i1 - i0, j1 - j0); None when none is hidden."""
    straddles = band_hides(i0, i1, j0, j1, p.lo, p.offset)
    return hidden_entries(i0, i1, j0, j1, straddles, p.offset, p.mask, slice(None), p.lo,
                          p.key_lengths, p.bands)


def _key_blocks(p: Problem, i0: int, i1: int, b_c: int) -> range:
    """The starts of the key blocks that some row of [i0, i1) may see (the others skipped)."""
    lengths = None if p.key_lengths is None else int(p.key_lengths.max())
    start, stop = key_range(i0, i1, p.n_k, p.lo, p.offset, lengths)
    return range(start - start % b_c, stop, b_c)


def dropout_forward(p: Problem, dropout_p: float, seed: int,
                    workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """o (B, n_q, d_v) in q's dtype and lse (B, n_q) in the compute dtype of a validated
    problem with dropout ``dropout_p`` > 0 and ``seed`` (:func:`check_dropout`).

    Query blocks (all heads at once) run on ``workers`` threads (default: the BLAS limit);
    the result does not depend on their number, nor on the blocks: each entry's mask bit is a
    function of its position, and each row's sums run over the same key blocks in order.
    """
    dtype = compute_dtype(p.dtype)
    p = p.repeat_kv()  # grouped-query heads: K, V per query head
    n_b, n_q, n_k, d_v = p.q.shape[0], p.n_q, p.n_k, p.v.shape[-1]
    b_r, b_c = max(1, min(p.block_q, n_q)), max(1, min(p.block_k, n_k))
    k, v = p.k.astype(dtype, copy=False), p.v.astype(dtype, copy=False)
    heads = np.arange(n_b)[:, None, None]  # the counter's (batch, head) word
    keep_scale = dtype.type(1 / (1 - dropout_p))
    o = np.empty((n_b, n_q, d_v), dtype=p.dtype)
    lse = np.empty((n_b, n_q), dtype=dtype)

    def work(_: None, i0: int) -> None:
        i1 = min(i0 + b_r, n_q)
        q_i = p.q[:, i0:i1].astype(dtype) * p.scale  # (B, B_r, d)
        rows = np.arange(i0, i1)[None, :, None]
        m_i = np.full((n_b, i1 - i0), -np.inf, dtype=dtype)
        l_i = np.zeros((n_b, i1 - i0), dtype=dtype)
        acc = np.zeros((n_b, i1 - i0, d_v), dtype=dtype)
        for j0 in _key_blocks(p, i0, i1, b_c):
            j1 = min(j0 + b_c, n_k)
            hidden = _tile_hidden(p, i0, i1, j0, j1)
            if hidden is not None and hidden.all():
                continue
            s = q_i @ k[:, j0:j1].swapaxes(-1, -2)  # S_ij: (B, B_r, B_c)
            if hidden is not None:
                np.copyto(s, -np.inf, where=hidden)
            m_new = np.maximum(m_i, s.max(axis=-1))
            m_ref = np.where(np.isneginf(m_new), 0, m_new)  # rows that saw no key yet
            s -= m_ref[..., None]
            np.exp(s, out=s)  # P~_ij
            alpha = np.exp(m_i - m_ref)
            l_i = alpha * l_i + s.sum(axis=-1)  # every entry: the normaliser
            s *= dropout_keep(seed, heads, rows, np.arange(j0, j1), dropout_p)  # Z_ij
            acc = alpha[..., None] * acc + s @ v[:, j0:j1]
            m_i = m_new
        seen = l_i > 0  # rows that see no key: output 0, lse -inf
        inv = np.divide(keep_scale, l_i, out=np.zeros_like(l_i), where=seen)
        o[:, i0:i1] = acc * inv[..., None]
        lse_i = np.full_like(l_i, -np.inf)
        np.log(l_i, out=lse_i, where=seen)
        lse[:, i0:i1] = lse_i + np.where(seen, m_i, 0)

    items = list(range(0, n_q, b_r))
    work_size = float(n_b) * n_q * n_k * (p.q.shape[-1] + d_v)
    threads = pool.workers_for(work_size, len(items), workers, tile=n_b * b_r * b_c)
    with np.errstate(over="ignore", invalid="ignore"):
        pool.run_items(work, items, threads, lambda: None)
    check_no_overflow(p.dtype, o, stats=lse)
    return o, lse


def dropout_backward(p: Problem, o: np.ndarray, lse: np.ndarray, do: np.ndarray,
                     dropout_p: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dq, dk, dv), unflattened to the caller's shapes and in q's dtype, of a
    validated backward problem (o, lse, do flattened like it) with the forward's
    ``dropout_p`` > 0 and ``seed``: FlashAttention-2's loop order (key blocks outside, query
    blocks inside, all heads at once), each tile's mask drawn again, P_ij = exp(S_ij - lse_i),
    ``dV += (P Z)^T dO / (1 - p)``, ``dP = (dO V^T) Z / (1 - p)``, ``dS = P (dP - D)``."""
    dtype = compute_dtype(p.dtype)
    g, p = p, p.repeat_kv()
    n_b, n_q, n_k = p.q.shape[0], p.n_q, p.n_k
    b_r, b_c = max(1, min(p.block_q, n_q)), max(1, min(p.block_k, n_k))
    q, k, v, o, do = (x.astype(dtype, copy=False) for x in (p.q, p.k, p.v, o, do))
    lse = np.where(np.isneginf(lse), np.inf, lse).astype(dtype)  # rows that see no key: P = 0
    delta = np.sum(do * o, axis=-1)  # D = rowsum(dO * O): (B, n_q)
    heads = np.arange(n_b)[:, None, None]
    keep_scale = dtype.type(1 / (1 - dropout_p))
    dq, dk, dv = (np.zeros(x.shape, dtype=dtype) for x in (q, k, v))
    with np.errstate(over="ignore", invalid="ignore"):
        for j0 in range(0, n_k, b_c):  # outer loop over key blocks
            j1 = min(j0 + b_c, n_k)
            k_j, v_j = k[:, j0:j1], v[:, j0:j1]
            cols = np.arange(j0, j1)
            for i0 in range(0, n_q, b_r):  # inner loop over query blocks
                i1 = min(i0 + b_r, n_q)
                if j0 not in _key_blocks(p, i0, i1, b_c):
                    continue  # a key block the band or the padding hides from the rows
                hidden = _tile_hidden(p, i0, i1, j0, j1)
                if hidden is not None and hidden.all():
                    continue
                s = (q[:, i0:i1] * p.scale) @ k_j.swapaxes(-1, -2)  # S_ij
                s -= lse[:, i0:i1, None]
                prob = np.exp(s, out=s)  # P_ij
                if hidden is not None:
                    np.copyto(prob, 0, where=hidden)
                z = dropout_keep(seed, heads, np.arange(i0, i1)[None, :, None], cols,
                                 dropout_p) * keep_scale  # Z_ij / (1 - p)
                do_i = do[:, i0:i1]
                dv[:, j0:j1] += (prob * z).swapaxes(-1, -2) @ do_i
                dp = (do_i @ v_j.swapaxes(-1, -2)) * z  # through the dropout
                ds = prob * (dp - delta[:, i0:i1, None])
                ds *= p.scale
                dq[:, i0:i1] += ds @ k_j
                dk[:, j0:j1] += ds.swapaxes(-1, -2) @ q[:, i0:i1]
    check_no_overflow(p.dtype, dq, dk, dv)
    return (p.unflatten(dq).astype(p.dtype, copy=False),
            g.sum_kv(dk).astype(p.dtype, copy=False), g.sum_kv(dv).astype(p.dtype, copy=False))
