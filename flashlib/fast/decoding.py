"""Split-KV decoding (Flash-Decoding), the library version: :func:`decode_attention`.

At decoding time a few query rows (usually one per sequence) attend over a long KV cache: one
program per head would leave most of a GPU idle, so the cache is cut into ``n_splits`` shares
of keys, each attended on its own (FlashAttention-2's forward on that share, giving a partial
output ``O_s`` and its logsumexp ``L_s``), and the partial results are merged exactly:
``L = log sum_s exp(L_s)``, ``O = sum_s exp(L_s - L) O_s`` (Dao et al. 2023, Flash-Decoding).

The teaching function is :func:`flashlib.algorithms.split_kv_decode` (one head, unchecked, as
the chapter writes it); :func:`decode_attention` is its library twin: batched, grouped-query
heads, the masks of :func:`flashlib.flash_attention` (the cache's real lengths through
``key_lengths``, like flash-attn's ``cache_seqlens``), validated, each share run by the
library forward, the partial results kept in the compute dtype and merged in one pass (as
flash-decoding's combine kernel does).  :func:`split_ranges` is the one place the shares
are cut (the Beyond chapter's merge tree uses it too).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from flashlib.core.checks import check_flag, check_int
from flashlib.core.constants import BLOCK_K, BLOCK_Q, compute_dtype
from flashlib.core.problem import Problem, check_no_overflow, check_problem
from flashlib.fast.forward import run_forward

__all__ = ["decode_attention", "split_ranges", "combine_shares"]


def split_ranges(n_k: int, n_splits: int) -> list[tuple[int, int]]:
    """The key ranges [start, stop) of the shares of a cache of ``n_k`` keys cut into
    ``n_splits`` shares of ceil(n_k / n_splits) keys (fewer shares when n_splits > n_k: none
    is empty; none at all for an empty cache).  n_splits: a positive integer."""
    n_k = check_int(n_k, "n_k", minimum=0)
    n_splits = check_int(n_splits, "n_splits", minimum=1)
    size = max(1, -(-n_k // n_splits))  # keys per share
    return [(s, min(s + size, n_k)) for s in range(0, n_k, size)]


def _share(p: Problem, start: int, stop: int, dtype: np.dtype) -> Problem:
    """The problem restricted to keys [start, stop), in ``dtype``: the same masks, moved to the
    share's own key indices (key j of the share is key start + j of the cache)."""
    def moved(bound: int | None) -> int | None:
        return None if bound is None else bound - start

    lengths = None if p.key_lengths is None else np.clip(p.key_lengths - start, 0, stop - start)
    return p._replace(
        q=p.q.astype(dtype, copy=False), k=p.k[:, start:stop].astype(dtype, copy=False),
        v=p.v[:, start:stop].astype(dtype, copy=False), dtype=dtype,
        mask=None if p.mask is None else p.mask[..., start:stop],
        offset=moved(p.offset), lo=moved(p.lo), key_lengths=lengths,
        bands=None if p.bands is None else p.bands - start)


def combine_shares(shares: Iterable[tuple[np.ndarray, np.ndarray]], shape: tuple[int, ...],
                   dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Flash-Decoding's combine: the shares' normalised outputs O_s (B, n_q, d_v) and
    logsumexps L_s (B, n_q), in one pass (running max m, sum l, output acc), into attention
    over all their keys: o (``shape``) and lse (-inf, o = 0 for rows no share saw)."""
    m = np.full(shape[:-1], -np.inf, dtype=dtype)
    l = np.zeros(shape[:-1], dtype=dtype)  # noqa: E741
    acc = np.zeros(shape, dtype=dtype)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for o_s, lse_s in shares:
            m_new = np.maximum(m, lse_s)
            m_ref = np.where(np.isneginf(m_new), 0, m_new)  # rows that saw nothing yet
            alpha, beta = np.exp(m - m_ref), np.exp(lse_s - m_ref)  # 0 for -inf
            l = l * alpha + beta  # noqa: E741
            acc = acc * alpha[..., None] + o_s * beta[..., None]
            m = m_new
        seen = l > 0
        o = np.divide(acc, l[..., None], out=np.zeros_like(acc), where=seen[..., None])
        lse = np.full_like(m, -np.inf)
        np.log(l, out=lse, where=seen)
        lse += np.where(seen, m, 0)
    return o, lse


def decode_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    n_splits: int = 1,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    causal: bool | str = False,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    return_lse: bool = False,
    window: tuple[int | None, int | None] | None = None,
    key_lengths: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Attention of the query rows q (a few: the new tokens) over a KV cache cut into
    ``n_splits`` shares of keys, each attended on its own, then merged (Flash-Decoding).

    What :func:`flashlib.flash_attention` returns with the same arguments, up to rounding.
    n_splits: a positive integer, the number of shares (:func:`split_ranges`: fewer when the
    cache has fewer keys).  block_q, block_k: the tiles of each share's forward (B_r, B_c).
    Shapes, grouped-query heads and the other options: those of :mod:`flashlib.fast`, said
    once there; for a cache padded to n_k keys, ``key_lengths`` (one per batch element, like
    flash-attn's ``cache_seqlens``) hides the padding and puts a bottom-right diagonal
    (``causal="bottom_right"``, a window) on each sequence's last real key.  An empty cache,
    or rows that see no key, give 0 (lse ``-inf``).  The partial outputs stay in the compute
    dtype (float32 for float16 inputs) until the merge, which rounds once.
    """
    return_lse = check_flag(return_lse, "return_lse")
    p = check_problem(q, k, v, causal=causal, mask=mask, scale=scale,
                      blocks=(block_q, block_k), window=window, key_lengths=key_lengths,
                      gqa=True)
    dtype = compute_dtype(p.dtype)
    shares = (run_forward(_share(p, start, stop, dtype))  # O_s, L_s of one share
              for start, stop in split_ranges(p.n_k, n_splits))
    o, lse = combine_shares(shares, (p.q.shape[0], p.n_q, p.v.shape[-1]), dtype)
    check_no_overflow(p.dtype, o, stats=lse)
    o = p.unflatten(o.astype(p.dtype, copy=False))
    return (o, p.unflatten(lse)) if return_lse else o
