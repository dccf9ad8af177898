"""The papers' remaining algorithms as teaching functions: FlashAttention-1's backward
(Algorithm 4) equals the standard backward, torch autograd and FlashAttention-2's on awkward
shapes, causal included (m and l from a causal forward); paged-KV decoding equals contiguous
decoding for any page size, table order and length; dropout's teaching functions move exactly
what FlashAttention-2's do (the mask is never stored)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashlib.algorithms import (
    flash1_backward,
    flash2_backward,
    flash2_dropout_backward,
    flash2_dropout_forward,
    flash2_forward,
    masked_flash_forward,
    paged_kv_decode,
    split_kv_decode,
    standard_attention,
    standard_attention_backward,
)
from flashlib.core.hbm import CountingMemory
from flashlib.core.masks import causal_top_left
from flashlib.studies.tiling import KEY_SIDE
from tests.helpers import max_err, torch, torch_grads

# (n_q, n_k, d, d_v, B_r, B_c)
SHAPES = {
    "ragged_last_blocks": (100, 70, 16, 16, 32, 32),
    "n1": (1, 1, 8, 8, 64, 64),
    "block_larger_than_n": (7, 9, 8, 8, 64, 128),
    "one_query_many_keys": (1, 37, 16, 16, 8, 8),
    "many_queries_one_key": (37, 1, 16, 16, 8, 8),
    "nq_ne_nk_br_ne_bc_dv_ne_d": (70, 50, 32, 12, 16, 32),
    "blocks_1x1": (9, 11, 4, 3, 1, 1),
    "d1": (20, 17, 1, 1, 8, 4),
}


def _qkv(shape, dtype=np.float64, seed=0):
    n_q, n_k, d, d_v, _, _ = shape
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype)
                 for s in ((n_q, d), (n_k, d), (n_k, d_v), (n_q, d_v)))


def _m_l(Q, K, visible=None):
    """Algorithm 1's m and l: the row maximum of S and the row sum of exp(S - m)."""
    S = Q @ K.T / math.sqrt(Q.shape[1])
    if visible is not None:
        S = np.where(visible, S, -np.inf)
    m = S.max(axis=1)
    return m, np.exp(S - m[:, None]).sum(axis=1)


@pytest.mark.parametrize("case", list(SHAPES))
def test_flash1_backward_equals_the_standard_backward_and_fa2(case):
    shape = SHAPES[case]
    Q, K, V, dO = _qkv(shape)
    O = standard_attention(Q, K, V)
    m, l = _m_l(Q, K)
    got = flash1_backward(Q, K, V, O, l, m, dO, *shape[4:])
    ref = standard_attention_backward(Q, K, V, dO)
    O2, L = flash2_forward(Q, K, V, *shape[4:])
    fa2 = flash2_backward(Q, K, V, O2, L, dO, *shape[4:])
    for g, r, f in zip(got, ref, fa2, strict=True):
        assert g.shape == r.shape and max_err(g, r) <= 1e-12 * max(1, np.abs(r).max())
        assert max_err(g, f) <= 1e-12 * max(1, np.abs(r).max())


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("case", ["ragged_last_blocks", "nq_ne_nk_br_ne_bc_dv_ne_d",
                                  "blocks_1x1", "many_queries_one_key", "block_larger_than_n",
                                  "d1"])
@pytest.mark.parametrize("causal", [False, True])
def test_flash1_backward_equals_torch_autograd(case, causal):
    """Causal: Algorithm 4's masking (masked scores at -inf in each tile, so P_ij = 0 there),
    on the masked forward's m and l."""
    shape = SHAPES[case]
    Q, K, V, dO = _qkv(shape, seed=1)
    n_q, n_k = len(Q), len(K)
    rule = causal_top_left if causal else None
    visible = rule(np.arange(n_q)[:, None], np.arange(n_k), n_q, n_k) if causal else None
    O = masked_flash_forward(Q, K, V, rule, *shape[4:])[0] if causal else \
        standard_attention(Q, K, V)
    m, l = _m_l(Q, K, visible)
    got = flash1_backward(Q, K, V, O, l, m, dO, *shape[4:], visible=rule)
    _, *ref = torch_grads(Q, K, V, dO, causal=causal)
    for g, r in zip(got, ref, strict=True):
        assert max_err(g, r) <= 1e-12 * max(1, np.abs(r).max())


