"""Property-based tests (hypothesis) over shapes, block sizes, causal alignments, masks and
logit magnitudes up to 1e4: outputs stay finite, raise no warning, and match the float64
reference.  The profile registered in conftest.py makes the examples deterministic."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashlib import (
    flash_attention,
    flash_attention_backward,
    flash_attention_v1,
    naive_attention,
    naive_attention_backward,
)
from tests.helpers import (
    assert_error_within,
    default_scale,
    logits,
    make_mask,
    make_qkv,
    max_err,
    plain_attention,
    reference_attention,
    torch_grads,
)

# every test here on both forward paths (tests/fast/conftest.py)
pytestmark = pytest.mark.usefixtures("forward_path")

EPS64 = float(np.finfo(np.float64).eps)


@st.composite
def problems(draw, max_logit=1e4):
    return dict(
        lead=draw(st.sampled_from([(), (2,), (1, 2)])),
        n_q=draw(st.integers(1, 24)),
        n_k=draw(st.integers(1, 24)),
        d=draw(st.integers(1, 12)),
        d_v=draw(st.integers(1, 8)),
        block_q=draw(st.integers(1, 32)),
        block_k=draw(st.integers(1, 32)),
        causal=draw(st.sampled_from([False, True, "top_left", "bottom_right"])),
        mask=draw(st.sampled_from([None, "random", "rows", "key_padding", "none_visible"])),
        logit=draw(
            st.sampled_from([None, 1.0, 30.0, 1e3, max_logit])
            | st.floats(1.0, max_logit, allow_nan=False)
        ),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def _build(pr, dtype):
    rng = np.random.default_rng(pr["seed"])
    q, k, v = make_qkv(rng, pr["lead"], pr["n_q"], pr["n_k"], pr["d"], pr["d_v"], dtype=dtype,
                       logit_scale=pr["logit"])
    mask = make_mask(rng, pr["mask"], pr["lead"], pr["n_q"], pr["n_k"])
    kw = dict(causal=pr["causal"], mask=mask)
    blocks = dict(block_q=pr["block_q"], block_k=pr["block_k"])
    return rng, q, k, v, kw, blocks


def _logit_max(q, k, dtype):
    return float(np.max(np.abs(logits(q, k, default_scale(q.shape[-1], dtype)))))


def _f64_tol(q, k, v):
    """1e-12, or the conditioning of softmax at large logits when that is larger: each float64
    logit carries an error of a few eps * |s|, which moves the output by that times max|v|."""
    s_max = _logit_max(q, k, np.float64)
    return max(1e-12, 16 * EPS64 * s_max * max(1.0, float(np.max(np.abs(v)))))


def _all_forward(q, k, v, kw, blocks):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return {
            "naive": naive_attention(q, k, v, **kw),
            "flash_v1": flash_attention_v1(q, k, v, **blocks, **kw),
            "flash": flash_attention(q, k, v, **blocks, **kw, return_lse=True),
        }


@settings(max_examples=60)
@given(pr=problems())
def test_forward_float64_matches_reference(pr):
    _, q, k, v, kw, blocks = _build(pr, np.float64)
    ref, ref_lse = reference_attention(q, k, v, **kw)
    outs = _all_forward(q, k, v, kw, blocks)
    o_flash, lse = outs.pop("flash")
    outs["flash"] = o_flash
    tol = _f64_tol(q, k, v)
    for name, o in outs.items():
        assert o.shape == ref.shape and o.dtype == np.float64, name
        assert np.all(np.isfinite(o)), name
        assert max_err(o, ref) <= tol, (name, max_err(o, ref), tol)
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty)
    assert np.all(o_flash[empty] == 0.0)
    assert max_err(lse[~empty], ref_lse[~empty]) <= tol


@settings(max_examples=50)
@given(pr=problems(), dtype=st.sampled_from([np.float32, np.float16]))
def test_forward_low_precision_within_twice_plain(pr, dtype):
    if dtype == np.float16 and pr["logit"] is not None:
        pr = dict(pr, logit=min(pr["logit"], 1e3))  # keeps the plain baseline's S finite
    _, q, k, v, kw, blocks = _build(pr, dtype)
    ref, _ = reference_attention(q, k, v, **kw)
    outs = _all_forward(q, k, v, kw, blocks)
    outs["flash"] = outs["flash"][0]
    plain = plain_attention(q, k, v, **kw)
    logit_max = _logit_max(q, k, dtype)
    for name, o in outs.items():
        assert o.dtype == dtype, name
        assert np.all(np.isfinite(o)), name
        assert_error_within(o, plain, ref, logit_max=logit_max, label=name)


@settings(max_examples=40)
@given(pr=problems(max_logit=1e3))
def test_backward_float64_matches_autograd(pr):
    rng, q, k, v, kw, blocks = _build(pr, np.float64)
    do = rng.standard_normal(q.shape[:-1] + (v.shape[-1],))
    _, *ref = torch_grads(q, k, v, do, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        naive = naive_attention_backward(q, k, v, do, **kw)
        o, lse = flash_attention(q, k, v, **blocks, **kw, return_lse=True)
        flash = flash_attention_backward(q, k, v, o, lse, do, **blocks, **kw)
    # dS = P (dP - D) inherits the logits' relative error (a few eps |s|): scale like forward.
    tol = _f64_tol(q, k, v) * max(1.0, float(np.max(np.abs(do))))
    for label, gn, gf, r in zip(("dq", "dk", "dv"), naive, flash, ref, strict=True):
        mag = max(1.0, float(np.max(np.abs(r), initial=0.0)), float(np.max(np.abs(q))),
                  float(np.max(np.abs(k))))
        assert np.all(np.isfinite(gf)) and np.all(np.isfinite(gn)), label
        assert max_err(gn, r) <= tol * mag, ("naive", label, max_err(gn, r), tol * mag)
        assert max_err(gf, r) <= tol * mag, ("flash", label, max_err(gf, r), tol * mag)


@settings(max_examples=40)
@given(pr=problems())
def test_flash_equals_v1_and_is_block_independent(pr):
    """The two loop orders agree with each other and with a different tiling, in float64."""
    _, q, k, v, kw, blocks = _build(pr, np.float64)
    tol = _f64_tol(q, k, v)
    a = flash_attention(q, k, v, **blocks, **kw)
    b = flash_attention_v1(q, k, v, **blocks, **kw)
    c = flash_attention(q, k, v, block_q=blocks["block_k"], block_k=blocks["block_q"], **kw)
    assert max_err(a, b) <= 2 * tol
    assert max_err(a, c) <= 2 * tol
