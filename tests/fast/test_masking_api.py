"""Sliding windows and key padding in the public API: flash_attention (tiled, empty tiles
skipped) against naive_attention with the same arguments, against the dense predicate as an
explicit mask, and against torch SDPA with an explicit boolean mask."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashlib import flash_attention, flash_attention_v1, naive_attention
from flashlib.core.masks import (
    band,
    band_tile_class,
    both,
    causal_bottom_right,
    causal_top_left,
    dense_mask,
    padded,
    sliding_window,
)

# every test here on both forward paths (tests/fast/conftest.py)
pytestmark = pytest.mark.usefixtures("forward_path")

SHAPES = [(1, 1), (1, 9), (9, 1), (17, 17), (13, 29), (29, 13), (64, 64)]


def _dense(n_q, n_k, causal, window, lengths):
    """The token-level truth from the predicates, (B, n_q, n_k) for key lengths (B,): one
    diagonal per call (top-left for causal True/"top_left", else bottom-right), and a padded
    sequence masked as its unpadded self (masks.padded)."""
    base = []
    top_left = causal in (True, "top_left")
    if top_left:
        base.append(causal_top_left)
    elif causal == "bottom_right":
        base.append(causal_bottom_right)
    if window is not None:
        base.append(sliding_window(*window, align="top_left" if top_left else "bottom_right"))
    if lengths is None:
        return dense_mask(both(*base), n_q, n_k)
    return np.stack([dense_mask(padded(both(*base), int(n)), n_q, n_k) for n in lengths])


def _qkv(rng, b, n_q, n_k, d=7, d_v=5):
    return (rng.standard_normal((b, n_q, d)), rng.standard_normal((b, n_k, d)),
            rng.standard_normal((b, n_k, d_v)))


@pytest.mark.parametrize("n_q, n_k", SHAPES)
@pytest.mark.parametrize("causal, window", [(False, (3, 2)), (False, (0, 0)), (True, (4, None)),
                                            ("bottom_right", (5, 0)), (False, (None, 1)),
                                            (False, None)])
def test_window_and_padding_match_the_dense_mask(n_q, n_k, causal, window):
    rng = np.random.default_rng(0)
    lengths = np.array([n_k, max(n_k - 3, 0), 0])[:, None]  # (3, 1): batch 3, 1 head
    q, k, v = (x[:, None] for x in _qkv(rng, 3, n_q, n_k))
    mask = _dense(n_q, n_k, causal, window, lengths.ravel())[:, None]
    o_ref, lse_ref = naive_attention(q, k, v, mask=mask, return_lse=True)
    o_nv, lse_nv = naive_attention(q, k, v, causal=causal, window=window, key_lengths=lengths,
                                   return_lse=True)
    np.testing.assert_allclose(o_nv, o_ref, atol=1e-12)
    np.testing.assert_array_equal(lse_nv, lse_ref)
    for (b_r, b_c), fn in itertools.product([(4, 4), (3, 8), (64, 64)],
                                            [flash_attention, flash_attention_v1]):
        o, lse = fn(q, k, v, block_q=b_r, block_k=b_c, causal=causal, window=window,
                    key_lengths=lengths, return_lse=True)
        np.testing.assert_allclose(o, o_ref, atol=1e-12)
        blind = ~mask.any(axis=-1)
        assert (o[blind] == 0).all() and np.isneginf(lse[blind]).all()
        np.testing.assert_allclose(lse[~blind], lse_ref[~blind], atol=1e-12)


def test_window_and_padding_match_torch_sdpa():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    n_q, n_k, window = 23, 41, (6, 2)
    lengths = np.array([41, 30])
    q, k, v = _qkv(rng, 2, n_q, n_k)
    mask = _dense(n_q, n_k, False, window, lengths)
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(x) for x in (q, k, v)), attn_mask=torch.from_numpy(mask)).numpy()
    seen = mask.any(axis=-1)
    for fn in (flash_attention, flash_attention_v1):
        got = fn(q, k, v, block_q=8, block_k=8, window=window, key_lengths=lengths)
        np.testing.assert_allclose(got[seen], want[seen], atol=1e-12)


def test_fully_masked_rows_float32_and_float16():
    rng = np.random.default_rng(2)
    for dtype in (np.float32, np.float16):
        q, k, v = (x.astype(dtype) for x in _qkv(rng, 1, 9, 4))
        o, lse = flash_attention(q, k, v, causal="bottom_right", return_lse=True, block_q=4,
                                 block_k=2)
        assert (o[0, :5] == 0).all() and np.isneginf(lse[0, :5]).all()
        assert np.isfinite(o).all()
        o, lse = flash_attention(q, k, v, key_lengths=0, return_lse=True)
        assert (o == 0).all() and np.isneginf(lse).all()


@pytest.mark.parametrize("n_q, n_k, b_r, b_c, causal, window, length", [
    (64, 64, 16, 16, True, (15, None), 64), (100, 100, 16, 8, False, (20, 20), 90),
    (10, 40, 4, 8, "bottom_right", (7, 0), 33), (40, 10, 8, 4, False, None, 5)])
def test_flash_attention_computes_only_the_nonempty_tiles(n_q, n_k, b_r, b_c, causal, window,
                                                          length, monkeypatch):
    """The tiles flash_attention computes are exactly those band_tile_class calls non-empty.
    (A group of query blocks meets a key block once: every query block of the rows it passes
    to band_hides is computed.)"""
    import flashlib.fast.bounded
    import flashlib.fast.row_group

    lo, hi = band(n_q, n_k, causal, window, length)
    want = [(i0, j0) for i0 in range(0, n_q, b_r) for j0 in range(0, n_k, b_c)
            if band_tile_class(i0, min(i0 + b_r, n_q), j0, min(j0 + b_c, n_k), lo, hi,
                               length) != "empty"]
    seen = []
    real = flashlib.core.masks.band_hides

    def counting(i0, i1, j0, j1, lo, hi):
        assert i0 % b_r == 0
        seen.extend((i, j0) for i in range(i0, i1, b_r))
        return real(i0, i1, j0, j1, lo, hi)

    for path in (flashlib.fast.bounded, flashlib.fast.row_group):  # either path's loop
        monkeypatch.setattr(path, "band_hides", counting)
    x = np.random.default_rng(0).standard_normal((max(n_q, n_k), 4))
    flash_attention(x[:n_q], x[:n_k], x[:n_k], block_q=b_r, block_k=b_c, causal=causal,
                    window=window, key_lengths=length)
    assert set(want) == set(seen)
    assert all(j0 < length for _, j0 in seen)
    assert len(seen) == len(set(seen))


@given(n_q=st.integers(1, 30), n_k=st.integers(1, 30), b_r=st.integers(1, 12),
       b_c=st.integers(1, 12), causal=st.sampled_from([False, True, "bottom_right"]),
       left=st.none() | st.integers(0, 10), right=st.none() | st.integers(0, 10),
       use_window=st.booleans(), pad=st.integers(0, 30), seed=st.integers(0, 2**16))
def test_property_flash_equals_naive(n_q, n_k, b_r, b_c, causal, left, right, use_window, pad,
                                     seed):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, 2, n_q, n_k, d=3, d_v=2)
    kw = dict(causal=causal, window=(left, right) if use_window else None,
              key_lengths=np.array([n_k, min(pad, n_k)]))
    o_ref, lse_ref = naive_attention(q, k, v, return_lse=True, **kw)
    o, lse = flash_attention(q, k, v, block_q=b_r, block_k=b_c, return_lse=True, **kw)
    np.testing.assert_allclose(o, o_ref, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))


@pytest.mark.parametrize("kw, err, match", [
    (dict(window=3), TypeError, "window"), (dict(window=(1, 2, 3)), TypeError, "window"),
    (dict(window=(-1, 0)), ValueError, r"window\[0\]"),
    (dict(window=(0, 1.5)), TypeError, r"window\[1\]"),
    (dict(key_lengths=np.array([1.0])), TypeError, "key_lengths"),
    (dict(key_lengths=np.array([9])), ValueError, "key_lengths"),
    (dict(key_lengths=np.array([1, 2, 3])), ValueError, "key_lengths"),
    (dict(key_lengths=True), TypeError, "key_lengths")])
def test_bad_window_and_lengths(kw, err, match):
    q = np.zeros((2, 4, 3))
    for fn in (flash_attention, naive_attention):
        with pytest.raises(err, match=match):
            fn(q, q, q, **kw)


@pytest.mark.parametrize("n_q, n_k", [(1, 9), (9, 1), (17, 17), (13, 29), (29, 13)])
@pytest.mark.parametrize("causal, window", [(False, (3, 2)), (True, (4, None)),
                                            ("bottom_right", (5, 0)), (False, None)])
def test_backward_window_and_padding(n_q, n_k, causal, window):
    """flash_attention_backward and naive_attention_backward with window= and key_lengths=
    against naive_attention_backward with the dense mask (rows that see no key: zero)."""
    from flashlib import flash_attention_backward, naive_attention_backward

    rng = np.random.default_rng(3)
    lengths = np.array([n_k, max(n_k - 4, 0)])
    q, k, v = _qkv(rng, 2, n_q, n_k)
    do = rng.standard_normal((2, n_q, 5))
    mask = _dense(n_q, n_k, causal, window, lengths)
    want = naive_attention_backward(q, k, v, do, mask=mask)
    kw = dict(causal=causal, window=window, key_lengths=lengths)
    for got in (naive_attention_backward(q, k, v, do, **kw),):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-12)
    o, lse = flash_attention(q, k, v, return_lse=True, **kw)
    for b_r, b_c in [(4, 4), (3, 8), (64, 64)]:
        got = flash_attention_backward(q, k, v, o, lse, do, block_q=b_r, block_k=b_c, **kw)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-11)


# --- window bounds of any size; one alignment per call; key_lengths index the batch ---------

HUGE = [2**63 - 1, 2**63, 10**30, np.uint64(2**64 - 1), np.int64(2**63 - 1)]


def _all_functions(q, k, v, **kw):
    """The outputs of every public function that takes window= and key_lengths=."""
    from flashlib import flash_attention_backward, flash_attention_v1, naive_attention_backward
    from flashlib.fast.decoding import decode_attention

    o, lse = flash_attention(q, k, v, return_lse=True, **kw)
    return {"flash_attention": o, "lse": lse,
            "naive_attention": naive_attention(q, k, v, **kw),
            "flash_attention_v1": flash_attention_v1(q, k, v, **kw),
            "decode_attention": decode_attention(q, k, v, n_splits=2, **kw),
            "flash_attention_backward": flash_attention_backward(q, k, v, o, lse, o, **kw),
            "naive_attention_backward": naive_attention_backward(q, k, v, o, **kw)}


@pytest.mark.parametrize("bound", HUGE, ids=str)
def test_a_window_bound_of_any_size_is_no_bound(bound):
    """(0, 2**63 - 1) wrapped around int64 (rows 1-3 returned zeros); 2**63 and more raised a
    raw OverflowError.  Any bound >= max(n_q, n_k) hides no key: it equals None."""
    x = np.random.default_rng(0).standard_normal((4, 3))
    for window, none in [((0, bound), (0, None)), ((bound, 0), (None, 0)),
                         ((bound, bound), None)]:
        for causal in (False, True, "bottom_right"):
            got = _all_functions(x, x, x, window=window, causal=causal)
            want = _all_functions(x, x, x, window=none, causal=causal)
            for name in want:
                np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]),
                                              err_msg=f"{name} window={window}")


def test_causal_true_with_a_window_is_one_top_left_band():
    """causal=True is top-left; the window used to be bottom-right, so that n_q = 4, n_k = 10,
    causal=True, window=(2, 0) hid every key.  Now the window sits on the call's diagonal."""
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, 1, 4, 10)
    want = dense_mask(both(causal_top_left, sliding_window(2, 0, align="top_left")), 4, 10)
    assert want.any(axis=-1).all()
    o = flash_attention(q, k, v, causal=True, window=(2, 0))
    np.testing.assert_allclose(o, naive_attention(q, k, v, mask=want), atol=1e-12)
    assert (np.abs(o) > 0).any(axis=-1).all()


