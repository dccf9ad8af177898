"""Masks as predicates (flashlib.core.masks): the alignments, the window conventions, tile
classification from the predicate against the band the fast path keeps, and the fully-masked
row of the careless and the guarded kernel."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashlib import naive_attention
from flashlib.algorithms import masked_flash_forward
from flashlib.core.masks import (
    TILE_CLASSES,
    WINDOW_CONVENTIONS,
    band,
    band_tile_class,
    both,
    causal_bottom_right,
    causal_mask,
    causal_tiles,
    causal_top_left,
    classify_tiles,
    dense_mask,
    key_padding,
    sliding_window,
    tile_class,
    window_from,
)


def test_flash_attn_readme_examples():
    """flash-attn's README: causal=True is bottom-right aligned; 2 x 5 and 5 x 2."""
    two_by_five = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=bool)
    five_by_two = np.array([[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]], dtype=bool)
    assert (dense_mask(causal_bottom_right, 2, 5) == two_by_five).all()
    assert (dense_mask(causal_bottom_right, 5, 2) == five_by_two).all()
    # SDPA's is_causal (top-left): the first query sees the first key
    assert (dense_mask(causal_top_left, 2, 5) == np.tri(2, 5, dtype=bool)).all()
    for n_q, n_k in [(2, 5), (5, 2), (4, 4), (1, 7)]:
        assert (dense_mask(causal_top_left, n_q, n_k) == causal_mask(n_q, n_k, True)).all()
        assert (dense_mask(causal_bottom_right, n_q, n_k)
                == causal_mask(n_q, n_k, "bottom_right")).all()


def test_window_zero_right_is_causal_and_infinite_left():
    for n_q, n_k in [(3, 7), (7, 3), (5, 5)]:
        assert (dense_mask(sliding_window(None, 0), n_q, n_k)
                == dense_mask(causal_bottom_right, n_q, n_k)).all()
        assert (dense_mask(sliding_window(None, 0, align="top_left"), n_q, n_k)
                == dense_mask(causal_top_left, n_q, n_k)).all()
        assert dense_mask(sliding_window(None, None), n_q, n_k).all()
    band3 = dense_mask(sliding_window(1, 1, align="top_left"), 4, 4)
    assert band3.sum(axis=1).tolist() == [2, 3, 3, 2]


def test_key_padding_and_both():
    m = dense_mask(both(causal_top_left, key_padding(3)), 5, 6)
    assert m.sum(axis=1).tolist() == [1, 2, 3, 3, 3]
    assert not dense_mask(key_padding(0), 3, 4).any()


# The rule each library states in its own words, written literally (i query, j key).
LITERAL_RULES = {
    # flash-attn: window_size=(left, right), bottom-right: j in [i + n_k - n_q - left,
    # i + n_k - n_q + right]
    "flash-attn": lambda w: lambda i, j, n_q, n_k: (j >= i + n_k - n_q - w) & (j <= i + n_k - n_q),
    # Transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window, and causal
    "Transformers": lambda w: lambda i, j, n_q, n_k: (j > i - w) & (j <= i),
    # attention-gym's generate_sliding_window: q_idx - kv_idx <= w, and causal
    "attention-gym": lambda w: lambda i, j, n_q, n_k: (i - j <= w) & (i >= j),
}


@pytest.mark.parametrize("row", WINDOW_CONVENTIONS, ids=[r[0] for r in WINDOW_CONVENTIONS])
@pytest.mark.parametrize("w", [1, 2, 5])
def test_window_convention_table(row, w):
    library = row[0]
    for n_q, n_k in [(9, 9), (4, 9)] if library == "flash-attn" else [(9, 9)]:
        ours = dense_mask(window_from(library, w), n_q, n_k)
        theirs = dense_mask(LITERAL_RULES[library](w), n_q, n_k)
        assert (ours == theirs).all(), (library, w, n_q, n_k)


def test_w_tokens_including_the_current_one():
    """W tokens including the current one: flash-attn (W - 1, 0), Transformers W,
    attention-gym W - 1; every row of a square mask (past the start) sees exactly W keys."""
    W = 4
    masks = [dense_mask(window_from("flash-attn", W - 1), 10, 10),
             dense_mask(window_from("Transformers", W), 10, 10),
             dense_mask(window_from("attention-gym", W - 1), 10, 10)]
    for m in masks:
        assert (m == masks[0]).all()
        assert (m.sum(axis=1)[W - 1:] == W).all()
    with pytest.raises(ValueError, match="library"):
        window_from("xformers", 3)


@st.composite
def tiled_masks(draw):
    n_q, n_k = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    causal = draw(st.sampled_from([False, True, "bottom_right"]))
    left = draw(st.none() | st.integers(0, 12))
    right = draw(st.none() | st.integers(0, 12))
    window = draw(st.sampled_from([None, (left, right)]))
    length = draw(st.none() | st.integers(0, n_k))
    return dict(n_q=n_q, n_k=n_k, B_r=draw(st.integers(1, 16)), B_c=draw(st.integers(1, 16)),
                causal=causal, window=window, length=length)


