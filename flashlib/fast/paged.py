"""Decoding over a paged KV cache: :func:`paged_decode_attention`.

A paged KV cache (vLLM's PagedAttention, Kwon et al. 2023) stores keys and values as
fixed-size pages of ``P`` token positions in one pool shared by every sequence, so that no
sequence needs a contiguous region reserved for its longest possible length; each sequence's
row of the *block table* names, in order, the pages that hold its keys: key ``t P + r`` of
sequence ``b`` is row ``r`` of page ``block_table[b, t]``.  A sequence grows a page at a time,
and sequences may share pages (a common prompt prefix).  vLLM's ``paged_attention_v2`` kernel
(csrc/attention/paged_attention_v2.cu) takes ``block_tables`` of shape ``[num_seqs,
max_num_blocks_per_seq]`` and ``seq_lens``, and cuts each sequence into partitions of
``PARTITION_SIZE`` (512) tokens, one program each, merged by a reduce kernel: the split-KV
schedule over pages.  flash-attn's ``flash_attn_with_kvcache(q, k_cache, v_cache, ...,
cache_seqlens=..., block_table=...)`` takes the same three things (its docstring in
flash_attn/flash_attn_interface.py, commit 0251105a): ``k_cache`` of shape ``(num_blocks,
page_block_size, nheads_k, headdim)`` when there is a block table (``page_block_size`` a
multiple of 256 there, also checked in csrc/flash_attn/flash_api.cpp), ``block_table`` of
shape ``(batch_size, max_num_blocks_per_seq)``, dtype int32, and ``cache_seqlens``, the
cache's lengths; it has no backward pass (its docstring says so), and neither has this.

The teaching function is :func:`flashlib.algorithms.paged_kv_decode` (one sequence, one head);
this is its library twin: batched, grouped-query heads, the masks of a KV cache (its lengths,
a bottom-right causal diagonal, a window), validated, each page one share of split-KV decoding
(:mod:`flashlib.fast.decoding`'s schedule over pages: the page of every sequence at position
t gathered, attended by the library forward, and merged in one pass).  Its layout is numpy's
(heads before positions, as ``q``): pages ``(n_pages, h_kv, P, d)``.
"""

from __future__ import annotations

import numpy as np

from flashlib.core.checks import as_array, as_float_array, check_finite, check_flag
from flashlib.core.constants import BLOCK_K, BLOCK_Q, compute_dtype
from flashlib.core.problem import check_no_overflow, check_problem
from flashlib.fast.decoding import _share, combine_shares
from flashlib.fast.forward import run_forward

__all__ = ["paged_decode_attention", "check_block_table"]


def _table_array(block_table: object, n_b: int) -> np.ndarray:
    """The table as given, checked for its dtype (integers, not bools) and shape
    (B, max_pages)."""
    table = as_array(block_table, "block_table", "pass an integer array of page ids")
    if table.dtype == np.bool_ or not np.issubdtype(table.dtype, np.integer):
        raise TypeError(f"block_table must be an integer array of page ids (B, max_pages), got "
                        f"dtype {table.dtype}")
    if table.ndim != 2 or table.shape[0] != n_b:
        raise ValueError(f"block_table must have shape (B, max_pages) = ({n_b}, ...), one row "
                         f"per sequence of q, got shape {table.shape}")
    return table


def check_block_table(block_table: object, key_lengths: np.ndarray, n_pages: int,
                      page_size: int) -> np.ndarray:
    """The block table as an int64 array (B, max_pages), checked against the cache lengths
    ``key_lengths`` (B,): an integer array (bools refused) with one row per sequence, long
    enough for each sequence (``ceil(L_b / P)`` pages), its used entries page ids in
    [0, n_pages), no page twice in one sequence (two positions of one sequence cannot hold the
    same keys; sequences may share pages).  Entries past a sequence's pages are not read (-1
    padding is fine)."""
    given = _table_array(block_table, len(key_lengths))
    # int64: a uint64 id beyond int64 wraps to a negative one, refused below where it is read
    # (by its value as given); unread padding may hold anything
    table = given.astype(np.int64)
    used = -(-key_lengths // page_size)  # pages each sequence needs
    for b, (row, n) in enumerate(zip(table, used, strict=True)):
        if n > len(row):
            raise ValueError(
                f"block_table row {b} holds {len(row)} pages of {page_size} keys, fewer than "
                f"key_lengths[{b}] = {key_lengths[b]} needs ({n} pages)")
        ids = row[:n]
        bad = given[b, :n][(ids < 0) | (ids >= n_pages)]
        if bad.size:
            raise ValueError(f"block_table row {b} names page {bad[0]}, outside the cache's "
                             f"pages [0, {n_pages})")
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"block_table row {b} names a page twice among its {n} pages "
                             f"(each position of a sequence has its own page)")
    return table


