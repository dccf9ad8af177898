"""Dropout that is never stored: flash_attention(..., dropout_p, seed) and its backward equal
attention with the same mask materialised (float64 to 1e-12, float32/float16 by the 2x rule);
the mask is regenerated bit for bit whatever the tiles and the threads; its rate and 1/(1-p)
scaling hold on large samples; memory stays O(n); the teaching functions equal the library;
bad arguments are refused by name."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashlib import flash_attention, flash_attention_backward, naive_attention
from flashlib.algorithms import flash2_dropout_backward, flash2_dropout_forward
from flashlib.core.accuracy import assert_error_within
from flashlib.core.measure import measure_peak
from flashlib.core.philox import dropout_keep
from flashlib.core.problem import check_problem
from flashlib.fast.dropout import dropout_forward
from tests.helpers import max_err, torch

TOL = 1e-12


def _qkv(lead, n_q, n_k, d, d_v, dtype=np.float64, seed=0, h_kv=None):
    rng = np.random.default_rng(seed)
    kv_lead = lead if h_kv is None else lead[:-1] + (h_kv,)
    q = rng.standard_normal(lead + (n_q, d))
    k, v = rng.standard_normal(kv_lead + (n_k, d)), rng.standard_normal(kv_lead + (n_k, d_v))
    do = rng.standard_normal(lead + (n_q, d_v))
    return tuple(x.astype(dtype) for x in (q, k, v, do))


def _mask_z(lead, n_q, n_k, p, seed):
    """The keep-mask of every head, materialised: (..., n_q, n_k)."""
    heads = np.arange(math.prod(lead)).reshape(lead + (1, 1))
    return dropout_keep(seed, heads, np.arange(n_q)[:, None], np.arange(n_k), p)


def _probs(q, k, **masks):
    """softmax(S) with the masks, (..., n_q, n_k) in float64: naive attention of V = I."""
    n_k = k.shape[-2]
    eye = np.broadcast_to(np.eye(n_k, dtype=k.dtype), k.shape[:-2] + (n_k, n_k))
    return naive_attention(q, k, eye, **masks)


def _reference(q, k, v, do, p, seed, scale=None, **masks):
    """O and (dq, dk, dv) of attention with dropout mask Z materialised, from the derivation
    (dP = (dO V^T) Z / (1 - p), D = rowsum(P dP): not from D = rowsum(dO O)), computed in the
    inputs' precision (float32 for float16, rounded once at the end): float64 inputs give the
    reference, lower precisions the plain baseline of the 2x rule."""
    dtype = q.dtype
    work = np.dtype(np.float32) if dtype == np.float16 else dtype
    g = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    k, v = (np.repeat(x, g, axis=-3) if g > 1 else x for x in (k, v))
    scale = work.type(1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    prob = _probs(q.astype(work), k.astype(work), scale=scale, **masks)
    q, k, v, do = (x.astype(work) for x in (q, k, v, do))
    z = _mask_z(q.shape[:-2], q.shape[-2], k.shape[-2], p, seed) * work.type(1 / (1 - p))
    pd = prob * z
    o = pd @ v
    dv = pd.swapaxes(-1, -2) @ do
    dp = (do @ v.swapaxes(-1, -2)) * z
    ds = prob * (dp - np.sum(prob * dp, axis=-1, keepdims=True))
    dq, dk = scale * ds @ k, scale * ds.swapaxes(-1, -2) @ q
    if g > 1:
        dk, dv = (x.reshape(x.shape[:-3] + (-1, g) + x.shape[-2:]).sum(-3) for x in (dk, dv))
    return o.astype(dtype), tuple(x.astype(dtype) for x in (dq, dk, dv))


# (lead, n_q, n_k, d, d_v, block_q, block_k, masks)
CASES = {
    "ragged": ((2, 3), 37, 29, 8, 5, 8, 6, {}),
    "n1": ((), 1, 1, 4, 4, 64, 64, {}),
    "block_larger_than_n": ((2,), 7, 9, 8, 8, 64, 128, {}),
    "blocks_1x1": ((1,), 9, 11, 4, 3, 1, 1, {}),
    "causal": ((2, 2), 33, 33, 8, 8, 8, 8, {"causal": True}),
    "causal_bottom_right": ((2,), 13, 40, 8, 6, 4, 16, {"causal": "bottom_right"}),
    "window_padding": ((3,), 20, 31, 8, 8, 8, 8,
                       {"window": (4, 2), "key_lengths": np.array([31, 12, 0])}),
    "explicit_mask": ((2,), 17, 23, 4, 4, 5, 7,
                      {"mask": np.random.default_rng(5).random((2, 17, 23)) < 0.6}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_forward_and_backward_equal_the_materialised_mask_float64(case, p):
    lead, n_q, n_k, d, d_v, b_q, b_k, masks = CASES[case]
    q, k, v, do = _qkv(lead, n_q, n_k, d, d_v)
    o, lse = flash_attention(q, k, v, block_q=b_q, block_k=b_k, dropout_p=p, seed=1234,
                             return_lse=True, **masks)
    ref_o, ref_grads = _reference(q, k, v, do, p, 1234, **masks)
    assert max_err(o, ref_o) <= TOL
    _, ref_lse = naive_attention(q, k, v, return_lse=True, **masks)  # lse: as without dropout
    np.testing.assert_allclose(lse, ref_lse, atol=TOL, rtol=0)
    grads = flash_attention_backward(q, k, v, o, lse, do, block_q=b_k, block_k=b_q,
                                     dropout_p=p, seed=1234, **masks)
    for name, got, ref in zip("dq dk dv".split(), grads, ref_grads, strict=True):
        assert got.shape == ref.shape and got.dtype == np.float64
        assert max_err(got, ref) <= TOL * max(1.0, float(np.abs(ref).max())), name


def test_grouped_query_heads_and_a_scale():
    q, k, v, do = _qkv((2, 4), 19, 23, 8, 8, h_kv=2)
    o, lse = flash_attention(q, k, v, dropout_p=0.3, seed=7, scale=0.7, causal=True,
                             return_lse=True, block_q=8, block_k=8)
    ref_o, ref_grads = _reference(q, k, v, do, 0.3, 7, scale=0.7, causal=True)
    assert max_err(o, ref_o) <= TOL
    grads = flash_attention_backward(q, k, v, o, lse, do, dropout_p=0.3, seed=7, scale=0.7,
                                     causal=True)
    for got, ref in zip(grads, ref_grads, strict=True):
        assert got.shape == ref.shape and max_err(got, ref) <= TOL * max(1, np.abs(ref).max())


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_gradients_equal_torch_autograd_with_the_same_mask():
    q, k, v, do = _qkv((2,), 21, 26, 8, 6)
    z = _mask_z((2,), 21, 26, 0.4, 99) / 0.6
    o, lse = flash_attention(q, k, v, dropout_p=0.4, seed=99, causal=True, return_lse=True,
                             block_q=8, block_k=8)
    grads = flash_attention_backward(q, k, v, o, lse, do, dropout_p=0.4, seed=99, causal=True)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    s = tq @ tk.transpose(-1, -2) / math.sqrt(8)
    s = s.masked_fill(~torch.ones(21, 26, dtype=torch.bool).tril(), -torch.inf)
    to = (torch.softmax(s, -1) * torch.tensor(z)) @ tv
    to.backward(torch.tensor(do))
    assert max_err(o, to.detach().numpy()) <= TOL
    for got, t in zip(grads, (tq, tk, tv), strict=True):
        assert max_err(got, t.grad.numpy()) <= TOL * max(1, float(t.grad.abs().max()))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_within_twice_plain_attention(dtype):
    q, k, v, do = _qkv((2, 2), 70, 50, 16, 16, dtype=dtype)
    o, lse = flash_attention(q, k, v, dropout_p=0.2, seed=3, return_lse=True, block_q=16,
                             block_k=32)
    grads = flash_attention_backward(q, k, v, o, lse, do, dropout_p=0.2, seed=3)
    ref_o, ref_grads = _reference(*(x.astype(np.float64) for x in (q, k, v, do)), 0.2, 3)
    plain_o, plain_grads = _reference(q, k, v, do, 0.2, 3)
    assert o.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert_error_within(o, plain_o, ref_o, dtype=dtype, label="o")
    for name, got, plain, ref in zip(("dq", "dk", "dv"), grads, plain_grads, ref_grads,
                                     strict=True):
        assert_error_within(got, plain, ref, dtype=dtype, label=name)


# --- the mask: regenerated bit for bit --------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(n_q=st.integers(1, 40), n_k=st.integers(1, 40), b_r=st.integers(1, 45),
       b_c=st.integers(1, 45), head=st.integers(0, 2**20), seed=st.integers(0, 2**64 - 1),
       p=st.floats(0.0, 0.99))
def test_any_tiling_assembles_the_same_mask(n_q, n_k, b_r, b_c, head, seed, p):
    whole = dropout_keep(seed, head, np.arange(n_q)[:, None], np.arange(n_k), p)
    tiled = np.empty((n_q, n_k), dtype=bool)
    for i in range(0, n_q, b_r):
        for j in range(0, n_k, b_c):
            rows = np.arange(i, min(i + b_r, n_q))[:, None]
            tiled[i : i + b_r, j : j + b_c] = dropout_keep(
                seed, head, rows, np.arange(j, min(j + b_c, n_k)), p)
    np.testing.assert_array_equal(tiled, whole)



@pytest.mark.parametrize(("fwd_blocks", "bwd_blocks"), [((64, 32), (16, 48)), ((1, 1), (7, 5)),
                                                         ((100, 3), (128, 128))])
@pytest.mark.parametrize("workers", [1, 3])
def test_the_backward_regenerates_the_forward_bits(fwd_blocks, bwd_blocks, workers):
    """With V = I the forward's O is P * Z / (1 - p), zero exactly where dropped; with dO = I
    the backward's dV^T is the same matrix: the bits each pass used, read off its results,
    are the same (and the mask drawn whole), whatever the tiles of either pass and the threads
    of the forward; as the masking chapter's experiment shows with the teaching functions."""
    n, heads = 96, 3
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((2, heads, n, 16))
    eye = np.broadcast_to(np.eye(n), (heads, n, n)).copy()
    p = check_problem(q, k, eye, blocks=fwd_blocks)
    o, lse = dropout_forward(p, 0.3, 2**40 + 9, workers=workers)
    _, _, dv = flash_attention_backward(q, k, eye, o, lse, eye, dropout_p=0.3,
                                        seed=2**40 + 9, block_q=bwd_blocks[0],
                                        block_k=bwd_blocks[1])
    z = _mask_z((heads,), n, n, 0.3, 2**40 + 9)
    np.testing.assert_array_equal(o > 0, z)
    np.testing.assert_array_equal(dv.swapaxes(-1, -2) > 0, z)


