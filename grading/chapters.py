"""The chapters as the grader sees them: exercises, checker calls, the code before them.

number_key, exercise_cells   the exercises of a notebook, by their "Exercise C.K" headings
load_chapter(s)              a chapter (from the student notebook the book generates): its
                             steps (code cells and exercises in order), each exercise's
                             checker call, the cells as handed out
checker_function             the checker an exercise names (flashlib.book.exercises.MODULE.NAME)
checker_description          its title and what it checks; exercise_table: all of them
solutions                    the book's published solution of each exercise (flagging answers
                             identical to it; the made-up class's "solution" students)

Used by grading.grade (grading a class), grading.made_up_class and grading.instructor_files.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from flashlib.book.exercises.grader_adapter import CHECKER_PACKAGE
from tools import colab, convert, notebooks, toc
from tools.paths import ROOT

SOLUTION_SUMMARY = re.compile(r"<summary>Solution to Exercise (?P<number>[\d.]+)")
PYTHON_BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", re.MULTILINE | re.DOTALL)


def number_key(number: str) -> tuple[int, ...]:
    """Sort key of an exercise number, "2" < "10", "1.2" < "1.10"."""
    return tuple(int(part) for part in number.split("."))


def exercise_cells(nb: nbformat.NotebookNode, chapter_markdown: set[str] | None = None
                   ) -> dict[str, list[int]]:
    """``{exercise number: [indices of its code cells]}`` of a notebook: the code cells under
    the exercise's heading up to the next markdown cell; with ``chapter_markdown`` (the
    chapter's own markdown sources), only a markdown cell of the chapter ends an exercise (a
    student's note does not). A heading followed by another in the same cell has no cells."""
    found: dict[str, list[int]] = {}
    current: str | None = None
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            numbers = convert.exercise_numbers(cell.source)
            own = chapter_markdown is not None and cell.source.strip() not in chapter_markdown
            if numbers:
                for number in numbers:
                    found.setdefault(number, [])
                current = numbers[-1]
            elif not own:
                current = None
        elif cell.cell_type == "code" and current is not None:
            found[current].append(i)
    return found


def _parse(source: str) -> ast.Module | None:
    """A code cell as Python (IPython magics and shell lines turned into calls), or None."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return None


def checker_imports(sources: list[str]) -> dict[str, str]:
    """``{name in the chapter: "flashlib.book.exercises.module.checker"}`` for every
    ``from flashlib.book.exercises.X import ...`` of the chapter's code cells."""
    names = {}
    for source in sources:
        tree = _parse(source)
        for node in ast.walk(tree) if tree else ():
            if (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith(CHECKER_PACKAGE)):
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def checker_call(sources: list[str], checkers: dict[str, str]) -> tuple[str, str] | None:
    """``(call source, checker name)`` of the last top-level call of an imported checker in an
    exercise's cells (``check_merge(merge)``), or None: an exercise without a checker."""
    found = None
    for source in sources:
        code = _parse(source)
        for node in code.body if code else ():
            if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Name) and node.value.func.id in checkers):
                found = (ast.unparse(node.value), node.value.func.id)
    return found


@dataclass
class Exercise:
    number: str
    call: str  # the checker call as the chapter writes it: "check_merge(merge)"
    name: str  # the checker's name in the chapter's namespace: "check_merge"
    checker: str  # its full name: "flashlib.book.exercises.online_softmax.check_merge"


@dataclass
class Chapter:
    """One chapter as the grader sees it (from the student notebook the book generates)."""

    name: str  # "online-softmax"
    title: str
    steps: list[tuple[str, str]]  # ("code", source) or ("exercise", number), in order
    exercises: dict[str, Exercise]  # the exercises with a checker
    ungraded: list[str]  # exercise numbers without a checker call (not graded)
    markdown: set[str] = field(default_factory=set)  # its markdown cells' sources, stripped
    starters: dict[str, list[str]] = field(default_factory=dict)  # the cells as handed out

    def for_judge(self) -> dict[str, Any]:
        """What a judge needs of the chapter (grading/judge.py)."""
        return {"name": self.name, "steps": self.steps,
                "exercises": {n: asdict(e) for n, e in self.exercises.items()},
                "checkers": sorted({e.name for e in self.exercises.values()})}


