"""What the exercises and the grader share: the one module of flashlib that knows a grader
exists (grading/ imports flashlib.book.exercises through it alone; flashlib never imports
grading).

In the grader (grading/judge.py) a learner's function runs in another process, a sandbox: it
reaches a checker as a handle, an object whose ``__learner_remote__`` is true (:func:`is_remote`)
and whose calls run there.  The exercises treat such a handle like a function:

- :func:`flashlib.book.exercises.call_learner` calls it (the handle watches the call where it
  runs, with the names :func:`forbidden_names` gives, and reports the calls back for
  :func:`library_call_problem` to refuse);
- :func:`learner_side` marks the checkers' helpers that must run where the learner's code is
  (the GPU chapter's kernel launches): given a handle, such a helper runs in the sandbox
  (``handle.run_helper(module, qualname, args, kwargs)``);
- flashlib.book.exercises.memory's ``measure_peak`` asks the handle to measure the call's
  peak memory there (:func:`measuring`) and takes what it reports (:func:`record_peak`).

The rest is re-exported for the grader: the Feedback it reads a verdict from, the exceptions
it carries across the sandbox's wire, the watcher the sandbox runs a call under, the plain
``measure_peak`` it measures a call with there, and the per-student variants
(flashlib.book.exercises.variants: the judge runs a checker ``as_student(id)``; the student's
process gets the id in the environment variable ``STUDENT_ENV``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from flashlib.book.exercises.feedback import NOT_ATTEMPTED, Feedback, LearnerError, NotAttempted
from flashlib.book.exercises.refusal import forbidden_names, library_call_problem, watching
from flashlib.book.exercises.variants import ENV as STUDENT_ENV
from flashlib.book.exercises.variants import as_student
from flashlib.core.measure import measure_peak

__all__ = ["REMOTE", "is_remote", "learner_side", "measuring", "record_peak", "remote_peak",
           "CHECKER_PACKAGE", "Feedback", "NOT_ATTEMPTED", "LearnerError", "NotAttempted",
           "forbidden_names", "library_call_problem", "watching", "measure_peak", "as_student",
           "STUDENT_ENV"]

#: The package whose modules hold the checkers (the only modules a handle's helper may name).
CHECKER_PACKAGE = "flashlib.book.exercises"
#: The attribute that marks a grader's handle on an object in the sandbox.
REMOTE = "__learner_remote__"


def is_remote(obj: Any) -> bool:
    """Whether ``obj`` is a grader's handle on an object of the learner's process."""
    return bool(getattr(obj, REMOTE, False))


def learner_side(helper: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for a checker's helper that must run where the learner's function lives
    (it plugs it into a Triton kernel): given a grader's handle among its arguments, the
    helper runs in the learner's process (``handle.run_helper``); otherwise here."""

    @functools.wraps(helper)
    def run(*args: Any, **kwargs: Any) -> Any:
        remote = next((a for a in (*args, *kwargs.values()) if is_remote(a)), None)
        if remote is None:
            return helper(*args, **kwargs)
        return remote.run_helper(helper.__module__, helper.__qualname__, args, kwargs)

    return run


# Per peak measurement in progress (flashlib.book.exercises.memory): the largest peak a call
# measured in the learner's process reported (record_peak), in bytes.
_remote_peaks: list[int] = []


def measuring() -> bool:
    """Whether a checker is measuring peak memory now (a call that runs in the learner's
    process must then measure its own peak there and :func:`record_peak` it)."""
    return bool(_remote_peaks)


def record_peak(nbytes: int) -> None:
    """Report the peak of a call that ran in the learner's process to every measurement in
    progress."""
    _remote_peaks[:] = [max(p, int(nbytes)) for p in _remote_peaks]


@contextlib.contextmanager
def remote_peak() -> Iterator[list[int]]:
    """A measurement in progress: the block's remote peak is ``box[0]`` after it."""
    _remote_peaks.append(0)
    box = [0]
    try:
        yield box
    finally:
        box[0] = _remote_peaks.pop()
