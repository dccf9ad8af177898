"""flashlib.studies.precision: rounding with ml_dtypes, emulated accumulators, attention with cast
points, and the facts the Precision chapter states (each measured here)."""

from __future__ import annotations

import functools
import math
import warnings
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import flashlib
from flashlib.book.chapters.precision import precision_table
from flashlib.core.accuracy import assert_error_within, error_stats
from flashlib.studies.precision import (
    CAST_POINTS,
    DTYPES,
    NUMBER_LINE_DTYPES,
    Casts,
    accumulate,
    as_dtype,
    attention_magnitudes,
    block_size_sweep,
    dot,
    error_budget,
    flash2_forward_with_casts,
    length_sweep,
    matmul,
    number_line,
    random_inputs,
    round_to,
    saturate_to,
    spacing,
    standard_attention_with_casts,
)
from tests.helpers import plain_attention

NARROW = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


def _rounded(rng, n, d, dtype, n_k=None, d_v=None, scale=1.0):
    Q, K, V = random_inputs(n, d, rng, n_k=n_k, d_v=d_v, scale=scale)
    return tuple(round_to(X, dtype) for X in (Q, K, V))


def _ref(Q, K, V):
    return standard_attention_with_casts(Q, K, V, Casts.exact())


# ---- rounding and the number lines ----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_round_to_is_the_cast_away_from_double_rounding_ties(dtype, rng):
    x = np.concatenate([rng.standard_normal(500) * 10.0 ** rng.integers(-6, 6, 500),
                        [0.0, -0.0, 1e6, -1e9, 500.0, np.inf, -np.inf, np.nan]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = x.astype(as_dtype(dtype)).astype(np.float64)
    got = round_to(x, dtype)  # no warning (pytest turns warnings into errors)
    assert got.dtype == np.float64 and got.shape == x.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(round_to(got, dtype), got)  # idempotent


def _finite_values(dtype):
    """Every finite value of a 16- or 8-bit ``dtype``, sorted, with its bit pattern (-0 left
    out)."""
    dt = as_dtype(dtype)
    bits = np.arange(2 ** (8 * dt.itemsize), dtype=np.uint16 if dt.itemsize == 2 else np.uint8)
    with np.errstate(invalid="ignore"):  # the NaN patterns
        values = bits.view(dt).astype(np.float64)
    keep = np.isfinite(values) & ~((values == 0) & np.signbit(values))
    order = np.argsort(values[keep], kind="stable")
    return values[keep][order], bits[keep][order]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_round_to_rounds_once_to_the_nearest_value(dtype):
    """Against brute force over every value of the format, at the midpoints between neighbours
    and 2**-30 (relative) to either side of them: ml_dtypes' cast of float64 goes through
    float32 and rounded 1 + 2**-8 + 2**-30 to 1.0 in bfloat16 (the nearest is 1 + 2**-7)."""
    values, bits = _finite_values(dtype)
    mid = (values[:-1] + values[1:]) / 2
    x = np.concatenate([mid, mid * (1 + 2.0**-30), mid * (1 - 2.0**-30), values])
    x = x[np.abs(x) <= values[-1]]
    i = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    lo, hi = values[i - 1], values[i]
    tie = (x - lo) == (hi - x)
    even_hi = (bits[i] & 1) == 0
    want = np.where(tie, np.where(even_hi, hi, lo), np.where(x - lo < hi - x, lo, hi))
    got = round_to(x, dtype)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(x[j], got[j], want[j]) for j in bad[:5]]
    assert round_to(1 + 2**-8 + 2**-30, "bfloat16") == 1 + 2**-7


def test_round_to_accepts_dtypes_in_every_spelling():
    for spelling in ("bfloat16", ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16)):
        assert round_to(1 + 2**-9, spelling) == 1.0  # ties to even
    assert round_to(np.float16(3.0), np.float32) == 3.0
    assert round_to([[1.0, 2.0]], "float16").shape == (1, 2)
    for bad in ("float128", np.int32, "int8", None, "bf16"):
        with pytest.raises(TypeError, match="dtype must be one of"):
            round_to(1.0, bad)
    with pytest.raises(TypeError, match="x must"):
        round_to(np.array(["a"]), "float16")


