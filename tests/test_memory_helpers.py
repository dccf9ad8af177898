"""flashlib.memory: tracemalloc peaks, score-matrix bytes, the NEP 50 promotion, timing."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from flashlib.memory import (
    measure_peak,
    median_seconds,
    naive_attention_memory,
    peak_memory,
    random_qkv,
    scale_scores,
    scale_scores_promoting,
    score_matrix_bytes,
)


def test_peak_memory_sees_a_numpy_allocation():
    nbytes = 1 << 20
    peak = peak_memory(np.ones, nbytes // 8)
    assert nbytes <= peak < nbytes + 64 * 1024


def test_peak_memory_counts_freed_temporaries():
    def temp_then_small():
        big = np.ones(1 << 18)  # 2 MiB, freed before returning
        return float(big.sum())

    result, peak = measure_peak(temp_then_small)
    assert result == float(1 << 18)
    assert peak >= 8 * (1 << 18)


def test_peak_memory_nests_inside_running_tracemalloc():
    tracemalloc.start()
    try:
        peak = peak_memory(np.zeros, 1 << 17)
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()
    assert peak >= 8 * (1 << 17)


def test_score_matrix_bytes():
    assert score_matrix_bytes(16384, dtype=np.float32) == 2**30
    assert score_matrix_bytes(100, 30, "float16", batch=2, heads=3) == 2 * 3 * 100 * 30 * 2
    assert score_matrix_bytes(0) == 0
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="n_q"):
            score_matrix_bytes(bad)


def test_random_qkv_shapes_and_seed():
    q, k, v = random_qkv(5, 3, np.float16)
    assert q.shape == k.shape == v.shape == (5, 3) and q.dtype == np.float16
    np.testing.assert_array_equal(random_qkv(5, 3, np.float16)[0], q)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_naive_attention_memory_is_one_score_matrix(dtype):
    n = 256
    measured = naive_attention_memory(n, 16, dtype)
    predicted = score_matrix_bytes(n, n, dtype)
    assert predicted <= measured <= 1.2 * predicted


def test_naive_attention_memory_grows_4x_per_doubling():
    a, b = naive_attention_memory(256, 16), naive_attention_memory(512, 16)
    assert 3.6 <= b / a <= 4.4


def test_promotion_pitfall_and_fix():
    s = np.ones((8, 8), dtype=np.float32)
    assert scale_scores_promoting(s, 64).dtype == np.float64  # NEP 50
    for dtype in (np.float16, np.float32, np.float64):
        x = np.full((3, 4), 8.0, dtype=dtype)
        y = scale_scores(x, 64)
        assert y.dtype == dtype
        np.testing.assert_array_equal(y, np.ones((3, 4), dtype=dtype))


def test_promotion_doubles_memory():
    s = np.ones((512, 512), dtype=np.float32)
    promoted = peak_memory(scale_scores_promoting, s, 64)
    kept = peak_memory(scale_scores, s, 64)
    assert 1.9 <= promoted / kept <= 2.3  # plus numpy's casting buffer


def test_median_seconds():
    t = median_seconds(sum, range(1000), repeat=3)
    assert 0 < t < 1
    with pytest.raises(ValueError, match="repeat"):
        median_seconds(sum, [], repeat=0)


@pytest.mark.parametrize(("args", "error", "match"), [
    ((0, 4), ValueError, "n must be"),
    ((4, -1), ValueError, "d must be"),
    ((4, 2.0), ValueError, "d must be"),
    ((4, 4, np.int32), TypeError, "dtype must be"),
    ((4, 4, "nonsense"), TypeError, "dtype must be"),
])
def test_random_qkv_refuses_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        random_qkv(*args)
    with pytest.raises(error, match=match):
        naive_attention_memory(*args)


def test_scale_scores_refuses_bad_input():
    with pytest.raises(TypeError, match="s must be"):
        scale_scores(np.ones((2, 2), dtype=np.int64), 4)
    with pytest.raises(ValueError, match="d must be"):
        scale_scores(np.ones((2, 2)), 0)
