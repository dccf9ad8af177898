"""Exercises as data, one test for all of them: for every exercise of the book, the book's own
solution (its ```python blocks, as the notebooks carry them) passes the exercise's checker, and
every mistake the checker declares (flashlib.book.exercises.mistakes.<chapter>: a wrong answer,
often a small wrong implementation, and the hints it must produce) fails with its own hints.

A declared mistake runs as a learner's code would (a copy of its source compiled outside
flashlib, tests.helpers.learner_copy), so that the checkers' refusal of library calls and their
naming of warnings see it as the learner's."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import types

import nbformat
import pytest

from flashlib.book.exercises import CHAPTERS
from flashlib.book.exercises.registry import declared_mistakes
from grading import chapters as grading_chapters
from tests.helpers import import_code, learner_copy, text
from tools import notebooks, toc


def _exercises() -> list[tuple[str, str, str, str]]:
    """``(chapter, number, checker call, checker's full name)`` of every exercise with a
    checker, from the student notebooks (what the grader reads too)."""
    found = []
    for source in toc.chapters():
        nb = nbformat.read(notebooks.target(source, student=True), as_version=4)
        codes = [c.source for c in nb.cells if c.cell_type == "code"]
        checkers = grading_chapters.checker_imports(codes)
        for number, indices in grading_chapters.exercise_cells(nb).items():
            call = grading_chapters.checker_call([nb.cells[i].source for i in indices],
                                                 checkers)
            if call is not None:
                found.append((source.stem, number, call[0], checkers[call[1]]))
    return sorted(found, key=lambda e: grading_chapters.number_key(e[1]))


EXERCISES = _exercises()
CHECKERS = {full: grading_chapters.checker_function(full) for *_, full in EXERCISES}
MISTAKES = [(full, mistake) for full, check in CHECKERS.items()
            for mistake in declared_mistakes(check)]
GPU_HEAD = "import triton\nimport triton.language as tl\n\n"


def _source(stem: str):
    return next(s for s in toc.chapters() if s.stem == stem)


@functools.cache
def _solutions(stem: str) -> dict[str, str]:
    return grading_chapters.solutions(_source(stem))


@functools.cache
def _chapter_imports(stem: str) -> str:
    """The top-level import statements of the chapter's code cells (what a solution may use)."""
    nb = nbformat.read(notebooks.target(_source(stem)), as_version=4)
    lines = []
    for cell in nb.cells:
        tree = grading_chapters._parse(cell.source) if cell.cell_type == "code" else None
        for node in tree.body if tree else ():
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                lines.append(ast.unparse(node))
    return "\n".join(lines)


def test_every_checker_of_every_chapter_is_an_exercise():
    """The list below covers every checker the chapters' modules export, once."""
    exported = {f"flashlib.book.exercises.{chapter}.{name}" for chapter in CHAPTERS
                for name in importlib.import_module(f"flashlib.book.exercises.{chapter}").__all__
                if name.startswith("check_")}
    assert set(CHECKERS) == exported, sorted(set(CHECKERS) ^ exported)
    assert len(EXERCISES) == len(CHECKERS) == 56


@pytest.mark.parametrize(("chapter", "number", "call", "full"), EXERCISES,
                         ids=[f"{n} {full.rpartition('.')[2]}" for _, n, _, full in EXERCISES])
def test_the_books_solution_passes(chapter, number, call, full, tmp_path):
    code = _solutions(chapter)
    assert number in code, f"no solution of Exercise {number} in the book"
    source = _chapter_imports(chapter) + "\n\n" + code[number] + "\n"
    if chapter == "gpu":  # Triton reads a kernel's source from its file
        if importlib.util.find_spec("triton") is None or importlib.util.find_spec(
                "torch") is None:
            pytest.skip("the GPU exercises need torch and triton")
        import flashlib.gpu

        if not flashlib.gpu.capabilities().triton:
            pytest.skip(" ".join(flashlib.gpu.capabilities().notes[:1]))
        namespace = vars(import_code(GPU_HEAD + source, tmp_path, f"solution_{number[3:]}"))
    else:
        namespace: dict = {}
        exec(compile(source, f"<solution {number}>", "exec"), namespace)  # noqa: S102
    fb = eval(call, namespace)  # noqa: S307 - the chapter's own checker call
    assert fb.passed, text(fb)


def _as_learner(arg):
    """A function as a learner hands it in (its source compiled again outside flashlib); a
    closure or a functools.partial (a mistake made by keyword) as it is."""
    if isinstance(arg, types.FunctionType) and not arg.__closure__:
        try:
            return learner_copy(arg)
        except (OSError, TypeError):  # no source (a lambda among others): as it is
            return arg
    return arg


def _needs_triton(interpreter: bool = False) -> None:
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("the GPU exercises need torch and triton")
    import flashlib.gpu

    caps = flashlib.gpu.capabilities()
    if not caps.triton:
        pytest.skip(" ".join(caps.notes[:1]))
    if interpreter and caps.mode != "interpreter":
        pytest.skip("the memory watch and tiles under 16: interpreter")


def _from_source(full: str, mistake, folder) -> tuple:
    """The checker's arguments of a mistake given as text: the right code (a library
    function's, or the book's solution) with the mistake's swaps, in a file of its own."""
    _needs_triton(mistake.needs == "interpreter")
    names = mistake.names
    if mistake.source == "solution":
        chapter, number = next((c, n) for c, n, _, f in EXERCISES if f == full)
        source = _solutions(chapter)[number]
    else:
        module_name, _, name = mistake.source.rpartition(".")
        fn = getattr(importlib.import_module(module_name), name)
        source = inspect.getsource(getattr(fn, "fn", fn))
        names = names or (name,)
    for old, new in mistake.swaps:
        assert old in source, f"{mistake.name}: {old!r} is not in the right code any more"
        source = source.replace(old, new)
    module = import_code(GPU_HEAD + source, folder, f"mistake_{abs(hash(mistake.name))}")
    return tuple(getattr(module, name) for name in names)


@pytest.mark.parametrize(("full", "mistake"), MISTAKES,
                         ids=[f"{full.rpartition('.')[2]}: {m.name}" for full, m in MISTAKES])
def test_a_declared_mistake_fails_with_its_hints(full, mistake, tmp_path):
    args = (_from_source(full, mistake, tmp_path) if mistake.source
            else tuple(map(_as_learner, mistake.args)))
    fb = CHECKERS[full](*args, **mistake.kwargs)
    assert not fb.passed, text(fb)
    for hint in mistake.hints:
        assert hint in text(fb), (hint, text(fb))
        if mistake.every_problem:
            assert all(hint in problem for problem in fb.problems), (hint, text(fb))
    for phrase in mistake.absent:
        assert phrase not in text(fb), (phrase, text(fb))


def test_each_mistake_is_named_once_and_has_a_hint():
    for full, check in CHECKERS.items():
        declared = declared_mistakes(check)
        names = [m.name for m in declared]
        assert len(names) == len(set(names)), (full, names)
        assert all(m.hints and all(m.hints) for m in declared), full
