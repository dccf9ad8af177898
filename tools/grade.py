"""Grade students' notebooks with the book's own exercise checkers (``make grade``).

    python -m tools.grade SUBMISSIONS [--out grading-report] [--timeout 60] [--jobs 1]
                            [--chapters overflow online-softmax ...]
    python -m tools.grade --list-exercises     # every exercise, its checker, what it checks

(the processes that run the students' code: tools/grade_worker.py)

SUBMISSIONS is a folder of the students' notebooks (the student edition, notebooks/student/,
with their code in the exercise cells): one sub-folder per student, at any depth below it
(nbgrader's ``submitted/<student>/<assignment>/NAME.ipynb`` works as it is), or notebooks
directly in it, one per student (the student is the file name). A notebook is matched to its
chapter by its title (its first ``# `` heading), else by its file name (``Copy of NAME.ipynb``
too); any other notebook is reported as unrelated, an unreadable one as such.

How an exercise is graded. Exercises are numbered as the notebooks and the site number them
(tools/convert.py: the headings its ``directive`` writes, read by
``convert.exercise_numbers``). The exercise's cells in the student's notebook are the code
cells under its heading, up to the next markdown cell of the chapter (the student's own
markdown cells do not end it). For each chapter, one worker process runs the chapter's own code
cells in order, from the student notebook the book generates (never the students' copies), as
Jupyter would (IPython, working directory book/, matplotlib's Agg backend, one BLAS/OpenMP
thread); at each exercise it forks one child per student notebook (``--jobs`` at a time), so
each exercise of each student runs in isolation, in the namespace the chapter has at that point,
at the cost of one run of the chapter per grading run. A child runs the student's exercise cells
(their own calls of the checker do nothing there), then the exercise's checker call as the
chapter writes it, e.g. ``check_merge(merge)``, with the real checker, and reports the
:class:`~flashlib.book.exercises.Feedback`. A child still running after ``--timeout`` seconds is
killed and reported as a timeout; one that dies is reported as crashed; a file written by the
student's code is limited to 16 MiB. Forking needs Linux or macOS (Windows: use WSL).

The status of an exercise:

    passed         every check passed
    failed         the checker ran and a check failed
    not attempted  the function still raises NotImplementedError (the cell's placeholder)
    error          an exercise cell raised (a syntax error too; even if the checks then pass,
                   whose counts the row keeps), or the checker call could not run (e.g. the
                   function the exercise asks for is not defined)
    timeout        killed at the time limit (an infinite loop, or far too slow)
    crashed        the process died (e.g. out of memory, os._exit)
    missing        the notebook has no heading or no code cell for the exercise, or the student
                   has no notebook for a chapter named with --chapters
    unrelated      (a notebook, not an exercise) not a chapter of the book
    unreadable     (a notebook) not a readable .ipynb file
    grader-error   the chapter itself failed to run here (see logs/CHAPTER.log)

What it writes in --out:

    results.csv        one row per student, notebook and exercise: student, notebook, chapter,
                       exercise, status, passed, checks_passed, checks_total, first_problem,
                       runtime_s
    results.json       the same rows with each checker's whole feedback and the tail of what
                       the student's code printed
    summary.md         per chapter, a table of students x exercises, then every problem
    nbgrader_grades.csv  one row per chapter and student in the columns of nbgrader's
                       ``nbgrader export`` (assignment = chapter, score = exercises passed)
    otter_final_grades_CHAPTER.csv  otter-grader's final_grades.csv layout (one point per
                       exercise, first row points-per-question)
    logs/CHAPTER.log   what running the chapter printed

Why in tools/ and not in the flashlib package: it reads the chapters (book/*.md, through
tools/convert.py, the one reader of the exercises' numbers), which only the repository has;
the checkers it runs are the package's. Grade with a checkout of the release the students used.

This is not a sandbox: the students' code runs with your permissions. Grade untrusted
notebooks in a container or a throw-away account, as nbgrader and otter-grader advise.
"""

from __future__ import annotations

import argparse
import ast
import csv
import html
import inspect
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from tools import toc
from tools.colab import colab_cell
from tools.convert import clean_notebook, exercise_numbers
from tools.grade_worker import one_line
from tools.paths import ROOT

