"""Decoding over a paged KV cache (flashlib.fast.paged.paged_decode_attention): equal to
contiguous decoding (decode_attention on the same keys laid out in order) for any page size,
table order and sequence lengths, with grouped-query heads, causal and window masks, shared
pages across sequences; equal to the teaching function; every bad table refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashlib.algorithms import paged_kv_decode
from flashlib.core.accuracy import assert_error_within
from flashlib.fast.decoding import decode_attention
from flashlib.fast.paged import paged_decode_attention
from tests.helpers import max_err


def _cache(rng, n_b, h_kv, lengths, P, d, d_v, spare=2, dtype=np.float64, share=False):
    """Pages in a shuffled pool and a table (unused entries -1), and the same keys laid out
    contiguously (B, h_kv, max_pages * P, .) for decode_attention."""
    used = [-(-int(n) // P) for n in lengths]
    max_pages = max(used + [1]) + 1
    n_pages = sum(used) + spare
    k_pages = rng.standard_normal((n_pages, h_kv, P, d)).astype(dtype)
    v_pages = rng.standard_normal((n_pages, h_kv, P, d_v)).astype(dtype)
    pool = list(rng.permutation(n_pages))
    table = np.full((n_b, max_pages), -1, dtype=np.int32)
    for b, n in enumerate(used):
        table[b, :n] = [pool.pop() for _ in range(n)]
    if share and n_b > 1 and used[0] and used[1]:  # sequence 1 shares sequence 0's first page
        table[1, 0] = table[0, 0]
    K = np.zeros((n_b, h_kv, max_pages * P, d), dtype)
    V = np.zeros((n_b, h_kv, max_pages * P, d_v), dtype)
    for b, n in enumerate(used):
        for t in range(n):
            K[b, :, t * P : (t + 1) * P] = k_pages[table[b, t]]
            V[b, :, t * P : (t + 1) * P] = v_pages[table[b, t]]
    return k_pages, v_pages, table, K, V


@settings(max_examples=40, deadline=None)
@given(P=st.integers(1, 9), lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4),
       n_q=st.integers(1, 3), g=st.sampled_from([1, 2]), share=st.booleans(),
       causal=st.sampled_from([False, "bottom_right"]), seed=st.integers(0, 2**16))
def test_equals_contiguous_decoding(P, lengths, n_q, g, share, causal, seed):
    rng = np.random.default_rng(seed)
    n_b, h_kv = len(lengths), 2
    k_pages, v_pages, table, K, V = _cache(rng, n_b, h_kv, lengths, P, 8, 5, share=share)
    if share and n_b > 1 and lengths[0] and lengths[1]:
        K[1, :, :P], V[1, :, :P] = K[0, :, :P], V[0, :, :P]
    q = rng.standard_normal((n_b, h_kv * g, n_q, 8))
    L = np.array(lengths)
    o, lse = paged_decode_attention(q, k_pages, v_pages, table, key_lengths=L, causal=causal,
                                    return_lse=True, block_k=4)
    ref, ref_lse = decode_attention(q, K, V, key_lengths=L, causal=causal, return_lse=True)
    assert o.shape == ref.shape and max_err(o, ref) <= 1e-12
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    assert max_err(lse[finite], ref_lse[finite]) <= 1e-12


def test_window_scale_and_default_lengths():
    rng = np.random.default_rng(1)
    k_pages, v_pages, table, K, V = _cache(rng, 2, 1, [12, 12], 4, 8, 8, spare=0)
    table = table[:, :3]  # full rows: the default length is 3 pages of 4 keys
    K, V = K[:, :, :12], V[:, :, :12]
    q = rng.standard_normal((2, 1, 3, 8))
    got = paged_decode_attention(q, k_pages, v_pages, table, window=(5, 0), scale=0.3)
    ref = decode_attention(q, K, V, window=(5, 0), scale=0.3)
    assert max_err(got, ref) <= 1e-12


def test_equals_the_teaching_function():
    rng = np.random.default_rng(2)
    k_pages, v_pages, table, _, _ = _cache(rng, 2, 1, [23, 7], 5, 8, 6)
    q = rng.standard_normal((2, 1, 2, 8))
    got = paged_decode_attention(q, k_pages, v_pages, table, key_lengths=[23, 7])
    for b, n in enumerate((23, 7)):
        for n_splits in (1, 2, 5):
            ref = paged_kv_decode(q[b, 0], k_pages[:, 0], v_pages[:, 0], table[b], n, n_splits)
            assert max_err(got[b, 0], ref) <= 1e-12


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_within_twice_contiguous(dtype):
    rng = np.random.default_rng(3)
    k_pages, v_pages, table, K, V = _cache(rng, 3, 2, [100, 37, 64], 16, 32, 32, dtype=dtype)
    q = rng.standard_normal((3, 4, 1, 32)).astype(dtype)
    L = np.array([100, 37, 64])
    got = paged_decode_attention(q, k_pages, v_pages, table, key_lengths=L)
    ref = decode_attention(*(x.astype(np.float64) for x in (q, K, V)), key_lengths=L)
    plain = decode_attention(q, K, V, key_lengths=L)
    assert got.dtype == dtype
    assert_error_within(got, plain, ref, dtype=dtype)


def _bad_call(**change):
    rng = np.random.default_rng(4)
    k_pages, v_pages, table, _, _ = _cache(rng, 2, 1, [9, 4], 4, 8, 8)
    args = {"q": rng.standard_normal((2, 1, 1, 8)), "k_pages": k_pages, "v_pages": v_pages,
            "block_table": table, "key_lengths": np.array([9, 4])}
    args.update(change)
    return paged_decode_attention(args.pop("q"), args.pop("k_pages"), args.pop("v_pages"),
                                  args.pop("block_table"), **args)


@pytest.mark.parametrize(("change", "error", "words"), [
    ({"block_table": np.array([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=float)}, TypeError,
     "block_table must be an integer array"),
    ({"block_table": np.ones((2, 4), dtype=bool)}, TypeError, "block_table must be an integer"),
    ({"block_table": np.zeros((3, 4), dtype=np.int32)}, ValueError, r"shape \(B, max_pages\)"),
    ({"block_table": np.zeros(4, dtype=np.int32)}, ValueError, r"shape \(B, max_pages\)"),
    ({"block_table": np.array([[0, 1], [2, -1]])}, ValueError,
     "block_table holds 2 pages of 4 keys"),
    ({"block_table": np.array([[0, 1, 99, -1], [2, -1, -1, -1]])}, ValueError,
     "block_table row 0 names page 99, outside"),
    ({"block_table": np.array([[0, 1, 2, -1], [-3, -1, -1, -1]])}, ValueError,
     "block_table row 1 names page -3"),
    ({"block_table": np.array([[0, 1, 0, -1], [2, -1, -1, -1]])}, ValueError,
     "block_table row 0 names a page twice"),
    ({"key_lengths": np.array([9, 100])}, ValueError, "block_table holds 4 pages of 4 keys"),
    ({"key_lengths": np.array([9, -1])}, ValueError, "key_lengths must lie in"),
    ({"key_lengths": np.array([9.0, 4.0])}, TypeError, "key_lengths must be integers"),
    ({"k_pages": np.zeros((5, 1, 4))}, ValueError, r"k_pages must have shape"),
    ({"v_pages": np.zeros((9, 1, 3, 8))}, ValueError, "k_pages and v_pages must have the same"),
    ({"k_pages": np.zeros((9, 1, 4, 8), np.float32)}, TypeError, "k_pages must have q's dtype"),
    ({"q": np.zeros((2, 1, 8))}, ValueError, r"q must have shape \(B, h_q, n_q, d\)"),
    ({"k_pages": np.full((9, 1, 4, 8), np.nan)}, ValueError, "k_pages"),
])
def test_bad_inputs_are_refused_by_name(change, error, words):
    with pytest.raises(error, match=words):
        _bad_call(**change)


def test_pages_shared_across_sequences_are_allowed():
    table = np.array([[0, 1, 2, -1], [0, 3, -1, -1]])  # a shared first page (a common prefix)
    got = _bad_call(block_table=table, key_lengths=np.array([9, 5]))
    assert np.isfinite(got).all()


def test_check_block_table_names_the_short_row():
    from flashlib.fast.paged import check_block_table
    with pytest.raises(ValueError, match=r"block_table row 1 holds 2 pages of 4 keys, fewer "
                                         r"than key_lengths\[1\] = 9"):
        check_block_table(np.array([[0, 1], [2, 3]]), np.array([3, 9]), 5, 4)


@pytest.mark.parametrize("table_dtype", [np.int32, np.int64, np.uint8, np.int16])
def test_any_integer_table_and_unread_padding(table_dtype):
    """Any integer dtype holds the same table; entries past a sequence's pages are never read,
    whatever they hold (here page ids far outside the pool)."""
    rng = np.random.default_rng(5)
    k_pages, v_pages, table, K, V = _cache(rng, 2, 1, [9, 4], 4, 8, 8)
    table = np.where(table < 0, 99, table).astype(table_dtype)
    q = rng.standard_normal((2, 1, 1, 8))
    L = np.array([9, 4])
    got = paged_decode_attention(q, k_pages, v_pages, table, key_lengths=L)
    assert max_err(got, decode_attention(q, K, V, key_lengths=L)) <= 1e-12


def test_a_page_id_beyond_int64_is_refused_by_name_where_it_is_read():
    table = np.array([[0, 2**64 - 1, 2, 7], [3, 4, 5, 6]], dtype=np.uint64)  # read: column 1
    with pytest.raises(ValueError, match="row 0 names page 18446744073709551615"):
        _bad_call(block_table=table)
    table[0] = [0, 1, 2, 2**64 - 1]  # unread padding of row 0 (it needs 3 pages): fine
    _bad_call(block_table=table)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_scores_in_the_thousands(dtype):
    """Pages whose logsumexps differ by thousands: exp(L_s) alone would overflow; the merge
    of the pages' states does not."""
    rng = np.random.default_rng(6)
    k_pages, v_pages, table, K, V = _cache(rng, 2, 2, [50, 23], 8, 16, 16, dtype=dtype)
    q = (300 * rng.standard_normal((2, 2, 1, 16))).astype(dtype)
    L = np.array([50, 23])
    got = paged_decode_attention(q, k_pages, v_pages, table, key_lengths=L)
    ref = decode_attention(*(x.astype(np.float64) for x in (q, K, V)), key_lengths=L)
    assert np.isfinite(got).all()
    if dtype == np.float64:
        assert max_err(got, ref) <= 1e-12
    else:
        assert_error_within(got, decode_attention(q, K, V, key_lengths=L), ref, dtype=dtype)
