"""The memory probe of the checkers that bound an answer's memory (tiling, backward, beyond):
:func:`measure_peak` is flashlib.core.measure's, plus the peak of a learner's call that ran in
the grader's sandbox (flashlib.book.exercises.grader_adapter), so that the numeric layer's
measure stays plain."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flashlib.book.exercises.grader_adapter import remote_peak
from flashlib.core import measure

__all__ = ["measure_peak"]


def measure_peak(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """``(result, peak)`` of ``fn(*args, **kwargs)`` (flashlib.core.measure.measure_peak);
    a learner's function called in it that runs in the grader's sandbox measures its peak
    there, and that peak counts too."""
    with remote_peak() as remote:
        result, peak = measure.measure_peak(fn, *args, **kwargs)
    return result, max(peak, remote[0])