def _visible(fn, n_q, n_k, **kw):
    """The keys each query sees, read through ``fn``'s output: q = 0 gives uniform weights over
    the visible keys, and V = I shows them."""
    q, k = np.zeros((1, n_q, 2)), np.ones((1, n_k, 2))
    return fn(q, k, np.eye(n_k)[None], **kw)[0] > 0


@pytest.mark.parametrize("row", range(4))
@pytest.mark.parametrize("fn", [naive_attention, flash_attention], ids=lambda f: f.__name__)
def test_alignment_rules_table(row, fn):
    """Each row of masks.ALIGNMENT_RULES, read through the library: with n_q = 3 queries and
    L = 5 real keys of n_k = 7, the diagonal key of row i is what the table says."""
    from flashlib.core.masks import ALIGNMENT_RULES

    n_q, n_k, L = 3, 7, 5  # noqa: N806
    args, diagonal, _ = ALIGNMENT_RULES[row]
    kw = {0: dict(causal=True), 1: dict(causal="bottom_right"), 2: dict(window=(0, 0)),
          3: dict(causal=True, window=(0, 0))}[row]
    seen = _visible(fn, n_q, n_k, key_lengths=L, **kw)
    for i in range(n_q):
        c = eval(diagonal, {"i": i, "L": L, "n_q": n_q})
        last = np.flatnonzero(seen[i]).max() if seen[i].any() else None
        assert last == c, (args, i)
        if "window" in args:
            assert np.flatnonzero(seen[i]).tolist() == [c]


