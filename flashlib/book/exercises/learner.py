"""Running a learner's function for a checker: :func:`call_learner` turns the learner's
exceptions into feedback (:class:`NotAttempted`, :class:`LearnerError`), records the warnings
the call raised with where each came from (:class:`Warned`, :func:`warned`), explains numpy's
shape errors in words, and refuses calls of the library functions the exercise forbids
(flashlib.book.exercises.refusal).  A grader's handle on a function that runs in another
process (flashlib.book.exercises.grader_adapter) is called the same way."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flashlib.book.exercises.feedback import LearnerError, NotAttempted, broadcast_hint
from flashlib.book.exercises.grader_adapter import is_remote
from flashlib.book.exercises.refusal import (
    FLASHLIB_DIR,
    _short,
    forbidden_names,
    library_call_problem,
    own_library_function,
    watching,
)

__all__ = ["Warned", "warning_source", "warned", "call_learner"]

class Warned(str):
    """A warning raised during the learner's call: ``"Category: message"`` as a string, with
    ``source``, where it came from: ``"numpy"`` (a floating-point warning: overflow, invalid
    value, divide by zero), ``"python:<module>"`` (a module of Python's standard library,
    e.g. ``"python:multiprocessing"``), ``"flashlib"``, or ``"your code"``."""

    source: str

    def __new__(cls, text: str, source: str = "your code") -> Warned:
        obj = super().__new__(cls, text)
        obj.source = source
        return obj



_NUMPY_MESSAGES = re.compile(r"encountered in|overflow|underflow|invalid value|divide by zero")


def warning_source(category: type, filename: str, message: str) -> str:
    """Where a warning came from (see :class:`Warned`), from its category, the file that
    raised it and its message."""
    name = str(filename)
    parts = Path(name).parts
    if "numpy" in parts or (issubclass(category, RuntimeWarning)
                            and _NUMPY_MESSAGES.search(message)):
        return "numpy"
    if name.startswith(FLASHLIB_DIR):
        return "flashlib"
    stdlib = Path(warnings.__file__).resolve().parent
    if name.startswith(str(stdlib)) and "site-packages" not in parts:
        module = Path(name).resolve().relative_to(stdlib).parts[0].removesuffix(".py")
        return f"python:{module}"
    if "site-packages" in parts:
        return f"package:{parts[parts.index('site-packages') + 1].split('.')[0]}"
    return "your code"


def warned(warning: str) -> str:
    """Feedback words for a warning of the learner's call: "numpy warned 'RuntimeWarning:
    overflow encountered in exp'", "Python's multiprocessing warned 'ResourceWarning: ...'
    (close the pool: use `with Pool() as pool:`)", or "your code warned '...'"."""
    source = getattr(warning, "source", "numpy")
    if source == "numpy":
        return f"numpy warned '{warning}'"
    if source.startswith("python:"):
        module = source.partition(":")[2]
        hint = (" (close the pool: `with Pool() as pool:`, or pool.close())"
                if "pool" in warning.lower() and module == "multiprocessing" else "")
        return f"Python's {module} warned '{warning}'{hint}"
    if source.startswith("package:"):
        return f"the package {source.partition(':')[2]} warned '{warning}'"
    if source == "flashlib":
        return f"flashlib warned '{warning}'"
    return f"your code warned '{warning}'"



def call_learner(fn: Callable[..., Any], *args: Any) -> tuple[Any, list[Warned]]:
    """Run the learner's ``fn(*args)`` for a checker: ``(result, warnings)``.

    ``warnings`` lists every warning raised during the call as a :class:`Warned`,
    ``"Category: message"`` with its source; numpy's error state is left as it is.
    ``NotImplementedError`` (the exercise not attempted yet) raises :class:`NotAttempted`;
    a call of a library function the checker forbids (:func:`forbidding`) raises
    :class:`LearnerError` "refused: ..."; any other exception raises :class:`LearnerError`
    "your function raised Type: message".
    """
    own = None if is_remote(fn) else own_library_function(fn)
    if own is not None:
        raise LearnerError(f"refused: you passed flashlib's `{_short(own)}`, which computes "
                           "the answer: this exercise asks you to write it yourself")
    remote = is_remote(fn)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if remote:  # the grader's handle watches the call where it runs, and refuses
                result = fn(*args)
                calls: list = []
            else:
                with watching(forbidden_names()) as calls:
                    result = fn(*args)
    except NotImplementedError as err:
        raise NotAttempted from err
    except LearnerError:
        raise
    except Exception as err:  # report any error from the learner's code
        hint = broadcast_hint(str(err)) if isinstance(err, ValueError) else None
        if hint is not None:
            raise LearnerError(f"your function hit a shape mismatch: {hint}") from err
        raise LearnerError(f"your function raised {type(err).__name__}: {err}") from err
    problem = library_call_problem(calls)
    if problem is not None:
        raise LearnerError(problem)
    return result, [Warned(f"{w.category.__name__}: {w.message}",
                           warning_source(w.category, w.filename, str(w.message)))
                    for w in caught]

