"""The Beyond chapter's experiments: split-KV decoding's merge tree, and the KV cache.

:func:`split_kv_tree` computes the same merge as :func:`flashlib.algorithms.split_kv_decode`
(whose checked library twin is :func:`flashlib.fast.decoding.decode_attention`), as a tree,
level by level (the chapter's widget draws it), behind the library's checks;
:func:`kv_cache_bytes` is the size of the cache that grouped-query attention
(:func:`flashlib.algorithms.grouped_query_attention`) shrinks; :func:`paged_layout` lays out a
batch of sequences in a paged KV cache (the pool, each sequence's block table, the pages each
split of :func:`flashlib.algorithms.paged_kv_decode` reads); :func:`fa3_timeline` is a
model of FlashAttention-3's schedules (one after the other, ping-pong between two warpgroups,
the two-stage pipeline inside one), from which the chapter's timeline diagram is drawn.
"""

from __future__ import annotations

import math
from typing import NamedTuple

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
    "PagedLayout",
    "paged_layout",
    "fa3_timeline",
    "Interval",
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


class PagedLayout(NamedTuple):
    """A batch of sequences in a pool of pages (:func:`paged_layout`).

    tables: each sequence's block table, its page ids in order; owner: for each page of the
    pool, (sequence, logical block) or None when free; rows: the positions used in each page;
    splits: for each sequence, the split that reads each of its logical blocks (0-based)."""

    tables: list[list[int]]
    owner: list[tuple[int, int] | None]
    rows: list[int]
    splits: list[list[int]]


def paged_layout(lengths: list[int], page_size: int, n_splits: int, spare: int = 0
                 ) -> PagedLayout:
    """Sequences of ``lengths`` tokens grown one token per step, all at once, in a pool of
    pages of ``page_size`` positions: a sequence whose page is full (or that has none) takes
    the lowest free page, so the tables interleave; ``spare`` pages stay free.  Each
    sequence's T = ceil(L / P) pages are cut into ``n_splits`` runs of ceil(T / n_splits)
    pages, as :func:`flashlib.algorithms.paged_kv_decode` cuts them."""
    lengths = [check_int(n, "lengths", minimum=0) for n in lengths]
    page_size = check_int(page_size, "page_size", minimum=1)
    n_splits = check_int(n_splits, "n_splits", minimum=1)
    spare = check_int(spare, "spare", minimum=0)
    tables: list[list[int]] = [[] for _ in lengths]
    owner: list[tuple[int, int] | None] = []
    rows: list[int] = []
    for step in range(max(lengths, default=0)):
        for b, n in enumerate(lengths):
            if step >= n:
                continue
            if step % page_size == 0:  # a new page: the lowest free one
                tables[b].append(len(owner))
                owner.append((b, len(tables[b]) - 1))
                rows.append(0)
            rows[tables[b][-1]] += 1
    owner += [None] * spare
    rows += [0] * spare
    splits = []
    for table in tables:  # the table's entries cut as split-KV cuts keys (paged_kv_decode)
        splits.append([s for s, (start, stop) in enumerate(split_ranges(len(table), n_splits))
                       for _ in range(start, stop)])
    return PagedLayout(tables, owner, rows, splits)


#: One operation on a timeline: (row, start, stop, kind, label); kind is "matmul" (tensor
#: cores) or "softmax" (the exponentials, on the special-function units).
Interval = tuple[str, float, float, str, str]

SCHEDULES = ("serial", "ping-pong", "pipelined")


def fa3_timeline(schedule: str, exp_share: float, tiles: int) -> list[Interval]:
    """A model of one SM's timeline over ``tiles`` key tiles, in units of one matmul of a tile.

    Per tile the matmuls are S_j = Q K_j^T and P_j V_j, one unit each; the softmax of S_j
    takes ``2 * exp_share`` units (``exp_share``: exponential time over matmul time, the
    chapter's computation from the H100's throughputs).  The tensor cores run one matmul at a
    time.  ``schedule``:

    - "serial": one warpgroup, each step after the last (QK, softmax, PV per tile);
    - "ping-pong": two warpgroups (rows "warpgroup 1", "warpgroup 2"), each with its own
      query rows and ``tiles`` tiles, taking turns on the tensor cores: one's softmax runs
      while the other's matmuls do;
    - "pipelined": one warpgroup whose iteration j issues S_j, then P_{j-1} V_{j-1}, and
      runs the softmax of S_j while P_{j-1} V_{j-1} is on the tensor cores (rows "tensor
      cores", "softmax").

    A schematic model (no memory loads, no contention for the exp units): its point is which
    operations can overlap, not a prediction of a kernel's time.  Tiles are numbered from 1.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if isinstance(exp_share, bool) or not isinstance(exp_share, (int, float)) or not (
            0 < exp_share <= 4):
        raise ValueError(f"exp_share: expected a number in (0, 4], got {exp_share!r}")
    tiles = check_int(tiles, "tiles", minimum=1)
    soft = 2.0 * float(exp_share)
    out: list[Interval] = []
    if schedule == "serial":
        t = 0.0
        for j in range(1, tiles + 1):
            out.append(("warpgroup 1", t, t + 1, "matmul", f"QK_{j}"))
            out.append(("warpgroup 1", t + 1, t + 1 + soft, "softmax", f"exp_{j}"))
            t += 1 + soft
            out.append(("warpgroup 1", t, t + 1, "matmul", f"P_{j}V_{j}"))
            t += 1
        return out
    if schedule == "ping-pong":
        # each warpgroup's matmul bursts: [QK_1], [P_1V_1, QK_2], ..., [P_T V_T]
        bursts = [[f"QK_{1}"]] + [[f"P_{j}V_{j}", f"QK_{j + 1}"] for j in range(1, tiles)]
        bursts.append([f"P_{tiles}V_{tiles}"])
        free, ready = 0.0, [0.0, 0.0]
        for b, burst in enumerate(bursts):
            for w in (0, 1):  # the warpgroups take turns on the tensor cores
                row = f"warpgroup {w + 1}"
                t = max(free, ready[w])
                for name in burst:
                    out.append((row, t, t + 1, "matmul", name))
                    t += 1
                free = t
                if b < tiles:
                    out.append((row, t, t + soft, "softmax", f"exp_{b + 1}"))
                    ready[w] = t + soft
        return out
    # pipelined, one warpgroup: the softmax of S_j runs under P_{j-1} V_{j-1}
    out.append(("tensor cores", 0.0, 1.0, "matmul", "QK_1"))
    out.append(("softmax", 1.0, 1.0 + soft, "softmax", "exp_1"))
    soft_done, pv_done = 1.0 + soft, 1.0
    for j in range(2, tiles + 1):
        t = max(soft_done, pv_done)
        out.append(("tensor cores", t, t + 1, "matmul", f"QK_{j}"))
        out.append(("tensor cores", t + 1, t + 2, "matmul", f"P_{j - 1}V_{j - 1}"))
        out.append(("softmax", t + 1, t + 1 + soft, "softmax", f"exp_{j}"))
        soft_done, pv_done = t + 1 + soft, t + 2
    t = max(soft_done, pv_done)
    out.append(("tensor cores", t, t + 1, "matmul", f"P_{tiles}V_{tiles}"))
    return out
