"""Grouped-query and multi-query attention (k, v with fewer heads than q) in the public API:
equal to the same call with each K/V head repeated for its group, to torch autograd on the
repeated heads (gradients of K and V summed over each group), and to PyTorch SDPA's
``enable_gqa`` where this torch has it."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib import (
    flash_attention,
    flash_attention_backward,
    flash_attention_v1,
    naive_attention,
    naive_attention_backward,
)
from flashlib.algorithms import grouped_query_attention, standard_attention
from flashlib.core.measure import measure_peak
from flashlib.fast.decoding import decode_attention
from flashlib.studies.beyond import kv_cache_bytes, split_kv_tree
from tests.helpers import max_err, torch, torch_grads

# every test here on both forward paths (tests/fast/conftest.py)
pytestmark = pytest.mark.usefixtures("forward_path")

# (lead of q without the head axis, h_q, h_kv, n_q, n_k, d, d_v): awkward sizes on purpose
SHAPES = [
    ((2,), 8, 2, 113, 203, 59, 37),  # GQA, 4 query heads per K/V head
    ((), 6, 1, 33, 70, 16, 16),  # MQA, no batch axis
    ((3,), 4, 4, 1, 40, 8, 8),  # one K/V head per query head: plain multi-head, n_q = 1
    ((1,), 12, 3, 65, 65, 32, 24),  # 4 per group, more heads than the tile group
]


def _problem(rng, lead, h_q, h_kv, n_q, n_k, d, d_v, dtype=np.float64):
    q = rng.standard_normal((*lead, h_q, n_q, d)).astype(dtype)
    k = rng.standard_normal((*lead, h_kv, n_k, d)).astype(dtype)
    v = rng.standard_normal((*lead, h_kv, n_k, d_v)).astype(dtype)
    return q, k, v


def _repeat(x, h_q):
    return np.repeat(x, h_q // x.shape[-3], axis=-3)


def _sum_groups(x, h_kv):
    *lead, h_q, n, c = x.shape
    return x.reshape(*lead, h_kv, h_q // h_kv, n, c).sum(axis=-3)


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_equals_repeated_heads(rng, shape, causal):
    lead, h_q, h_kv, *sizes = shape
    q, k, v = _problem(rng, lead, h_q, h_kv, *sizes)
    want, lse_want = naive_attention(q, _repeat(k, h_q), _repeat(v, h_q), causal=causal,
                                     return_lse=True)
    o, lse = flash_attention(q, k, v, block_q=32, block_k=48, causal=causal, return_lse=True)
    assert o.shape == want.shape
    assert max_err(o, want) < 1e-12 and max_err(lse, lse_want) < 1e-12
    assert np.array_equal(naive_attention(q, k, v, causal=causal), want)
    o1, lse1 = flash_attention_v1(q, k, v, block_q=32, block_k=48, causal=causal,
                                  return_lse=True)
    assert max_err(o1, want) < 1e-12 and max_err(lse1, lse_want) < 1e-12
    assert max_err(decode_attention(q, k, v, n_splits=3, causal=causal), want) < 1e-12


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_with_mask_float32(rng, shape):
    lead, h_q, h_kv, n_q, n_k, d, d_v = shape
    q, k, v = _problem(rng, lead, h_q, h_kv, n_q, n_k, d, d_v, np.float32)
    mask = rng.random((h_q, n_q, n_k)) < 0.7  # a different mask per query head
    want = naive_attention(q, _repeat(k, h_q), _repeat(v, h_q), mask=mask)
    o = flash_attention(q, k, v, mask=mask, block_q=16, block_k=16)
    assert o.dtype == np.float32 and max_err(o, want) < 1e-5


@pytest.mark.parametrize("causal", [False, "bottom_right"])
@pytest.mark.parametrize("shape", SHAPES)
def test_backward_sums_over_the_group(rng, shape, causal):
    lead, h_q, h_kv, *sizes = shape
    q, k, v = _problem(rng, lead, h_q, h_kv, *sizes)
    o, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    do = rng.standard_normal(o.shape)
    _, dq_t, dk_t, dv_t = torch_grads(q, _repeat(k, h_q), _repeat(v, h_q), do, causal=causal)
    want = (dq_t, _sum_groups(dk_t, h_kv), _sum_groups(dv_t, h_kv))
    for got in (flash_attention_backward(q, k, v, o, lse, do, causal=causal, block_q=32,
                                         block_k=16),
                naive_attention_backward(q, k, v, do, causal=causal)):
        assert [g.shape for g in got] == [q.shape, k.shape, v.shape]
        for g, w in zip(got, want, strict=True):
            assert max_err(g, w) < 1e-10


def _sdpa_has_gqa() -> bool:
    """Whether this torch's scaled_dot_product_attention takes ``enable_gqa`` (torch >= 2.5)."""
    if torch is None:
        return False
    x = torch.zeros((2, 1, 2))
    try:
        torch.nn.functional.scaled_dot_product_attention(x, x[:1], x[:1], enable_gqa=True)
    except TypeError:
        return False
    return True


sdpa_gqa = pytest.mark.skipif(not _sdpa_has_gqa(),
                              reason="this torch's scaled_dot_product_attention has no enable_gqa")


@sdpa_gqa
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_equals_sdpa_enable_gqa(rng, shape, causal):
    lead, h_q, h_kv, *sizes = shape
    q, k, v = _problem(rng, lead, h_q, h_kv, *sizes)
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(x) for x in (q, k, v)), is_causal=causal, enable_gqa=True).numpy()
    assert max_err(flash_attention(q, k, v, causal=causal), want) < 1e-12


