"""Decoding: one new query row against a long KV cache, split across programs ("split-KV").

With one query row, FlashAttention-2's outer loop has a single block, so a GPU would run one
program and leave the others idle.  Split-KV (flash-decoding) gives each of ``n_splits``
programs a share of the keys; each writes a partial result (its normalised output and
logsumexp), and a second pass merges them with the online-softmax merge.  The traffic stays
about 2 N d (K and V read once): the split adds parallelism, not less traffic
(:func:`flashlib.io_model.traffic` with ``order="split_kv"``).

:func:`split_kv_decode` is the teaching function (one head, the memory of :mod:`flashlib.hbm`).
"""

from __future__ import annotations

import functools

import numpy as np

from flashlib.flash import flash2_forward
from flashlib.hbm import PLAIN, Memory
from flashlib.online import merge_states

__all__ = ["split_kv_decode"]


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
