"""Verdict formatting: the :class:`Feedback` a checker returns and how it shows (a verdict in
Jupyter and Colab, the neutral :data:`ON_THE_SITE` line while the book is built), and the words
for what went wrong (:func:`broadcast_hint`, :func:`shape_problem`, :func:`fmt`)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from flashlib.book import i18n
from flashlib.book.site import static_site

__all__ = ["NOT_ATTEMPTED", "ON_THE_SITE", "NotAttempted", "LearnerError", "Case", "Feedback",
           "broadcast_hint", "shape_problem", "fmt"]

NOT_ATTEMPTED = (
    "not attempted yet: replace `raise NotImplementedError` with your code and run the cell again"
)
#: What a checker cell shows on the website (the book build): never a verdict or a hint.
#: Two short lines under the exercise's title, so that the output fits a phone's code column.
ON_THE_SITE = ("Run this cell in Jupyter or Colab (links at the top of the page)\n"
               "to check your answer.")


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
        self._shown_in: int | None = None  # the cell it was displayed in (_cell_number)

    def ok(self, message: str) -> None:
        self.passes.append(message)
        i18n.record(message)

    def fail(self, message: str) -> None:
        self.problems.append(message)
        i18n.record(message)

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
        """The verdict and one line per check, in the reader's language
        (:mod:`flashlib.book.i18n`: English unless a Japanese notebook chose Japanese)."""
        t = i18n.translate
        if static_site():
            return f"{self.exercise}:\n{ON_THE_SITE}"
        if i18n.language() == "en":
            head = (f"PASSED {self.exercise}: all {len(self.passes)} checks passed."
                    if self.passed else f"NOT YET {self.exercise}:")
        else:  # the verdict, the checker's title and the count, each translated
            colon = i18n.SEPARATOR.get(i18n.language(), ": ")
            head = (f"{t('PASSED')} {t(self.exercise)}{colon}"
                    f"{t(f'all {len(self.passes)} checks passed.')}"
                    if self.passed else f"{t('NOT YET')} {t(self.exercise)}{colon}")
        lines = [head]
        lines += [f"  x  {t(p)}" for p in self.problems]
        lines += [f"  ok {t(p)}" for p in self.passes]
        return "\n".join(lines)

    __str__ = __repr__

    def show(self) -> None:
        """Display this Feedback now, in an IPython kernel (as plain text: the verdict, or on
        the website the neutral line); outside IPython, nothing."""
        shell = _ipython_shell()
        if shell is None:
            return
        from IPython.display import display

        display({"text/plain": repr(self)}, raw=True)
        self._shown_in = _cell_number(shell)

    def _ipython_display_(self) -> None:
        """IPython's display of the Feedback (a cell's last expression, ``display(fb)``):
        nothing when the checker already showed it in this same cell (see the module
        docstring), else :meth:`show`."""
        shell = _ipython_shell()
        if shell is not None and self._shown_in == _cell_number(shell):
            return
        self.show()


def _ipython_shell() -> Any:
    """The running IPython shell (a kernel, or IPython in a terminal), else None."""
    import sys

    if "IPython" not in sys.modules:  # never imported: no shell is running
        return None
    from IPython import get_ipython

    return get_ipython()


_CELLS = {"shell": None, "count": 0}


def _cell_number(shell: Any) -> int:
    """How many cells ``shell`` has started running since the first checker ran: a number
    that identifies the current cell (IPython's execution_count does not move in cells run
    with store_history=False)."""
    if _CELLS["shell"] is not shell:
        def started(*_args: Any) -> None:
            _CELLS["count"] += 1

        shell.events.register("pre_run_cell", started)
        _CELLS["shell"], _CELLS["count"] = shell, 0
    return _CELLS["count"]


def _shapes_in(message: str) -> list[tuple[int, ...]]:
    return [tuple(int(s) for s in group.split(",") if s.strip())
            for group in re.findall(r"\(([\d,\s]*)\)", message)]


def broadcast_hint(message: str) -> str | None:
    """Words for numpy's shape errors (the message of a ValueError), or None for another
    error.  "operands could not be broadcast together with shapes (4,8) (4,)" is a row
    statistic that lost its axis (missing keepdims=True or [:, None]); a matmul "mismatch in
    its core dimension" is a product whose inner sizes differ (a missing or extra ``.T``)."""
    if "could not be broadcast" in message:
        shapes = _shapes_in(message)
        if len(shapes) >= 2:
            a, b = shapes[0], shapes[1]
            for big, small in ((a, b), (b, a)):
                if len(small) == len(big) - 1 and small == big[:-1]:
                    return (f"numpy cannot combine an array of shape {big} with one of shape "
                            f"{small}. A row's maximum or sum (over axis=-1) must keep its "
                            f"axis, shape {(*small, 1)}: use keepdims=True, or [:, None]")
            return (f"numpy cannot combine arrays of shapes {a} and {b}; compare them "
                    "axis by axis from the right: each pair must be equal or contain a 1")
        return "numpy could not broadcast two arrays against each other"
    if "matmul" in message and "mismatch in its core dimension" in message:
        sizes = re.search(r"size (\d+) is different from (\d+)", message)
        detail = f" (sizes {sizes[1]} and {sizes[2]})" if sizes else ""
        return (f"in a matrix product A @ B, the last axis of A must match the second to last "
                f"of B{detail}: is a transpose (.T or np.swapaxes(x, -1, -2)) missing or extra?")
    return None


def shape_problem(got: Any, want: tuple[int, ...], what: str = "the result") -> str | None:
    """None when ``got`` (an array or a shape) has shape ``want``; else one line saying what
    is wrong, naming the likely mistake (a missing or extra trailing 1, a transpose, lost
    leading dimensions)."""
    shape = tuple(got) if isinstance(got, tuple) else np.shape(got)
    want = tuple(want)
    if shape == want:
        return None
    head = f"{what} has shape {shape}, expected {want}"
    if shape == want[:-1] and want[-1:] == (1,):
        return f"{head}: keep the reduced axis (keepdims=True, or [:, None])"
    if want == shape[:-1] and shape[-1:] == (1,):
        return f"{head}: drop the trailing axis of 1 (keepdims=False, or x[..., 0])"
    if len(shape) == len(want) >= 2 and shape[:-2] + shape[-2:][::-1] == want:
        return f"{head}: the last two axes are swapped (a transpose too many or too few)"
    if len(shape) < len(want) and shape == want[len(want) - len(shape):]:
        return f"{head}: the leading (batch, heads) axes {want[:len(want) - len(shape)]} were lost"
    return head



def fmt(x: Any) -> str:
    """An array (or number) on one line, 4 digits: for feedback messages."""
    return np.array2string(np.asarray(x), precision=4, separator=", ", max_line_width=10_000)