def test_float8_overflow_nan_and_saturation():
    """500 in float8_e4m3fn: NaN from the plain cast (the format has no inf), 448 saturated."""
    assert np.isnan(round_to(500.0, "float8_e4m3fn"))
    assert saturate_to(500.0, "float8_e4m3fn") == 448.0
    np.testing.assert_array_equal(saturate_to([-1e9, np.inf, 3.0], "float8_e4m3fn"),
                                  [-448.0, 448.0, 3.0])
    assert np.isnan(saturate_to(np.nan, "float8_e4m3fn"))
    assert round_to(1e6, "float8_e5m2") == np.inf and round_to(1e6, "float16") == np.inf
    assert saturate_to(1e6, "float8_e5m2") == 57344.0


def test_number_lines():
    facts = {line.name: line for line in map(number_line, NUMBER_LINE_DTYPES)}
    assert list(facts) == list(NUMBER_LINE_DTYPES)
    want = {  # eps, max, smallest normal
        "float32": (2.0**-23, float(np.finfo(np.float32).max), 2.0**-126),
        "float16": (2.0**-10, 65504.0, 2.0**-14),
        "bfloat16": (2.0**-7, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 2.0**-126),
        "float8_e4m3fn": (2.0**-3, 448.0, 2.0**-6),
        "float8_e5m2": (2.0**-2, 57344.0, 2.0**-14),
    }
    for name, (eps, top, normal) in want.items():
        line = facts[name]
        assert (line.eps, line.max, line.smallest_normal) == (eps, top, normal), name
        assert line.eps == 2.0**-line.mantissa_bits
        assert 0 < line.smallest_subnormal < line.smallest_normal
        assert round_to(line.max, name) == line.max
        assert round_to(1 + line.eps, name) == 1 + line.eps
        assert round_to(1 + line.eps / 2, name) == 1.0  # the tie goes to even
    assert facts["bfloat16"].bits == facts["float16"].bits == 16
    assert facts["float8_e5m2"].bits == 8


def test_spacing():
    assert spacing(1.0, "bfloat16") == 2.0**-7
    assert spacing(-0.3, "float16") == 2.0**-12
    assert spacing(300.0, "float8_e4m3fn") == 32.0
    np.testing.assert_array_equal(spacing([1.0, 2.0], "float32"), [2.0**-23, 2.0**-22])


# ---- accumulators ---------------------------------------------------------------------------

def test_summing_a_tenth_4096_times():
    """The chapter's fact: 4096 x 0.1 in a bfloat16 accumulator is 32, not 409.6; float32
    drifts in the fourth digit; float64 is right."""
    x, ones = np.full(4096, 0.1), np.ones(4096)
    assert dot(x, ones, "bfloat16") == 32.0
    assert accumulate(x[None], "bfloat16")[0, 0] == 32.0
    assert matmul(x[None], ones[:, None], "bfloat16")[0, 0] == 32.0
    f32 = dot(x, ones, "float32")
    assert f32 != 409.6 and abs(f32 - 409.6) < 0.05
    assert abs(dot(x, ones, "float64") - 409.6) < 1e-9


@pytest.mark.parametrize("acc", NARROW + ("float32",))
def test_accumulate_and_matmul_round_each_addition(acc, rng):
    A = rng.standard_normal((3, 17))
    B = rng.standard_normal((17, 4))
    start = rng.standard_normal((3, 4))
    for i in range(3):
        want = dot(A[i], np.ones(17), acc)
        assert accumulate(A, acc, axis=1)[i, 0] == want
        assert accumulate(A.T, acc, axis=0)[0, i] == want
    got = matmul(A, B, acc, start=start if acc != "float32" else None)
    assert got.shape == (3, 4) and got.dtype == np.float64
    if acc == "float32":  # a float32 matmul, BLAS's order
        np.testing.assert_array_equal(
            got, (A.astype(np.float32) @ B.astype(np.float32)).astype(np.float64))
        return
    for i in range(3):
        for j in range(4):
            total = float(round_to(start[i, j], acc))
            for p in range(17):
                total = float(round_to(total + A[i, p] * B[p, j], acc))
            assert got[i, j] == total or (np.isnan(got[i, j]) and np.isnan(total))


def test_float64_accumulators_are_plain_sums(rng):
    A, B = rng.standard_normal((5, 6)), rng.standard_normal((6, 7))
    np.testing.assert_allclose(matmul(A, B, "float64"), A @ B, rtol=0, atol=1e-14)
    np.testing.assert_allclose(accumulate(A, "float64", start=np.ones((5, 1))),
                               1 + A.sum(axis=1, keepdims=True), rtol=0, atol=1e-14)
    assert accumulate(np.zeros((2, 0)), "bfloat16").shape == (2, 1)


