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

Answers that call the library instead of writing the algorithm are refused: a checker names
the flashlib functions its exercise asks the learner to write (``@checker(title,
forbid=...)``, or :func:`forbidding` inside the body), and :func:`call_learner` watches the
learner's call (:func:`watching`, ``sys.setprofile``): a call of one of them from the
learner's code becomes the problem "refused: ...", in Jupyter as in the grader.  A warning
the learner's code raised is named after where it came from (:class:`Warned`,
:func:`warned`): numpy's floating-point warnings, a module of Python's (an unclosed
``multiprocessing`` pool's ResourceWarning), flashlib, or the learner's own code.

In the grader (tools/grade.py) the learner's function runs in another process: it reaches a
checker as a handle (``__learner_remote__``) whose calls run there; :func:`call_learner`
works the same on it, and :func:`learner_side` marks the checkers' helpers that must run
where the learner's code is (the GPU chapter's kernel launches).

Shapes, said once for every checker: numpy's broadcast and matmul errors raised by the
learner's code are explained in words by :func:`call_learner` (:func:`broadcast_hint`: "a
row's maximum has shape (4,); keep the reduced axis with keepdims=True or [:, None] so it
broadcasts against the (4, 8) scores"), and :func:`shape_problem` says what is wrong with a
returned array's shape (a missing or extra trailing axis of 1, a transpose, lost leading
dimensions) against the shape expected.

On the website no verdict is shown: while the book is built
(:func:`flashlib.book.site.static_site`) a Feedback displays the neutral :data:`ON_THE_SITE`
line, so the page gives nothing away before the reader has tried; in Jupyter and Colab it
shows the verdict.