@pytest.mark.parametrize("workers", [2, 3])
def test_forward_bits_do_not_depend_on_threads(workers):
    """Large enough for threads (flashlib.core.threads.workers_for): bit for bit."""
    q, k, v, _ = _qkv((4,), 256, 256, 8, 8, dtype=np.float32)
    p = check_problem(q, k, v, blocks=(64, 64))
    o, lse = dropout_forward(p, 0.25, 5, workers=workers)
    ref, ref_lse = dropout_forward(p, 0.25, 5, workers=1)
    np.testing.assert_array_equal(o, ref)
    np.testing.assert_array_equal(lse, ref_lse)


@pytest.mark.parametrize("blocks", [(1, 1), (7, 5), (100, 3)])
def test_forward_does_not_depend_on_blocks_but_by_rounding(blocks):
    q, k, v, _ = _qkv((3,), 90, 70, 8, 8, dtype=np.float32)
    o = dropout_forward(check_problem(q, k, v, blocks=blocks), 0.25, 5)[0]
    ref = dropout_forward(check_problem(q, k, v, blocks=(64, 64)), 0.25, 5)[0]
    assert max_err(o, ref) <= 1e-5  # the same mask, other roundings


def test_seeds_heads_and_offsets_draw_different_masks():
    rows, cols = np.arange(64)[:, None], np.arange(64)
    base = dropout_keep(1, 0, rows, cols, 0.5)
    for other in (dropout_keep(2, 0, rows, cols, 0.5), dropout_keep(1, 1, rows, cols, 0.5),
                  dropout_keep(1, 0, rows, cols, 0.5, offset=1),
                  dropout_keep(1, 0, rows + 64, cols, 0.5)):
        assert 0.4 < np.mean(base != other) < 0.6  # independent: half the bits differ
    assert np.array_equal(base, dropout_keep(1, 0, rows, cols, 0.5))


