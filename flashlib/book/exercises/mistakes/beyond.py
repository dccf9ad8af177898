"""The declared mistakes of "Beyond FlashAttention-1" (flashlib.book.exercises.beyond)."""

from __future__ import annotations

import numpy as np

from flashlib import flash_attention
from flashlib.algorithms import paged_kv_decode
from flashlib.book.exercises.beyond import (
    check_grouped_query,
    check_kv_grad,
    check_paged_decode,
    check_split_kv,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes

# ---- 11.1 split-KV ---------------------------------------------------------------------------


def _split_kv(q, K, V, n_splits, merge="lse"):
    size = -(-len(K) // n_splits)
    outs, lses = zip(*(flash_attention(q, K[s:s + size], V[s:s + size], return_lse=True)
                       for s in range(0, len(K), size)), strict=True)
    O, L = np.stack(outs), np.stack(lses)  # (S, n_q, d_v), (S, n_q)
    if merge == "mean":
        return O.mean(axis=0)
    if merge == "raw":
        w = np.exp(L)
        return (w[..., None] * O).sum(0) / w.sum(0)[:, None]
    L_all = np.logaddexp.reduce(L, axis=0)
    return (np.exp(L - L_all)[..., None] * O).sum(axis=0)


def averaged(q, K, V, n_splits):
    return _split_kv(q, K, V, n_splits, merge="mean")


def weights_exp_l(q, K, V, n_splits):
    return _split_kv(q, K, V, n_splits, merge="raw")


def first_row(q, K, V, n_splits):
    return _split_kv(q, K, V, n_splits)[0]


def whole(q, K, V, n_splits):  # no split at all: exact, so only the calls tell
    return flash_attention(q, K, V)


declare_mistakes(
    check_split_kv,
    Mistake("the splits averaged", (averaged,), ("averaged",)),
    Mistake("weights exp(L_s)", (weights_exp_l,), ("exp(L_s - L)",)),
    Mistake("one row", (first_row,), ("has shape",)),
    Mistake("no split", (whole,), ("on all 1000 keys at once",)),
)


# ---- 11.2 grouped-query attention ------------------------------------------------------------

def _gqa(q, k, v, order="group"):
    *lead, h_q, n_q, d = q.shape
    h_kv = k.shape[-3]
    if order == "repeat":
        g = h_q // h_kv
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
        s = q @ k.swapaxes(-1, -2) / np.sqrt(d)
    elif order == "tile":
        g = h_q // h_kv
        reps = [1] * k.ndim
        reps[-3] = g
        k, v = np.tile(k, reps), np.tile(v, reps)
        s = q @ k.swapaxes(-1, -2) / np.sqrt(d)
    else:
        q = q.reshape(*lead, h_kv, h_q // h_kv, n_q, d)
        k, v = k[..., None, :, :], v[..., None, :, :]
        s = q @ k.swapaxes(-1, -2) / np.sqrt(d)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ v).reshape(*lead, h_q, n_q, v.shape[-1])


def repeated(q, k, v):
    return _gqa(q, k, v, order="repeat")


def tiled(q, k, v):
    return _gqa(q, k, v, order="tile")


def one_query(q, k, v):
    return _gqa(q, k, v)[..., 0, :]


def the_library(q, k, v):
    return flash_attention(q, k, v)


declare_mistakes(
    check_grouped_query,
    Mistake("K and V repeated", (repeated,), ("as much as K and V repeated",)),
    Mistake("K and V tiled", (tiled,), ("h % h_kv",)),
    Mistake("one query", (one_query,), ("has shape",)),
    Mistake("the library's attention", (the_library,), ("you called flash_attention",)),
)


# ---- 11.3 the gradient of shared K and V (the book's variant: K tiled, heads on axis -3) ----

def mean(x, h_kv):
    *lead, h_q, n, c = x.shape
    return x.reshape(*lead, h_q // h_kv, h_kv, n, c).mean(axis=-4)


def consecutive(x, h_kv):
    *lead, h_q, n, c = x.shape
    return x.reshape(*lead, h_kv, h_q // h_kv, n, c).sum(axis=-3)


def first(x, h_kv):
    return x[..., :h_kv, :, :]


def unchanged(x, h_kv):
    return x


declare_mistakes(
    check_kv_grad,
    Mistake("the mean", (mean,), ("sum, not mean",)),
    Mistake("the page's consecutive groups", (consecutive,), ("h + h_kv",)),
    Mistake("the first head of each group", (first,), ("add them all",)),
    Mistake("not reduced", (unchanged,), ("has shape",)),
)


# ---- 11.4 paged split-KV decoding ------------------------------------------------------------

def _paged(q, K_cache, V_cache, table, N, n_splits, pages="table", rows="N", merge="lse"):
    P, d, d_v = K_cache.shape[1], K_cache.shape[2], V_cache.shape[2]
    T = -(-N // P) if pages != "all" else len(table)
    ids = np.arange(T) if pages == "logical" else np.asarray(table)[:T]
    per_split = -(-T // n_splits)
    outs, lses = [], []
    for s in range(0, T, per_split):
        run = ids[s:s + per_split]
        stop = min(N, (s + per_split) * P) - s * P if rows == "N" else None
        K_s = K_cache[run].reshape(-1, d)[:stop]
        V_s = V_cache[run].reshape(-1, d_v)[:stop]
        O_s, L_s = flash_attention(q, K_s, V_s, return_lse=True)
        outs.append(O_s)
        lses.append(L_s)
    O, L = np.stack(outs), np.stack(lses)
    L_all = np.logaddexp.reduce(L, axis=0)
    if merge == "mean":
        return O.mean(axis=0), L_all
    if merge == "raw":
        with np.errstate(over="ignore", invalid="ignore"):
            w = np.exp(L)
            return (w[..., None] * O).sum(0) / w.sum(0)[:, None], L_all
    if merge == "O only":
        return (np.exp(L - L_all)[..., None] * O).sum(axis=0)
    if merge == "L max":
        return (np.exp(L - L_all)[..., None] * O).sum(axis=0), L.max(axis=0)
    return (np.exp(L - L_all)[..., None] * O).sum(axis=0), L_all


def logical_blocks(q, K_cache, V_cache, table, N, n_splits):
    return _paged(q, K_cache, V_cache, table, N, n_splits, pages="logical")


def last_page_full(q, K_cache, V_cache, table, N, n_splits):
    return _paged(q, K_cache, V_cache, table, N, n_splits, rows="all")


def whole_table(q, K_cache, V_cache, table, N, n_splits):
    return _paged(q, K_cache, V_cache, table, N, n_splits, pages="all", rows="all")


def runs_averaged(q, K_cache, V_cache, table, N, n_splits):
    return _paged(q, K_cache, V_cache, table, N, n_splits, merge="mean")


def runs_weighted_exp_l(q, K_cache, V_cache, table, N, n_splits):
    return _paged(q, K_cache, V_cache, table, N, n_splits, merge="raw")


def o_alone(q, K_cache, V_cache, table, N, n_splits):
    return _paged(q, K_cache, V_cache, table, N, n_splits, merge="O only")


def l_as_the_largest(q, K_cache, V_cache, table, N, n_splits):
    return _paged(q, K_cache, V_cache, table, N, n_splits, merge="L max")


def teaching_function(q, K_cache, V_cache, table, N, n_splits):
    return paged_kv_decode(q, K_cache, V_cache, table, N, n_splits)


def gathered_at_once(q, K_cache, V_cache, table, N, n_splits):
    T = -(-N // K_cache.shape[1])
    K = K_cache[table[:T]].reshape(-1, K_cache.shape[2])[:N]
    V = V_cache[table[:T]].reshape(-1, V_cache.shape[2])[:N]
    return flash_attention(q, K, V)


declare_mistakes(
    check_paged_decode,
    Mistake("pages indexed by logical block", (logical_blocks,), ("page table[t]",)),
    Mistake("the last page counted as full", (last_page_full,), ("counted the last page",)),
    Mistake("the padding read as pages", (whole_table,), ("page -1",)),
    Mistake("runs merged without their lse", (runs_averaged,), ("without their logsumexps",)),
    Mistake("weights exp(L_s)", (runs_weighted_exp_l,), ("exp(L_s - L)", "NaN or inf")),
    Mistake("the teaching function", (teaching_function,), ("you called paged_kv_decode",)),
    Mistake("no split", (gathered_at_once,), ("on all 37 keys at once",)),
    Mistake("O alone (the shown paged_kv_decode)", (o_alone,), ("return the pair (O, L)",)),
    Mistake("L as the runs' largest L_s", (l_as_the_largest,), ("L is off", "logaddexp")),
)