@given(n_q=st.integers(1, 12), n_k=st.integers(1, 20), pad=st.integers(0, 8),
       causal=st.sampled_from([False, True, "bottom_right"]),
       left=st.none() | st.integers(0, 8), right=st.none() | st.integers(0, 8),
       b_r=st.integers(1, 8), b_c=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_property_padding_keys_changes_no_output(n_q, n_k, pad, causal, left, right, b_r, b_c,
                                                  seed):
    """The rule's consequence: a sequence padded with keys that key_lengths hides gives the
    outputs, logsumexp and gradients of the unpadded sequence (flash-attn's variable-length
    and KV-cache lengths: the bottom-right diagonal sits on the last real key)."""
    from flashlib import flash_attention_backward

    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, 1, n_q, n_k + pad, d=3, d_v=2)
    do = rng.standard_normal((1, n_q, 2))
    kw = dict(causal=causal, window=(left, right), block_q=b_r, block_k=b_c)
    o, lse = flash_attention(q, k[:, :n_k], v[:, :n_k], return_lse=True, **kw)
    o_pad, lse_pad = flash_attention(q, k, v, key_lengths=n_k, return_lse=True, **kw)
    np.testing.assert_allclose(o_pad, o, atol=1e-12)
    np.testing.assert_allclose(lse_pad, lse, atol=1e-12)
    grads = flash_attention_backward(q, k[:, :n_k], v[:, :n_k], o, lse, do, **kw)
    grads_pad = flash_attention_backward(q, k, v, o_pad, lse_pad, do, key_lengths=n_k, **kw)
    for g, g_pad in zip(grads, grads_pad, strict=True):
        np.testing.assert_allclose(g_pad[:, :g.shape[1]], g, atol=1e-12)
    assert (grads_pad[1][:, n_k:] == 0).all() and (grads_pad[2][:, n_k:] == 0).all()
    kw.pop("block_q"), kw.pop("block_k")
    np.testing.assert_allclose(naive_attention(q, k, v, key_lengths=n_k, **kw), o, atol=1e-12)


