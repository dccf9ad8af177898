"""flashlib.studies.overflow: exp thresholds (a nextafter walk), the unstable softmax, pass
counting."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.studies.overflow import (
    PassRecord,
    exp_overflow_threshold,
    exp_underflow_threshold,
    naive_softmax,
    safe_softmax_passes,
)

DTYPES = [np.float16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_overflow_threshold_is_the_last_finite_exp(dtype):
    t = exp_overflow_threshold(dtype)
    x = np.array(t, dtype=dtype)[()]
    assert float(x) == t  # representable
    with np.errstate(over="ignore"):
        assert np.isfinite(np.exp(x))
        assert np.isinf(np.exp(np.nextafter(x, dtype(np.inf))))


@pytest.mark.parametrize("dtype", DTYPES)
def test_overflow_threshold_is_near_log_max(dtype):
    t = exp_overflow_threshold(dtype)
    log_max = float(np.log(np.float64(np.finfo(dtype).max)))
    assert abs(t - log_max) <= 2 * float(np.spacing(np.array(log_max, dtype=dtype)))


def test_overflow_thresholds_known_values():
    assert exp_overflow_threshold(np.float64) == pytest.approx(709.782712893384, abs=1e-12)
    assert exp_overflow_threshold("float32") == pytest.approx(88.72283, abs=1e-4)
    assert exp_overflow_threshold(np.dtype("float16")) == pytest.approx(11.09, abs=0.01)


@pytest.mark.parametrize("dtype", DTYPES)
def test_underflow_threshold_is_the_last_nonzero_exp(dtype):
    u = exp_underflow_threshold(dtype)
    x = np.array(u, dtype=dtype)[()]
    assert u < 0
    with np.errstate(under="ignore"):
        assert np.exp(x) > 0
        assert np.exp(np.nextafter(x, dtype(-np.inf))) == 0


@pytest.mark.parametrize("bad", [np.int32, np.int8, "int64", bool, "not a dtype",
                                 np.complex128, np.longdouble])
def test_thresholds_refuse_non_float_dtypes(bad):
    with pytest.raises(TypeError, match="dtype must be"):
        exp_overflow_threshold(bad)
    with pytest.raises(TypeError, match="dtype must be"):
        exp_underflow_threshold(bad)


def test_thresholds_known_values_underflow():
    # the values the former bit-pattern bisection found
    assert exp_underflow_threshold(np.float16) == -17.328125
    assert exp_underflow_threshold(np.float32) == -103.97207641601562
    assert exp_underflow_threshold(np.float64) == -745.1332191019411
    assert exp_overflow_threshold(np.float16) == 11.0859375
    assert exp_overflow_threshold(np.float32) == 88.72283172607422
    assert exp_overflow_threshold(np.float64) == 709.782712893384


def test_naive_softmax_fine_for_small_logits():
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    p = naive_softmax(x)
    np.testing.assert_allclose(p.sum(axis=-1), 1.0)
    np.testing.assert_allclose(p[1], 1 / 3)


def test_naive_softmax_overflows_with_warnings():
    with pytest.warns(RuntimeWarning) as record:
        p = naive_softmax(np.array([1000.0, 0.0]))
    assert np.isnan(p[0])
    messages = [str(w.message) for w in record]
    assert messages == ["overflow encountered in exp", "invalid value encountered in divide"]


def test_naive_softmax_underflow_gives_nan():
    with pytest.warns(RuntimeWarning, match="invalid value encountered in divide"):
        p = naive_softmax(np.array([-1000.0, -1000.0]))  # underflow itself is silent
    assert np.isnan(p).all()


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 1, 4)])
def test_safe_softmax_passes(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape) * 500
    p, passes = safe_softmax_passes(x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(axis=-1, keepdims=True), rtol=1e-12)
    assert [r.name for r in passes] == ["max", "exp and sum", "divide"]
    assert all(isinstance(r, PassRecord) and r.reads == x.size for r in passes)
    assert sum(r.writes for r in passes) == 2 * x.size


@pytest.mark.parametrize("x", [np.float64(3.0), np.zeros((2, 0))])
def test_safe_softmax_passes_refuses_empty(x):
    with pytest.raises(ValueError, match="x must have shape"):
        safe_softmax_passes(x)
