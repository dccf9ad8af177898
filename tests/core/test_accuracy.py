"""flash-attn's accuracy rule as one helper (flashlib.core.accuracy): the bound, the floor
conventions, the failures it reports, and that it needs numpy only."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from flashlib.core.accuracy import (
    FLOOR,
    ErrorStats,
    RuleCheck,
    assert_error_within,
    error_floor,
    error_stats,
)


def _triple(rng, k_out, k_plain=1.0, shape=(32, 8)):
    """ref, and out/plain whose max errors are exactly k_out and k_plain times 2**-10."""
    ref = rng.integers(-512, 512, size=shape) / 256
    e = 2.0**-10 * rng.choice([-1.0, 1.0], size=shape)
    return ref + k_out * e, ref + k_plain * e, ref


def test_error_stats():
    ref = np.zeros((2, 2))
    out = np.array([[3.0, 0.0], [0.0, -4.0]])
    assert error_stats(out, ref) == ErrorStats(4.0, np.sqrt(25 / 4))
    assert error_stats(np.zeros((0, 3)), np.zeros((0, 3))) == ErrorStats(0.0, 0.0)
    nan = error_stats(np.array([np.nan, 1.0]), np.zeros(2))
    assert np.isnan(nan.max) and np.isnan(nan.rms)
    with pytest.raises(ValueError, match="same shape"):
        error_stats(np.zeros(3), np.zeros(4))
    with pytest.raises(TypeError, match="out"):
        error_stats(np.array(["a"]), np.zeros(1))


def test_floor_conventions_are_the_tests_old_ones():
    """The floor the tests used before the helper existed (tests/conftest.py), unchanged."""
    ref = np.array([[0.5, -3.0]])
    for dt in (np.float16, np.float32):
        eps = float(np.finfo(dt).eps)
        for logit_max in (1.0, 50.0):
            old = max(FLOOR[np.dtype(dt)] * 3.0, eps * logit_max * 3.0)
            assert error_floor(dt, ref, logit_max) == old
    assert error_floor(np.float16, np.zeros(3)) == 1e-3  # max(1, |ref|) = 1
    assert error_floor("float64", np.ones(2)) == float(np.finfo(np.float64).eps)
    pytest.importorskip("ml_dtypes")
    assert error_floor("bfloat16", np.ones(2)) == 2.0**-7


def test_rule_passes_and_fails_exactly_at_the_bound(rng):
    out, plain, ref = _triple(rng, 2.0)
    check = assert_error_within(out, plain, ref, floor=0.0)
    assert check == RuleCheck(2 * 2.0**-10, 2.0**-10, 0.0, 2 * 2.0**-10)
    assert check.ratio == 2.0
    out, plain, ref = _triple(rng, 2.5)
    with pytest.raises(AssertionError, match=r"kernel: max error 0\.00244 > bound 0\.00195 "
                                             r"= max\(2 x plain 0\.000977, floor 0\)"):
        assert_error_within(out, plain, ref, floor=0.0, label="kernel")
    assert_error_within(out, plain, ref, factor=3, floor=0.0)
    assert_error_within(out, plain, ref, floor=1e-2)  # the floor rescues it
    with pytest.raises(AssertionError):
        assert_error_within(out, plain, ref, floor=0.0, metric="rms")
    assert assert_error_within(out, plain, ref, factor=3, floor=0.0,
                               metric="rms").ratio == pytest.approx(2.5)


def test_default_floor_is_the_outputs_dtype():
    ref16 = np.full((4, 4), 0.125)
    plain = ref16.astype(np.float16)  # exact: the bare rule would demand an exact kernel
    out = (ref16 + 2.0**-12).astype(np.float16)  # one float16 rounding away, 2.4e-4
    check = assert_error_within(out, plain, ref16)  # within the float16 floor
    assert check.floor == error_floor(np.float16, ref16)
    with pytest.raises(AssertionError):
        assert_error_within(out, plain, ref16, floor=0.0)
    with pytest.raises(AssertionError):  # float32's floor is 1000x tighter
        assert_error_within(out, plain, ref16, dtype=np.float32)


def test_nan_and_exact_cases(rng):
    out, plain, ref = _triple(rng, 1.0)
    out[0, 0] = np.nan
    with pytest.raises(AssertionError, match="nan"):
        assert_error_within(out, plain, ref, floor=1.0)
    assert assert_error_within(ref, ref, ref, floor=0.0).ratio == 0.0
    assert assert_error_within(ref + 1, ref, ref, floor=1.0).ratio == float("inf")
    assert RuleCheck(1.0, 0.0, 1.0, 1.0).ratio == float("inf")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(factor=0), ValueError, "factor"),
    (dict(factor="2"), ValueError, "factor"),
    (dict(floor=-1.0), ValueError, "floor"),
    (dict(floor=float("nan")), ValueError, "floor"),
    (dict(metric="mean"), ValueError, "metric"),
    (dict(dtype="int8"), TypeError, "dtype"),
])
def test_bad_arguments(rng, kwargs, error, match):
    out, plain, ref = _triple(rng, 1.0)
    with pytest.raises(error, match=match):
        assert_error_within(out, plain, ref, **kwargs)


def test_needs_numpy_only():
    """With ml_dtypes hidden, flashlib and the rule import and work; naming bfloat16 says
    what is missing, and flashlib.studies.precision's ImportError names ml_dtypes."""
    code = textwrap.dedent("""
        import sys
        sys.modules["ml_dtypes"] = None  # import ml_dtypes now raises ImportError
        import numpy as np
        import flashlib
        from flashlib.core.accuracy import assert_error_within, error_floor
        assert_error_within(np.ones(3, np.float16), np.ones(3, np.float16), np.ones(3))
        try:
            error_floor("bfloat16", np.ones(2))
        except TypeError as err:
            assert "ml_dtypes" in str(err), err
        else:
            raise SystemExit("no TypeError")
        try:
            import flashlib.studies.precision
        except ImportError as err:
            assert "pip install ml_dtypes" in str(err), err
            print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