CHECKER_PACKAGE = "flashlib.book.exercises"
WORKER = "tools.grade_worker"  # run as python -m, with the repository root on PYTHONPATH
CSV_COLUMNS = ["student", "notebook", "chapter", "exercise", "status", "passed",
               "checks_passed", "checks_total", "first_problem", "runtime_s"]
STATUSES = ("passed", "failed", "not attempted", "error", "timeout", "crashed", "missing",
            "unrelated", "unreadable", "grader-error")
#: Environment of the worker that runs a chapter: as the book's build runs it, single-threaded
#: (forking is safe, the children's timings are comparable).
WORKER_ENV = {"MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1",
              "PYDEVD_DISABLE_FILE_VALIDATION": "1"}


# ---------------------------------------------------------------------------------------------
# The chapters: exercises, checker calls and the code that runs before them
# ---------------------------------------------------------------------------------------------

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
            numbers = exercise_numbers(cell.source)
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


def load_chapter(source: Path) -> Chapter:
    nb = clean_notebook(source, student=True)
    setup = colab_cell().source
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
    return Chapter(source.stem, title, steps, exercises, ungraded, markdown)


def load_chapters() -> dict[str, Chapter]:
    return {source.stem: load_chapter(source) for source in toc.chapters()}


# ---------------------------------------------------------------------------------------------
# The students' notebooks
# ---------------------------------------------------------------------------------------------

@dataclass
class Submission:
    student: str
    path: Path
    notebook: str  # the path relative to the submissions folder, as the reports show it


def find_submissions(folder: Path) -> list[Submission]:
    """Every .ipynb below ``folder`` (not in hidden folders or .ipynb_checkpoints): the
    student is the first folder under ``folder``, or the file name for a notebook in it."""
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") or part == ".ipynb_checkpoints" for part in rel.parts):
            continue
        student = rel.parts[0] if len(rel.parts) > 1 else path.stem
        found.append(Submission(student, path, rel.as_posix()))
    return found


def notebook_title(nb: nbformat.NotebookNode) -> str | None:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^# (.+)$", cell.source, re.MULTILINE)
            if match:
                return match[1].strip()
    return None


def match_chapter(nb: nbformat.NotebookNode, path: Path, chapters: dict[str, Chapter]
                  ) -> Chapter | None:
    """The chapter of a student's notebook: by its title, else by its file name."""
    title = notebook_title(nb)
    for chapter in chapters.values():
        if title == chapter.title:
            return chapter
    stem = re.sub(r"^copy of ", "", path.stem.lower())
    stem = re.sub(r"\s*\(\d+\)$", "", stem)
    return chapters.get(stem)


# ---------------------------------------------------------------------------------------------
# Rows of the report
# ---------------------------------------------------------------------------------------------

@dataclass
class Row:
    student: str
    notebook: str
    chapter: str
    exercise: str
    status: str
    checks_passed: int = 0
    checks_total: int = 0
    first_problem: str = ""
    runtime_s: float | None = None
    feedback: str = ""
    output: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def csv(self) -> dict[str, Any]:
        return {"student": self.student, "notebook": self.notebook, "chapter": self.chapter,
                "exercise": self.exercise, "status": self.status, "passed": self.passed,
                "checks_passed": self.checks_passed, "checks_total": self.checks_total,
                "first_problem": self.first_problem,
                "runtime_s": "" if self.runtime_s is None else f"{self.runtime_s:.2f}"}


# ---------------------------------------------------------------------------------------------
# Grading: submissions -> rows
# ---------------------------------------------------------------------------------------------