def test_accumulator_bad_inputs():
    with pytest.raises(ValueError, match="A and B"):
        matmul(np.ones((2, 3)), np.ones((2, 3)), "float32")
    with pytest.raises(TypeError, match="acc must be one of"):
        matmul(np.ones((2, 3)), np.ones((3, 2)), "int8")
    with pytest.raises(ValueError, match="axis"):
        accumulate(np.ones((2, 3)), "float16", axis=2)
    with pytest.raises(TypeError, match="axis"):
        accumulate(np.ones((2, 3)), "float16", axis=1.0)


# ---- attention with cast points -------------------------------------------------------------

SHAPES = [  # n_q, n_k, d, d_v, B_c: ragged, one row, a block larger than n, n_q != n_k
    (37, 53, 16, 8, 16), (1, 9, 4, 4, 4), (12, 7, 8, 8, 64), (64, 64, 32, 32, 64),
    (5, 130, 16, 24, 32),
]


@pytest.mark.parametrize(("n_q", "n_k", "d", "d_v", "B_c"), SHAPES)
def test_float64_casts_are_exact_attention(n_q, n_k, d, d_v, B_c, rng):
    Q, K, V = random_inputs(n_q, d, rng, n_k=n_k, d_v=d_v, scale=2.0)
    ref = flashlib.naive_attention(Q, K, V)
    for O in (standard_attention_with_casts(Q, K, V, Casts.exact()),
              flash2_forward_with_casts(Q, K, V, B_c, Casts.exact())):
        assert O.shape == (n_q, d_v)
        np.testing.assert_allclose(O, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("n_q", "n_k", "d", "d_v", "B_c"), SHAPES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_flash_casts_meet_the_2x_rule(n_q, n_k, d, d_v, B_c, dtype, rng):
    """FlashAttention-2's casts against plain attention in the same dtype, both standard and
    tiled, reference float64 on the rounded inputs (flash-attn's convention)."""
    Q, K, V = _rounded(rng, n_q, d, dtype, n_k=n_k, d_v=d_v)
    ref = _ref(Q, K, V)
    plain = standard_attention_with_casts(Q, K, V, Casts.plain(dtype))
    for O in (standard_attention_with_casts(Q, K, V, Casts.flash(dtype)),
              flash2_forward_with_casts(Q, K, V, B_c, Casts.flash(dtype))):
        assert_error_within(O, plain, ref, dtype=dtype)


def test_plain_float16_is_the_tests_baseline(rng):
    """Casts.plain("float16") and tests/conftest.py's plain_attention model the same thing
    (they differ in where the scale is applied): each within 2x of the other's error."""
    Q, K, V = _rounded(rng, 200, 64, "float16", n_k=300)
    ref = _ref(Q, K, V)
    ours = standard_attention_with_casts(Q, K, V, Casts.plain("float16"))
    theirs = plain_attention(*(X.astype(np.float16) for X in (Q, K, V)))
    assert_error_within(ours, theirs, ref, floor=0.0)
    assert_error_within(theirs, ours, ref, floor=0.0)


def test_casts_validation_and_presets():
    assert CAST_POINTS == ("inputs", "S", "P", "acc", "m", "l", "O", "compute")
    assert Casts.exact() == Casts()
    flash = Casts.flash(ml_dtypes.bfloat16)
    assert (flash.inputs, flash.S, flash.P, flash.acc, flash.l, flash.O) == (
        "bfloat16", "float32", "bfloat16", "float32", "float32", "bfloat16")
    assert Casts.plain("float16").S == "float16" and Casts.plain("float16").acc == "float32"
    assert Casts.everything("float16").l == "float16"
    assert flash.replace(l=np.float16).l == "float16"
    with pytest.raises(TypeError, match="Casts.acc must be one of"):
        Casts(acc="int8")
    with pytest.raises(TypeError, match="casts must be"):
        error_budget(*random_inputs(4, 4, np.random.default_rng(0)), casts="bfloat16")


@pytest.mark.parametrize("bad", [
    dict(Q=np.ones((3, 4, 1))), dict(K=np.ones((5, 3))), dict(V=np.ones((4, 4))),
    dict(Q=np.ones((0, 4))), dict(Q=np.full((3, 4), np.nan)),
])
def test_bad_problems(bad):
    args = dict(Q=np.ones((3, 4)), K=np.ones((5, 4)), V=np.ones((5, 2)))
    args.update(bad)
    with pytest.raises(ValueError, match="Q, K, V"):
        error_budget(args["Q"], args["K"], args["V"], Casts.flash("float16"))


def test_random_inputs():
    rng = np.random.default_rng(0)
    Q, K, V = random_inputs(100, 8, rng, n_k=50, d_v=3, scale=2.0, outlier=10.0, rate=0.05)
    assert Q.shape == (100, 8) and K.shape == (50, 8) and V.shape == (50, 3)
    assert np.max(np.abs(Q)) > 15  # outliers present
    for kwargs, match in ((dict(scale=-1.0), "scale"), (dict(outlier=np.inf), "outlier"),
                          (dict(rate=2.0), "rate")):
        with pytest.raises(ValueError, match=match):
            random_inputs(4, 4, rng, **kwargs)
    with pytest.raises(TypeError, match="rng"):
        random_inputs(4, 4, 0)


# ---- the chapter's facts --------------------------------------------------------------------

@pytest.fixture(scope="module")
def budget():
    Q, K, V = random_inputs(256, 32, np.random.default_rng(0))
    return (error_budget(Q, K, V, Casts.everything("bfloat16"), B_c=32),
            error_budget(Q, K, V, Casts.flash("bfloat16"), B_c=32))


def test_error_budget_attributes_the_error(budget):
    everything, flash = budget
    rows = {r.point: r for r in everything}
    assert [r.point for r in everything] == ["inputs", "S", "P", "acc", "m", "l", "O", "compute"]
    assert rows["m"].standard_alone.max < 1e-12 and rows["m"].tiled_alone.max < 1e-12
    half = max(rows[p].tiled_alone.max for p in ("inputs", "S", "P", "O"))
    for kept in ("acc", "l"):  # what is kept decides the error
        assert rows[kept].tiled_alone.max > 3 * half
        assert rows[kept].standard_alone.max > 3 * half
    f = {r.point: r for r in flash}
    for point in ("S", "acc", "m", "l", "compute"):  # float32: nothing measurable
        assert f[point].tiled_alone.max < 1e-5, point
    # the last cumulative row is the total: the casts computed directly
    Q, K, V = random_inputs(256, 32, np.random.default_rng(0))
    ref = _ref(Q, K, V)
    total = error_stats(flash2_forward_with_casts(Q, K, V, 32, Casts.flash("bfloat16")), ref)
    assert flash[-1].tiled_cumulative == total


def test_tiling_adds_no_error(rng):
    """Flat against the block size: every B_c within 1.5x of standard attention's error."""
    Q, K, V = random_inputs(256, 32, rng)
    rows = block_size_sweep(Q, K, V, Casts.flash("bfloat16"), [1, 8, 32, 100, 256, 1000])
    standard = rows[0].standard
    for row in rows:
        assert row.standard == standard
        assert row.tiled.rms <= 1.5 * standard.rms and row.tiled.max <= 1.5 * standard.max
        assert row.tiled.max <= 2 * row.plain.max  # and within the 2x rule


def test_error_against_n():
    """FlashAttention-2's casts stay within the 2x rule as n grows; keeping l and the
    accumulator in bfloat16 breaks it, more so for larger n."""
    flash = length_sweep(Casts.flash("bfloat16"), [64, 256, 1024], d=16)
    everything = length_sweep(Casts.everything("bfloat16"), [64, 256, 1024], d=16)
    assert [r.value for r in flash] == [64, 256, 1024]
    for row in flash:
        assert row.tiled.max <= 2 * row.plain.max
    ratios = [row.tiled.max / row.plain.max for row in everything]
    assert ratios[-1] > 2 and ratios[-1] > ratios[0]


def test_magnitudes():
    Q, K, V = random_inputs(128, 16, np.random.default_rng(0))
    spans = attention_magnitudes(Q, K, V)
    assert set(spans) == {"S", "P", "l", "O"}
    assert spans["P"][1] <= 1 and 1 <= spans["l"][0] <= spans["l"][1] <= 128
    for low, high in spans.values():
        assert 0 < low <= high


def test_precision_table():
    rows = precision_table(ns=(32, 64), blocks=(8, 64), scales=(1.0,), inputs=("bfloat16",),
                           P=(None, "float32"), acc=("float32", "bfloat16"), d=8)
    assert len(rows) == 2 * 2 * 2 * 2
    for row in rows:
        assert row.inputs == "bfloat16" and row.P in ("bfloat16", "float32")
        assert row.spacing in (2.0**-8, 2.0**-9, 2.0**-10, 2.0**-7)
        assert all(np.isfinite(x) for x in (*row.standard, *row.tiled, *row.plain))
    by = {(r.n, r.P, r.acc, r.block): r for r in rows}
    assert by[64, "float32", "float32", 8].standard == by[64, "float32", "float32", 64].standard
    row = by[64, "bfloat16", "float32", 8]
    assert row.tiled.max <= 2 * row.plain.max


def test_no_warnings_on_overflow():
    """float16 S overflows for huge logits: inf/NaN in the result, never a numpy warning."""
    Q, K, V = random_inputs(8, 4, np.random.default_rng(0), scale=300.0)
    rows = error_budget(Q, K, V, Casts.plain("float16"), B_c=4)
    assert not all(math.isfinite(r.standard_cumulative.max) for r in rows)


def test_the_chapters_functions_are_short():
    """What the chapter literalincludes reads like the algorithm: at most ~30 lines of body."""
    import ast
    import inspect
    import textwrap

    from flashlib.studies import precision as fp8

    for fn in (round_to, saturate_to, dot, standard_attention_with_casts,
               flash2_forward_with_casts, fp8.random_hadamard, fp8.quantize,
               fp8.fp8_attention):
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        body = tree.body[0].body[1:]  # after the docstring
        lines = body[-1].end_lineno - body[0].lineno + 1
        assert lines <= 30, f"{fn.__name__}: {lines} lines"


def _nearest_by_fractions(x: Fraction, dtype) -> float:
    """The nearest value of ``dtype`` to the exact rational x (ties to even), found among every
    finite value of the format (float16, bfloat16: 2**16 bit patterns) or x's two float32
    neighbours, in exact arithmetic."""
    dt = np.dtype(dtype)
    if dt == np.float32:
        f = np.float32(float(x))  # a float32 within an ulp of x, then its neighbours
        cands = {f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))}
        cands = [float(c) for c in cands]
    else:  # the format's finite values in order: the two on each side of float(x)
        line = _number_line(dt)
        at = int(np.searchsorted(line, float(x)))
        cands = [float(c) for c in line[max(0, at - 2): at + 2]]
    best = min(cands, key=lambda c: abs(Fraction(c) - x))
    ties = [c for c in cands if abs(Fraction(c) - x) == abs(Fraction(best) - x)]
    if len(ties) > 1:  # ties to even: the one whose last bit of the format is 0
        ties.sort()
        as_bits = np.array(ties, dtype=np.float64).astype(dt).view(
            np.uint32 if dt == np.float32 else np.uint16)
        best = ties[int(np.nonzero((as_bits & 1) == 0)[0][0])]
    return best


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_to_rounds_wide_inputs_once(dtype):
    # int64 beyond 2**53 and long doubles hold more bits than float64: rounding through
    # float64 first would round twice (issue 31: 1 + 2**-24 + 2**-60 gave 1.0 in float32)
    x = np.longdouble(1) + np.longdouble(2**-24) + np.longdouble(2**-60)
    if np.finfo(np.longdouble).nmant > 52:  # a real long double (x86-64 Linux)
        assert float(round_to(x, "float32")) == 1 + 2**-23
    rng = np.random.default_rng(5)
    top = 60000 if dtype == "float16" else 2**62
    ints = np.concatenate([rng.integers(-top, top, 300, dtype=np.int64),
                           np.array([2**60 + 2**36 + 1, -(2**53 + 1), 2**63 - 1, -2**63,
                                     65519, 65520], dtype=np.int64)])
    got = round_to(ints, dtype)
    for xi, g in zip(ints.tolist(), got.tolist(), strict=True):
        if dtype == "float16" and abs(xi) >= 65520:
            assert g == np.copysign(np.inf, xi)
            continue
        assert g == _nearest_by_fractions(Fraction(xi), _dtype(dtype)), xi
    if np.finfo(np.longdouble).nmant > 52:
        longs = (np.longdouble(1) + rng.integers(1, 2**62, 200).astype(np.longdouble)
                 * np.longdouble(2.0**-62)) * np.longdouble(3.0)
        for xi, g in zip(longs, round_to(longs, dtype).tolist(), strict=True):
            num, den = xi.as_integer_ratio()
            assert g == _nearest_by_fractions(Fraction(num, den), _dtype(dtype)), xi
    assert round_to(np.int64(2**63 - 1), "float64") == 2.0**63
    assert round_to(np.int64(7), "float32").shape == ()


@functools.cache
def _number_line(dt):
    with np.errstate(invalid="ignore"):  # the NaN patterns
        values = np.arange(2**16, dtype=np.uint16).view(dt).astype(np.float64)
    return np.unique(values[np.isfinite(values)])


def _dtype(name):
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name, None) or name)
