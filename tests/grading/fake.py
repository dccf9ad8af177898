"""A made-up chapter for the grader's tests: its import cell, then the given steps; each
exercise calls the online-softmax chapter's ``check_empty_partial(empty)``."""

from __future__ import annotations

import dataclasses

from grading import chapters

IMPORTS = ("code", "import numpy as np\n"
                   "from flashlib.book.exercises.online_softmax import check_empty_partial")


def fake_chapter(*steps: tuple[str, str]) -> chapters.Chapter:
    """``steps``: ("code", source) or ("exercise", number), after the import cell."""
    exercise = chapters.Exercise("1", "check_empty_partial(empty)", "check_empty_partial",
                                 "flashlib.book.exercises.online_softmax.check_empty_partial")
    numbers = [value for kind, value in steps if kind == "exercise"]
    return chapters.Chapter("fake", "Fake", [IMPORTS, *steps],
                            {n: dataclasses.replace(exercise, number=n) for n in numbers}, [])