def test_bad_group_sizes_name_k():
    rng = np.random.default_rng(0)
    q, k, v = _problem(rng, (2,), 6, 4, 5, 7, 8, 8)
    for fn in (flash_attention, naive_attention):
        with pytest.raises(ValueError, match=r"k and v have 4 heads .* multiple"):
            fn(q, k, v)
    with pytest.raises(ValueError, match=r"\bk\b"):
        flash_attention(q, k, v[:, :2])  # k and v disagree
    with pytest.raises(ValueError, match=r"\bk\b"):
        flash_attention(q, k[None], v[None])  # one more axis: not a head count
    do = np.zeros((2, 6, 5, 8))
    with pytest.raises(ValueError, match=r"multiple"):
        naive_attention_backward(q, k, v, do)


def test_flash_does_not_copy_kv_per_query_head():
    """The fast path reads each K/V head for its whole group: its extra memory does not grow
    with the number of query heads per K/V head the way a repeated K and V would."""
    rng = np.random.default_rng(0)
    h_kv, n, d = 1, 2048, 64
    q, k, v = _problem(rng, (), 16, h_kv, 64, n, d, d, np.float32)
    _, peak = measure_peak(flash_attention, q, k, v)
    repeated = 2 * 16 * n * d * 4  # K and V repeated for 16 query heads
    assert peak < repeated / 4, (peak, repeated)


def test_teaching_function_and_cache_bytes(rng):
    q, k, v = _problem(rng, (), 6, 2, 9, 30, 8, 5)
    assert max_err(grouped_query_attention(q, k, v),
                   np.stack([standard_attention(q[h], k[h // 3], v[h // 3])
                             for h in range(6)])) == 0
    assert max_err(grouped_query_attention(q, k, v), naive_attention(q, k, v)) < 1e-12
    # a 32-layer model, 32 query heads of 128, 8 K/V heads, 4096 tokens, fp16
    assert kv_cache_bytes(layers=32, kv_heads=8, head_dim=128, tokens=4096, itemsize=2) == (
        2 * 32 * 8 * 128 * 4096 * 2)
    with pytest.raises(ValueError, match="tokens"):
        kv_cache_bytes(layers=1, kv_heads=1, head_dim=1, tokens=-1, itemsize=2)


@pytest.mark.parametrize(("n", "splits"), [(1000, 7), (37, 37), (5, 8), (64, 1), (100, 3)])
def test_split_kv_tree_root_is_attention(rng, n, splits):
    """The merge tree's root is one-pass attention, whatever the splits; each level halves."""
    q, k, v = rng.standard_normal((2, 16)) * 3, rng.standard_normal((n, 16)), rng.standard_normal(
        (n, 5))
    ranges, levels = split_kv_tree(q, k, v, splits)
    assert ranges[0][0] == 0 and ranges[-1][1] == n and len(levels[0]) == len(ranges)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert [len(x) for x in levels[1:]] == [-(-len(x) // 2) for x in levels[:-1]]
    _, l, acc = levels[-1][0]
    assert max_err(acc / l[:, None], standard_attention(q, k, v)) < 1e-13


@pytest.mark.parametrize("kw", [{"key_lengths": np.array([[20], [29]])},
                                {"window": (5, 0), "causal": True,
                                 "key_lengths": np.array([[20], [29]])}])
def test_grouped_query_attention_with_window_and_key_lengths(kw):
    """Grouped-query attention combines with the masking options: forward and backward equal
    the naive functions (which repeat K and V) on a ragged problem."""
    from flashlib import (
        flash_attention,
        flash_attention_backward,
        naive_attention,
        naive_attention_backward,
    )

    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 37, 8))
    k, v = (rng.standard_normal((2, 2, 29, 8)) for _ in range(2))
    o, lse = flash_attention(q, k, v, block_q=16, block_k=8, return_lse=True, **kw)
    np.testing.assert_allclose(o, naive_attention(q, k, v, **kw), atol=1e-13)
    np.testing.assert_allclose(flash_attention_v1(q, k, v, block_q=16, block_k=8, **kw), o,
                               atol=1e-13)
    do = rng.standard_normal(o.shape)
    got = flash_attention_backward(q, k, v, o, lse, do, block_q=16, block_k=8, **kw)
    for g, w in zip(got, naive_attention_backward(q, k, v, do, **kw), strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-13)


@pytest.mark.parametrize("factor", [1.0, 30.0])  # the bounded path, the running-maximum one
def test_gqa_on_whole_tiles_of_both_paths(factor):
    # K/V heads broadcast over a group of query heads, on whole default tiles (the plain
    # steps lay V out as blocks of rows: by K/V head, not by query head)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 8, 256, 64)).astype(np.float32) * np.float32(factor)
    k, v = (rng.standard_normal((2, 2, 256, 64)).astype(np.float32) for _ in range(2))
    k_rep, v_rep = np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1)
    for causal in (False, True):
        got = flash_attention(q, k, v, causal=causal)
        plain = naive_attention(q, k_rep, v_rep, causal=causal)
        ref = naive_attention(*(x.astype(np.float64) for x in (q, k_rep, v_rep)),
                              causal=causal)
        assert max_err(got, ref) <= 2 * max_err(plain, ref) + 1e-5  # flash-attn's rule
