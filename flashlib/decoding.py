"""Decoding: one new query row against a long KV cache, split across programs ("split-KV").

With one query row, FlashAttention-2's outer loop has a single block, so a GPU would run one
program and leave the others idle.  Split-KV (flash-decoding) gives each of ``n_splits``
programs a share of the keys; each writes a partial result (its normalised output and
logsumexp), and a second pass merges them with the online-softmax merge.  The traffic stays
about 2 N d (K and V read once): the split adds parallelism, not less traffic
(:func:`flashlib.io_model.traffic` with ``order="split_kv"``).

:func:`split_kv_decode` is the teaching function (one head, the memory of :mod:`flashlib.hbm`);
:func:`split_kv_tree` computes the same merge as a tree, level by level (the chapter's widget
draws it).  :func:`grouped_query_attention` is grouped-query attention as a teaching function
(several query heads share one K/V head; :func:`flashlib.flash_attention` takes such k, v
directly) and :func:`kv_cache_bytes` the size of the cache it shrinks.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from flashlib._validate import check_int
from flashlib.flash import flash2_forward
from flashlib.hbm import PLAIN, Memory
from flashlib.naive import standard_attention
from flashlib.online import merge_states

__all__ = ["split_kv_decode", "split_kv_tree", "grouped_query_attention", "kv_cache_bytes"]


def split_kv_decode(
    q: np.ndarray, K: np.ndarray, V: np.ndarray, n_splits: int, B_c: int, mem: Memory = PLAIN
) -> np.ndarray:
    """Attention of the query rows q (a few, usually one) over K, V split into ``n_splits``
    shares, each attended by its own program, then merged.

    q: (n_q, d), K: (N, d), V: (N, d_v) -> O: (n_q, d_v).
    """
    size = -(-K.shape[0] // n_splits)  # keys per program
    parts = [flash2_forward(q, K[s : s + size], V[s : s + size], len(q), B_c, mem)
             for s in range(0, K.shape[0], size)]  # one program each: (O_s, L_s) to HBM
    # (O_s, L_s) is the partial state m = L_s, l = 1, acc = O_s: merge them pairwise
    states = [(mem.read(L_s), np.ones(len(q), q.dtype), mem.read(O_s)) for O_s, L_s in parts]
    _, l, acc = functools.reduce(merge_states, states)
    return mem.put("O", acc / l[:, None])  # (n_q, d_v)


State = tuple[np.ndarray, np.ndarray, np.ndarray]


def split_kv_tree(q: np.ndarray, K: np.ndarray, V: np.ndarray, n_splits: int
                  ) -> tuple[list[tuple[int, int]], list[list[State]]]:
    """The partial states of :func:`split_kv_decode` and their merge as a binary tree.

    q: (n_q, d), K: (N, d), V: (N, d_v).  Returns the key range [start, stop) of each split
    and the tree's levels: level 0 holds one state (m, l, acc) per split (m = L_s, l = 1,
    acc = O_s), each next level the pairwise merges of the one below (an odd one out is
    carried up), the last level one state: acc / l is the output.  A GPU merges the splits
    in a tree (or in one pass over them); the result is the same up to rounding.
    """
    size = -(-K.shape[0] // n_splits)
    ranges = [(s, min(s + size, K.shape[0])) for s in range(0, K.shape[0], size)]
    level = []
    for start, stop in ranges:
        O_s, L_s = flash2_forward(q, K[start:stop], V[start:stop], len(q), stop - start)
        level.append((L_s, np.ones(len(q), q.dtype), O_s))
    levels = [level]
    while len(level) > 1:
        level = [merge_states(*level[i : i + 2]) if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
        levels.append(level)
    return ranges, levels


def grouped_query_attention(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray
) -> np.ndarray:
    """Grouped-query attention (Ainslie et al. 2023): query head h attends
    with K/V head h // g, g = h_q / h_kv (h_kv = 1: multi-query attention).

    Q: (h_q, N_q, d), K: (h_kv, N_k, d), V: (h_kv, N_k, d_v)
    -> O: (h_q, N_q, d_v).
    """
    g = Q.shape[0] // K.shape[0]  # query heads per K/V head
    assert g * K.shape[0] == Q.shape[0], "h_q must be a multiple of h_kv"
    O = [standard_attention(Q[h], K[h // g], V[h // g]) for h in range(len(Q))]
    return np.stack(O)  # (h_q, N_q, d_v)


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, tokens: int, itemsize: int,
                   batch: int = 1) -> int:
    """Bytes of a decoder's KV cache: K and V, each (batch, kv_heads, tokens, head_dim) per
    layer, ``itemsize`` bytes a number (2 for float16/bfloat16).  Grouped-query attention
    divides it by h_q / kv_heads against multi-head attention (kv_heads = h_q)."""
    values = [check_int(x, name, minimum=0) for name, x in (
        ("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim), ("tokens", tokens),
        ("itemsize", itemsize), ("batch", batch))]
    return 2 * math.prod(values)