def test_flash1_backward_in_float32_stays_float32():
    shape = SHAPES["ragged_last_blocks"]
    Q, K, V, dO = _qkv(shape, dtype=np.float32)
    m, l = _m_l(Q, K)
    got = flash1_backward(Q, K, V, standard_attention(Q, K, V), l, m, dO, *shape[4:])
    ref = standard_attention_backward(*(x.astype(np.float64) for x in (Q, K, V, dO)))
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == np.float32 and max_err(g, r) <= 1e-4 * max(1, np.abs(r).max())


# --- paged-KV decoding --------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(N=st.integers(1, 60), P=st.integers(1, 17), n_q=st.integers(1, 3),
       spare=st.integers(0, 6), n_splits=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_paged_decode_equals_contiguous_decoding(N, P, n_q, spare, n_splits, seed):
    """Any page size, any order of the pages in the pool, any length (a part-full last page),
    any number of splits (more splits than pages included), a table longer than needed (its
    tail never read, here -1)."""
    rng = np.random.default_rng(seed)
    used = -(-N // P)
    n_pages = used + spare
    K_cache = rng.standard_normal((n_pages, P, 8))
    V_cache = rng.standard_normal((n_pages, P, 5))
    table = np.concatenate([rng.permutation(n_pages)[:used], np.full(spare, -1)])
    q = rng.standard_normal((n_q, 8))
    K = K_cache[table[:used]].reshape(-1, 8)[:N]  # the sequence's keys, contiguous
    V = V_cache[table[:used]].reshape(-1, 5)[:N]
    got = paged_kv_decode(q, K_cache, V_cache, table, N, n_splits)
    assert max_err(got, standard_attention(q, K, V)) <= 1e-12
    assert max_err(got, split_kv_decode(q, K, V, used, P)) <= 1e-12


# --- dropout moves nothing more: the mask is never stored ---------------------------------------

@pytest.mark.parametrize("case", ["ragged_last_blocks", "blocks_1x1", "n1"])
def test_dropout_adds_no_hbm_traffic(case):
    """On the counting memory, the dropout forward and backward read and write exactly what
    FlashAttention-2's forward and backward do: no mask is written, none is read back."""
    shape = SHAPES[case]
    Q, K, V, dO = _qkv(shape)
    O, L = flash2_forward(Q, K, V, *shape[4:])
    counts = []
    for fn, extra, args in ((flash2_forward, {}, ()),
                            (flash2_dropout_forward, {}, (0.3, 5)),
                            (flash2_backward, {"O": O, "L": L, "dO": dO}, ()),
                            (flash2_dropout_backward, {"O": O, "L": L, "dO": dO}, (0.3, 5))):
        mem = CountingMemory(key_side=KEY_SIDE, score_tiles=2)
        arrays = mem.inputs(Q=Q, K=K, V=V, **extra)
        if args:  # p_drop and seed come before the blocks
            mem.run(fn, *arrays, *args, *shape[4:])
        else:
            mem.run(fn, *arrays, *shape[4:])
        counts.append((mem.traffic.reads, mem.traffic.writes))
    assert counts[0] == counts[1] and counts[2] == counts[3]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_paged_decode_with_scores_in_the_thousands(dtype):
    """The teaching function on the library's edge: pages whose logsumexps differ by
    thousands, a part-full last page, 3 splits over 7 pages."""
    rng = np.random.default_rng(7)
    N, P = 50, 8
    K_cache = rng.standard_normal((9, P, 16)).astype(dtype)
    V_cache = rng.standard_normal((9, P, 16)).astype(dtype)
    table = rng.permutation(9)[:7]
    q = (300 * rng.standard_normal((2, 16))).astype(dtype)
    K, V = K_cache[table].reshape(-1, 16)[:N], V_cache[table].reshape(-1, 16)[:N]
    got = paged_kv_decode(q, K_cache, V_cache, table, N, 3)
    ref = standard_attention(*(x.astype(np.float64) for x in (q, K, V)))
    assert got.dtype == dtype and np.isfinite(got).all()
    assert max_err(got, ref) <= (1e-12 if dtype == np.float64 else 1e-4)