def grade_chapter(chapter: Chapter, tasks: list[dict[str, Any]], timeout: float, jobs: int,
                  logs: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Run the chapter's worker on ``tasks``: ``({task id: result}, [context errors])``."""
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        job, results = Path(tmp) / "job.json", Path(tmp) / "results.jsonl"
        job.write_text(json.dumps({
            "cwd": str(ROOT / "book"), "steps": chapter.steps, "tasks": tasks,
            "exercises": {n: asdict(e) for n, e in chapter.exercises.items()},
            "timeout": timeout, "jobs": jobs, "results": str(results)}), encoding="utf-8")
        env = os.environ | WORKER_ENV | {"IPYTHONDIR": str(Path(tmp) / "ipython"),
                                          "PYTHONPATH": str(ROOT)}
        logs.mkdir(parents=True, exist_ok=True)
        budget = 1800 + timeout * len(tasks) / jobs
        worker_errors = []
        with open(logs / f"{chapter.name}.log", "w", encoding="utf-8") as log:
            proc = subprocess.Popen([sys.executable, "-m", WORKER, str(job)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
            try:
                code = proc.wait(timeout=budget)
                if code:
                    worker_errors.append(f"the chapter's worker exited with code {code}")
            except subprocess.TimeoutExpired:
                worker_errors.append(f"the chapter did not finish in {budget:g} s")
            finally:
                try:  # the worker and anything a student's code left running
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        found, errors = {}, []
        lines = results.read_text(encoding="utf-8").splitlines() if results.exists() else []
        for line in lines:
            result = json.loads(line)
            if "context_error" in result:
                errors.append(result["context_error"])
            else:
                found[result["id"]] = result
    return found, errors + worker_errors


def grade(folder: Path, out: Path, *, timeout: float = 60.0, jobs: int = 1,
          chapter_names: list[str] | None = None) -> list[Row]:
    """Grade every notebook below ``folder``; write the reports into ``out``; the rows."""
    if not hasattr(os, "fork"):
        raise SystemExit("tools/grade.py forks a process per exercise: run it on Linux or "
                         "macOS (on Windows, in WSL)")
    chapters = load_chapters()
    unknown = sorted(set(chapter_names or []) - set(chapters))
    if unknown:
        raise SystemExit(f"--chapters: no chapter {', '.join(unknown)} (chapters: "
                         f"{', '.join(chapters)})")
    rows: list[Row] = []
    tasks: dict[str, list[dict[str, Any]]] = {name: [] for name in chapters}
    pending: dict[str, Row] = {}
    graded: dict[str, set[str]] = {}  # chapter -> students with a notebook for it
    for sub in find_submissions(folder):
        try:
            nb = nbformat.read(sub.path, as_version=4)
        except Exception as err:  # noqa: BLE001 - any unreadable file is reported
            rows.append(Row(sub.student, sub.notebook, "", "", "unreadable",
                            first_problem=f"not a readable notebook: {one_line(err, 200)}"))
            continue
        chapter = match_chapter(nb, sub.path, chapters)
        if chapter is None:
            rows.append(Row(sub.student, sub.notebook, "", "", "unrelated",
                            first_problem=f"not a chapter of the book (title "
                                          f"{notebook_title(nb)!r}, file {sub.path.name!r})"))
            continue
        graded.setdefault(chapter.name, set()).add(sub.student)
        cells = exercise_cells(nb, chapter.markdown)
        for number in chapter.exercises:
            row = Row(sub.student, sub.notebook, chapter.name, number, "missing")
            if number not in cells:
                row.first_problem = f"no 'Exercise {number}' heading in the notebook"
            elif not cells[number]:
                row.first_problem = f"no code cell under Exercise {number}"
            else:
                task_id = f"{len(pending)}"
                pending[task_id] = row
                tasks[chapter.name].append({"id": task_id, "exercise": number,
                                            "cells": [nb.cells[i].source
                                                      for i in cells[number]]})
            rows.append(row)
    for name in chapter_names or []:
        students = {r.student for r in rows} - graded.get(name, set())
        for student in sorted(students):
            rows.append(Row(student, "", name, "", "missing",
                            first_problem=f"no notebook of the chapter {name!r}"))
    context_errors: dict[str, list[str]] = {}
    for name, chapter_tasks in tasks.items():
        if not chapter_tasks:
            continue
        found, errors = grade_chapter(chapters[name], chapter_tasks, timeout, jobs,
                                      out / "logs")
        context_errors[name] = errors
        for task in chapter_tasks:
            row = pending[task["id"]]
            result = found.get(task["id"])
            if result is None:
                row.status = "grader-error"
                row.first_problem = (f"no result: the chapter failed to run here "
                                     f"({one_line('; '.join(errors) or 'see the log', 200)})")
                continue
            row.status = result["status"]
            row.checks_passed = result.get("checks_passed", 0)
            row.checks_total = result.get("checks_total", 0)
            row.first_problem = one_line(result.get("first_problem", ""))
            row.runtime_s = result.get("runtime_s")
            row.feedback = result.get("feedback", "")
            row.output = result.get("output", "")
    order = {name: i for i, name in enumerate(chapters)}
    rows.sort(key=lambda r: (r.student, order.get(r.chapter, -1), r.notebook,
                             number_key(r.exercise) if r.exercise else ()))
    write_reports(rows, chapters, out, timeout=timeout, context_errors=context_errors,
                  chapter_names=chapter_names)
    return rows


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------

def write_reports(rows: list[Row], chapters: dict[str, Chapter], out: Path, *, timeout: float,
                  context_errors: dict[str, list[str]], chapter_names: list[str] | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(row.csv() for row in rows)
    (out / "results.json").write_text(json.dumps(
        [row.csv() | {"feedback": row.feedback, "output": row.output} for row in rows],
        indent=1) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(summary(rows, chapters, timeout, context_errors),
                                    encoding="utf-8")
    assignments = [n for n in chapters if n in (chapter_names or [])
                   or any(r.chapter == n and r.exercise for r in rows)]
    write_nbgrader_csv(rows, chapters, assignments, out / "nbgrader_grades.csv")
    for name in assignments:
        write_otter_csv(rows, chapters[name], out / f"otter_final_grades_{name}.csv")


def _cell(row: Row) -> str:
    if row.status in ("passed", "failed"):
        return f"{row.status} {row.checks_passed}/{row.checks_total}"
    return row.status


def _md(text: str) -> str:
    """Text for a Markdown table cell or list item: one line, no table breaks, no HTML."""
    return html.escape(one_line(text), quote=False).replace("|", "\\|")


def summary(rows: list[Row], chapters: dict[str, Chapter], timeout: float,
            context_errors: dict[str, list[str]]) -> str:
    """The readable report: per chapter, students x exercises, then what went wrong."""
    from flashlib import __version__

    notebooks_graded = {(r.student, r.notebook) for r in rows if r.notebook}
    out = io.StringIO()
    out.write("# Grading report\n\n")
    out.write(f"{len(notebooks_graded)} notebooks of {len({r.student for r in rows})} "
              f"students, graded with the checkers of flashlib {__version__} "
              f"(`tools/grade.py`), each exercise in its own process with a time limit of "
              f"{timeout:g} s. A cell shows the status and the checks passed; `results.csv` "
              "has every row, `results.json` the checkers' whole feedback.\n")
    for name, chapter in chapters.items():
        chapter_rows = [r for r in rows if r.chapter == name]
        if not chapter_rows:
            continue
        numbers = sorted(chapter.exercises, key=number_key)
        out.write(f"\n## {chapter.title} (`{name}`)\n\n")
        if chapter.ungraded:
            out.write(f"Exercises without a checker (not graded): "
                      f"{', '.join(chapter.ungraded)}.\n\n")
        for error in context_errors.get(name, []):
            out.write(f"> **The chapter itself**: {_md(error)} (`logs/{name}.log`)\n\n")
        out.write("| student | notebook | " + " | ".join(f"Ex. {n}" for n in numbers)
                  + " | passed |\n")
        out.write("| --- | --- | " + " | ".join("---" for _ in numbers) + " | --- |\n")
        by_notebook: dict[tuple[str, str], dict[str, Row]] = {}
        for row in chapter_rows:
            by_notebook.setdefault((row.student, row.notebook), {})[row.exercise] = row
        for (student, notebook), cells in by_notebook.items():
            if "" in cells:  # no notebook for this chapter
                line = [cells[""].status] * len(numbers)
                passed = 0
            else:
                line = [_cell(cells[n]) if n in cells else "" for n in numbers]
                passed = sum(cells[n].passed for n in numbers if n in cells)
            out.write(f"| {_md(student)} | {_md(notebook) or '-'} | " + " | ".join(line)
                      + f" | {passed}/{len(numbers)} |\n")
        problems = [r for r in chapter_rows if r.status not in ("passed", "not attempted")]
        idle: dict[str, list[str]] = {}
        for row in chapter_rows:
            if row.status == "not attempted":
                idle.setdefault(row.student, []).append(row.exercise)
        if idle:
            out.write("\nNot attempted: " + "; ".join(
                f"{_md(student)} ({', '.join(numbers)})" for student, numbers in idle.items())
                + ".\n")
        if problems:
            out.write("\nWhat went wrong:\n\n")
            for row in problems:
                what = f"Exercise {row.exercise}" if row.exercise else "the chapter"
                checks = (f" ({row.checks_passed}/{row.checks_total} checks)"
                          if row.checks_total else "")
                out.write(f"- {_md(row.student)}, {what}: **{row.status}**{checks}: "
                          f"{_md(row.first_problem)}\n")
    other = [r for r in rows if not r.chapter]
    if other:
        out.write("\n## Notebooks not graded\n\n| student | notebook | status | why |\n"
                  "| --- | --- | --- | --- |\n")
        for row in other:
            out.write(f"| {_md(row.student)} | {_md(row.notebook)} | {row.status} | "
                      f"{_md(row.first_problem)} |\n")
    return out.getvalue()


NBGRADER_COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name",
                    "first_name", "email", "raw_score", "late_submission_penalty", "score",
                    "max_score"]


def write_nbgrader_csv(rows: list[Row], chapters: dict[str, Chapter], assignments: list[str],
                       path: Path) -> None:
    """Scores in the columns of ``nbgrader export`` (its CsvExportPlugin): one row per chapter
    (the assignment) and student; the score is the number of exercises passed in the student's
    best notebook of the chapter, 0 without one; names, dates and penalties are empty or 0."""
    students = sorted({r.student for r in rows})
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, NBGRADER_COLUMNS)
        writer.writeheader()
        for name in assignments:
            for student in students:
                per_notebook: dict[str, int] = {}
                for row in rows:
                    if row.chapter == name and row.student == student and row.exercise:
                        per_notebook[row.notebook] = per_notebook.get(row.notebook, 0) + (
                            1 if row.passed else 0)
                score = float(max(per_notebook.values(), default=0))
                writer.writerow({
                    "assignment": name, "duedate": "", "timestamp": "", "student_id": student,
                    "last_name": "", "first_name": "", "email": "", "raw_score": score,
                    "late_submission_penalty": 0.0, "score": score,
                    "max_score": float(len(chapters[name].exercises))})


def write_otter_csv(rows: list[Row], chapter: Chapter, path: Path) -> None:
    """The chapter's scores in the layout of otter-grader's final_grades.csv: ``file``, one
    column per exercise (1 point each, all or nothing), ``total_points_earned``,
    ``percent_correct``, ``grading_status``; the first row gives the points per question."""
    numbers = sorted(chapter.exercises, key=number_key)
    questions = [f"Exercise {n}" for n in numbers]
    columns = ["file", *questions, "total_points_earned", "percent_correct", "grading_status"]
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerow({"file": "points-per-question", **dict.fromkeys(questions, 1),
                         "total_points_earned": len(numbers), "percent_correct": 1,
                         "grading_status": "--"})
        by_notebook: dict[str, dict[str, Row]] = {}
        for row in rows:
            if row.chapter == chapter.name and row.exercise:
                by_notebook.setdefault(row.notebook, {})[row.exercise] = row
        for notebook, cells in by_notebook.items():
            scores = {f"Exercise {n}": int(cells[n].passed) if n in cells else 0
                      for n in numbers}
            total = sum(scores.values())
            writer.writerow({"file": notebook, **scores, "total_points_earned": total,
                             "percent_correct": round(total / len(numbers), 4) if numbers
                             else 0, "grading_status": "Completed"})


# ---------------------------------------------------------------------------------------------
# The exercise list (for teachers: what each checker checks)
# ---------------------------------------------------------------------------------------------

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", nargs="?", type=Path,
                        help="folder of the students' notebooks")
    parser.add_argument("--out", type=Path, default=Path("grading-report"),
                        help="folder for the reports (default: grading-report)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per exercise and student before it is killed (default 60)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="exercises run at the same time (default 1)")
    parser.add_argument("--chapters", nargs="+", metavar="NAME",
                        help="the chapters assigned: a student without a notebook of one is "
                             "reported as missing it (default: the chapters found)")
    parser.add_argument("--list-exercises", action="store_true",
                        help="print every exercise, its checker and what it checks (Markdown)")
    args = parser.parse_args(argv)
    if args.list_exercises:
        print(exercise_table(), end="")
        return 0
    if args.submissions is None or not args.submissions.is_dir():
        parser.error("SUBMISSIONS must be a folder of notebooks")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    rows = grade(args.submissions, args.out, timeout=args.timeout, jobs=args.jobs,
                 chapter_names=args.chapters)
    counts = {status: sum(r.status == status for r in rows) for status in STATUSES}
    print(f"graded {len(rows)} rows: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    print(f"reports in {args.out}/: results.csv, summary.md, results.json, nbgrader_grades.csv, "
          "otter_final_grades_*.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
