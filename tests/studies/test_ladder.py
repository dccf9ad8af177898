"""Every rung of the optimisation ladder is exact attention: float64 within 1e-12 of
flashlib.naive_attention, float32/float16 within twice the error of plain attention in the same
dtype (flash-attn's rule, tests/conftest.py's plain_attention) or a rounding floor,
on awkward shapes, causal alignments, empty rows, and inputs that force the rescaling paths."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib import flash_attention, naive_attention
from flashlib.core.constants import LOG2E
from flashlib.core.masks import band_hides, causal_mask, causal_tiles, straddles_diagonal
from flashlib.fast.forward import STALE_LIMIT
from flashlib.studies.ladder import (
    CHAPTER_RUNGS,
    RESCALE_THRESHOLD,
    RUNGS,
    THREADS_RUNG,
    flash2_in_matmul,
    naive_inplace,
)
from tests.helpers import assert_error_within, plain_attention

FUNCS = [("naive_inplace", naive_inplace)] + RUNGS + [THREADS_RUNG]
IDS = [label for label, _ in FUNCS]

# lead, n_q, n_k, d, d_v, block_q, block_k, causal
SHAPES = [
    ((), 1, 1, 1, 1, 1, 1, False),
    ((), 37, 53, 8, 5, 16, 8, False),
    ((2, 3), 33, 33, 16, 16, 8, 16, True),
    ((2,), 40, 24, 8, 8, 16, 8, "bottom_right"),  # n_q > n_k: 16 rows see no key
    ((2,), 24, 40, 8, 12, 8, 16, "top_left"),
    ((3,), 65, 64, 4, 4, 64, 64, True),  # one block plus one ragged row
    ((), 7, 9, 3, 2, 100, 100, "bottom_right"),  # blocks larger than the problem
]


def _qkv(rng, lead, n_q, n_k, d, d_v, dtype=np.float64, key_growth=None):
    q = rng.standard_normal((*lead, n_q, d))
    k = rng.standard_normal((*lead, n_k, d))
    v = rng.standard_normal((*lead, n_k, d_v))
    if key_growth is not None:  # later keys score ever higher: the running max keeps growing
        k *= np.linspace(0.1, key_growth, n_k)[:, None]
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _call(fn, q, k, v, b_r, b_c, causal):
    if fn is naive_inplace:
        return fn(q, k, v, causal=causal)
    return fn(q, k, v, block_q=b_r, block_k=b_c, causal=causal)


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s[:-1]) + str(s[-1]) for s in SHAPES])
@pytest.mark.parametrize(("label", "fn"), FUNCS, ids=IDS)
def test_float64_exact(label, fn, shape):
    lead, n_q, n_k, d, d_v, b_r, b_c, causal = shape
    q, k, v = _qkv(np.random.default_rng(0), lead, n_q, n_k, d, d_v)
    o = _call(fn, q, k, v, b_r, b_c, causal)
    ref = naive_attention(q, k, v, causal=causal)
    assert o.shape == ref.shape and o.dtype == np.float64
    assert np.all(np.isfinite(o))
    assert np.max(np.abs(o - ref), initial=0.0) <= 1e-12, label


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize(("label", "fn"), FUNCS, ids=IDS)
def test_low_precision_within_twice_plain(label, fn, causal, dtype):
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, (2,), 45, 38, 16, 16, dtype=dtype)
    ref = naive_attention(*(x.astype(np.float64) for x in (q, k, v)), causal=causal)
    o = _call(fn, q, k, v, 16, 8, causal)
    assert o.dtype == dtype
    floor = {np.float32: 1e-6, np.float16: 1e-3}[dtype]  # not scaled by max|ref|
    assert_error_within(o, plain_attention(q, k, v, causal=causal), ref, floor=floor,
                        label=label)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("label", "fn"), FUNCS, ids=IDS)
def test_growing_maximum_takes_the_rescaling_paths(label, fn, dtype):
    """Keys whose scores grow by far more than RESCALE_THRESHOLD (and than log2 of the stale
    limit) along the sequence: rung 5 must rescale, rungs 6 and 7 must redo tiles, rungs 8 to
    10 move m_i up."""
    rng = np.random.default_rng(2)
    b_r, b_c = 16, 8
    q, k, v = _qkv(rng, (2,), 50, 96, 16, 8, key_growth=40.0)
    # the test really moves the maximum: along every row, the base-2 scores of the last key
    # block top those of the first by more than RESCALE_THRESHOLD (rung 5 rescales), and in
    # most rows by more than log2(STALE_LIMIT) (rungs 6 and 7 redo a tile, later ones move m_i)
    s2 = (q @ k.swapaxes(-1, -2)) / np.sqrt(q.shape[-1]) * LOG2E
    growth = s2[..., -b_c:].max(axis=-1) - s2[..., :b_c].max(axis=-1)
    assert np.all(growth > RESCALE_THRESHOLD), growth.min()
    assert np.mean(growth > np.log2(STALE_LIMIT)) > 0.9
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    ref = naive_attention(*(x.astype(np.float64) for x in (q, k, v)))
    o = _call(fn, q, k, v, b_r, b_c, False)
    if dtype == np.float64:
        assert np.max(np.abs(o - ref)) <= 1e-12, label
    else:
        assert_error_within(o, plain_attention(q, k, v), ref, floor=1e-6, label=label)


def test_last_rung_is_the_library_function():
    assert RUNGS[-1][1] is flash_attention
    assert [label.split()[0] for label, _ in RUNGS + [THREADS_RUNG]] == [
        str(i) for i in range(len(RUNGS) + 1)]


@pytest.mark.parametrize(("label", "fn"), RUNGS + [THREADS_RUNG],
                         ids=[label for label, _ in RUNGS + [THREADS_RUNG]])
def test_rungs_validate_inputs(label, fn):
    q = np.zeros((4, 8))
    with pytest.raises(ValueError, match="block_q"):
        fn(q, q, q, block_q=0)
    with pytest.raises(TypeError, match="dtype"):
        fn(q.astype(np.int64), q, q)


# n_q, n_k, block_q, block_k, causal
TILE_CASES = [
    (4, 4, 2, 2, True), (100, 100, 16, 24, True), (10, 10, 3, 4, "top_left"),
    (5, 5, 8, 8, True), (37, 53, 8, 16, True), (37, 53, 8, 16, "bottom_right"),
    (53, 37, 16, 8, "bottom_right"), (40, 24, 16, 8, "bottom_right"), (33, 17, 5, 7, False),
    (0, 9, 4, 4, True), (9, 0, 4, 4, "bottom_right"), (1, 1, 1, 1, True),
]


@pytest.mark.parametrize("case", TILE_CASES, ids=[str(c) for c in TILE_CASES])
def test_causal_tiles_counts_the_tiles_the_mask_leaves(case):
    """computed: the tiles with a visible entry; masked: those that also hide one; total:
    all of them.  Checked against the full (n_q, n_k) causal mask, cut into tiles."""
    n_q, n_k, b_r, b_c, causal = case
    visible = causal_mask(n_q, n_k, causal)
    tiles = [visible[i0:i0 + b_r, j0:j0 + b_c]
             for i0 in range(0, n_q, b_r) for j0 in range(0, n_k, b_c)]
    computed = sum(bool(t.any()) for t in tiles)
    masked = sum(bool(t.any() and not t.all()) for t in tiles)
    assert causal_tiles(n_q, n_k, b_r, b_c, causal) == (computed, masked, len(tiles))


def test_causal_tiles_values_and_validation():
    assert causal_tiles(4, 4, 2, 2) == (3, 2, 4)
    assert causal_tiles(4096, 4096, 128, 64) == (1056, 64, 2048)  # 32 row blocks x (2i + 2)
    assert causal_tiles(10, 10, 3, 4, causal=False) == (12, 0, 12)
    with pytest.raises(ValueError, match="block_q"):
        causal_tiles(8, 8, 0, 4)
    with pytest.raises(TypeError, match="block_k"):
        causal_tiles(8, 8, 4, 2.5)
    with pytest.raises(ValueError, match="n_q"):
        causal_tiles(-1, 8, 4, 4)
    with pytest.raises(ValueError, match="causal"):
        causal_tiles(8, 8, 4, 4, causal="diagonal")


@pytest.mark.parametrize("case", [c for c in TILE_CASES if c[0] and c[1]],
                         ids=[str(c) for c in TILE_CASES if c[0] and c[1]])
def test_causal_tiles_is_what_flash_attention_visits(case, monkeypatch):
    """flash_attention asks band_hides once per group of query blocks it multiplies with a key
    block: count the tiles of those calls, and the masked ones among them."""
    import flashlib.fast.bounded
    import flashlib.fast.row_group

    n_q, n_k, b_r, b_c, causal = case
    seen = []

    def counting(i0, i1, j0, j1, lo, hi):
        assert i0 % b_r == 0
        tiles = [band_hides(a, min(a + b_r, i1), j0, j1, lo, hi) for a in range(i0, i1, b_r)]
        assert tiles == [straddles_diagonal(a, j1, hi) for a in range(i0, i1, b_r)]
        seen.extend(tiles)
        return band_hides(i0, i1, j0, j1, lo, hi)

    for path in (flashlib.fast.bounded, flashlib.fast.row_group):  # either path's loop
        monkeypatch.setattr(path, "band_hides", counting)
    x = np.random.default_rng(0).standard_normal((max(n_q, n_k), 4))
    flash_attention(x[:n_q], x[:n_k], x[:n_k], block_q=b_r, block_k=b_c, causal=causal)
    computed, masked, _ = causal_tiles(n_q, n_k, b_r, b_c, causal)
    assert (len(seen), sum(seen)) == (computed, masked)


# ---- the chapter's rungs: flash2_forward and the two steps shown as diffs from it ------------

CHAPTER_SHAPES = [  # H, n_q, n_k, d, d_v, B_r, B_c
    (1, 1, 1, 1, 1, 1, 1),
    (2, 37, 53, 8, 5, 16, 8),  # n not a multiple of the block, n_q != n_k
    (3, 65, 64, 4, 4, 64, 64),  # one block plus one ragged row
    (2, 7, 9, 3, 2, 100, 100),  # blocks larger than the problem
    (2, 100, 7, 8, 3, 3, 5),
]


@pytest.mark.parametrize("shape", CHAPTER_SHAPES, ids=str)
@pytest.mark.parametrize(("label", "fn"), CHAPTER_RUNGS, ids=[x for x, _ in CHAPTER_RUNGS])
def test_chapter_rungs_float64_exact(label, fn, shape):
    h, n_q, n_k, d, d_v, b_r, b_c = shape
    q, k, v = _qkv(np.random.default_rng(0), (h,), n_q, n_k, d, d_v)
    o, lse = fn(q, k, v, b_r, b_c)
    ref_o, ref_lse = naive_attention(q, k, v, return_lse=True)
    assert o.dtype == lse.dtype == np.float64 and o.shape == ref_o.shape
    np.testing.assert_allclose(o, ref_o, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("label", "fn"), CHAPTER_RUNGS, ids=[x for x, _ in CHAPTER_RUNGS])
def test_chapter_rungs_float32_growing_and_large_logits(label, fn):
    """A running maximum that keeps growing and logits 30 times the usual scale send
    flash2_in_matmul through its exact step and its overflow check; float32 stays within twice
    plain attention's error, with no warning."""
    rng = np.random.default_rng(1)
    for key_growth, big in ((30.0, 1.0), (None, 30.0)):
        q, k, v = _qkv(rng, (2,), 70, 90, 16, 8, key_growth=key_growth)
        q = q * big
        ref = naive_attention(q, k, v)
        q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            o, _ = fn(q32, k32, v32, 16, 32)
        assert o.dtype == np.float32
        assert_error_within(o, ref, plain_attention(q32, k32, v32))


def test_in_matmul_takes_the_stale_step():
    """The stale step is the point of flash2_in_matmul: at ordinary logits most tiles skip the
    exact step's max pass (counted through the ufunc np.maximum it calls)."""
    q, k, v = _qkv(np.random.default_rng(2), (2,), 64, 256, 8, 8)
    calls = []
    real = np.maximum

    class Spy:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def maximum(*a, **kw):
            calls.append(1)
            return real(*a, **kw)

    import flashlib.studies.ladder as ladder

    saved = ladder.np
    ladder.np = Spy()
    try:
        flash2_in_matmul(q, k, v, 16, 16)
    finally:
        ladder.np = saved
    assert len(calls) == 64 // 16  # one exact step per query block: the first tile
