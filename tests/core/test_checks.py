"""Every bad input gives a ValueError/TypeError whose message names the argument; no function
mutates its inputs."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib import (
    causal_mask,
    flash_attention,
    flash_attention_backward,
    flash_attention_v1,
    naive_attention,
    naive_attention_backward,
    softmax,
)
from flashlib.core.checks import check_block, check_int
from flashlib.core.masks import causal_tiles
from flashlib.fast.forward import workspace_bytes
from flashlib.fast.online import online_softmax, partial_blocks
from flashlib.studies.intro import random_qkv, score_matrix_bytes

ERRORS = (ValueError, TypeError)


def _qkv(n_q=6, n_k=5, d=4, d_v=3, lead=(2,), dtype=np.float64):
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((*lead, n_q, d)).astype(dtype),
        rng.standard_normal((*lead, n_k, d)).astype(dtype),
        rng.standard_normal((*lead, n_k, d_v)).astype(dtype),
    )


def _bwd_flash(q, k, v, **kw):
    """flash_attention_backward with well-formed o, lse, do (built from float64 copies when
    the inputs themselves are broken)."""
    o = np.zeros((*np.shape(q)[:-1], np.shape(v)[-1]), dtype=np.asarray(q).dtype)
    lse = np.zeros(np.shape(q)[:-1], dtype=np.promote_types(np.asarray(q).dtype, np.float32))
    return flash_attention_backward(q, k, v, o, lse, o.copy(), **kw)


def _bwd_naive(q, k, v, **kw):
    do = np.zeros((*np.shape(q)[:-1], np.shape(v)[-1]), dtype=np.asarray(q).dtype)
    return naive_attention_backward(q, k, v, do, **kw)


ALL = {
    "naive": naive_attention,
    "flash_v1": flash_attention_v1,
    "flash": flash_attention,
    "naive_backward": _bwd_naive,
    "flash_backward": _bwd_flash,
}
BLOCKED = {k: ALL[k] for k in ("flash_v1", "flash", "flash_backward")}


def _raises(fn, name_regex, *args, **kwargs):
    with pytest.raises(ERRORS, match=name_regex):
        fn(*args, **kwargs)


@pytest.mark.parametrize("fname", list(ALL))
def test_mismatched_d(fname):
    q, _, v = _qkv()
    _, k, _ = _qkv(d=5)
    _raises(ALL[fname], r"\bk\b", q, k, v)


@pytest.mark.parametrize("fname", list(ALL))
def test_mismatched_n_k(fname):
    q, k, _ = _qkv()
    _, _, v = _qkv(n_k=7)
    _raises(ALL[fname], r"\bv\b", q, k, v)


@pytest.mark.parametrize("fname", list(ALL))
def test_unequal_leading_dims(fname):
    q, _, _ = _qkv(lead=(2,))
    _, k, v = _qkv(lead=(3,))
    _raises(ALL[fname], r"\bk\b", q, k, v)
    q4, _, _ = _qkv(lead=(2, 3))
    _, k4, v4 = _qkv(lead=(3, 1))  # no broadcasting of batch/head dims either
    _raises(ALL[fname], r"\bk\b", q4, k4, v4)
    _, k4, v4 = _qkv(lead=(2, 2))  # 3 query heads cannot share 2 K/V heads (grouped-query)
    _raises(ALL[fname], r"\bk\b", q4, k4, v4)
    _, k0, v0 = _qkv(lead=())
    _raises(ALL[fname], r"\bk\b", q4, k0, v0)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_, np.complex128, object])
@pytest.mark.parametrize("fname", list(ALL))
def test_non_floating_dtypes(fname, dtype):
    q, k, v = _qkv()
    bad = q.astype(dtype)
    _raises(ALL[fname], r"\bq\b", bad, k, v)
    _raises(ALL[fname], r"\bk\b", q, k.astype(dtype), v)
    _raises(ALL[fname], r"\bv\b", q, k, v.astype(dtype))


@pytest.mark.parametrize("fname", list(ALL))
def test_mixed_float_dtypes(fname):
    q, k, v = _qkv()
    _raises(ALL[fname], r"\bk\b", q, k.astype(np.float32), v)
    _raises(ALL[fname], r"\bv\b", q, k, v.astype(np.float16))
    _raises(ALL[fname], r"dtype", q.astype(np.float32), k, v)


@pytest.mark.parametrize("fname", list(ALL))
def test_wrong_ndim(fname):
    q, k, v = _qkv(lead=())
    _raises(ALL[fname], r"\bq\b", q[0], k, v)
    _raises(ALL[fname], r"\bk\b", q, k[0], v)
    _raises(ALL[fname], r"\bv\b", q, k, v[0])
    _raises(ALL[fname], r"\bq\b", np.float64(1.0), k, v)


@pytest.mark.parametrize("bad", [0, -1, -64])
@pytest.mark.parametrize("arg", ["block_q", "block_k"])
@pytest.mark.parametrize("fname", list(BLOCKED))
def test_non_positive_block(fname, arg, bad):
    _raises(BLOCKED[fname], arg, *_qkv(), **{arg: bad})


@pytest.mark.parametrize("bad", [2.0, 1.5, True, False, "8", None, np.float64(4.0)])
@pytest.mark.parametrize("arg", ["block_q", "block_k"])
@pytest.mark.parametrize("fname", list(BLOCKED))
def test_non_integer_block(fname, arg, bad):
    _raises(BLOCKED[fname], arg, *_qkv(), **{arg: bad})


@pytest.mark.parametrize("fname", list(BLOCKED))
def test_numpy_integer_block_accepted(fname):
    BLOCKED[fname](*_qkv(), block_q=np.int64(2), block_k=np.int32(3))


@pytest.mark.parametrize(
    "bad", [np.ones((6, 5), dtype=np.int64), np.ones((6, 5)), np.ones((6, 5), dtype=np.uint8)]
)
@pytest.mark.parametrize("fname", list(ALL))
def test_mask_not_boolean(fname, bad):
    _raises(ALL[fname], r"\bmask\b", *_qkv(), mask=bad)


@pytest.mark.parametrize("shape", [(6, 4), (5, 5), (3, 6, 5), (2, 6, 5, 1), (6,), (7, 1)])
@pytest.mark.parametrize("fname", list(ALL))
def test_mask_not_broadcastable(fname, shape):
    _raises(ALL[fname], r"\bmask\b", *_qkv(), mask=np.ones(shape, dtype=bool))


@pytest.mark.parametrize("shape", [(1, 5), (2, 1, 5), (6, 5), (2, 6, 5), (1, 1), ()])
@pytest.mark.parametrize("fname", list(ALL))
def test_broadcastable_masks_accepted(fname, shape):
    ALL[fname](*_qkv(), mask=np.ones(shape, dtype=bool))


@pytest.mark.parametrize("bad", ["top-left", "bottom_left", "causal", "", 2, 1.0, "TRUE"])
@pytest.mark.parametrize("fname", list(ALL))
def test_unknown_causal(fname, bad):
    _raises(ALL[fname], r"\bcausal\b", *_qkv(), causal=bad)


@pytest.mark.parametrize("causal", [False, True, "top_left", "bottom_right"])
@pytest.mark.parametrize("fname", list(ALL))
def test_known_causal_accepted(fname, causal):
    ALL[fname](*_qkv(), causal=causal)


# --- backward-specific arguments ------------------------------------------------------------

def _bwd_args():
    q, k, v = _qkv()
    o, lse = flash_attention(q, k, v, return_lse=True)
    do = np.ones_like(o)
    return q, k, v, o, lse, do


@pytest.mark.parametrize("shape", [(2, 6, 4), (2, 5, 3), (6, 3), (1, 2, 6, 3)])
def test_backward_o_shape(shape):
    q, k, v, o, lse, do = _bwd_args()
    _raises(flash_attention_backward, r"\bo\b", q, k, v, np.zeros(shape), lse, do)


@pytest.mark.parametrize("shape", [(2, 5), (6,), (2, 6, 1), (2, 6, 3)])
def test_backward_lse_shape(shape):
    q, k, v, o, lse, do = _bwd_args()
    _raises(flash_attention_backward, r"\blse\b", q, k, v, o, np.zeros(shape), do)


@pytest.mark.parametrize("shape", [(2, 6, 4), (2, 5, 3), (6, 3)])
def test_backward_do_shape(shape):
    q, k, v, o, lse, do = _bwd_args()
    _raises(flash_attention_backward, r"\bdo\b", q, k, v, o, lse, np.zeros(shape))
    _raises(naive_attention_backward, r"\bdo\b", q, k, v, np.zeros(shape))


def test_backward_non_floating_extras():
    q, k, v, o, lse, do = _bwd_args()
    _raises(flash_attention_backward, r"\bo\b", q, k, v, o.astype(np.int64), lse, do)
    _raises(flash_attention_backward, r"\blse\b", q, k, v, o, lse.astype(bool), do)
    _raises(flash_attention_backward, r"\bdo\b", q, k, v, o, lse, do.astype(np.int64))
    _raises(naive_attention_backward, r"\bdo\b", q, k, v, do.astype(np.complex128))


# --- softmax / online softmax arguments ---------------------------------------------------

def test_softmax_rejects_non_floating():
    _raises(softmax, r"\bx\b", np.arange(5))
    _raises(softmax, r"\bx\b", np.ones(3, dtype=bool))


def test_softmax_rejects_nan_and_bad_axis():
    _raises(softmax, r"\bx\b", np.array([0.0, np.nan]))
    _raises(softmax, r"\baxis\b", np.ones((2, 3)), axis=2)
    _raises(softmax, r"\baxis\b", np.ones((2, 3)), axis=1.0)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_online_softmax_block(bad):
    _raises(online_softmax, r"\bblock\b", np.ones(4), block=bad)


# --- no input is mutated --------------------------------------------------------------------

def _readonly(*arrays):
    out = []
    for a in arrays:
        a = np.array(a, copy=True)
        a.flags.writeable = False
        out.append(a)
    return out


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, "bottom_right"])
def test_inputs_not_mutated(dtype, causal):
    q, k, v = _qkv(n_q=9, n_k=7, dtype=dtype)
    mask = np.ones((2, 1, 7), dtype=bool)
    mask[0, 0, 2] = False
    do = np.ones((2, 9, 3), dtype=dtype)
    originals = [x.copy() for x in (q, k, v, mask, do)]
    rq, rk, rv, rmask, rdo = _readonly(q, k, v, mask, do)  # in-place writes would raise
    kw = dict(causal=causal, mask=rmask)
    naive_attention(rq, rk, rv, **kw)
    flash_attention_v1(rq, rk, rv, block_q=4, block_k=2, **kw)
    o, lse = flash_attention(rq, rk, rv, block_q=4, block_k=2, return_lse=True, **kw)
    o_c, lse_c = o.copy(), lse.copy()
    ro, rlse = _readonly(o, lse)
    naive_attention_backward(rq, rk, rv, rdo, **kw)
    flash_attention_backward(rq, rk, rv, ro, rlse, rdo, block_q=4, block_k=2, **kw)
    # and with ordinary writeable arrays: compare values afterwards
    naive_attention(q, k, v, causal=causal, mask=mask)
    flash_attention_v1(q, k, v, block_q=4, block_k=2, causal=causal, mask=mask)
    flash_attention(q, k, v, block_q=4, block_k=2, causal=causal, mask=mask)
    naive_attention_backward(q, k, v, do, causal=causal, mask=mask)
    flash_attention_backward(q, k, v, o, lse, do, block_q=4, block_k=2, causal=causal,
                             mask=mask)
    for x, orig in zip((q, k, v, mask, do), originals, strict=True):
        assert np.array_equal(x, orig)
    assert np.array_equal(o, o_c) and np.array_equal(lse, lse_c)


def test_softmax_and_online_softmax_do_not_mutate():
    x = np.random.default_rng(0).standard_normal((3, 8))
    orig = x.copy()
    (rx,) = _readonly(x)
    softmax(rx)
    online_softmax(rx, block=3)
    softmax(x, axis=0)
    online_softmax(x, block=3, trace=True)
    assert np.array_equal(x, orig)


def test_outputs_do_not_alias_inputs():
    q, k, v = _qkv(n_q=5, n_k=5, d=3, d_v=3)
    for fn in (naive_attention, flash_attention_v1, flash_attention):
        o = fn(q, k, v)
        assert not np.shares_memory(o, q) and not np.shares_memory(o, v)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("arg", ["q", "k", "v"])
@pytest.mark.parametrize("fname", list(ALL))
def test_non_finite_inputs(fname, arg, bad):
    args = dict(zip("qkv", _qkv(), strict=True))
    args[arg][0, 2, 1] = bad
    with pytest.raises(ValueError, match=f"^{arg} must contain only finite"):
        ALL[fname](args["q"], args["k"], args["v"])


def test_backward_non_finite_o_do_lse():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((6, 4)) for _ in range(3))
    o, lse = flash_attention(q, k, v, return_lse=True)
    do = np.ones_like(o)
    bad_o = o.copy()
    bad_o[0, 0] = np.nan
    with pytest.raises(ValueError, match="o must"):
        flash_attention_backward(q, k, v, bad_o, lse, do)
    with pytest.raises(ValueError, match="do must"):
        flash_attention_backward(q, k, v, o, lse, do * np.inf)
    for bad in (np.nan, np.inf):
        bad_lse = lse.copy()
        bad_lse[1] = bad
        with pytest.raises(ValueError, match="lse"):
            flash_attention_backward(q, k, v, o, bad_lse, do)


def test_scale_that_overflows_the_compute_dtype():
    """float16 inputs are computed in float32: 1e6 is a fine scale, 1e39 is not."""
    q = np.ones((3, 4), dtype=np.float16)
    np.testing.assert_array_equal(flash_attention(q, q, q, scale=1e6), np.ones((3, 4)))
    with pytest.raises(ValueError, match="scale"):
        flash_attention(q, q, q, scale=1e39)


def test_numpy_bool_causal_accepted():
    q = np.random.default_rng(0).standard_normal((5, 4))
    np.testing.assert_array_equal(
        flash_attention(q, q, q, causal=np.True_),
        flash_attention(q, q, q, causal=True),
    )


# --- the one integer check (check_int) and the arguments that use it -------------------------

@pytest.mark.parametrize("good", [0, 3, np.int64(3), np.int32(-2), np.uint8(7)])
def test_check_int_accepts_python_and_numpy_integers(good):
    assert check_int(good, "n") == int(good) and type(check_int(good, "n")) is int


@pytest.mark.parametrize("bad", [True, False, np.True_, 3.0, 3.5, np.float64(2.0), "3", None,
                                 [3], 3 + 0j])
def test_check_int_refuses_non_integers(bad):
    with pytest.raises(TypeError, match=r"^n_q must be an integer"):
        check_int(bad, "n_q")


def test_check_int_minimum():
    assert check_int(0, "n", minimum=0) == 0
    with pytest.raises(ValueError, match=r"n must be a non-negative integer, got -1"):
        check_int(-1, "n", minimum=0)
    with pytest.raises(ValueError, match=r"block must be a positive integer, got 0"):
        check_int(0, "block", minimum=1)
    with pytest.raises(ValueError, match=r"repeats must be an integer >= 3, got 2"):
        check_int(2, "repeats", minimum=3)


def test_causal_mask_refuses_a_float_size():
    """Regression: causal_mask(3.5, 3) returned a (4, 3) mask."""
    with pytest.raises(TypeError, match="n_q"):
        causal_mask(3.5, 3)
    with pytest.raises(TypeError, match="n_k"):
        causal_mask(3, True)
    with pytest.raises(ValueError, match="n_k"):
        causal_mask(3, -1)
    assert causal_mask(np.int64(2), 3).shape == (2, 3)


def test_workspace_bytes_refuses_a_negative_d_v():
    """Regression: workspace_bytes(..., d_v=-5) returned 32."""
    with pytest.raises(ValueError, match="d_v"):
        workspace_bytes(1, 1, 1, np.float16, d_v=-5)
    with pytest.raises(TypeError, match="batch"):
        workspace_bytes(1, 1, 1, np.float32, batch=True)


@pytest.mark.parametrize(("call", "name"), [
    (lambda bad: check_block(bad, "block_q"), "block_q"),
    (lambda bad: flash_attention(np.ones((4, 2)), np.ones((4, 2)), np.ones((4, 2)),
                                 block_k=bad), "block_k"),
    (lambda bad: online_softmax(np.ones(4), block=bad), "block"),
    (lambda bad: partial_blocks(np.ones((2, 4)), np.ones((4, 3)), bad), "block"),
    (lambda bad: causal_tiles(8, bad, 4, 4), "n_k"),
    (lambda bad: score_matrix_bytes(4, heads=bad), "heads"),
    (lambda bad: random_qkv(bad, 4), "n"),
    (lambda bad: softmax(np.ones(3), axis=bad), "axis"),
])
@pytest.mark.parametrize("bad", [True, 2.0])
def test_booleans_and_floats_are_refused_everywhere(call, name, bad):
    with pytest.raises(TypeError, match=rf"\b{name}\b"):
        call(bad)


def test_none_is_refused_by_name_where_it_has_no_meaning():
    """np.asarray(None) is an object array and np.dtype(None) is float64: both used to slip
    through (``dtype=None`` silently meant float64)."""
    from flashlib.core.checks import as_float_array, check_flag, check_float_dtype
    from flashlib.fast.forward import workspace_bytes

    with pytest.raises(TypeError, match="^q must be an array, got None"):
        as_float_array(None, "q")
    with pytest.raises(TypeError, match="dtype must be float16, float32 or float64, got None"):
        check_float_dtype(None)
    with pytest.raises(TypeError, match="dtype must be"):
        workspace_bytes(4, 4, 2, None)
    assert check_flag(np.True_, "f") is True and check_flag(False, "f") is False
    for bad in (None, "yes", 1, np.array([True])):
        with pytest.raises(TypeError, match="return_lse must be True or False"):
            check_flag(bad, "return_lse")


def test_shapes_beyond_int64_are_refused_by_name():
    from flashlib.core.checks import check_shape
    from flashlib.fast.online import softmax_state_init

    assert check_shape(np.uint64(3)) == (3,)
    with pytest.raises(ValueError, match="shape must have sizes below 2"):
        softmax_state_init(10**30)
