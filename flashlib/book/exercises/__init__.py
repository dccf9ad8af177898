"""Checkers for the chapters' exercises, one module per chapter, written in one idiom.

Each checker takes the learner's function (or answer), runs it on a set of cases including
awkward ones (huge and tiny logits, ``-inf`` scores, the empty state, float16), and returns a
:class:`Feedback` whose text says which case failed and what to try.  A checker never raises
because of the learner's code.

The idiom::

    @checker("stable softmax")                 # the title shown in the feedback
    def check_stable_softmax(fb, fn):          # fb: the Feedback; then the checker's arguments
        for name, x in cases:
            with fb.case(name):                # a LearnerError inside becomes "name: message"
                got, warns = call_learner(fn, x)   # NotImplementedError -> NotAttempted
                ...
                fb.ok(f"{name}: correct")      # or fb.fail(...)

:func:`checker` turns a learner that has not attempted the exercise (the cell's
``raise NotImplementedError``) into one "not attempted yet" line, wherever it happens;
:func:`call_learner` turns any other exception of the learner's code into a
:class:`LearnerError`, which :meth:`Feedback.case` records against the case (and
:func:`checker` against the exercise, outside any case).

flashlib.book.exercises.intro           the Introduction
flashlib.book.exercises.overflow        The overflow problem
flashlib.book.exercises.online_softmax  Online softmax
flashlib.book.exercises.ladder          The optimisation ladder
flashlib.book.exercises.tiling          Tiling
flashlib.book.exercises.io_model        The HBM IO model
flashlib.book.exercises.backward        The backward pass
flashlib.book.exercises.gpu             On a real GPU (Triton kernels, run in the interpreter
                                        without a GPU)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from flashlib.measure import call_capturing_warnings

__all__ = [
    "Feedback",
    "NotAttempted",
    "LearnerError",
    "NOT_ATTEMPTED",
    "call_learner",
    "checker",
    "fmt",
]

NOT_ATTEMPTED = (
    "not attempted yet: replace `raise NotImplementedError` with your code and run the cell again"
)


class NotAttempted(Exception):
    """Raised by :func:`call_learner` when the learner's function still raises
    ``NotImplementedError`` (the exercise cell's placeholder)."""


class LearnerError(Exception):
    """The learner's code failed in a way the feedback should name: it raised (see
    :func:`call_learner`), or it returned something of the wrong kind.  The message is
    feedback text, e.g. ``"your function raised ZeroDivisionError: division by zero"``."""


class Case:
    """One case of a checker, from :meth:`Feedback.case`: ``failed`` after the block tells
    whether the learner's code failed in it (so that a loop can stop)."""

    def __init__(self) -> None:
        self.failed = False


class Feedback:
    """The result of a checker: ``passed`` plus one line per check, shown as the cell's output."""

    def __init__(self, exercise: str) -> None:
        self.exercise = exercise
        self.passes: list[str] = []
        self.problems: list[str] = []

    def ok(self, message: str) -> None:
        self.passes.append(message)

    def fail(self, message: str) -> None:
        self.problems.append(message)

    @contextlib.contextmanager
    def case(self, label: str, hint: str = "") -> Iterator[Case]:
        """A block checking one case: a :class:`LearnerError` raised inside is recorded as the
        problem ``"label: message"`` (``hint`` appended) and the block ends there."""
        case = Case()
        try:
            yield case
        except LearnerError as err:
            case.failed = True
            self.fail(f"{label}: {err}" + (f" {hint}" if hint else ""))

    @property
    def passed(self) -> bool:
        return not self.problems and bool(self.passes)

    @property
    def messages(self) -> list[str]:
        return self.problems + self.passes

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        head = (f"PASSED {self.exercise}: all {len(self.passes)} checks passed."
                if self.passed else f"NOT YET {self.exercise}:")
        lines = [head]
        lines += [f"  x  {p}" for p in self.problems]
        lines += [f"  ok {p}" for p in self.passes]
        return "\n".join(lines)

    __str__ = __repr__


def call_learner(fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str]]:
    """Run the learner's ``fn(*args)`` for a checker: ``(result, warnings)``.

    ``warnings`` lists every warning raised during the call as ``"Category: message"``
    (:func:`flashlib.measure.call_capturing_warnings`).  ``NotImplementedError`` (the exercise
    not attempted yet) raises :class:`NotAttempted`; any other exception raises
    :class:`LearnerError` ``"your function raised Type: message"``.
    """
    try:
        return call_capturing_warnings(fn, *args)
    except NotImplementedError as err:
        raise NotAttempted from err
    except Exception as err:  # report any error from the learner's code
        raise LearnerError(f"your function raised {type(err).__name__}: {err}") from err


def checker(title: str) -> Callable[[Callable[..., None]], Callable[..., Feedback]]:
    """Decorator: ``body(fb, *args)`` becomes ``check(*args) -> Feedback`` titled ``title``.

    The body records its checks on ``fb``.  An exercise not attempted yet (:class:`NotAttempted`,
    wherever it is raised) gives the one "not attempted yet" problem; a :class:`LearnerError`
    outside any :meth:`Feedback.case` is recorded as a problem too.  The checker never raises
    because of the learner's code.
    """

    def decorate(body: Callable[..., None]) -> Callable[..., Feedback]:
        @functools.wraps(body)
        def check(*args: Any, **kwargs: Any) -> Feedback:
            fb = Feedback(title)
            try:
                body(fb, *args, **kwargs)
            except NotAttempted:
                fb.problems = [NOT_ATTEMPTED]
                fb.passes = []
            except LearnerError as err:
                fb.fail(str(err))
            return fb

        signature = inspect.signature(body)  # shown by help(): the body's, without fb
        check.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=list(signature.parameters.values())[1:], return_annotation="Feedback")
        return check

    return decorate


def fmt(x: Any) -> str:
    """An array (or number) on one line, 4 digits: for feedback messages."""
    return np.array2string(np.asarray(x), precision=4, separator=", ", max_line_width=10_000)
