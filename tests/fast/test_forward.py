"""Forward pass: naive_attention, flash_attention_v1 and flash_attention against an independent
float64 reference (tests/conftest.py) and against torch's scaled_dot_product_attention."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import flashlib
from flashlib import flash_attention, flash_attention_v1, naive_attention, softmax
from flashlib.core.constants import BLOCK_K, BLOCK_Q
from tests.helpers import (
    assert_error_within,
    make_mask,
    make_qkv,
    max_err,
    plain_attention,
    reference_attention,
    visible_mask,
)

# every test here on both forward paths (tests/fast/conftest.py)
pytestmark = pytest.mark.usefixtures("forward_path")

FUNCS = ("naive", "flash_v1", "flash")
F64_TOL = 1e-12


def attend(name, q, k, v, *, block_q=64, block_k=64, **kw):
    """Call one of the three forward functions (the naive one takes no block sizes)."""
    if name == "naive":
        return naive_attention(q, k, v, **kw)
    if name == "flash_v1":
        return flash_attention_v1(q, k, v, block_q=block_q, block_k=block_k, **kw)
    return flash_attention(q, k, v, block_q=block_q, block_k=block_k, **kw)


# (lead, n_q, n_k, d, d_v, block_q, block_k, causal, mask kind)
CASES = {
    "n_not_multiple_of_block": ((), 100, 100, 16, 16, 32, 32, False, None),
    "n1": ((), 1, 1, 16, 16, 64, 64, False, None),
    "n1_causal": ((), 1, 1, 8, 8, 4, 4, True, None),
    "block_larger_than_n": ((), 7, 9, 8, 8, 64, 128, False, None),
    "one_query_many_keys": ((), 1, 37, 16, 16, 8, 8, False, None),
    "many_queries_one_key": ((), 37, 1, 16, 16, 8, 8, False, None),
    "bq_ne_bk_nq_ne_nk_dv_ne_d": ((), 70, 50, 32, 12, 16, 32, False, None),
    "block_1": ((), 9, 11, 4, 3, 1, 1, False, None),
    "blocks_1_and_5": ((), 13, 8, 4, 4, 1, 5, "bottom_right", None),
    "batch_heads": ((2, 3), 33, 47, 16, 8, 8, 16, False, None),
    "causal_true": ((2,), 40, 40, 16, 16, 16, 8, True, None),
    "top_left_nq_lt_nk": ((), 20, 50, 16, 16, 8, 16, "top_left", None),
    "top_left_nq_gt_nk": ((), 50, 20, 16, 16, 16, 8, "top_left", None),
    "bottom_right_nq_lt_nk": ((2, 2), 20, 50, 16, 16, 8, 16, "bottom_right", None),
    "bottom_right_nq_gt_nk": ((2,), 50, 20, 16, 16, 16, 8, "bottom_right", None),
    "bottom_right_square": ((), 33, 33, 8, 8, 16, 16, "bottom_right", None),
    "mask_empty_rows": ((2,), 30, 41, 16, 16, 8, 16, False, "random"),
    "mask_broadcast_rows": ((2, 2), 17, 23, 8, 8, 8, 8, False, "rows"),
    "key_padding": ((2, 3), 25, 31, 16, 16, 16, 8, False, "key_padding"),
    "key_padding_causal": ((2, 3), 25, 31, 16, 16, 16, 8, True, "key_padding"),
    "padding_broadcast_over_heads": ((2, 3), 19, 26, 8, 8, 8, 8, "bottom_right", "batch_padding"),
    "mask_and_bottom_right": ((2,), 40, 24, 8, 8, 8, 8, "bottom_right", "random"),
    "mask_and_top_left": ((2,), 24, 40, 8, 8, 8, 16, "top_left", "random"),
    "all_masked": ((2,), 12, 10, 8, 8, 4, 4, False, "none_visible"),
}


def _case(case_id, rng, dtype=np.float64):
    lead, n_q, n_k, d, d_v, bq, bk, causal, mask_kind = CASES[case_id]
    q, k, v = make_qkv(rng, lead, n_q, n_k, d, d_v, dtype=dtype)
    mask = make_mask(rng, mask_kind, lead, n_q, n_k)
    return q, k, v, dict(causal=causal, mask=mask), dict(block_q=bq, block_k=bk)


def _empty_rows(q, k, causal, mask):
    vis = np.broadcast_to(
        visible_mask(q.shape[-2], k.shape[-2], causal, mask), (*q.shape[:-1], k.shape[-2])
    )
    return ~vis.any(axis=-1)


@pytest.mark.parametrize("case_id", list(CASES))
@pytest.mark.parametrize("name", FUNCS)
def test_float64_matches_reference(name, case_id, rng):
    q, k, v, kw, blocks = _case(case_id, rng)
    o = attend(name, q, k, v, **blocks, **kw)
    ref, _ = reference_attention(q, k, v, **kw)
    assert o.shape == ref.shape
    assert o.dtype == np.float64
    assert np.all(np.isfinite(o))
    assert max_err(o, ref) <= F64_TOL
    empty = _empty_rows(q, k, kw["causal"], kw["mask"])
    assert np.all(o[empty] == 0.0)


@pytest.mark.parametrize("case_id", list(CASES))
def test_flash_lse_matches_reference(case_id, rng):
    q, k, v, kw, blocks = _case(case_id, rng)
    o, lse = flash_attention(q, k, v, **blocks, **kw, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, **kw)
    assert lse.shape == q.shape[:-1]
    assert lse.dtype == np.float64
    assert max_err(o, ref) <= F64_TOL
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), "lse must be -inf exactly on empty rows"
    assert not np.any(np.isnan(lse)) and not np.any(np.isposinf(lse))
    assert max_err(lse[~empty], ref_lse[~empty]) <= F64_TOL


@pytest.mark.parametrize("d", [1, 16, 64, 128])
@pytest.mark.parametrize("name", FUNCS)
def test_head_dims(name, d, rng):
    q, k, v = make_qkv(rng, (2,), 45, 38, d, d_v=d)
    for causal in (False, "bottom_right"):
        o = attend(name, q, k, v, block_q=32, block_k=16, causal=causal)
        ref, _ = reference_attention(q, k, v, causal=causal)
        assert max_err(o, ref) <= F64_TOL, (d, causal)


@pytest.mark.parametrize("name", FUNCS)
def test_explicit_scale(name, rng):
    q, k, v = make_qkv(rng, (), 30, 20, 16)
    for scale in (0.3, 1.0, 2.5):
        o = attend(name, q, k, v, block_q=8, block_k=8, scale=scale, causal="bottom_right")
        ref, _ = reference_attention(q, k, v, scale=scale, causal="bottom_right")
        assert max_err(o, ref) <= F64_TOL, scale


def _sdpa(q, k, v, *, causal, mask, scale):
    """torch SDPA in float64 on (batch, n, d) views; returns numpy (..., n_q, d_v)."""
    n_q, d = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    lead = q.shape[:-2]
    tq, tk, tv = (
        torch.from_numpy(np.ascontiguousarray(x, np.float64)).reshape(-1, x.shape[-2], x.shape[-1])
        for x in (q, k, v)
    )
    if (causal is True or causal == "top_left") and mask is None:
        o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, scale=scale)
    elif causal is False and mask is None:
        o = F.scaled_dot_product_attention(tq, tk, tv, scale=scale)
    else:  # SDPA has no bottom-right flag and no causal+mask: pass the explicit boolean mask
        vis = np.broadcast_to(visible_mask(n_q, n_k, causal, mask), (*lead, n_q, n_k))
        attn_mask = torch.from_numpy(np.ascontiguousarray(vis)).reshape(-1, n_q, n_k)
        o = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=attn_mask, scale=scale)
    return o.reshape(*lead, n_q, d_v).numpy()


@pytest.mark.parametrize("case_id", list(CASES))
@pytest.mark.parametrize("name", FUNCS)
def test_matches_torch_sdpa(name, case_id, rng):
    q, k, v, kw, blocks = _case(case_id, rng)
    scale = 1.0 / np.sqrt(q.shape[-1])
    o = attend(name, q, k, v, **blocks, **kw, scale=scale)
    with warnings.catch_warnings():  # torch's own warnings are not under test here
        warnings.simplefilter("ignore")
        o_sdpa = _sdpa(q, k, v, scale=scale, **kw)
    empty = _empty_rows(q, k, kw["causal"], kw["mask"])
    # SDPA returns NaN (or garbage) for rows that see no key; compare only the others.
    assert max_err(o[~empty], o_sdpa[~empty]) <= F64_TOL
    assert np.all(o[empty] == 0.0)


def test_sdpa_is_causal_is_top_left(rng):
    """Guards the test's own reading of causal=True: SDPA's is_causal is top-left aligned."""
    q, k, v = make_qkv(rng, (), 6, 9, 4)
    vis = torch.from_numpy(visible_mask(6, 9, "top_left"))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    a = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    b = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=vis)
    assert torch.allclose(a, b, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case_id", list(CASES))
@pytest.mark.parametrize("name", FUNCS)
def test_low_precision_within_twice_plain(name, case_id, dtype, rng):
    """flash-attn's rule: err <= max(2 err(plain attention in the same dtype), floor), both
    against float64.  naive_attention, a careful implementation, must meet it too."""
    q, k, v, kw, blocks = _case(case_id, rng, dtype=dtype)
    ref, _ = reference_attention(q, k, v, **kw)
    o_plain = plain_attention(q, k, v, **kw)
    o = attend(name, q, k, v, **blocks, **kw)
    assert o.dtype == dtype and o_plain.dtype == dtype
    assert o.shape == ref.shape
    assert np.all(np.isfinite(o))
    assert_error_within(o, o_plain, ref, label=f"{name} {np.dtype(dtype)}")
    empty = _empty_rows(q, k, kw["causal"], kw["mask"])
    assert np.all(o[empty] == 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case_id", list(CASES))
def test_naive_low_precision_is_sane(case_id, dtype, rng):
    """The naive baseline itself is accurate to a few hundred roundings (else '2x naive' is
    meaningless) and keeps the dtype."""
    q, k, v, kw, _ = _case(case_id, rng, dtype=dtype)
    ref, _ = reference_attention(q, k, v, **kw)
    o = naive_attention(q, k, v, **kw)
    assert o.dtype == dtype
    eps = float(np.finfo(dtype).eps)
    assert max_err(o, ref) <= 300 * eps * max(1.0, float(np.max(np.abs(ref), initial=0.0)))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_lse_dtype_and_natural_log(dtype, rng):
    q, k, v = make_qkv(rng, (2,), 20, 30, 16, dtype=dtype)
    o, lse = flash_attention(q, k, v, block_q=8, block_k=8, return_lse=True)
    assert o.dtype == dtype
    assert lse.shape == (2, 20)
    assert lse.dtype == np.promote_types(dtype, np.float32)
    _, ref_lse = reference_attention(q, k, v)
    # natural log: compare with log(sum(exp(s))) computed directly in float64
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    scale = float(np.asarray(1.0 / np.sqrt(16)).astype(dtype))
    s = scale * q64 @ np.swapaxes(k64, -1, -2)
    direct = np.log(np.exp(s).sum(axis=-1))
    tol = {np.float16: 2e-2, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    assert max_err(lse, direct) <= tol
    assert max_err(lse, ref_lse) <= tol


def test_return_lse_false_returns_array(rng):
    q, k, v = make_qkv(rng, (), 10, 10, 8)
    o = flash_attention(q, k, v)
    assert isinstance(o, np.ndarray) and o.shape == (10, 8)


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_empty_rows_no_warnings(name, dtype, rng):
    """Fully masked rows: zeros, no NaN, no RuntimeWarning (checked with warnings as errors)."""
    q, k, v = make_qkv(rng, (2,), 9, 5, 4, dtype=dtype)
    mask = np.ones((9, 5), dtype=bool)
    mask[3] = False
    for causal, m in ((False, mask), ("bottom_right", None), ("bottom_right", mask),
                      (False, np.zeros((9, 5), dtype=bool))):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with np.errstate(all="warn", under="ignore"):
                o = attend(name, q, k, v, block_q=4, block_k=2, causal=causal, mask=m)
        empty = _empty_rows(q, k, causal, m)
        assert empty.any()
        assert np.all(np.isfinite(o))
        assert np.all(o[empty] == 0.0)


@pytest.mark.parametrize("name", FUNCS)
def test_mask_true_everywhere_equals_no_mask(name, rng):
    q, k, v = make_qkv(rng, (2,), 19, 23, 8)
    a = attend(name, q, k, v, block_q=8, block_k=8)
    b = attend(name, q, k, v, block_q=8, block_k=8, mask=np.ones((19, 23), dtype=bool))
    c = attend(name, q, k, v, block_q=8, block_k=8, mask=np.ones((1, 23), dtype=bool))
    assert max_err(a, b) <= F64_TOL and max_err(a, c) <= F64_TOL


@pytest.mark.parametrize("name", FUNCS)
def test_causal_true_equals_top_left_and_explicit_mask(name, rng):
    q, k, v = make_qkv(rng, (), 21, 29, 8)
    a = attend(name, q, k, v, block_q=8, block_k=4, causal=True)
    b = attend(name, q, k, v, block_q=8, block_k=4, causal="top_left")
    c = attend(name, q, k, v, block_q=8, block_k=4, mask=visible_mask(21, 29, "top_left"))
    d = attend(name, q, k, v, block_q=8, block_k=4, causal="bottom_right")
    e = attend(name, q, k, v, block_q=8, block_k=4, mask=visible_mask(21, 29, "bottom_right"))
    assert max_err(a, b) == 0.0
    assert max_err(a, c) <= F64_TOL
    assert max_err(d, e) <= F64_TOL


def test_block_sizes_do_not_change_result(rng):
    q, k, v = make_qkv(rng, (), 50, 61, 16)
    ref, _ = reference_attention(q, k, v, causal="bottom_right")
    for bq, bk in ((1, 1), (1, 64), (64, 1), (7, 13), (50, 61), (128, 3)):
        for fn in (flash_attention_v1, flash_attention):
            o = fn(q, k, v, block_q=bq, block_k=bk, causal="bottom_right")
            assert max_err(o, ref) <= F64_TOL, (fn.__name__, bq, bk)


def test_the_root_api_is_small():
    """The root is what a program that only wants attention imports: the library twins."""
    assert sorted(flashlib.__all__) == sorted([
        "softmax", "naive_attention", "flash_attention_v1", "flash_attention",
        "naive_attention_backward", "flash_attention_backward", "causal_mask"])
    for name in flashlib.__all__:
        assert hasattr(flashlib, name), name


# --- softmax -------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_matches_torch(axis, rng):
    x = rng.standard_normal((4, 5, 6)) * 10
    ours = softmax(x, axis=axis)
    theirs = torch.softmax(torch.from_numpy(x), dim=axis).numpy()
    assert ours.shape == x.shape
    assert max_err(ours, theirs) <= 1e-15


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_softmax_large_logits_stable(dtype):
    x = np.array([[1e4, 1e4 - 1.0, -1e4], [-1e4, -1e4, -1e4]], dtype=dtype)
    p = softmax(x)
    assert p.dtype == dtype
    assert np.all(np.isfinite(p))
    x64 = x.astype(np.float64)
    ref = np.exp(x64 - x64.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    assert max_err(p, ref) <= 4 * np.finfo(dtype).eps
    assert np.allclose(p.sum(-1), 1.0, rtol=0, atol=4 * np.finfo(dtype).eps)


def test_softmax_default_axis_is_last(rng):
    x = rng.standard_normal((3, 7))
    assert np.array_equal(softmax(x), softmax(x, axis=-1))
    assert np.allclose(softmax(x).sum(axis=1), 1.0, rtol=0, atol=1e-15)


def test_softmax_all_minus_inf_row_gives_zeros():
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = softmax(x)
    assert not p[0].any()
    assert abs(p[1].sum() - 1.0) <= 1e-15 and p[1, 1] == 0.0


@pytest.mark.parametrize("name", FUNCS)
def test_non_contiguous_inputs(name, rng):
    """Transposed / strided views (e.g. (n, heads, d) memory read as (heads, n, d))."""
    base_q = rng.standard_normal((30, 3, 8))
    base_k = rng.standard_normal((20, 3, 8))
    base_v = np.asfortranarray(rng.standard_normal((20, 3, 6)))
    q, k, v = (np.swapaxes(x, 0, 1) for x in (base_q, base_k, base_v))
    q = q[:, ::2]  # strided rows too: (3, 15, 8)
    mask = (rng.random((20, 15)) < 0.7).T  # non-contiguous boolean mask
    assert not q.flags.c_contiguous and not mask.flags.c_contiguous
    o = attend(name, q, k, v, block_q=4, block_k=8, mask=mask, causal="bottom_right")
    ref, _ = reference_attention(np.ascontiguousarray(q), np.ascontiguousarray(k),
                           np.ascontiguousarray(v), mask=np.ascontiguousarray(mask),
                           causal="bottom_right")
    assert max_err(o, ref) <= F64_TOL


def test_public_signatures():
    """The keyword-only options and defaults the chapters and outside checks rely on."""
    import inspect

    sig = inspect.signature(flash_attention)
    assert list(sig.parameters)[:3] == ["q", "k", "v"]
    kw = {n: p.default for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert kw == {"block_q": BLOCK_Q, "block_k": BLOCK_K,
                  "causal": False, "mask": None, "scale": None, "return_lse": False,
                  "window": None, "key_lengths": None, "dropout_p": 0.0, "seed": None}
    # one default tile for every tiled function
    assert (BLOCK_Q, BLOCK_K) == (128, 128)
    for fn in (flash_attention_v1, flashlib.flash_attention_backward):
        kw = {n: p.default for n, p in inspect.signature(fn).parameters.items()
              if p.kind is p.KEYWORD_ONLY}
        extra = ({"return_lse": False} if fn is flash_attention_v1 else
                 {"dropout_p": 0.0, "seed": None})
        assert kw == {"block_q": BLOCK_Q, "block_k": BLOCK_K, "causal": False, "mask": None,
                      "scale": None, "window": None, "key_lengths": None, **extra}


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("mask_kind", [None, "random", "key_padding"])
def test_default_blocks_multi_tile(dtype, causal, mask_kind, rng):
    """At the default tile sizes, with several tiles in both directions and ragged edges."""
    lead, n_q, n_k = (2, 3), 301, 457
    q, k, v = make_qkv(rng, lead, n_q, n_k, 64, dtype=dtype)
    mask = make_mask(rng, mask_kind, lead, n_q, n_k)
    ref, ref_lse = reference_attention(q, k, v, causal=causal, mask=mask)
    o, lse = flash_attention(q, k, v, causal=causal, mask=mask, return_lse=True)
    assert o.dtype == dtype and lse.shape == lead + (n_q,)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    if dtype == np.float64:
        assert max_err(o, ref) <= F64_TOL
    else:
        assert_error_within(o, plain_attention(q, k, v, causal=causal, mask=mask), ref)