def _predicate(causal, window, length):
    masks = []
    if causal is True:
        masks.append(causal_top_left)
    elif causal == "bottom_right":
        masks.append(causal_bottom_right)
    if window is not None:
        masks.append(sliding_window(*window))
    if length is not None:
        masks.append(key_padding(length))
    return both(*masks)


@given(tiled_masks())
def test_band_tile_class_matches_the_dense_mask(case):
    """The fast path's O(1) classification equals the predicate's, tile by tile."""
    n_q, n_k, B_r, B_c = case["n_q"], case["n_k"], case["B_r"], case["B_c"]
    visible = _predicate(case["causal"], case["window"], case["length"])
    lo, hi = band(n_q, n_k, case["causal"], case["window"])
    dense = dense_mask(visible, n_q, n_k)
    classes = classify_tiles(visible, n_q, n_k, B_r, B_c)
    for ti, i0 in enumerate(range(0, n_q, B_r)):
        for tj, j0 in enumerate(range(0, n_k, B_c)):
            i1, j1 = min(i0 + B_r, n_q), min(j0 + B_c, n_k)
            tile = dense[i0:i1, j0:j1]
            truth = "empty" if not tile.any() else "full" if tile.all() else "partial"
            assert TILE_CLASSES[classes[ti, tj]] == truth
            assert tile_class(visible, i0, i1, j0, j1, n_q, n_k) == truth
            assert band_tile_class(i0, i1, j0, j1, lo, hi, case["length"]) == truth