def load_chapter(source: Path) -> Chapter:
    nb = convert.clean_notebook(source, student=True)
    setup = colab.colab_cell().source
    cells = exercise_cells(nb)
    owner = {i: number for number, indices in cells.items() for i in indices}
    checkers = checker_imports([c.source for c in nb.cells if c.cell_type == "code"])
    exercises, ungraded, steps = {}, [], []
    for number, indices in cells.items():
        found = checker_call([nb.cells[i].source for i in indices], checkers)
        if found is None:
            ungraded.append(number)
        else:
            exercises[number] = Exercise(number, found[0], found[1], checkers[found[1]])
    placed = set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cell.source == setup:
            continue
        if i not in owner:
            steps.append(("code", cell.source))
        elif owner[i] in exercises and owner[i] not in placed:
            steps.append(("exercise", owner[i]))
            placed.add(owner[i])
    title = toc.page_titles()[source.relative_to(ROOT).with_suffix("").as_posix()][0]
    markdown = {c.source.strip() for c in nb.cells if c.cell_type == "markdown"}
    starters = {n: [nb.cells[i].source for i in indices] for n, indices in cells.items()}
    return Chapter(source.stem, title, steps, exercises, ungraded, markdown, starters)


def load_chapters() -> dict[str, Chapter]:
    return {source.stem: load_chapter(source) for source in toc.chapters()}



def checker_function(full_name: str) -> Any:
    """The checker named ``flashlib.book.exercises.MODULE.NAME``."""
    import importlib

    module, _, name = full_name.rpartition(".")
    if not module.startswith(CHECKER_PACKAGE):
        raise ValueError(f"{full_name} is not one of the book's checkers")
    return getattr(importlib.import_module(module), name)


def _forbidden(exercise: Exercise) -> list[str]:
    """The library functions an exercise's checker forbids (its ``forbid``)."""
    try:
        return list(checker_function(exercise.checker).forbid)
    except (ImportError, AttributeError, ValueError):
        return []


def checker_description(full_name: str) -> tuple[str, str]:
    """``(title, what it checks)`` of a checker: its ``@checker("title")`` and the first
    paragraph of its docstring."""
    import importlib

    module_name, _, name = full_name.rpartition(".")
    module = importlib.import_module(module_name)
    title = ""
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Call) and getattr(deco.func, "id", "") == "checker"
                        and deco.args and isinstance(deco.args[0], ast.Constant)):
                    title = deco.args[0].value
    doc = inspect.getdoc(getattr(module, name)) or ""
    doc = " ".join(doc.split("\n\n")[0].split())
    doc = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", doc)  # reST roles and literals as Markdown
    return title, doc.replace("``", "`")


def exercise_table(chapters: dict[str, Chapter] | None = None) -> str:
    """Markdown: every exercise of the book with its checker and what the checker checks."""
    chapters = load_chapters() if chapters is None else chapters
    lines = ["| chapter | exercise | checker call | checker | what it checks |",
             "| --- | --- | --- | --- | --- |"]
    for chapter in chapters.values():
        for number in sorted(chapter.exercises, key=number_key):
            exercise = chapter.exercises[number]
            title, doc = checker_description(exercise.checker)
            doc = doc.replace("|", "\\|")
            lines.append(f"| {chapter.name} | {number} | `{exercise.call}` | "
                         f"`{exercise.checker}` ({title}) | {doc} |")
        for number in chapter.ungraded:
            lines.append(f"| {chapter.name} | {number} | - | - | no checker (not graded) |")
    return "\n".join(lines) + "\n"


def solutions(source: Path) -> dict[str, str]:
    """``{exercise number: the code of its solution}``: the ```python blocks and the code
    cells of each "Solution to Exercise" in the chapter's notebook (notebooks/NAME.ipynb)."""
    nb = nbformat.read(notebooks.target(source), as_version=4)
    found: dict[str, list[str]] = {}
    open_number = None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for part in re.split(r"(?=<details>)", cell.source):
                summary = SOLUTION_SUMMARY.search(part)
                if summary:
                    open_number = summary["number"]
                if open_number is not None:  # the solution's blocks, not those after it
                    found.setdefault(open_number, []).extend(
                        m["code"] for m in PYTHON_BLOCK.finditer(part.split("</details>")[0]))
                if "</details>" in part:
                    open_number = None
        elif cell.cell_type == "code":
            title = re.match(r"#@title Solution to Exercise ([\d.]+)", cell.source)
            if title:
                found.setdefault(title[1], []).append(cell.source.split("\n", 1)[1])
    found = {number: "\n\n".join(code.strip("\n") for code in codes)
             for number, codes in found.items() if codes}
    return found
