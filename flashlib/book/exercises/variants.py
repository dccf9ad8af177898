"""Per-student variants: exercises whose answer is a number, a letter or a formula take their
parameters from the student's id, so that a classmate's answer, or the web's, is the answer to
another question.

- The **reader's edition** (no id) asks variant 0: the question the book prints, whose
  solution the book shows.
- A **student** (an id, e.g. ``"s1234567"``) gets a variant drawn from the id and the
  exercise's number (:func:`draw`: the SHA-256 of both), always the same for the same id,
  and never variant 0, whose answer is published.  The student notebook's set-up cell sets
  the id (``STUDENT_ID = "..."``, or the environment variable :data:`ENV`) and prints the
  chapter's variants (:func:`use_student`); an exercise's code reads its own with
  :func:`variant`.
- The **grader** grades each student against the variant of their id, the name of their
  submission folder: the judge runs the checker :func:`as_student` (grading/judge.py), and the
  student's process gets the id in :data:`ENV` (grading/worker.py), so both sides agree.

A checker reads its exercise's parameters with :func:`variant`; an exercise declares its
variants with :func:`declare` (a tuple of parameter mappings, variant 0 first, and the
sentence the set-up cell prints for one of them).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

__all__ = ["ENV", "declare", "draw", "variant", "student_id", "as_student", "use_student",
           "describe", "VARIANTS"]

#: The environment variable that holds the student's id (the set-up cell sets it from
#: ``STUDENT_ID``; the grader sets it in each student's process).
ENV = "FLASHLIB_STUDENT_ID"

#: The checker module of each chapter, by the chapter's number.
_CHECKERS = {"1": "intro", "2": "overflow", "3": "online_softmax", "4": "tiling", "5": "ladder",
             "6": "masking", "7": "backward", "8": "precision", "9": "io_model", "10": "gpu",
             "11": "beyond"}

_STUDENT: ContextVar[str | None] = ContextVar("flashlib_student", default=None)


@dataclass(frozen=True)
class Variants:
    """One exercise's variants: ``choices[0]`` is the book's question."""

    exercise: str
    choices: tuple[Mapping[str, Any], ...]
    says: Callable[[Mapping[str, Any]], str]


#: ``{exercise number: its Variants}``, filled by :func:`declare` (each chapter's checkers).
VARIANTS: dict[str, Variants] = {}


def declare(exercise: str, choices: Sequence[Mapping[str, Any]],
            says: Callable[[Mapping[str, Any]], str]) -> Variants:
    """Declare ``exercise``'s variants (at least two; ``choices[0]``: the book's question).
    ``says(params)``: the sentence the set-up cell prints for a student's variant."""
    if len(choices) < 2:
        raise ValueError(f"exercise {exercise}: give at least two variants, got {len(choices)}")
    found = Variants(exercise, tuple(dict(c) for c in choices), says)
    VARIANTS[exercise] = found
    return found


def student_id() -> str:
    """The student whose variants are asked: the one :func:`as_student` names, else the
    environment variable :data:`ENV`; ``""`` for a reader (variant 0)."""
    current = _STUDENT.get()
    if current is None:
        current = os.environ.get(ENV, "")
    return str(current).strip()


def draw(exercise: str, count: int, student: str | None = None) -> int:
    """The variant (an index below ``count``) of ``exercise`` for ``student`` (by default
    :func:`student_id`): 0 for no id; else 1 to ``count - 1``, from the SHA-256 of the
    exercise's number and the id (the same id always draws the same)."""
    who = student_id() if student is None else str(student).strip()
    if not who or count < 2:
        return 0
    digest = hashlib.sha256(f"flashlib variant\0{exercise}\0{who}".encode()).digest()
    return 1 + int.from_bytes(digest[:8], "big") % (count - 1)


def variant(exercise: str, student: str | None = None) -> dict[str, Any]:
    """The parameters of ``exercise`` for ``student`` (by default the current one), with
    ``"variant"``: its index."""
    found = VARIANTS[exercise]
    index = draw(exercise, len(found.choices), student)
    return dict(found.choices[index]) | {"variant": index}


@contextlib.contextmanager
def as_student(student: str | None) -> Iterator[None]:
    """Within the block, :func:`variant` answers for ``student`` (``""``: a reader)."""
    token = _STUDENT.set("" if student is None else str(student))
    try:
        yield
    finally:
        _STUDENT.reset(token)


def describe(prefix: str = "", student: str | None = None) -> list[str]:
    """One line per declared exercise whose number starts with ``prefix`` (a chapter's
    ``"4."``): its variant for ``student`` and what it asks."""
    numbers = sorted((n for n in VARIANTS if n.startswith(prefix)),
                     key=lambda n: tuple(int(p) for p in n.split(".")))
    lines = []
    for number in numbers:
        params = variant(number, student)
        lines.append(f"Exercise {number} (variant {params['variant']}): "
                     f"{VARIANTS[number].says(params)}")
    return lines


def use_student(student: str = "", chapter: str = "") -> str:
    """The set-up cell's call: ``student`` (the notebook's ``STUDENT_ID``, else :data:`ENV`)
    becomes the id this kernel's exercises use; prints the variants of ``chapter``'s
    exercises (``"4"``: Exercises 4.x; ``""``: all) and returns the id."""
    import importlib

    module = _CHECKERS.get(str(chapter))
    if module:  # the chapter's checkers declare its variants when imported
        with contextlib.suppress(ImportError):
            importlib.import_module(f"flashlib.book.exercises.{module}")
    who = str(student or os.environ.get(ENV, "")).strip()
    os.environ[ENV] = who
    prefix = f"{chapter}." if chapter else ""
    lines = describe(prefix, who)
    if not lines:
        return who
    if who:
        print(f"Student {who}: your variants of this chapter's exercises "
              "(the grader checks these):")
    else:
        print("No student id (STUDENT_ID is empty): the book's variant 0 of each exercise. "
              "If your course grades you, put your id in STUDENT_ID and run this cell again.")
    for line in lines:
        print("  " + line)
    return who
