"""Refusal of library calls: an exercise that asks the learner to write attention, a merge,
a backward pass refuses an answer that calls flashlib's own (``@checker(title, forbid=...)``,
or :func:`forbidding` inside the body).

:func:`watching` records the calls of the named library functions made from code outside
flashlib while a block runs: it swaps each function's ``__code__`` for a small trampoline that
records the call and runs the original, and restores it afterwards (process-wide, whatever
name the learner's code calls it by; nothing else is slowed down).
:func:`library_call_problem` turns a recorded call into the refusal "refused: ...";
:func:`own_library_function` refuses the library's function passed as the answer itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ATTENTION", "MERGES", "names", "forbidding", "forbidden_names", "library_codes",
           "library_functions", "watching", "library_call_problem", "own_library_function",
           "FLASHLIB_DIR"]

#: The flashlib package's folder: code in it is the library's, any other is the learner's.
FLASHLIB_DIR = str(Path(__file__).resolve().parents[2])

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
            if not caller.f_code.co_filename.startswith(FLASHLIB_DIR):
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



def own_library_function(fn: Any) -> str | None:
    """The forbidden name that ``fn`` itself is (the learner passed the library's function,
    or a functools.partial of it), or None.  Any forbidden name counts, a rule's too: a rule
    allows some calls inside an answer, never the library function as the answer."""
    spec = _FORBIDDEN.get()
    if not spec:
        return None
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    for name in spec:
        if code is not None and code in library_codes([name]):
            return name
    return None

