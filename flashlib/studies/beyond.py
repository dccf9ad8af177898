"""The Beyond chapter's experiments: split-KV decoding's merge tree, and the KV cache.

:func:`split_kv_tree` computes the same merge as :func:`flashlib.algorithms.split_kv_decode`
(whose checked library twin is :func:`flashlib.fast.decoding.decode_attention`), as a tree,
level by level (the chapter's widget draws it), behind the library's checks;
:func:`kv_cache_bytes` is the size of the cache that grouped-query attention
(:func:`flashlib.algorithms.grouped_query_attention`) shrinks.
"""

from __future__ import annotations

import math

import numpy as np

from flashlib.algorithms import (
    flash2_forward,
    merge_states,
)
from flashlib.core.checks import check_int
from flashlib.core.problem import check_problem
from flashlib.fast.decoding import split_ranges

__all__ = [
    "split_kv_tree",
    "kv_cache_bytes",
]


State = tuple[np.ndarray, np.ndarray, np.ndarray]


def split_kv_tree(q: np.ndarray, K: np.ndarray, V: np.ndarray, n_splits: int
                  ) -> tuple[list[tuple[int, int]], list[list[State]]]:
    """The partial states of :func:`split_kv_decode` and their merge as a binary tree.

    q: (n_q, d), K: (N, d), V: (N, d_v), float arrays, finite, N >= 1; n_splits: a positive
    integer (the checks of :func:`flashlib.fast.decoding.decode_attention`, whose shares are
    the same, :func:`flashlib.fast.decoding.split_ranges`).  Returns the key range
    [start, stop) of each split and the tree's levels: level 0 holds one state (m, l, acc)
    per split (m = L_s, l = 1, acc = O_s), each next level the pairwise merges of the one
    below (an odd one out is carried up), the last level one state: acc / l is the output.
    A GPU merges the splits in a tree (or in one pass over them); the result is the same up
    to rounding.
    """
    p = check_problem(q, K, V)  # float, finite, matching shapes: (..., n, d)
    if len(p.batch_shape) != 0 or np.ndim(K) != 2 or np.ndim(V) != 2:
        raise ValueError(f"q, K and V must be 2-D (one head): q (n_q, d), K (N, d), V (N, d_v), "
                         f"got q {np.shape(q)}, K {np.shape(K)}, V {np.shape(V)}")
    if p.n_k == 0 or p.n_q == 0:
        raise ValueError(f"q and K must hold at least one row (a tree of no splits has no "
                         f"root), got q {np.shape(q)} and K {np.shape(K)}")
    q, K, V = p.q[0], p.k[0], p.v[0]
    ranges = split_ranges(p.n_k, n_splits)
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


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, tokens: int, itemsize: int,
                   batch: int = 1) -> int:
    """Bytes of a decoder's KV cache: K and V, each (batch, kv_heads, tokens, head_dim) per
    layer, ``itemsize`` bytes a number (2 for float16/bfloat16).  Grouped-query attention
    divides it by h_q / kv_heads against multi-head attention (kv_heads = h_q)."""
    values = [check_int(x, name, minimum=0) for name, x in (
        ("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim), ("tokens", tokens),
        ("itemsize", itemsize), ("batch", batch))]
    return 2 * math.prod(values)
