"""Split-KV decoding, the library twin (flashlib.fast.decoding.decode_attention): equal to the
teaching function, to naive_attention, to flash_attention with the same masks and to torch;
every bad input a clear error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from flashlib import flash_attention, naive_attention
from flashlib.algorithms import split_kv_decode
from flashlib.core.accuracy import assert_error_within
from flashlib.fast.decoding import decode_attention, split_ranges
from tests.helpers import plain_attention, reference_attention


@pytest.mark.parametrize("n_k, n_splits", [(1000, 1), (1000, 3), (1000, 8), (37, 64), (5, 5),
                                           (1, 2)])
@pytest.mark.parametrize("n_q", [1, 3])
def test_equals_the_teaching_function_and_naive(n_k, n_splits, n_q):
    rng = np.random.default_rng(n_k + n_splits)
    q, K, V = (rng.standard_normal((n, 16)) for n in (n_q, n_k, n_k))
    got = decode_attention(q, K, V, n_splits=n_splits, block_k=32)
    np.testing.assert_allclose(got, split_kv_decode(q, K, V, n_splits, 32), atol=1e-13)
    np.testing.assert_allclose(got, naive_attention(q, K, V), atol=1e-13)
    o, lse = decode_attention(q, K, V, n_splits=n_splits, return_lse=True)
    _, lse_ref = flash_attention(q, K, V, return_lse=True)
    np.testing.assert_allclose(lse, lse_ref, atol=1e-12)


def test_split_ranges():
    assert split_ranges(10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert split_ranges(3, 8) == [(0, 1), (1, 2), (2, 3)]  # no empty share
    assert split_ranges(0, 4) == []
    assert split_ranges(7, 1) == [(0, 7)]


@pytest.mark.parametrize("kw", [
    {}, {"causal": "bottom_right"}, {"window": (6, 0)}, {"causal": True, "window": (3, 1)},
    {"key_lengths": np.array([40, 13])},
    {"key_lengths": np.array([40, 13]), "causal": "bottom_right", "window": (9, 0)},
    {"mask": "random"}, {"scale": 0.7}])
def test_batched_grouped_query_and_masks_equal_flash_attention(kw):
    """(B, h_q, n_q, d) queries over a (B, h_kv, n_k, d) cache in 4 shares: what
    flash_attention gives with the same arguments."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 3, 8))
    k, v = rng.standard_normal((2, 2, 40, 8)), rng.standard_normal((2, 2, 40, 5))
    if kw.get("mask") == "random":
        kw = {"mask": rng.random((2, 4, 3, 40)) < 0.3}
    want, want_lse = flash_attention(q, k, v, return_lse=True, **kw)
    got, lse = decode_attention(q, k, v, n_splits=4, block_k=8, return_lse=True, **kw)
    np.testing.assert_allclose(got, want, atol=1e-13)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    seen = ~np.isneginf(want_lse)
    np.testing.assert_allclose(lse[seen], want_lse[seen], atol=1e-12)


def test_cache_seqlens_hide_the_padding():
    """A padded cache with key_lengths gives each sequence what its unpadded cache gives."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, 2, 8))
    k, v = rng.standard_normal((3, 50, 8)), rng.standard_normal((3, 50, 8))
    lengths = np.array([50, 17, 1])
    got = decode_attention(q, k, v, n_splits=3, key_lengths=lengths, causal="bottom_right")
    for b, n in enumerate(lengths):
        want = naive_attention(q[b], k[b, :n], v[b, :n], causal="bottom_right")
        np.testing.assert_allclose(got[b], want, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_against_torch_within_twice_plain(dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, n, 64)).astype(dtype) for n in (1, 777, 777))
    got = decode_attention(q, k, v, n_splits=5)
    assert got.dtype == dtype
    ref, _ = reference_attention(q, k, v)
    torch_out = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(x.astype(np.float64)) for x in (q, k, v))).numpy()
    np.testing.assert_allclose(ref, torch_out, atol=1e-12)
    assert_error_within(got, plain_attention(q, k, v), ref)


def test_an_empty_cache_and_rows_that_see_nothing_give_zero():
    q = np.ones((2, 1, 4))
    o, lse = decode_attention(q, np.zeros((2, 0, 4)), np.zeros((2, 0, 3)), n_splits=4,
                              return_lse=True)
    assert o.shape == (2, 1, 3) and (o == 0).all() and np.isneginf(lse).all()
    o = decode_attention(q, np.ones((2, 6, 4)), np.ones((2, 6, 4)), n_splits=2,
                         key_lengths=np.array([0, 6]))
    assert (o[0] == 0).all() and (o[1] == 1).all()


@pytest.mark.parametrize("kw, err, match", [
    ({"n_splits": 0}, ValueError, "n_splits must be a positive integer"),
    ({"n_splits": -1}, ValueError, "n_splits must be a positive integer"),
    ({"n_splits": 2.5}, TypeError, "n_splits must be an integer"),
    ({"n_splits": True}, TypeError, "n_splits must be an integer"),
    ({"n_splits": None}, TypeError, "n_splits must be an integer"),
    ({"block_k": 0}, ValueError, "block_k must be a positive integer"),
    ({"return_lse": "yes"}, TypeError, "return_lse must be True or False"),
    ({"window": (0, -1)}, ValueError, r"window\[1\]")])
def test_bad_options(kw, err, match):
    x = np.zeros((1, 4, 3))
    with pytest.raises(err, match=match):
        decode_attention(x, x, x, **kw)


def test_bad_arrays():
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((1, 4)), rng.standard_normal((10, 4))
    with pytest.raises(ValueError, match="v must have as many rows as k"):
        decode_attention(q, k, k[:7])
    with pytest.raises(ValueError, match="q must contain only finite values"):
        decode_attention(np.full((1, 4), np.nan), k, k)
    with pytest.raises(TypeError, match="q must have a floating dtype"):
        decode_attention(np.ones((1, 4), dtype=int), k, k)
    with pytest.raises(TypeError, match="k must be an array, got None"):
        decode_attention(q, None, k)
    with pytest.raises(ValueError, match="multiple of the number of K/V heads"):
        decode_attention(np.zeros((3, 1, 4)), np.zeros((2, 10, 4)), np.zeros((2, 10, 4)))
    with pytest.raises(ValueError, match="multiple of the number of K/V heads"):
        decode_attention(np.zeros((3, 1, 4)), np.zeros((0, 10, 4)), np.zeros((0, 10, 4)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning on any of these
        decode_attention(q, k, k, n_splits=3)