# --- the rate and the scaling, on large samples -----------------------------------------------

@pytest.mark.parametrize("p", [0.01, 0.1, 0.5, 0.9])
def test_keep_rate_and_scaling_on_a_million_entries(p):
    n = 1024
    keep = dropout_keep(2024, np.arange(4)[:, None, None], np.arange(n)[:, None],
                        np.arange(n // 4), p)  # 2**20 entries
    count = keep.size
    frac = keep.mean()
    sigma = math.sqrt(p * (1 - p) / count)
    assert abs(frac - (1 - p)) <= 6 * sigma, (frac, 1 - p, sigma)
    scaled = keep / (1 - p)  # E = 1, sd = sqrt(p / (1 - p))
    assert abs(scaled.mean() - 1) <= 6 * math.sqrt(p / (1 - p) / count)
    # rows and columns look alike: no row's rate is far out (6 sigma of a row)
    row_sigma = math.sqrt(p * (1 - p) / keep.shape[-1])
    assert np.abs(keep.mean(axis=-1) - (1 - p)).max() <= 6 * row_sigma


def test_output_is_unbiased():
    """E[O] = P V: with V = 1 every row of O averages 1 over many keys and heads."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((64, 128, 16)) * 0.1, rng.standard_normal((64, 2048, 16)) * 0.1
    v = np.ones((64, 2048, 1))
    o = flash_attention(q, k, v, dropout_p=0.3, seed=8)
    # each output is a weighted mean of 2048 scaled Bernoulli terms, weights near 1/2048
    sd = math.sqrt(0.3 / 0.7 / 2048) * 1.1
    assert abs(o.mean() - 1) <= 6 * sd / math.sqrt(o.size)
    assert np.abs(o - 1).max() <= 6 * sd


def test_zero_dropout_is_plain_attention_bit_for_bit():
    q, k, v, _ = _qkv((2,), 30, 40, 8, 8, dtype=np.float32)
    np.testing.assert_array_equal(flash_attention(q, k, v, dropout_p=0.0, seed=3),
                                  flash_attention(q, k, v))


# --- memory: O(n) -----------------------------------------------------------------------------

def _extra(fn, *args, **kwargs):
    """Peak bytes of a call beyond its inputs and its results (measure_peak)."""
    out, peak = measure_peak(fn, *args, **kwargs)
    return out, peak - sum(x.nbytes for x in (out if isinstance(out, tuple) else (out,)))


@pytest.mark.slow  # 10 s: in make test, not in make check's fast loop
def test_memory_stays_linear_in_n():
    """Beyond inputs and outputs, the forward and the backward hold O(n d) and a few tiles:
    under 1.5% of one n x n float32 matrix at n = 4096, and twice n at most doubles it."""
    extra = {}
    for n in (2048, 4096):
        q, k, v, do = _qkv((), n, n, 32, 32, dtype=np.float32)
        (o, lse), fwd = _extra(flash_attention, q, k, v, dropout_p=0.1, seed=1,
                               return_lse=True, block_q=64, block_k=64)
        _, bwd = _extra(flash_attention_backward, q, k, v, o, lse, do, dropout_p=0.1, seed=1,
                        block_q=64, block_k=64)
        extra[n] = (fwd, bwd)
    nxn = 4096 * 4096 * 4  # one n x n float32 matrix: 64 MiB
    assert max(extra[4096]) < 0.015 * nxn, extra
    for small, large in zip(extra[2048], extra[4096], strict=True):
        assert large < 2.2 * small + 64 * 64 * 8 * 8, extra  # linear (plus a few tiles)


# --- teaching == library ----------------------------------------------------------------------

@pytest.mark.parametrize(("n_q", "n_k", "b_r", "b_c"), [(37, 29, 8, 6), (1, 1, 4, 4),
                                                        (9, 11, 1, 1), (7, 9, 64, 128)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_teaching_functions_equal_the_library(n_q, n_k, b_r, b_c, dtype):
    q, k, v, do = _qkv((2, 2), n_q, n_k, 8, 5, dtype=dtype)
    o, lse = flash_attention(q, k, v, dropout_p=0.35, seed=77, return_lse=True, block_q=b_c,
                             block_k=b_r)
    grads = flash_attention_backward(q, k, v, o, lse, do, dropout_p=0.35, seed=77)
    tol = TOL if dtype == np.float64 else 1e-5
    for b in range(2):
        for h in range(2):
            head = b * 2 + h
            O, L = flash2_dropout_forward(q[b, h], k[b, h], v[b, h], 0.35, 77, b_r, b_c,
                                          head=head)
            assert O.dtype == dtype
            assert max_err(O, o[b, h]) <= tol and max_err(L, lse[b, h]) <= tol
            got = flash2_dropout_backward(q[b, h], k[b, h], v[b, h], o[b, h], lse[b, h],
                                          do[b, h], 0.35, 77, b_r, b_c, head=head)
            for g_t, g_l in zip(got, grads, strict=True):
                assert max_err(g_t, g_l[b, h]) <= tol * max(1, float(np.abs(g_l).max()))


# --- bad arguments ----------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"dropout_p": 1.0, "seed": 1}, ValueError, "dropout_p must lie in [0, 1)"),
    ({"dropout_p": -0.1, "seed": 1}, ValueError, "dropout_p must lie in [0, 1)"),
    ({"dropout_p": float("nan"), "seed": 1}, ValueError, "dropout_p"),
    ({"dropout_p": True, "seed": 1}, TypeError, "dropout_p must be a real number"),
    ({"dropout_p": "0.1", "seed": 1}, TypeError, "dropout_p must be a real number"),
    ({"dropout_p": 0.1}, ValueError, "needs a seed"),
    ({"dropout_p": 0.1, "seed": 1.5}, TypeError, "seed must be an integer"),
    ({"dropout_p": 0.1, "seed": True}, TypeError, "seed must be an integer"),
    ({"dropout_p": 0.1, "seed": -1}, ValueError, "seed must lie in [0, 2**64)"),
    ({"dropout_p": 0.1, "seed": 2**64}, ValueError, "seed must lie in [0, 2**64)"),
    ({"dropout_p": 0.0, "seed": "x"}, TypeError, "seed must be an integer"),
])
def test_bad_dropout_arguments_are_refused_by_name(kwargs, error, words):
    q, k, v, do = _qkv((), 4, 4, 4, 4)
    o, lse = flash_attention(q, k, v, return_lse=True)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("*", r"\*")):
        flash_attention(q, k, v, **kwargs)
    with pytest.raises(error, match="dropout_p|seed"):
        flash_attention_backward(q, k, v, o, lse, do, **kwargs)


def test_numpy_scalars_are_accepted():
    q, k, v, _ = _qkv((), 6, 6, 4, 4)
    a = flash_attention(q, k, v, dropout_p=np.float32(0.25), seed=np.uint64(2**64 - 1))
    b = flash_attention(q, k, v, dropout_p=0.25, seed=2**64 - 1)
    np.testing.assert_array_equal(a, b)
