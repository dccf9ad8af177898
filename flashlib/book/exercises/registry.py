"""The registry: :func:`checker` turns a checker's body into the function a chapter calls,
and keeps every checker and its declared mistakes (:class:`Mistake`: a small wrong
implementation, a "mutant", with the hints its feedback must contain), so that one test
(tests/book/exercises/test_declared_mistakes.py) proves for every exercise that the book's
solution passes and every declared mistake fails with its own hint."""

from __future__ import annotations

import functools
import importlib
import inspect
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flashlib.book.exercises.feedback import NOT_ATTEMPTED, Feedback, LearnerError, NotAttempted
from flashlib.book.exercises.refusal import forbidding

__all__ = ["checker", "CHAPTERS", "Mistake", "declare_mistakes", "declared_mistakes",
           "learner_copy"]

#: The chapters' checker modules, in the book's order (flashlib.book.exercises.NAME).
CHAPTERS = ("intro", "overflow", "online_softmax", "ladder", "tiling", "io_model", "masking",
            "backward", "precision", "gpu", "beyond")


@dataclass(frozen=True)
class Mistake:
    """A named mistake a checker must catch: ``args``, the checker's arguments as a learner
    who made it hands them in (the mutant: a small wrong implementation, or a wrong answer),
    and ``hints``, phrases the feedback must contain (the diagnosis and what to try).
    ``absent``: phrases it must not contain (the right value of a derivation, another
    mistake's diagnosis); ``every_problem``: each hint is in every problem line (the mistake
    is diagnosed alike on every case where it is wrong).

    A mistake in code that must live in a file of its own (a Triton kernel: Triton reads its
    source) is given as text: ``source``, where the right code comes from (the dotted name
    of a library function, or ``"solution"``: the book's solution of the exercise), and
    ``swaps``, each ``(old, new)`` replaced in it; the checker's arguments are then the
    module's ``names`` (by default the function's own name).  ``needs``: ``"interpreter"``
    when the checker sees the mistake only in Triton's interpreter (its memory watch)."""

    name: str
    args: tuple
    hints: tuple[str, ...]
    absent: tuple[str, ...] = ()
    every_problem: bool = False
    kwargs: dict = field(default_factory=dict)
    source: str = ""
    swaps: tuple[tuple[str, str], ...] = ()
    names: tuple[str, ...] = ()
    needs: str = ""


#: ``{checker's qualified name: [its declared mistakes]}``, filled by :func:`declare_mistakes`.
_MISTAKES: dict[str, list[Mistake]] = {}


def learner_copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A learner's copy of a function: its source compiled again (outside flashlib's files) in
    a copy of its module's namespace, as a student who pasted the code the page shows hands it
    in.  The checkers refuse the library's own function where the exercise asks for it
    (flashlib.book.exercises.refusal), not a copy of its code; a declared mistake runs as such
    a copy (tests/book/exercises/test_declared_mistakes.py)."""
    original = inspect.unwrap(fn)
    namespace = dict(original.__globals__)
    exec(compile(textwrap.dedent(inspect.getsource(original)),  # noqa: S102
                 f"<a copy of {original.__qualname__}>", "exec"), namespace)
    return namespace[original.__name__]


def _key(check: Callable[..., Any]) -> str:
    body = inspect.unwrap(check)
    return f"{body.__module__}.{body.__qualname__}"


def declare_mistakes(check: Callable[..., Feedback], *declared: Mistake) -> None:
    """Declare the mistakes ``check`` must catch, each with its own hint."""
    _MISTAKES.setdefault(_key(check), []).extend(declared)


def declared_mistakes(check: Callable[..., Feedback]) -> list[Mistake]:
    """The mistakes declared for ``check`` (its chapter's flashlib.book.exercises.mistakes
    module is imported first: the declarations live there, beside the checkers)."""
    chapter = inspect.unwrap(check).__module__.rpartition(".")[2]
    try:
        importlib.import_module(f"flashlib.book.exercises.mistakes.{chapter}")
    except ModuleNotFoundError as err:
        if err.name != f"flashlib.book.exercises.mistakes.{chapter}":
            raise
    return list(_MISTAKES.get(_key(check), []))


def checker(title: str, forbid: Mapping[str, Callable[[list], str | None] | None] | None = None
            ) -> Callable[[Callable[..., None]], Callable[..., Feedback]]:
    """Decorator: ``body(fb, *args)`` becomes ``check(*args) -> Feedback`` titled ``title``.

    The body records its checks on ``fb``.  An exercise not attempted yet (:class:`NotAttempted`,
    wherever it is raised) gives the one "not attempted yet" problem; a :class:`LearnerError`
    outside any :meth:`Feedback.case` is recorded as a problem too.  The checker never raises
    because of the learner's code.  ``forbid``: the library functions the exercise asks the
    learner to write (:func:`forbidding`), refused while the checker runs; ``check.forbid``
    keeps them.
    """
    spec = dict(forbid or {})

    def decorate(body: Callable[..., None]) -> Callable[..., Feedback]:
        @functools.wraps(body)
        def check(*args: Any, **kwargs: Any) -> Feedback:
            fb = Feedback(title)
            try:
                with forbidding(spec):
                    body(fb, *args, **kwargs)
            except NotAttempted:
                fb.problems = [NOT_ATTEMPTED]
                fb.passes = []
            except LearnerError as err:
                fb.fail(str(err))
            fb.show()  # the verdict shows even when the call is not the cell's last line
            return fb

        signature = inspect.signature(body)  # shown by help(): the body's, without fb
        check.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=list(signature.parameters.values())[1:], return_annotation="Feedback")
        check.forbid = spec  # type: ignore[attr-defined]
        return check

    return decorate

