"""flashlib.core.measure: the one peak-memory measurement, warning capturer and timer."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from flashlib.core import measure
from flashlib.core.measure import call_capturing_warnings, measure_peak, median_times, time_calls
from flashlib.studies.overflow import naive_softmax

MiB = 1 << 20


def test_measure_peak_sees_a_numpy_allocation():
    _, peak = measure_peak(np.ones, MiB // 8)
    assert MiB <= peak < MiB + 64 * 1024


def test_measure_peak_counts_freed_temporaries():
    def temp_then_small():
        big = np.ones(1 << 18)  # 2 MiB, freed before returning
        return float(big.sum())

    result, peak = measure_peak(temp_then_small)
    assert result == float(1 << 18)
    assert peak >= 8 * (1 << 18)


def test_measure_peak_inside_running_tracemalloc():
    tracemalloc.start()
    try:
        _, peak = measure_peak(np.zeros, 1 << 17)
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()
    assert peak >= 8 * (1 << 17)


def test_nested_measure_peak_keeps_the_outer_peak():
    """Regression: a nested measurement reset tracemalloc's peak and wiped the outer one."""
    def outer():
        big = np.ones(4 * MiB // 8)  # 4 MiB, freed before the inner measurement
        del big
        _, inner = measure_peak(np.ones, MiB // 8)  # 1 MiB
        return inner

    inner, peak = measure_peak(outer)
    assert MiB <= inner < 2 * MiB
    assert 4 * MiB <= peak < 5 * MiB

    def two_levels():
        return measure_peak(outer)

    (inner, middle), top = measure_peak(two_levels)
    assert MiB <= inner < 2 * MiB and 4 * MiB <= middle < 5 * MiB and 4 * MiB <= top < 5 * MiB
    assert not tracemalloc.is_tracing()


def test_measure_peak_after_an_exception_leaves_tracing_off():
    with pytest.raises(ZeroDivisionError):
        measure_peak(lambda: 1 / 0)
    assert not tracemalloc.is_tracing()
    assert measure_peak(np.ones, MiB // 8)[1] >= MiB  # the bookkeeping is clean


def test_call_capturing_warnings_records_messages():
    p, messages = call_capturing_warnings(naive_softmax, np.array([1000.0, 0.0]))
    assert np.isnan(p[0])
    assert messages == ["RuntimeWarning: overflow encountered in exp",
                        "RuntimeWarning: invalid value encountered in divide"]
    q, none = call_capturing_warnings(naive_softmax, np.array([1.0, 2.0]))
    assert none == [] and np.isfinite(q).all()


def test_time_calls_round_robin_and_validation():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = time_calls(calls, 3, warmup=False)
    assert order == ["a", "b"] * 3
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    order.clear()
    time_calls(calls, 1)
    assert order == ["a", "b", "a", "b"]  # a warm-up call of each, then the timed round
    with pytest.raises(ValueError, match="clock"):
        time_calls(calls, 1, clock="sundial")
    with pytest.raises(ValueError, match="repeats"):
        time_calls(calls, 0)
    with pytest.raises(TypeError, match="repeats"):
        time_calls(calls, 2.0)


def test_median_times_uses_the_chosen_clock(monkeypatch):
    now = [0.0]
    durations = {"a": iter([5.0, 3.0, 1.0, 2.0]), "b": iter([1.0, 7.0, 7.0, 0.5])}

    def call(name):
        now[0] += next(durations[name])

    monkeypatch.setitem(measure.CLOCKS, "cpu", lambda: now[0])
    med = median_times({"a": lambda: call("a"), "b": lambda: call("b")}, 3)
    assert med == {"a": 2.0, "b": 7.0}  # the warm-up call (5.0 and 1.0) is not counted
    with pytest.raises(ValueError, match="repeats"):
        median_times({"a": lambda: None}, 0)


def test_the_clocks():
    assert measure.CLOCKS == {"cpu": time.process_time, "wall": time.perf_counter}
    wall = median_times({"sleep": lambda: time.sleep(0.01)}, 1, clock="wall")["sleep"]
    cpu = median_times({"sleep": lambda: time.sleep(0.01)}, 1, clock="cpu")["sleep"]
    assert wall >= 0.009 and cpu < wall  # sleeping costs wall time, hardly any CPU time
