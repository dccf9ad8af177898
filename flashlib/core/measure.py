"""Measuring a call: its peak memory, its warnings, its time.  One of each, used everywhere.

measure_peak             peak bytes a call allocates (tracemalloc sees numpy's buffers); nests
call_capturing_warnings  the warnings a call raises, as "Category: message" strings
time_calls               the timer: seconds per call of several functions, round-robin
median_times             its medians, one per function (what chapters, bench and tests quote)

The clock is the process CPU time by default (``"cpu"``: on a shared machine it leaves out the
time other processes hold the core) or the wall clock (``"wall"``: what a reader waits for, and
the only meaningful one with several threads).
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from flashlib.core.checks import check_int

__all__ = [
    "measure_peak",
    "call_capturing_warnings",
    "CLOCKS",
    "time_calls",
    "median_times",
]

#: The clocks the timer reads: process CPU time and wall clock, in seconds.
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}

# One entry per measure_peak call in progress, outermost first: the highest traced peak seen
# before a nested call reset tracemalloc's peak counter (which is global).
_open_peaks: list[int] = []
def measure_peak(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Run ``fn(*args, **kwargs)``; return ``(result, peak)``.

    ``peak`` is the peak traced memory during the call, in bytes, above what was allocated when
    the call began (so the arguments do not count; the result, allocated during the call, does).
    Works whether or not :mod:`tracemalloc` was already tracing, and nests: a measurement made
    inside ``fn`` does not hide what ``fn`` allocated before it.
    """
    gc.collect()
    started_here = not tracemalloc.is_tracing()
    if started_here:
        tracemalloc.start()
    else:  # keep the outer measurements' peaks before resetting the shared counter
        _, peak_so_far = tracemalloc.get_traced_memory()
        _open_peaks[:] = [max(p, peak_so_far) for p in _open_peaks]
    tracemalloc.reset_peak()
    baseline, _ = tracemalloc.get_traced_memory()
    _open_peaks.append(0)
    try:
        result = fn(*args, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        peak_before_nested = _open_peaks.pop()
        if started_here:
            tracemalloc.stop()
    return result, max(peak, peak_before_nested) - baseline


def call_capturing_warnings(
    fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> tuple[Any, list[str]]:
    """Run ``fn(*args, **kwargs)`` and return ``(result, messages)`` of the warnings it raised.

    Every warning is recorded (``simplefilter("always")``), formatted as ``"Category: text"``;
    numpy's error state is left as it is (by default overflow and invalid values warn, underflow
    is silent).  An exception from ``fn`` propagates.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [f"{w.category.__name__}: {w.message}" for w in caught]


def time_calls(
    calls: Mapping[Any, Callable[[], object]],
    repeats: int = 5,
    *,
    clock: str = "cpu",
    warmup: bool = True,
    progress: Any = None,
) -> dict[Any, list[float]]:
    """Seconds per call of each zero-argument function, ``repeats`` times, round-robin.

    One call of every function per repeat, so slow drifts of the machine hit all of them alike;
    with ``warmup``, one untimed call of each first.  ``clock``: ``"cpu"`` or ``"wall"``
    (:data:`CLOCKS`).  ``progress``: an object with ``update(1)`` (a tqdm bar) called after
    every call.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    repeats = check_int(repeats, "repeats", minimum=1)
    now = CLOCKS[clock]
    if warmup:
        for fn in calls.values():
            fn()
            if progress is not None:
                progress.update(1)
    times: dict[Any, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = now()
            fn()
            times[name].append(now() - t0)
            if progress is not None:
                progress.update(1)
    return times


def median_times(
    calls: Mapping[Any, Callable[[], object]],
    repeats: int = 5,
    *,
    clock: str = "cpu",
    warmup: bool = True,
) -> dict[Any, float]:
    """Median seconds per call of each zero-argument function: :func:`time_calls` (a warm-up
    call each, then ``repeats`` round-robin calls), reduced to the median."""
    times = time_calls(calls, repeats, clock=clock, warmup=warmup)
    return {name: float(statistics.median(ts)) for name, ts in times.items()}