def paged_decode_attention(
    q: np.ndarray,
    k_pages: np.ndarray,
    v_pages: np.ndarray,
    block_table: np.ndarray,
    *,
    key_lengths: np.ndarray | int | None = None,
    causal: bool | str = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    return_lse: bool = False,
    block_k: int = BLOCK_K,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Attention of the new query rows of B sequences over their paged KV cache.

    q: (B, h_q, n_q, d); k_pages: (n_pages, h_kv, P, d), v_pages: (n_pages, h_kv, P, d_v), the
    cache's pages of P positions (h_q a multiple of h_kv: grouped-query heads);
    block_table: (B, max_pages) integers, sequence b's keys ``t P + r`` in row r of page
    ``block_table[b, t]`` (:func:`check_block_table`); key_lengths: the cache lengths L_b
    (flash-attn's ``cache_seqlens``), a scalar or (B,), at most max_pages P (default: every
    sequence fills its row of the table).  -> o: (B, h_q, n_q, d_v), q's dtype: what
    :func:`flashlib.fast.decoding.decode_attention` returns on the same keys laid out
    contiguously (``key_lengths``, ``causal``, ``window``, ``scale`` and ``return_lse`` as
    there; a bottom-right diagonal on each sequence's last key), up to rounding.  Each page
    position is one share: the pages of all sequences at that position are gathered (one
    page per sequence at a time, never the whole cache), attended with tiles of ``block_k``
    keys, and merged exactly.
    """
    return_lse = check_flag(return_lse, "return_lse")
    q = as_float_array(q, "q")
    k_pages, v_pages = as_float_array(k_pages, "k_pages"), as_float_array(v_pages, "v_pages")
    if q.ndim != 4:
        raise ValueError(f"q must have shape (B, h_q, n_q, d), got {q.shape}")
    for name, x in (("k_pages", k_pages), ("v_pages", v_pages)):
        if x.ndim != 4:
            raise ValueError(f"{name} must have shape (n_pages, h_kv, P, d), got {x.shape}")
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
        check_finite(x, name)
    if k_pages.shape[:3] != v_pages.shape[:3]:
        raise ValueError(f"k_pages and v_pages must have the same (n_pages, h_kv, P), got "
                         f"{k_pages.shape} and {v_pages.shape}")
    n_pages, h_kv, page_size, d = k_pages.shape
    if page_size < 1:
        raise ValueError(f"pages must hold at least one position, got P = {page_size}")
    n_b = q.shape[0]
    max_pages = _table_array(block_table, n_b).shape[1]
    n_k = max_pages * page_size  # the longest sequence the table can hold
    lengths = np.asarray(n_k if key_lengths is None else key_lengths)
    if np.issubdtype(lengths.dtype, np.integer) and lengths.size and lengths.max() > n_k:
        raise ValueError(f"block_table holds {max_pages} pages of {page_size} keys per "
                         f"sequence ({n_k} keys), fewer than key_lengths = {lengths.max()}")
    # the validated problem over a stand-in for the contiguous cache (a broadcast view: no
    # memory): its masks, lengths, scale and grouped heads, as decode_attention's
    stand_in = (np.broadcast_to(np.zeros((), q.dtype), (n_b, h_kv, n_k, d)),
                np.broadcast_to(np.zeros((), q.dtype), (n_b, h_kv, n_k, v_pages.shape[-1])))
    p = check_problem(q, *stand_in, causal=causal, scale=scale, blocks=(BLOCK_Q, block_k),
                      window=window, key_lengths=lengths, gqa=True)
    lengths = p.key_lengths.reshape(n_b, -1)[:, 0]  # one length per sequence
    table = check_block_table(block_table, lengths, n_pages, page_size)
    dtype = compute_dtype(p.dtype)
    n_q, d_v = p.n_q, v_pages.shape[-1]

    def shares():  # O_s, L_s of each page position, its page read through the table
        for t in range(-(-int(lengths.max(initial=0)) // page_size)):
            ids = np.where(t * page_size < lengths, table[:, t], 0)  # unused: any page
            share = _share(p, t * page_size, (t + 1) * page_size, dtype)._replace(
                k=k_pages[ids].reshape(-1, page_size, d).astype(dtype, copy=False),
                v=v_pages[ids].reshape(-1, page_size, d_v).astype(dtype, copy=False))
            yield run_forward(share)

    o, lse = combine_shares(shares(), (p.q.shape[0], n_q, d_v), dtype)
    check_no_overflow(p.dtype, o, stats=lse)
    o = p.unflatten(o.astype(p.dtype, copy=False))
    return (o, p.unflatten(lse)) if return_lse else o