A checker displays its Feedback itself, as soon as it returns, whenever it runs in an IPython
kernel (Jupyter, Colab, the book's build): the verdict shows even when the call is not the
last line of its cell (``check_x(f)`` followed by ``print("done")``). The returned Feedback,
as the cell's last expression, is then not shown a second time in the same cell
(:meth:`Feedback._ipython_display_`); shown in a later cell, or printed, it shows again.

flashlib.book.exercises.intro           the Introduction
flashlib.book.exercises.overflow        The overflow problem
flashlib.book.exercises.online_softmax  Online softmax
flashlib.book.exercises.ladder          The optimisation ladder
flashlib.book.exercises.tiling          Tiling
flashlib.book.exercises.io_model        The HBM IO model
flashlib.book.exercises.masking         Masking
flashlib.book.exercises.backward        The backward pass
flashlib.book.exercises.gpu             On a real GPU (Triton kernels, run in the interpreter
                                        without a GPU)
flashlib.book.exercises.beyond          Beyond FlashAttention-1 (split-KV, grouped-query)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import inspect
import re
import sys
import types
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flashlib.book.site import static_site

__all__ = [
    "Feedback",
    "NotAttempted",
    "LearnerError",
    "NOT_ATTEMPTED",
    "ON_THE_SITE",
    "Warned",
    "warned",
    "call_learner",
    "checker",
    "forbidding",
    "names",
    "ATTENTION",
    "MERGES",
    "library_codes",
    "library_functions",
    "watching",
    "library_call_problem",
    "learner_side",
    "fmt",
    "broadcast_hint",
    "shape_problem",
]

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
        if static_site():
            return f"{self.exercise}:\n{ON_THE_SITE}"
        head = (f"PASSED {self.exercise}: all {len(self.passes)} checks passed."
                if self.passed else f"NOT YET {self.exercise}:")
        lines = [head]
        lines += [f"  x  {p}" for p in self.problems]
        lines += [f"  ok {p}" for p in self.passes]
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


_FLASHLIB_DIR = str(Path(__file__).resolve().parents[2])  # the flashlib package's folder
_NUMPY_MESSAGES = re.compile(r"encountered in|overflow|underflow|invalid value|divide by zero")


def warning_source(category: type, filename: str, message: str) -> str:
    """Where a warning came from (see :class:`Warned`), from its category, the file that
    raised it and its message."""
    name = str(filename)
    parts = Path(name).parts
    if "numpy" in parts or (issubclass(category, RuntimeWarning)
                            and _NUMPY_MESSAGES.search(message)):
        return "numpy"
    if name.startswith(_FLASHLIB_DIR):
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


# ---------------------------------------------------------------------------------------------
# Refusing answers that call the library
# ---------------------------------------------------------------------------------------------

#: The library's attention functions: the answer to "write attention" (forbidden by the
#: exercises that ask for it).
ATTENTION = ("flashlib.fast.naive.naive_attention", "flashlib.fast.forward.flash_attention",
             "flashlib.fast.flash_v1.flash_attention_v1", "flashlib.algorithms.standard_attention",
             "flashlib.algorithms.flash1_forward", "flashlib.algorithms.flash2_forward",
             "flashlib.algorithms.masked_flash_forward",
             "flashlib.algorithms.grouped_query_attention", "flashlib.algorithms.split_kv_decode")
#: The library's merges of partial softmax states.
MERGES = ("flashlib.algorithms.merge_states", "flashlib.fast.online.merge_partials",
          "flashlib.fast.online.merge_in_order", "flashlib.fast.online.merge_random_tree")


def names(*groups: tuple[str, ...] | str) -> dict[str, None]:
    """A ``forbid`` spec refusing every call of the named functions."""
    out: dict[str, None] = {}
    for group in groups:
        out |= dict.fromkeys((group,) if isinstance(group, str) else group)
    return out


#: The library functions the running checker forbids: ``{dotted name: rule or None}``.  A
#: rule takes the shapes of the call's positional arguments (None for a non-array) and
#: returns why the call is refused, or None to allow it.
_FORBIDDEN: contextvars.ContextVar[Mapping[str, Callable[[list], str | None] | None]] = (
    contextvars.ContextVar("flashlib_forbidden", default=types.MappingProxyType({})))


@contextlib.contextmanager
def forbidding(spec: Mapping[str, Callable[[list], str | None] | None]) -> Iterator[None]:
    """Within the block, :func:`call_learner` refuses learner calls of the library functions
    ``spec`` names (dotted names, e.g. ``"flashlib.fast.online.merge_partials"``), or those
    calls its rule refuses."""
    token = _FORBIDDEN.set(dict(_FORBIDDEN.get()) | dict(spec))
    try:
        yield
    finally:
        _FORBIDDEN.reset(token)


def forbidden_names() -> list[str]:
    """The dotted names forbidden now (what the grader asks its sandbox to watch)."""
    return list(_FORBIDDEN.get())


def _resolve(name: str) -> Any:
    """The object of a dotted name: the longest importable module, then attributes (a
    package's attribute may hide its module of the same name: flashlib.fast.softmax)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(f"cannot resolve {name!r}")


def library_codes(names: list[str]) -> dict[Any, str]:
    """``{code object: dotted name}`` of the named functions and what they wrap."""
    codes: dict[Any, str] = {}
    for name in names:
        obj = _resolve(name)
        while obj is not None:
            code = getattr(obj, "__code__", None)
            if code is not None:
                codes.setdefault(code, name)
            obj = getattr(obj, "__wrapped__", None)
    return codes


def library_functions(names: list[str]) -> dict[Any, str]:
    """``{function: dotted name}`` of the named functions (the outermost of a decorated one)."""
    found: dict[Any, str] = {}
    for name in names:
        fn = _resolve(name)
        if isinstance(fn, types.FunctionType):
            found.setdefault(fn, name)
    return found


#: The functions :func:`watching` has wrapped, with how many watchers: ``{function: (its own
#: code, count)}``; and the handlers their wrapped code calls, by key.
_WATCHED: dict[Any, list] = {}
_HANDLERS: dict[int, Callable[[tuple, dict], Any]] = {}
_TRAMPOLINE = ("def _watched(*args, **kwargs):\n"
               "    return __flashlib_watch__[{key}](args, kwargs)\n")


def _shapes(code: Any, args: tuple, kwargs: dict) -> list[tuple[int, ...] | None]:
    """The shapes of a call's positional parameters (None for a non-array)."""
    names = code.co_varnames[: code.co_argcount]
    values = list(args[: len(names)]) + [kwargs.get(n) for n in names[len(args):]]
    return [tuple(np.shape(v)) if hasattr(v, "shape") else None for v in values]


@contextlib.contextmanager
def watching(names: list[str] | dict[Any, str]) -> Iterator[list[tuple[str, list]]]:
    """Record the calls of the named library functions made from code outside flashlib (in
    any thread) while the block runs: ``[(dotted name, shapes of its positional
    arguments)]``.  Each function's code is swapped for a small one that records the call
    and runs the original, and restored after: whatever name the learner's code calls it by,
    the call is seen, and nothing else is slowed down."""
    calls: list[tuple[str, list]] = []
    functions = library_functions(names) if isinstance(names, list) else dict(names)
    swapped = []
    for fn, name in functions.items():
        if fn.__closure__:  # cannot be swapped (none of flashlib's public functions)
            continue
        if fn in _WATCHED:
            _WATCHED[fn][1] += 1
            swapped.append(fn)
            continue
        original = fn.__code__
        run = types.FunctionType(original, fn.__globals__, fn.__name__, fn.__defaults__)
        run.__kwdefaults__ = fn.__kwdefaults__
        key = id(fn)

        def handler(args: tuple, kwargs: dict, run: Any = run, name: str = name,
                    original: Any = original) -> Any:
            caller = sys._getframe(2)  # the trampoline's caller
            if not caller.f_code.co_filename.startswith(_FLASHLIB_DIR):
                for record in _RECORDERS:
                    record.append((name, _shapes(original, args, kwargs)))
            return run(*args, **kwargs)

        namespace: dict[str, Any] = {}
        exec(compile(_TRAMPOLINE.format(key=key), f"<watched {name}>", "exec"),  # noqa: S102
             namespace)
        fn.__globals__.setdefault("__flashlib_watch__", _HANDLERS)
        _HANDLERS[key] = handler
        fn.__code__ = namespace["_watched"].__code__
        _WATCHED[fn] = [original, 1]
        swapped.append(fn)
    _RECORDERS.append(calls)
    try:
        yield calls
    finally:
        _RECORDERS.remove(calls)
        for fn in swapped:
            _WATCHED[fn][1] -= 1
            if _WATCHED[fn][1] == 0:
                fn.__code__ = _WATCHED.pop(fn)[0]
                _HANDLERS.pop(id(fn), None)


#: The lists :func:`watching` blocks in progress record into.
_RECORDERS: list[list[tuple[str, list]]] = []


def _short(name: str) -> str:
    return name.rpartition(".")[2]


def library_call_problem(calls: list[tuple[str, list]]) -> str | None:
    """The refusal for the first forbidden call among ``calls`` (see :func:`forbidding`), or
    None."""
    spec = _FORBIDDEN.get()
    for name, shapes in calls:
        if name not in spec:
            continue
        rule = spec[name]
        reason = (None if rule is not None else
                  f"your code calls flashlib's `{_short(name)}`, which computes the answer: "
                  "this exercise asks you to write it yourself")
        if rule is not None:
            try:
                reason = rule(list(shapes))
            except Exception:  # noqa: BLE001 - odd arguments: the rule does not apply
                reason = None
        if reason:
            return f"refused: {reason}"
    return None


def _own_library_function(fn: Any) -> str | None:
    """The forbidden name that ``fn`` itself is (the learner passed the library's function,
    or a functools.partial of it), or None.  Any forbidden name counts, a rule's too: a rule
    allows some calls inside an answer, never the library function as the answer."""
    spec = _FORBIDDEN.get()
    if not spec or getattr(fn, "__learner_remote__", False):
        return None
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    for name in spec:
        if code is not None and code in library_codes([name]):
            return name
    return None


def call_learner(fn: Callable[..., Any], *args: Any) -> tuple[Any, list[Warned]]:
    """Run the learner's ``fn(*args)`` for a checker: ``(result, warnings)``.

    ``warnings`` lists every warning raised during the call as a :class:`Warned`,
    ``"Category: message"`` with its source; numpy's error state is left as it is.
    ``NotImplementedError`` (the exercise not attempted yet) raises :class:`NotAttempted`;
    a call of a library function the checker forbids (:func:`forbidding`) raises
    :class:`LearnerError` "refused: ..."; any other exception raises :class:`LearnerError`
    "your function raised Type: message".
    """
    own = _own_library_function(fn)
    if own is not None:
        raise LearnerError(f"refused: you passed flashlib's `{_short(own)}`, which computes "
                           "the answer: this exercise asks you to write it yourself")
    remote = getattr(fn, "__learner_remote__", False)
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


def learner_side(helper: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for a checker's helper that must run where the learner's function lives
    (it plugs it into a Triton kernel): given a grader's handle among its arguments, the
    helper runs in the learner's process (``handle.run_helper``); otherwise here."""

    @functools.wraps(helper)
    def run(*args: Any, **kwargs: Any) -> Any:
        remote = next((a for a in (*args, *kwargs.values())
                       if getattr(a, "__learner_remote__", False)), None)
        if remote is None:
            return helper(*args, **kwargs)
        return remote.run_helper(helper.__module__, helper.__qualname__, args, kwargs)

    return run


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


def fmt(x: Any) -> str:
    """An array (or number) on one line, 4 digits: for feedback messages."""
    return np.array2string(np.asarray(x), precision=4, separator=", ", max_line_width=10_000)
