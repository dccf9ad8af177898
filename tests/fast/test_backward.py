"""Backward pass: naive_attention_backward and flash_attention_backward (fed o, lse from
flash_attention(..., return_lse=True)) against torch autograd and central finite differences."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from flashlib import flash_attention, flash_attention_backward, naive_attention_backward
from tests.helpers import (
    assert_error_within,
    default_scale,
    make_mask,
    make_qkv,
    max_err,
    plain_attention_backward,
    reference_attention,
    torch_grads,
    visible_mask,
)

GRAD_TOL_F64 = 1e-12  # times max(1, max|grad|)

# (lead, n_q, n_k, d, d_v, block_q, block_k, causal, mask kind)
CASES = {
    "n_not_multiple_of_block": ((), 45, 45, 16, 16, 16, 16, False, None),
    "n1": ((), 1, 1, 8, 8, 64, 64, False, None),
    "n1_causal": ((), 1, 1, 8, 8, 4, 4, True, None),
    "block_larger_than_n": ((), 7, 9, 8, 8, 64, 128, False, None),
    "block_1": ((), 6, 7, 4, 3, 1, 1, "bottom_right", None),
    "bq_ne_bk_nq_ne_nk_dv_ne_d": ((), 37, 29, 16, 8, 8, 16, False, None),
    "d1": ((), 20, 17, 1, 1, 8, 4, False, None),
    "d64": ((), 20, 17, 64, 64, 8, 4, True, None),
    "d128": ((), 20, 17, 128, 32, 16, 8, "bottom_right", None),
    "batch_heads": ((2, 3), 19, 23, 8, 8, 8, 8, False, None),
    "top_left_nq_gt_nk": ((2,), 30, 20, 8, 8, 8, 8, "top_left", None),
    "top_left_nq_lt_nk": ((2,), 20, 30, 8, 8, 8, 4, True, None),
    "bottom_right_nq_gt_nk": ((2,), 30, 20, 8, 8, 8, 8, "bottom_right", None),
    "bottom_right_nq_lt_nk": ((2, 2), 20, 30, 8, 8, 4, 8, "bottom_right", None),
    "mask_empty_rows": ((2,), 24, 31, 8, 8, 8, 8, False, "random"),
    "mask_broadcast_rows": ((2, 2), 17, 13, 8, 8, 8, 4, False, "rows"),
    "key_padding": ((2, 3), 15, 21, 8, 8, 8, 8, False, "key_padding"),
    "padding_broadcast_over_heads": ((2, 3), 13, 18, 8, 8, 4, 8, True, "batch_padding"),
    "mask_and_bottom_right": ((2,), 30, 18, 8, 8, 8, 8, "bottom_right", "random"),
    "all_masked": ((2,), 8, 6, 4, 4, 4, 4, False, "none_visible"),
}


def _case(case_id, rng, dtype=np.float64):
    lead, n_q, n_k, d, d_v, bq, bk, causal, mask_kind = CASES[case_id]
    q, k, v = make_qkv(rng, lead, n_q, n_k, d, d_v, dtype=dtype)
    do = rng.standard_normal((*lead, n_q, d_v)).astype(dtype)
    mask = make_mask(rng, mask_kind, lead, n_q, n_k)
    return q, k, v, do, dict(causal=causal, mask=mask), dict(block_q=bq, block_k=bk)


def _flash_grads(q, k, v, do, blocks, kw):
    o, lse = flash_attention(q, k, v, **blocks, **kw, return_lse=True)
    return flash_attention_backward(q, k, v, o, lse, do, **blocks, **kw)


def _grads(name, q, k, v, do, blocks, kw):
    if name == "naive":
        return naive_attention_backward(q, k, v, do, **kw)
    return _flash_grads(q, k, v, do, blocks, kw)


def _empty_rows(q, k, kw):
    vis = np.broadcast_to(
        visible_mask(q.shape[-2], k.shape[-2], kw["causal"], kw["mask"]),
        (*q.shape[:-1], k.shape[-2]),
    )
    return ~vis.any(axis=-1)


@pytest.mark.parametrize("case_id", list(CASES))
@pytest.mark.parametrize("name", ["naive", "flash"])
def test_float64_matches_torch_autograd(name, case_id, rng):
    q, k, v, do, kw, blocks = _case(case_id, rng)
    _, *ref = torch_grads(q, k, v, do, **kw)
    grads = _grads(name, q, k, v, do, blocks, kw)
    assert len(grads) == 3
    for label, g, r, x in zip(("dq", "dk", "dv"), grads, ref, (q, k, v), strict=True):
        assert g.shape == x.shape, label
        assert g.dtype == np.float64, label
        assert np.all(np.isfinite(g)), label
        tol = GRAD_TOL_F64 * max(1.0, float(np.max(np.abs(r), initial=0.0)))
        assert max_err(g, r) <= tol, f"{label}: {max_err(g, r):.3g} > {tol:.3g}"
    empty = _empty_rows(q, k, kw)
    assert np.all(grads[0][empty] == 0.0), "dq must be 0 on rows that see no key"


def _loss(q, k, v, do, kw):
    o, _ = reference_attention(q, k, v, **kw)
    return float(np.sum(o * do))


@pytest.mark.parametrize(
    "case_id", ["bq_ne_bk_nq_ne_nk_dv_ne_d", "mask_and_bottom_right", "batch_heads", "d1"]
)
@pytest.mark.parametrize("name", ["naive", "flash"])
def test_float64_matches_finite_differences(name, case_id, rng):
    """Central differences of sum(do * o) on a few entries of q, k and v (float64)."""
    q, k, v, do, kw, blocks = _case(case_id, rng)
    grads = _grads(name, q, k, v, do, blocks, kw)
    h = 1e-6
    for x, g in zip((q, k, v), grads, strict=True):
        flat_idx = rng.choice(x.size, size=min(6, x.size), replace=False)
        for f in flat_idx:
            idx = np.unravel_index(f, x.shape)
            orig = x[idx]
            x[idx] = orig + h
            plus = _loss(q, k, v, do, kw)
            x[idx] = orig - h
            minus = _loss(q, k, v, do, kw)
            x[idx] = orig
            fd = (plus - minus) / (2 * h)
            assert abs(fd - g[idx]) <= 1e-7 * max(1.0, abs(fd)), (idx, fd, g[idx])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case_id", list(CASES))
@pytest.mark.parametrize("name", ["naive", "flash"])
def test_low_precision_within_twice_plain(name, case_id, dtype, rng):
    """flash-attn's rule for gradients: err <= max(2 err(plain autograd in the same dtype),
    floor), against float64; the careful naive backward must meet it too."""
    q, k, v, do, kw, blocks = _case(case_id, rng, dtype=dtype)
    _, *ref = torch_grads(q, k, v, do, **kw, scale=default_scale(q.shape[-1], dtype))
    plain = plain_attention_backward(q, k, v, do, **kw)
    grads = _grads(name, q, k, v, do, blocks, kw)
    for label, g, gp, r in zip(("dq", "dk", "dv"), grads, plain, ref, strict=True):
        assert g.dtype == dtype and gp.dtype == dtype, label
        assert np.all(np.isfinite(g)), label
        assert_error_within(g, gp, r, label=label)


def test_uses_lse_not_recomputed_forward(rng):
    """flash_attention_backward must use the lse it is given (the saved statistics): a shifted
    lse scales every recomputed P by exp(-shift), hence dv by the same factor."""
    q, k, v = make_qkv(rng, (), 12, 10, 8)
    do = rng.standard_normal((12, 8))
    o, lse = flash_attention(q, k, v, block_q=4, block_k=4, return_lse=True)
    _, _, dv = flash_attention_backward(q, k, v, o, lse, do, block_q=4, block_k=4)
    _, _, dv_shift = flash_attention_backward(q, k, v, o, lse + np.log(2.0), do,
                                              block_q=4, block_k=4)
    assert max_err(dv_shift, dv / 2) <= 1e-12


@pytest.mark.parametrize("name", ["naive", "flash"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_empty_rows_zero_grads_no_warnings(name, dtype, rng):
    q, k, v = make_qkv(rng, (2,), 9, 5, 4, dtype=dtype)
    do = rng.standard_normal((2, 9, 4)).astype(dtype)
    mask = np.ones((9, 5), dtype=bool)
    mask[3] = False
    for causal, m in ((False, mask), ("bottom_right", None), ("bottom_right", mask),
                      (False, np.zeros((9, 5), dtype=bool))):
        kw = dict(causal=causal, mask=m)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with np.errstate(all="warn", under="ignore"):
                dq, dk, dv = _grads(name, q, k, v, do, dict(block_q=4, block_k=2), kw)
        empty = _empty_rows(q, k, kw)
        for g in (dq, dk, dv):
            assert np.all(np.isfinite(g))
        assert np.all(dq[empty] == 0.0)
        if causal is False and not m.any():  # nothing visible at all: every gradient is 0
            assert not dk.any() and not dv.any()


def test_keys_nobody_sees_get_zero_grads(rng):
    """Keys hidden from every query (key padding) get dk = dv = 0 exactly."""
    q, k, v = make_qkv(rng, (2,), 10, 12, 4)
    do = rng.standard_normal((2, 10, 4))
    mask = np.ones((2, 1, 12), dtype=bool)
    mask[..., 8:] = False
    for grads in (naive_attention_backward(q, k, v, do, mask=mask),
                  _flash_grads(q, k, v, do, dict(block_q=4, block_k=4), dict(mask=mask,
                                                                              causal=False))):
        _, dk, dv = grads
        assert not dk[:, 8:].any() and not dv[:, 8:].any()


def test_flash_backward_matches_naive_backward_large(rng):
    """A larger causal problem with several blocks in both directions."""
    q, k, v = make_qkv(rng, (2,), 130, 97, 32, d_v=24)
    do = rng.standard_normal((2, 130, 24))
    for causal in (True, "bottom_right"):
        ref = naive_attention_backward(q, k, v, do, causal=causal)
        got = _flash_grads(q, k, v, do, dict(block_q=32, block_k=16), dict(causal=causal,
                                                                           mask=None))
        for g, r in zip(got, ref, strict=True):
            assert max_err(g, r) <= 1e-12 * max(1.0, float(np.max(np.abs(r))))


def test_explicit_scale(rng):
    """An explicit scale is honoured by both backward functions."""
    q, k, v = make_qkv(rng, (), 11, 13, 8)
    do = rng.standard_normal((11, 8))
    for scale in (0.2, 1.7):
        kw = dict(causal="bottom_right", mask=None)
        _, *ref = torch_grads(q, k, v, do, scale=scale, **kw)
        naive = naive_attention_backward(q, k, v, do, scale=scale, **kw)
        o, lse = flash_attention(q, k, v, block_q=4, block_k=4, scale=scale,
                                 return_lse=True, **kw)
        flash = flash_attention_backward(q, k, v, o, lse, do, block_q=4, block_k=4,
                                         scale=scale, **kw)
        for g1, g2, r in zip(naive, flash, ref, strict=True):
            assert max_err(g1, r) <= 1e-12 * max(1.0, float(np.max(np.abs(r))))
            assert max_err(g2, r) <= 1e-12 * max(1.0, float(np.max(np.abs(r))))


def test_a_scale_the_forward_could_use_does_not_overflow_the_backward():
    """scale = 3e38 with tiny q and |k| of a few units: scale * q is moderate, scale * k is not.
    The backward folded the scale into K ("attention overflowed float32") while the forward
    folds it into Q and succeeded; both fold it into Q now."""
    rng = np.random.default_rng(0)
    q = (rng.standard_normal((6, 4)) * 1e-37).astype(np.float32)
    k = (rng.standard_normal((6, 4)) * 3).astype(np.float32)
    v = rng.standard_normal((6, 4)).astype(np.float32)
    do = (rng.standard_normal((6, 4)) * 1e-3).astype(np.float32)
    assert float(np.abs(k).max()) * 3e38 * np.log2(np.e) > np.finfo(np.float32).max
    o, lse = flash_attention(q, k, v, scale=3e38, return_lse=True)
    got = flash_attention_backward(q, k, v, o, lse, do, scale=3e38)
    plain = naive_attention_backward(q, k, v, do, scale=3e38)
    ref = naive_attention_backward(*(x.astype(np.float64) for x in (q, k, v, do)), scale=3e38)
    for label, g, gp, r in zip(("dq", "dk", "dv"), got, plain, ref, strict=True):
        assert np.isfinite(g).all(), label
        assert_error_within(g, gp, r, label=label)


@pytest.mark.parametrize("missing", ["o", "lse"])
def test_o_or_lse_none_is_refused_by_name(missing, rng):
    """lse=None passed the checks and failed later with "ufunc 'isinf' not supported"."""
    q = rng.standard_normal((2, 5, 3))
    o, lse = flash_attention(q, q, q, return_lse=True)
    args = {"o": o, "lse": lse, missing: None}
    with pytest.raises(TypeError, match=rf"^{missing} must be the .* flash_attention\(\.\.\., "
                                        r"return_lse=True\) returned, got None"):
        flash_attention_backward(q, q, q, args["o"], args["lse"], o)
