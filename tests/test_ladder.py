"""Every rung of the optimisation ladder is exact attention: float64 within 1e-12 of
flashlib.naive_attention, float32/float16 within twice naive's own error (or a rounding floor),
on awkward shapes, causal alignments, empty rows, and inputs that force the rescaling paths."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib import flash_attention, naive_attention
from flashlib.ladder import RESCALE_THRESHOLD, RUNGS, naive_inplace

FUNCS = [("naive_inplace", naive_inplace)] + RUNGS
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
def test_low_precision_within_twice_naive(label, fn, causal, dtype):
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, (2,), 45, 38, 16, 16)
    ref = naive_attention(q, k, v, causal=causal)  # float64
    naive_err = np.max(np.abs(naive_attention(*(x.astype(dtype) for x in (q, k, v)),
                                              causal=causal) - ref))
    o = _call(fn, *(x.astype(dtype) for x in (q, k, v)), 16, 8, causal)
    assert o.dtype == dtype
    floor = {np.float32: 1e-6, np.float16: 1e-3}[dtype]
    assert np.max(np.abs(o - ref)) <= max(2 * naive_err, floor), label


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("label", "fn"), FUNCS, ids=IDS)
def test_growing_maximum_takes_the_rescaling_paths(label, fn, dtype):
    """Keys whose scores grow by far more than RESCALE_THRESHOLD (and than log2 of the stale
    limit) along the sequence: rung 5 must rescale, rungs 6 and 7 must redo tiles."""
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, (2,), 50, 96, 16, 8, key_growth=40.0)
    s = naive_attention(q, k, v, return_lse=True)[1]
    assert np.ptp(s) > 2 * RESCALE_THRESHOLD  # the test really moves the maximum
    ref = naive_attention(q, k, v)
    naive_err = np.max(np.abs(naive_attention(*(x.astype(dtype) for x in (q, k, v))) - ref))
    o = _call(fn, *(x.astype(dtype) for x in (q, k, v)), 16, 8, False)
    tol = 1e-12 if dtype == np.float64 else max(2 * naive_err, 1e-6)
    assert np.max(np.abs(o - ref)) <= tol, label


def test_last_rung_is_the_library_function():
    assert RUNGS[-1][1] is flash_attention
    assert [label.split()[0] for label, _ in RUNGS] == [str(i) for i in range(len(RUNGS))]


@pytest.mark.parametrize(("label", "fn"), RUNGS, ids=[label for label, _ in RUNGS])
def test_rungs_validate_inputs(label, fn):
    q = np.zeros((4, 8))
    with pytest.raises(ValueError, match="block_q"):
        fn(q, q, q, block_q=0)
    with pytest.raises(TypeError, match="dtype"):
        fn(q.astype(np.int64), q, q)


# ---- the chapter's exercise checkers: pass the solutions, fail typical mistakes, specifically


def test_check_scores_base2():
    from flashlib.exercises_ladder import check_scores_base2
    from flashlib.flash import LOG2E

    good = check_scores_base2(lambda q, k, s: (q * q.dtype.type(s * LOG2E)) @ k.T)
    assert good.passed, good
    no_log2e = check_scores_base2(lambda q, k, s: (q * q.dtype.type(s)) @ k.T)
    assert not no_log2e.passed and "log2(e)" in str(no_log2e)
    promoted = check_scores_base2(lambda q, k, s: (q * np.float64(s * LOG2E)) @ k.T)
    assert not promoted.passed and "promote" in str(promoted)

    def todo(q, k, s):
        raise NotImplementedError

    assert "not attempted" in str(check_scores_base2(todo))


def test_check_pv_and_rowsum():
    from flashlib.exercises_ladder import check_pv_and_rowsum

    def good(p, v):
        out = p @ np.concatenate([v, np.ones(v.shape[:-1] + (1,))], axis=-1)
        return out[..., :-1], out[..., -1]

    assert check_pv_and_rowsum(good).passed
    swapped = check_pv_and_rowsum(lambda p, v: good(p, v)[::-1])
    assert not swapped.passed
    raising = check_pv_and_rowsum(lambda p, v: 1 / 0)
    assert "ZeroDivisionError" in str(raising)


def test_check_needs_rescale():
    from flashlib.exercises_ladder import check_needs_rescale

    assert check_needs_rescale(lambda m, t, th: t > m + th).passed
    non_strict = check_needs_rescale(lambda m, t, th: t >= m + th)
    assert not non_strict.passed and "strict" in str(non_strict)
    # m_tile - m_old gives NaN (and a warning) for -inf rows
    nan_based = check_needs_rescale(lambda m, t, th: (t - m) > th)
    assert not nan_based.passed


def test_check_causal_tiles():
    from flashlib.exercises_ladder import causal_tiles, check_causal_tiles

    assert check_causal_tiles(causal_tiles).passed
    everything = check_causal_tiles(lambda n, bq, bk: (-(-n // bq) * -(-n // bk), 0))
    assert not everything.passed and "skip" in str(everything)
    assert causal_tiles(4, 2, 2) == (3, 2)
    # and the count agrees with what flash_attention actually does
    from flashlib.masks import key_stop

    n, bq, bk = 100, 16, 24
    computed = sum(len(range(0, key_stop(i0, min(i0 + bq, n), n, 0), bk))
                   for i0 in range(0, n, bq))
    assert causal_tiles(n, bq, bk)[0] == computed
