"""flashlib.studies.intro: score-matrix bytes, measured memory of naive and flash attention; the
NEP 50 promotion (flashlib.studies.overflow).  (measure_peak itself:
tests/core/test_measure.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.core.checks import check_float_dtype
from flashlib.core.measure import measure_peak
from flashlib.studies.intro import (
    A100_SHARED_MEMORY,
    attention_times,
    naive_attention_memory,
    random_qkv,
    score_matrix_bytes,
)
from flashlib.studies.io_model import GPUS, sram_footprint, traffic
from flashlib.studies.overflow import scale_scores, scale_scores_promoting


def test_score_matrix_bytes():
    assert score_matrix_bytes(16384, dtype=np.float32) == 2**30
    assert score_matrix_bytes(100, 30, "float16", batch=2, heads=3) == 2 * 3 * 100 * 30 * 2
    assert score_matrix_bytes(0) == 0
    with pytest.raises(ValueError, match="n_q"):
        score_matrix_bytes(-1)
    for bad in (2.5, True, np.float64(3.0)):
        with pytest.raises(TypeError, match="n_q"):
            score_matrix_bytes(bad)
    for bad_dtype in (np.int8, np.longdouble):
        with pytest.raises(TypeError, match="dtype must be"):
            score_matrix_bytes(4, dtype=bad_dtype)


def test_random_qkv_shapes_and_seed():
    q, k, v = random_qkv(5, 3, np.float16)
    assert q.shape == k.shape == v.shape == (5, 3) and q.dtype == np.float16
    np.testing.assert_array_equal(random_qkv(5, 3, np.float16)[0], q)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_naive_attention_memory_is_one_score_matrix(dtype):
    """One (n, n) score matrix in the compute dtype: float16 inputs are computed in float32."""
    n = 256
    measured = naive_attention_memory(n, 16, dtype)
    predicted = score_matrix_bytes(n, n, np.float32 if dtype == np.float16 else dtype)
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
    _, promoted = measure_peak(scale_scores_promoting, s, 64)
    _, kept = measure_peak(scale_scores, s, 64)
    assert 1.9 <= promoted / kept <= 2.3  # plus numpy's casting buffer


@pytest.mark.parametrize(("args", "error", "match"), [
    ((0, 4), ValueError, "n must be"),
    ((4, -1), ValueError, "d must be"),
    ((4, 2.0), TypeError, "d must be"),
    ((True, 4), TypeError, "n must be"),
    ((4, 4, np.int32), TypeError, "dtype must be"),
    ((4, 4, "nonsense"), TypeError, "dtype must be"),
    ((4, 4, np.int8), TypeError, "dtype must be"),
    ((4, 4, np.longdouble), TypeError, "dtype must be"),
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


@pytest.mark.parametrize("bad", [np.int8, np.int64, bool, np.longdouble, np.complex128,
                                 "not a dtype"])
def test_check_float_dtype_refuses_non_float16_32_64(bad):
    with pytest.raises(TypeError, match="dtype_arg must be float16, float32 or float64"):
        check_float_dtype(bad, "dtype_arg")


@pytest.mark.parametrize("good", [np.float16, "float32", np.dtype(np.float64), float])
def test_check_float_dtype_accepts_float_dtypes(good):
    assert check_float_dtype(good, "dtype") == np.dtype(good)


A100 = GPUS["A100 (1.5 TB/s)"]


def test_attention_times_are_the_io_models_counts_over_the_gpus_rates():
    """The introduction's model: bytes (the IO model's counts) over the bandwidth, 4 n^2 d
    FLOPs over the peak, the same for both algorithms."""
    n, d, B = 1000, 64, 96  # n not a multiple of B: the count is the schedule's, not n^2 d / B
    t = attention_times(n, d, A100, B=B, itemsize=2)
    assert t["standard"]["compute"] == t["flash"]["compute"] == 4 * n * n * d / 312e12
    assert t["standard"]["memory"] == traffic("standard", n, n, d).total * 2 / 1.5e12
    assert t["flash"]["memory"] == traffic("v2", n, n, d, B_r=B, B_c=B).total * 2 / 1.5e12
    assert attention_times(n, d, A100, B=B, itemsize=4)["standard"]["memory"] == \
        2 * t["standard"]["memory"]


def test_attention_times_show_what_the_introduction_says():
    """Standard attention is memory-bound by about itemsize peak / (d bandwidth) at every
    long n; FlashAttention's memory term falls as 1 / B and crosses the compute term near
    B = itemsize peak / (2 bandwidth) (exercise 1.5: 208 on the A100 at 1.5 TB/s); blocks of
    16 move more than standard attention; blocks of 128 are the largest power of two whose
    step fits in one SM's shared memory in float16 at d = 64."""
    for n in (4096, 16384):
        t = attention_times(n, 64, A100, B=128)
        ratio = t["standard"]["memory"] / t["standard"]["compute"]
        assert ratio == pytest.approx(2 * 312e12 / (64 * 1.5e12), rel=0.03)
        flash = [attention_times(n, 64, A100, B=b)["flash"]["memory"] for b in (16, 64, 256)]
        assert flash[0] > t["standard"]["memory"] > flash[1] > flash[2]
    big = attention_times(2**16, 64, A100, B=208)["flash"]
    assert big["memory"] == pytest.approx(big["compute"], rel=0.03)

    def fits(b):
        return sum(sram_footprint("v2", b, b, 64).values()) * 2 <= A100_SHARED_MEMORY

    assert fits(128) and not fits(256)
    assert A100_SHARED_MEMORY == 164 * 1024 == A100.sram_per_sm  # one budget, one source


def test_one_sram_budget_everywhere():
    """The book's SRAM budget is one constant: the A100's 164 KB of shared memory per SM (not
    the 192 KB of L1 and shared memory together); every GPU entry and the intro use it."""
    from flashlib.studies import intro, io_model

    assert intro.A100_SHARED_MEMORY is io_model.A100_SHARED_MEMORY
    assert {g.sram_per_sm for n, g in io_model.GPUS.items() if "A100" in n} == {164 * 1024}
    assert io_model.A100_SHARED_PER_BLOCK == 163 * 1024
    assert io_model.H100_SHARED_MEMORY == 228 * 1024
    assert io_model.REGISTERS_PER_SM == 256 * 1024
    assert "164 KiB" in io_model.SRAM_BUDGET_NAME


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"n": 0}, ValueError, "n must be"), ({"d": 0}, ValueError, "d must be"),
    ({"B": 0}, ValueError, "B must be"), ({"itemsize": 0}, ValueError, "itemsize"),
    ({"itemsize": 2.0}, TypeError, "itemsize"),
])
def test_attention_times_refuses_bad_input(kwargs, error, match):
    args = {"n": 64, "d": 16, "B": 16, "itemsize": 2} | kwargs
    with pytest.raises(error, match=match):
        attention_times(args["n"], args["d"], A100, B=args["B"], itemsize=args["itemsize"])