def test_key_lengths_of_shape_b_are_per_batch_element_even_when_b_equals_h():
    """q (B, H, n, d) with B == H and key_lengths (B,): numpy's broadcasting read it per head;
    PyTorch and flash-attn read it per batch element, and so does flashlib now."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, n, 4)) for n in (5, 9, 9))
    lengths = np.array([3, 9])
    want = naive_attention(q, k, v, mask=(np.arange(9) < lengths[:, None, None, None]))
    for fn in (flash_attention, naive_attention):
        np.testing.assert_allclose(fn(q, k, v, key_lengths=lengths), want, atol=1e-12)
    # per head: say so with the shape (1, H); per batch element and head: (B, H)
    per_head = naive_attention(q, k, v, mask=(np.arange(9) < lengths[None, :, None, None]))
    np.testing.assert_allclose(flash_attention(q, k, v, key_lengths=lengths[None]), per_head,
                               atol=1e-12)
    both_axes = np.array([[3, 9], [9, 3]])
    np.testing.assert_allclose(
        flash_attention(q, k, v, key_lengths=both_axes),
        naive_attention(q, k, v, mask=np.arange(9) < both_axes[..., None, None]), atol=1e-12)


@pytest.mark.parametrize("lengths", [np.array([3, 4]), np.array([[3], [4]]),
                                     np.zeros((3, 2, 1), dtype=int)])
def test_key_lengths_that_do_not_index_the_leading_axes_are_refused(lengths):
    """q's batch shape (3, 2): (2,) is neither 3 batch elements nor, any longer, 2 heads."""
    q = np.zeros((3, 2, 4, 5))
    for fn in (flash_attention, naive_attention):
        with pytest.raises(ValueError, match="key_lengths must index q's leading batch axes"):
            fn(q, q, q, key_lengths=lengths)