def test_causal_square_tile_counts():
    """Causal, square, T x T tiles: T (T + 1) / 2 computed, T of them partial (the diagonal)."""
    for n, B in [(64, 16), (4096, 128)]:
        T = n // B
        classes = classify_tiles(causal_top_left, n, n, B, B)
        counts = np.bincount(classes.ravel(), minlength=3)
        assert counts.tolist() == [T * (T - 1) // 2, T, T * (T - 1) // 2]
        assert causal_tiles(n, n, B, B)[:2] == (T * (T + 1) // 2, T)


@pytest.mark.parametrize("n_q, n_k, B_r, B_c", [(7, 5, 3, 2), (5, 7, 2, 3), (1, 9, 4, 4),
                                                (9, 1, 4, 4), (10, 10, 16, 16)])
def test_masked_flash_forward_matches_naive(n_q, n_k, B_r, B_c):
    rng = np.random.default_rng(0)
    Q, K, V = rng.standard_normal((n_q, 6)), rng.standard_normal((n_k, 6)), rng.standard_normal(
        (n_k, 3))
    for visible in [causal_top_left, causal_bottom_right, sliding_window(2, 1),
                    both(causal_bottom_right, key_padding(max(n_k - 2, 0)))]:
        mask = dense_mask(visible, n_q, n_k)
        O, L = masked_flash_forward(Q, K, V, visible, B_r, B_c)
        O_ref, L_ref = naive_attention(Q, K, V, mask=mask, return_lse=True)
        np.testing.assert_allclose(O, O_ref, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(L), np.isneginf(L_ref))
        np.testing.assert_allclose(L[~np.isneginf(L)], L_ref[~np.isneginf(L_ref)], atol=1e-12)
        assert (O[~mask.any(axis=1)] == 0).all()


def test_careless_kernel_gives_nan_and_the_guard_fixes_it():
    """Bottom-right, n_q > n_k: the first rows see no key.  Without the guard a partial tile
    holding such a row gives exp(-inf - (-inf)) = NaN; with it O = 0 and L = -inf there."""
    rng = np.random.default_rng(0)
    Q, K, V = rng.standard_normal((6, 4)), rng.standard_normal((3, 4)), rng.standard_normal((3, 2))
    with np.errstate(invalid="ignore"):
        O_bad, _ = masked_flash_forward(Q, K, V, causal_bottom_right, 4, 4, guard=False)
    blind = ~dense_mask(causal_bottom_right, 6, 3).any(axis=1)
    assert blind.tolist() == [True, True, True, False, False, False]
    assert np.isnan(O_bad[blind]).all()
    O, L = masked_flash_forward(Q, K, V, causal_bottom_right, 4, 4)
    assert (O[blind] == 0).all() and np.isneginf(L[blind]).all()
    assert np.isfinite(O).all()


# --- window bounds of any size, the alignment rule, padded sequences -------------------------


@pytest.mark.parametrize("bound", [2**63 - 1, 2**63, 10**30, np.uint64(2**64 - 1)], ids=str)
def test_predicates_and_bands_take_bounds_of_any_size(bound):
    """int64 arithmetic on the bound wrapped around (sliding_window(0, 2**63 - 1) hid keys) or
    raised OverflowError; a bound this large is no bound."""
    for align in ("bottom_right", "top_left"):
        assert (dense_mask(sliding_window(0, bound, align), 4, 3)
                == dense_mask(sliding_window(0, None, align), 4, 3)).all()
        assert (dense_mask(sliding_window(bound, bound, align), 4, 3)).all()
    assert dense_mask(key_padding(bound), 2, 5).all()
    for causal in (False, True, "bottom_right"):
        assert band(4, 3, causal, (0, bound)) == band(4, 3, causal, (0, None))
        assert band(4, 3, causal, (bound, 0)) == band(4, 3, causal, (None, 0))


def test_band_bounds_clamp_at_the_longest_side():
    """A bound of max(n_q, n_k) or more hides no key: None; one less still may."""
    for n_q, n_k in [(4, 10), (10, 4), (6, 6)]:
        widest = max(n_q, n_k)
        for causal in (False, True):
            lo, hi = band(n_q, n_k, causal, (widest, widest))
            assert lo is None and hi == (None if not causal else band(n_q, n_k, causal)[1])
            want = both(causal_top_left if causal else (lambda i, j, a, b: True),
                        sliding_window(widest - 1, widest - 1,
                                       "top_left" if causal else "bottom_right"))
            lo, hi = band(n_q, n_k, causal, (widest - 1, widest - 1))
            i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
            from_band = np.ones((n_q, n_k), bool)
            if lo is not None:
                from_band &= j >= i + lo
            if hi is not None:
                from_band &= j <= i + hi
            assert (from_band == dense_mask(want, n_q, n_k)).all()


def test_alignment_rule():
    from flashlib.core.masks import ALIGNMENT_RULES, alignment

    assert [alignment(c) for c in (True, "top_left", np.True_, False, None, "bottom_right")] \
        == ["top_left"] * 3 + ["bottom_right"] * 3
    with pytest.raises(ValueError, match="causal must be"):
        alignment("upper_left")
    assert len(ALIGNMENT_RULES) == 5 and all(len(row) == 3 for row in ALIGNMENT_RULES)
    # causal=True with a window: one top-left band (it used to hide every key when n_q < n_k)
    assert band(4, 10, True, (2, 0)) == (-2, 0)
    assert band(4, 10, "bottom_right", (2, 0)) == (4, 6)
    assert band(4, 10, False, (2, 1)) == (4, 7)


def test_padded_sequences_and_sequence_bands():
    from flashlib.core.masks import padded, sequence_bands

    # the padded sequence's mask is its unpadded self's, then no padded key
    m = dense_mask(padded(causal_bottom_right, 5), 3, 8)
    assert (m[:, :5] == dense_mask(causal_bottom_right, 3, 5)).all() and not m[:, 5:].any()
    # top-left masks do not move: padded == AND key_padding
    assert (dense_mask(padded(causal_top_left, 5), 3, 8)
            == dense_mask(both(causal_top_left, key_padding(5)), 3, 8)).all()
    lengths = np.array([8, 5, 0])
    lo, hi, bands = sequence_bands("bottom_right", (2, 0), 3, 8, lengths)
    assert bands.tolist() == [[3, 5], [0, 2], [-5, -3]] and (lo, hi) == (-5, 5)
    for b, n in enumerate(lengths):
        assert band(3, 8, "bottom_right", (2, 0), length=int(n)) == tuple(bands[b])
    # one band for all: top-left calls, no band, all lengths full
    assert sequence_bands(True, (2, 0), 3, 8, lengths)[2] is None
    assert sequence_bands(False, None, 3, 8, lengths)[2] is None
    assert sequence_bands("bottom_right", None, 3, 8, np.array([8, 8]))[2] is None


@pytest.mark.parametrize("call, err, match", [
    (lambda: sliding_window(-1, 0), ValueError, r"window\[0\]"),
    (lambda: sliding_window(0, 1.5), TypeError, r"window\[1\]"),
    (lambda: sliding_window(0, 0, align="middle"), ValueError, "align"),
    (lambda: key_padding(-1), ValueError, "length"),
    (lambda: key_padding(2.0), TypeError, "length"),
    (lambda: dense_mask(causal_top_left, -1, 3), ValueError, "n_q"),
    (lambda: dense_mask(causal_top_left, 3, 2.5), TypeError, "n_k"),
    (lambda: classify_tiles(causal_top_left, 4, 4, 0, 2), ValueError, "B_r"),
    (lambda: window_from("Transformers", 0), ValueError, "w must be a positive integer"),
    (lambda: window_from("flash-attn", -1), ValueError, "w must be a non-negative"),
    (lambda: band(3, 5, length=6), ValueError, "length"),
    (lambda: dense_mask(None, 3, 3), TypeError, "visible must be a mask predicate"),
    (lambda: both(causal_top_left, None), TypeError, r"masks\[1\] must be a mask predicate")])
def test_bad_mask_arguments(call, err, match):
    with pytest.raises(err, match=match):
        call()
