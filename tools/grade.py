"""Grade students' notebooks with the book's own exercise checkers (``make grade``).

    python -m tools.grade SUBMISSIONS [--out grading-report] [--timeout 10] [--jobs 1]
                          [--chapters overflow online-softmax ...] [--roster roster.csv]
                          [--partial-credit] [--strict] [--standalone]
    python -m tools.grade --list-exercises     # every exercise, its checker, what it checks

SUBMISSIONS is a folder of the students' notebooks (the student edition, notebooks/student/,
with their code in the exercise cells): one sub-folder per student at any depth below it
(nbgrader's ``submitted/<student>/<assignment>/NAME.ipynb`` works as it is), notebooks
directly in it (the student is the file name), or a learning platform's export (Canvas's
``smithalice_1001_5551_Copy of overflow.ipynb``, Moodle's, Blackboard's: tools/gradebook.py).
``--roster`` maps them to a class list.  A notebook is matched to its chapter by its title
(its first ``# `` heading), else by its file name (``Copy of NAME.ipynb``, ``NAME (1)``,
``NAME-1`` too); any other notebook is reported as unrelated, an unreadable one as such.

Who decides a grade.  The students' code never runs in a process that decides anything:

- the *judges* (tools/grade_judge.py, ``--jobs`` of them, started by this process) run the
  checkers and decide each exercise's status; they are trusted and the students' code cannot
  reach them;
- each chapter runs in a sandboxed process (the *zygote*, tools/grade_worker.py; bubblewrap,
  namespaces and resource limits where the machine allows them, tools/grade_sandbox.py),
  which runs the chapter's own code cells in order (from the student notebook the book
  generates, never a student's copy), as Jupyter would;
- at each exercise, each student's notebook gets a process forked from the zygote, confined
  on its own (its own folder as the only writable place, limits on memory, processes, open
  files and bytes written, no network, killed with everything it started when the exercise
  ends); it receives that student's cells only, runs them in the chapter's namespace, and
  hands the judge the function the checker call names as a handle; the judge runs the
  checker (``check_merge(merge)``, as the chapter writes it) and each call of the student's
  function crosses to the student's process and back as plain data (tools/grade_rpc.py);
- this process reads the judges' verdicts and alone writes the reports.

So a student's code can neither forge nor spoil a verdict, its own or a classmate's: it never
holds the checker's result, the grading state, another student's cells, the reports' files
or the judge's process.  A crash, kill or hang costs that exercise only.

The rules (the student edition states them; ``--strict`` and ``--standalone`` change them):

- The student's earlier exercise cells of the notebook run first, in order, as Jupyter's
  "Run all" would: a helper defined in Exercise 3.1's cell may be used in 3.2's (their
  errors are ignored there, and they share the time limit once more).  ``--standalone``:
  each exercise's cells run alone, as before.
- A top-level statement of an exercise cell that does not parse (a typo in a scratch line)
  is skipped and the rest of the cell runs; a cell that raises after defining what the
  checker needs is graded anyway.  Either is reported as a note, and the exercise passes if
  its checks pass.  ``--strict``: any error of the cell is the exercise's status ("error").
- An exercise whose cells are unchanged since they were handed out is "not attempted".
- An answer that calls the library function the exercise asks for (``merge_partials`` in
  3.2) is refused by the checker, in Jupyter as here.
- ``--partial-credit``: an exercise scores its checks passed / checks run in the gradebook,
  nbgrader's and otter's files (default: 1 if every check passed, else 0).

The status of an exercise:

    passed         every check passed
    failed         the checker ran and a check failed
    not attempted  the cell is as handed out, or the function still raises
                   NotImplementedError (the cell's placeholder)
    error          the checker call could not run (e.g. the function the exercise asks for is
                   not defined), or an exercise cell raised and the checks did not pass
    timeout        killed at the time limit: --timeout seconds of CPU time (an infinite
                   loop, or far too slow), or 3 times as much wall-clock time (waiting)
    crashed        the student's process died (e.g. out of memory, os._exit, a signal)
    missing        the notebook has no heading or no code cell for the exercise, or the student
                   has no notebook for a chapter named with --chapters (or on the roster)
    unrelated      (a notebook, not an exercise) not a chapter of the book
    unreadable     (a notebook) not a readable .ipynb file
    grader-error   the chapter itself failed to run here (see logs/CHAPTER.log)

What it writes in --out:

    results.csv        one row per student, notebook and exercise: student, notebook, chapter,
                       exercise, status, passed, checks_passed, checks_total, first_problem,
                       runtime_s, score, notes, flags
    results.json       the same rows with each checker's whole feedback and the tail of what
                       the student's code printed
    summary.md         how the code was confined; per chapter, a table of students x
                       exercises, then every problem; the flags for the instructor
    gradebook.csv      one row per student, one column per exercise, the total (gradebook.py)
    feedback/ID.md     one file per student to hand back (gradebook.py)
    nbgrader_grades.csv  one row per chapter and student in the columns of nbgrader's
                       ``nbgrader export`` (assignment = chapter, score = exercises passed)
    otter_final_grades_CHAPTER.csv  otter-grader's final_grades.csv layout (one point per
                       exercise, first row points-per-question)
    logs/CHAPTER.log   what running the chapter printed

Flags (``flags`` column, and the summary's last section) point the instructor at code worth
a look: patching checkers or numpy, reaching into frames or /proc, signals and daemons,
reading sys.argv or other files (tools/grade_lint.py), processes left running when the
exercise ended, a grading process the student's code killed, an answer identical to a
classmate's or to the book's published solution.

Why in tools/ and not in the flashlib package: it reads the chapters (book/*.md, through
tools/convert.py, the one reader of the exercises' numbers), which only the repository has;
the checkers it runs are the package's.  Grade with a checkout of the release the students
used.  It needs Linux or macOS (forking); the sandbox needs Linux with bubblewrap (see
tools/grade_sandbox.py and the instructor guide for what each platform gets).
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
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from tools import colab, convert, grade_lint, gradebook, toc
from tools.grade_worker import one_line
from tools.paths import ROOT

CHECKER_PACKAGE = "flashlib.book.exercises"
CSV_COLUMNS = ["student", "notebook", "chapter", "exercise", "status", "passed",
               "checks_passed", "checks_total", "first_problem", "runtime_s", "score",
               "notes", "flags"]
STATUSES = ("passed", "failed", "not attempted", "error", "timeout", "crashed", "missing",
            "unrelated", "unreadable", "grader-error")
#: A judge left without work helps with another chapter when it has this many tasks left
#: (the chapter's cells then run once more, in the helper's sandbox).
HELP_AT = 12
UNCHANGED = "not attempted: the exercise cell is as it was handed out"


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
        """What a judge needs of the chapter (tools/grade_judge.py)."""
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


# ---------------------------------------------------------------------------------------------
# The students' notebooks
# ---------------------------------------------------------------------------------------------

@dataclass
class Submission:
    student: str
    path: Path
    notebook: str  # the path relative to the submissions folder, as the reports show it
    late: bool = False
    file_name: str = ""  # the notebook's own name (a platform's prefix removed)
    on_roster: bool = True


def find_submissions(folder: Path, roster: list[gradebook.Student] | None = None
                     ) -> list[Submission]:
    """Every .ipynb below ``folder`` (not in hidden folders or .ipynb_checkpoints), with its
    student (tools/gradebook.py's ``owner``; the roster's id when ``roster`` matches it)."""
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") or part == ".ipynb_checkpoints" for part in rel.parts):
            continue
        who = gradebook.owner(rel)
        student, on_roster = who.key, True
        if roster is not None:
            match = gradebook.match_roster(who, roster)
            student, on_roster = (match.id, True) if match else (who.key, False)
        found.append(Submission(student, path, rel.as_posix(), who.late, who.file_name,
                                on_roster))
    return found


def notebook_title(nb: nbformat.NotebookNode) -> str | None:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^# (.+)$", cell.source, re.MULTILINE)
            if match:
                return match[1].strip()
    return None


def match_chapter(nb: nbformat.NotebookNode, path: Path, chapters: dict[str, Chapter],
                  file_name: str = "") -> Chapter | None:
    """The chapter of a student's notebook: by its title, else by its file name."""
    title = notebook_title(nb)
    for chapter in chapters.values():
        if title == chapter.title:
            return chapter
    stem = Path(file_name or path.name).stem.lower()
    stem = re.sub(r"^copy of ", "", stem)
    stem = re.sub(r"\s*\(\d+\)$", "", stem)
    return chapters.get(stem) or chapters.get(re.sub(r"-\d+$", "", stem))


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
    notes: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    late: bool = False
    partial: bool = False  # the score is checks passed / total (--partial-credit)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def score(self) -> float:
        return gradebook.score(self, self.partial) if self.exercise else 0.0

    def csv(self) -> dict[str, Any]:
        return {"student": self.student, "notebook": self.notebook, "chapter": self.chapter,
                "exercise": self.exercise, "status": self.status, "passed": self.passed,
                "checks_passed": self.checks_passed, "checks_total": self.checks_total,
                "first_problem": self.first_problem,
                "runtime_s": "" if self.runtime_s is None else f"{self.runtime_s:.2f}",
                "score": gradebook._num(self.score) if self.exercise else "",
                "notes": " | ".join(self.notes), "flags": " | ".join(self.flags)}


# ---------------------------------------------------------------------------------------------
# Grading: tasks -> judges -> results
# ---------------------------------------------------------------------------------------------

def run_tasks(chapters: dict[str, Chapter], tasks: dict[str, list[dict[str, Any]]],
              options: Any, jobs: int) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """Grade ``tasks`` (per chapter, ``{"id", "exercise", "cells", "prelude"}``) with ``jobs``
    judge processes: ``({task id: result}, {chapter: [its own cells' errors]})``.

    Each judge asks for work; it gets the next task of its chapter (in exercise order, so
    that its sandboxed chapter only walks forward), else the largest chapter nobody has
    started, else a share of the chapter with the most work left, when that work is worth
    running the chapter's cells once more in the helper's own sandbox (its tasks' measured
    time more than twice its cells' time, or :data:`HELP_AT` tasks before anything is
    measured)."""
    import multiprocessing
    from multiprocessing.connection import wait

    from tools.grade_judge import judge_main

    queues = {name: deque(sorted(ts, key=lambda t: number_key(t["exercise"])))
              for name, ts in tasks.items() if ts}
    started: set[str] = set()
    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, list[str]] = {name: [] for name in queues}
    if not queues:
        return results, errors
    # fork where it is safe (Linux): no re-import of the caller's __main__, and fast
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux")
                                          else "spawn")
    judges, inflight = [], {}
    for _ in range(max(1, min(jobs, sum(map(len, queues.values()))))):
        ours, theirs = context.Pipe()
        process = context.Process(target=judge_main, args=(theirs, options), daemon=True)
        process.start()
        theirs.close()
        judges.append((ours, process))
        inflight[ours] = None

    # per notebook, its exercises whose own grading ended the process or ran out of time:
    # they are left out of the earlier cells that later exercises run (one exercise's crash,
    # kill or hang costs that exercise only)
    ended: dict[str, set[str]] = {}
    owners = {t["id"]: t.get("owner") for ts in tasks.values() for t in ts}
    chapter_of = {t["id"]: name for name, ts in tasks.items() for t in ts}
    numbers = {t["id"]: t["exercise"] for ts in tasks.values() for t in ts}

    def prepared(item: dict[str, Any]) -> dict[str, Any]:
        bad = ended.get(item.get("owner"), set())
        if not bad or not item.get("prelude"):
            return item
        return item | {"prelude": [p for p in item["prelude"] if p[0] not in bad],
                       "left_out": sorted((p[0] for p in item["prelude"] if p[0] in bad),
                                          key=number_key)}

    context_s: dict[str, float] = {}  # seconds a chapter's own cells take
    spent: dict[str, list[float]] = {}  # seconds of its tasks so far

    def work_left(name: str) -> float:
        times = spent.get(name)
        return len(queues[name]) * (sum(times) / len(times) if times else 1.0)

    def worth_helping(name: str) -> bool:
        if name not in context_s or not spent.get(name):
            return len(queues[name]) >= HELP_AT
        return work_left(name) > 2 * context_s[name] + 5

    def pop(name: str) -> dict[str, Any]:
        """The next task of a chapter, passing over those whose notebook has an earlier
        exercise still being graded by another judge (its cells run first: should they hang
        or end the process, the later exercise runs without them; a task waits only while
        others are ready)."""
        queue = queues[name]
        busy = {t.get("owner") for t in inflight.values() if t is not None}
        for index, item in enumerate(queue):
            if not item.get("prelude") or item.get("owner") not in busy:
                del queue[index]
                return item
        return queue.popleft()

    def next_task(current: str | None) -> tuple[str, dict[str, Any]] | None:
        if current in queues and queues[current]:
            return current, pop(current)
        fresh = [n for n in queues if n not in started and queues[n]]
        if fresh:
            name = max(fresh, key=lambda n: len(queues[n]))
        else:
            busy = [n for n in queues if queues[n] and worth_helping(n)]
            if not busy:
                return None
            name = max(busy, key=work_left)
        started.add(name)
        return name, pop(name)

    live = {conn: process for conn, process in judges}
    while live:
        for conn in wait(list(live)):
            try:
                message = conn.recv()
            except (EOFError, OSError):
                lost = inflight.get(conn)
                if lost is not None:
                    results[lost["id"]] = {"status": "grader-error",
                                           "first_problem": "no result: the judge process "
                                                            "died (see the grader's output)"}
                live.pop(conn).join(timeout=5)
                continue
            if message[0] == "result":
                results[message[1]] = message[2]
                done = inflight[conn]
                inflight[conn] = None
                if done is not None and message[2].get("runtime_s") is not None:
                    spent.setdefault(chapter_of[done["id"]], []).append(
                        float(message[2]["runtime_s"]))
                if message[2].get("status") in ("crashed", "timeout"):
                    ended.setdefault(owners.get(message[1]), set()).add(numbers[message[1]])
            elif message[0] == "next":
                _, current, context_errors, measured = message
                for name, seconds in measured.items():
                    context_s[name] = max(seconds, context_s.get(name, 0.0))
                if current is not None:
                    for error in context_errors:
                        if error not in errors[current]:
                            errors[current].append(error)
                task = next_task(current)
                if task is None:
                    conn.send(("stop",))
                    live.pop(conn).join(timeout=60)
                else:
                    name, item = task
                    inflight[conn] = item
                    conn.send(("task", chapters[name].for_judge(), prepared(item)))
    for queue in queues.values():  # only when every judge died
        for item in queue:
            results.setdefault(item["id"], {"status": "grader-error",
                                            "first_problem": "no result: no judge left"})
    return results, errors


def grade_chapter(chapter: Chapter, tasks: list[dict[str, Any]], timeout: float, jobs: int,
                  logs: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Grade one chapter's ``tasks``: ``({task id: result}, [the chapter's own errors])``; a
    task the chapter could not reach (its cells failed) has no result."""
    from tools.grade_judge import Options

    options = Options(timeout=timeout, logs=logs)
    tasks = [{"prelude": []} | t for t in tasks]
    found, errors = run_tasks({chapter.name: chapter}, {chapter.name: tasks}, options, jobs)
    return ({k: v for k, v in found.items() if v.get("status") != "grader-error"},
            errors.get(chapter.name, []))


def unchanged(cells: list[str], starters: list[str]) -> bool:
    """Whether the student's cells of an exercise are those handed out (comments and
    spacing aside)."""
    return bool(starters) and grade_lint.fingerprint(cells) == grade_lint.fingerprint(starters)


def grade(folder: Path, out: Path, *, timeout: float | None = None, jobs: int = 1,
          chapter_names: list[str] | None = None, roster: Path | None = None,
          partial_credit: bool = False, strict: bool = False, standalone: bool = False,
          confinement: Any = None) -> list[Row]:
    """Grade every notebook below ``folder``; write the reports into ``out``; the rows.
    ``timeout``: CPU seconds per exercise (None: tools.grade_judge.TIMEOUT)."""
    from tools import grade_sandbox
    from tools.grade_judge import TIMEOUT, Options

    timeout = TIMEOUT if timeout is None else timeout

    if not hasattr(os, "fork"):
        raise SystemExit("tools/grade.py forks a process per exercise: run it on Linux or "
                         "macOS (on Windows, in WSL)")
    chapters = load_chapters()
    unknown = sorted(set(chapter_names or []) - set(chapters))
    if unknown:
        raise SystemExit(f"--chapters: no chapter {', '.join(unknown)} (chapters: "
                         f"{', '.join(chapters)})")
    students = gradebook.load_roster(roster) if roster is not None else None
    confinement = confinement or grade_sandbox.probe()
    warning = confinement.warning()
    if warning:
        print(warning, file=sys.stderr)
    rows: list[Row] = []
    tasks: dict[str, list[dict[str, Any]]] = {name: [] for name in chapters}
    pending: dict[str, Row] = {}
    answers: dict[tuple[str, str], list[tuple[str, str, Row]]] = {}  # identical answers
    graded: dict[str, set[str]] = {}  # chapter -> students with a notebook for it
    subs = find_submissions(folder, students)
    for sub in subs:
        try:
            nb = nbformat.read(sub.path, as_version=4)
        except Exception as err:  # noqa: BLE001 - any unreadable file is reported
            rows.append(Row(sub.student, sub.notebook, "", "", "unreadable",
                            first_problem=f"not a readable notebook: {one_line(err, 200)}"))
            continue
        chapter = match_chapter(nb, sub.path, chapters, sub.file_name)
        if chapter is None:
            rows.append(Row(sub.student, sub.notebook, "", "", "unrelated",
                            first_problem=f"not a chapter of the book (title "
                                          f"{notebook_title(nb)!r}, file {sub.path.name!r})"))
            continue
        graded.setdefault(chapter.name, set()).add(sub.student)
        cells = exercise_cells(nb, chapter.markdown)
        order = sorted(cells, key=number_key)
        for number in sorted(chapter.exercises, key=number_key):
            row = Row(sub.student, sub.notebook, chapter.name, number, "missing",
                      late=sub.late, partial=partial_credit)
            rows.append(row)
            if number not in cells:
                row.first_problem = f"no 'Exercise {number}' heading in the notebook"
                continue
            if not cells[number]:
                row.first_problem = f"no code cell under Exercise {number}"
                continue
            sources = [nb.cells[i].source for i in cells[number]]
            forbid = _forbidden(chapter.exercises[number])
            row.flags = grade_lint.flags(sources, forbid)
            if unchanged(sources, chapter.starters.get(number, [])):
                row.status, row.first_problem = "not attempted", UNCHANGED
                continue
            answers.setdefault((chapter.name, number), []).append(
                (grade_lint.fingerprint(sources), _without_calls(sources), row))
            prelude = [[n, [nb.cells[i].source for i in cells[n]]] for n in order
                       if number_key(n) < number_key(number) and cells[n]]
            task_id = f"{len(pending)}"
            pending[task_id] = row
            tasks[chapter.name].append({"id": task_id, "exercise": number, "owner": sub.notebook,
                                        "cells": sources, "prelude": prelude})
    assigned = list(chapter_names or [])
    if students is not None and not assigned:
        assigned = [n for n in chapters if n in graded]
    everyone = {r.student for r in rows} | {s.id for s in students or []}
    for name in assigned:
        for student in sorted(everyone - graded.get(name, set())):
            rows.append(Row(student, "", name, "", "missing",
                            first_problem=f"no notebook of the chapter {name!r}"))
    _flag_identical(answers, chapters)
    options = Options(timeout=timeout, strict=strict, run_earlier=not standalone,
                      confinement=confinement, logs=out / "logs")
    started = time.monotonic()
    found, context_errors = run_tasks(chapters, tasks, options, jobs)
    for task_id, row in pending.items():
        result = found.get(task_id)
        if result is None or result.get("status") == "grader-error":
            errors = context_errors.get(row.chapter, [])
            row.status = "grader-error"
            row.first_problem = (result or {}).get("first_problem") or (
                f"no result: the chapter failed to run here "
                f"({one_line('; '.join(errors) or 'see the log', 200)})")
            continue
        row.status = result["status"]
        row.checks_passed = int(result.get("checks_passed", 0))
        row.checks_total = int(result.get("checks_total", 0))
        row.first_problem = one_line(result.get("first_problem", ""))
        row.runtime_s = result.get("runtime_s")
        row.feedback = result.get("feedback", "")
        row.output = result.get("output", "")
        row.notes = list(result.get("notes", []))
        row.flags = row.flags + [f for f in result.get("flags", []) if f not in row.flags]
    order = {name: i for i, name in enumerate(chapters)}
    rows.sort(key=lambda r: (r.student, order.get(r.chapter, -1), r.notebook,
                             number_key(r.exercise) if r.exercise else ()))
    info = {"timeout": timeout, "confinement": confinement.describe(), "strict": strict,
            "standalone": standalone, "partial_credit": partial_credit, "jobs": jobs,
            "seconds": time.monotonic() - started,
            "unmatched": sorted({s.notebook for s in subs if not s.on_roster})
            if students is not None else []}
    write_reports(rows, chapters, out, timeout=timeout, context_errors=context_errors,
                  chapter_names=assigned, roster=students, info=info)
    return rows


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


def _without_calls(sources: list[str]) -> str:
    """The fingerprint of the cells without their checker calls (to compare with the
    book's solution, which a student pastes above the call)."""
    return grade_lint.fingerprint([re.sub(r"^check_\w+\(.*\)\s*$", "", s, flags=re.MULTILINE)
                                   for s in sources])


def _flag_identical(answers: dict[tuple[str, str], list[tuple[str, str, Row]]],
                    chapters: dict[str, Chapter]) -> None:
    """Flag answers identical to a classmate's (comments and spacing aside), or to the book's
    published solution."""
    from tools.grade_class import solutions

    published: dict[str, dict[str, str]] = {}
    for (chapter, number), entries in answers.items():
        if chapter not in published:
            try:
                published[chapter] = solutions(ROOT / "book" / f"{chapter}.md")
            except (OSError, ValueError):
                published[chapter] = {}
        code = published[chapter].get(number)
        solution = grade_lint.fingerprint([code]) if code else None
        groups: dict[str, list[Row]] = {}
        for fp, _, row in entries:
            groups.setdefault(fp, []).append(row)
        for fp, bare, row in entries:
            if solution is not None and solution in (fp, bare):
                row.flags.append("the book's published solution, unchanged")
            others = sorted({r.student for r in groups[fp]} - {row.student})
            if others:
                row.flags.append("identical to the answer of " + ", ".join(others[:5])
                                 + (" and others" if len(others) > 5 else ""))


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------

def write_reports(rows: list[Row], chapters: dict[str, Chapter], out: Path, *, timeout: float,
                  context_errors: dict[str, list[str]], chapter_names: list[str] | None,
                  roster: list[gradebook.Student] | None = None,
                  info: dict[str, Any] | None = None) -> None:
    info = {"timeout": timeout} | (info or {})
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(row.csv() for row in rows)
    (out / "results.json").write_text(json.dumps(
        [row.csv() | {"feedback": row.feedback, "output": row.output, "notes": row.notes,
                      "flags": row.flags} for row in rows],
        indent=1) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(summary(rows, chapters, timeout, context_errors, info),
                                    encoding="utf-8")
    assignments = [n for n in chapters if n in (chapter_names or [])
                   or any(r.chapter == n and r.exercise for r in rows)]
    partial = bool(info.get("partial_credit"))
    write_nbgrader_csv(rows, chapters, assignments, out / "nbgrader_grades.csv", roster)
    for name in assignments:
        write_otter_csv(rows, chapters[name], out / f"otter_final_grades_{name}.csv")
    people = [(s.id, s.name, s.email) for s in roster or []]
    known = {p[0] for p in people}
    people += [(key, "", "") for key in sorted({r.student for r in rows}) if key not in known]
    exercises = [(name, n) for name in assignments
                 for n in sorted(chapters[name].exercises, key=number_key)]
    late: dict[str, set[str]] = {}
    for row in rows:
        if row.late and row.chapter:
            late.setdefault(row.student, set()).add(row.chapter)
    gradebook.write_gradebook(out / "gradebook.csv", rows, people, exercises, late, partial)
    gradebook.write_feedback(out / "feedback", rows, people, chapters, partial, timeout)


def _cell(row: Row) -> str:
    if row.status in ("passed", "failed"):
        return f"{row.status} {row.checks_passed}/{row.checks_total}"
    return row.status


def _md(text: str) -> str:
    """Text for a Markdown table cell or list item: one line, no table breaks, no HTML."""
    return html.escape(one_line(text), quote=False).replace("|", "\\|")


def summary(rows: list[Row], chapters: dict[str, Chapter], timeout: float,
            context_errors: dict[str, list[str]], info: dict[str, Any] | None = None) -> str:
    """The readable report: how the code ran, per chapter students x exercises, then what
    went wrong, then the flags for the instructor."""
    from flashlib import __version__

    info = info or {}
    notebooks_graded = {(r.student, r.notebook) for r in rows if r.notebook}
    out = io.StringIO()
    out.write("# Grading report\n\n")
    out.write(f"{len(notebooks_graded)} notebooks of {len({r.student for r in rows})} "
              f"students, graded with the checkers of flashlib {__version__} "
              f"(`tools/grade.py`), each exercise in its own process with a time limit of "
              f"{timeout:g} s of CPU time. A cell shows the status and the checks passed; "
              "`results.csv` has every row, `results.json` the checkers' whole feedback, "
              "`gradebook.csv` "
              "one row per student and `feedback/` one file per student.\n")
    if info.get("confinement"):
        out.write(f"\nThe students' code ran confined: {_md(info['confinement'])}.\n")
    rules = ["each exercise's cells alone" if info.get("standalone") else
             "each student's earlier exercise cells first, as Jupyter's Run all would",
             "any error of an exercise cell fails it" if info.get("strict") else
             "a statement that does not parse is skipped, an error after the answer noted",
             "partial credit (checks passed / run)" if info.get("partial_credit") else
             "one point per exercise whose checks all pass"]
    out.write("Rules: " + "; ".join(rules) + ".\n")
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
        noted = [r for r in chapter_rows if r.notes]
        if noted:
            out.write("\nNotes (graded anyway):\n\n")
            for row in noted:
                out.write(f"- {_md(row.student)}, Exercise {row.exercise}: "
                          f"{_md('; '.join(row.notes))}\n")
    other = [r for r in rows if not r.chapter]
    if other:
        out.write("\n## Notebooks not graded\n\n| student | notebook | status | why |\n"
                  "| --- | --- | --- | --- |\n")
        for row in other:
            out.write(f"| {_md(row.student)} | {_md(row.notebook)} | {row.status} | "
                      f"{_md(row.first_problem)} |\n")
    if info.get("unmatched"):
        out.write("\n## Notebooks of no one on the roster\n\nGraded under the name their "
                  "file gives:\n\n" + "".join(f"- `{_md(n)}`\n" for n in info["unmatched"]))
    flagged = [r for r in rows if r.flags]
    if flagged:
        out.write("\n## For the instructor: code worth a look\n\nFlags are not grades (the "
                  "checker decided each status above); they point at code that an exercise "
                  "does not need, or that another answer shares.\n\n"
                  "| student | exercise | status | flags |\n| --- | --- | --- | --- |\n")
        for row in flagged:
            out.write(f"| {_md(row.student)} | {row.exercise or '-'} | {row.status} | "
                      f"{_md('; '.join(row.flags))} |\n")
    return out.getvalue()


NBGRADER_COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name",
                    "first_name", "email", "raw_score", "late_submission_penalty", "score",
                    "max_score"]


def write_nbgrader_csv(rows: list[Row], chapters: dict[str, Chapter], assignments: list[str],
                       path: Path, roster: list[gradebook.Student] | None = None) -> None:
    """Scores in the columns of ``nbgrader export`` (its CsvExportPlugin): one row per chapter
    (the assignment) and student; the score is the student's best notebook of the chapter
    (exercises passed, or checks passed / total with --partial-credit), 0 without one;
    names and email from the roster, dates empty, penalties 0."""
    people = {s.id: s for s in roster or []}
    students = sorted({r.student for r in rows} | set(people))
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, NBGRADER_COLUMNS)
        writer.writeheader()
        for name in assignments:
            for student in students:
                per_notebook: dict[str, float] = {}
                for row in rows:
                    if row.chapter == name and row.student == student and row.exercise:
                        per_notebook[row.notebook] = per_notebook.get(row.notebook, 0) + (
                            row.score)
                score = float(round(max(per_notebook.values(), default=0), 4))
                person = people.get(student)
                first, _, last = (person.name.rpartition(" ")[::-1] if person and person.name
                                  else ("", "", ""))
                writer.writerow({
                    "assignment": name, "duedate": "", "timestamp": "", "student_id": student,
                    "last_name": first if person else "", "first_name": last if person else "",
                    "email": person.email if person else "", "raw_score": score,
                    "late_submission_penalty": 0.0, "score": score,
                    "max_score": float(len(chapters[name].exercises))})


def write_otter_csv(rows: list[Row], chapter: Chapter, path: Path) -> None:
    """The chapter's scores in the layout of otter-grader's final_grades.csv: ``file``, one
    column per exercise (1 point each: all or nothing, or checks passed / total with
    --partial-credit), ``total_points_earned``, ``percent_correct``, ``grading_status``; the
    first row gives the points per question."""
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
            scores = {f"Exercise {n}": gradebook._num(cells[n].score) if n in cells else 0
                      for n in numbers}
            total = round(sum(float(v) for v in scores.values()), 4)
            writer.writerow({"file": notebook, **scores,
                             "total_points_earned": gradebook._num(total),
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
    from tools.grade_judge import TIMEOUT, WALL_FACTOR

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", nargs="?", type=Path,
                        help="folder of the students' notebooks")
    parser.add_argument("--out", type=Path, default=Path("grading-report"),
                        help="folder for the reports (default: grading-report)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT,
                        help="CPU seconds per exercise and student before it is killed "
                             f"(default {TIMEOUT:g}; wall-clock time: {WALL_FACTOR:g} times "
                             "as much)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="exercises graded at the same time (default 1)")
    parser.add_argument("--chapters", nargs="+", metavar="NAME",
                        help="the chapters assigned: a student without a notebook of one is "
                             "reported as missing it (default: the chapters found)")
    parser.add_argument("--roster", type=Path,
                        help="CSV of the class (student id, name, email): notebooks are "
                             "matched to it, and a student without a notebook is missing it")
    parser.add_argument("--partial-credit", action="store_true",
                        help="an exercise scores its checks passed / checks run")
    parser.add_argument("--strict", action="store_true",
                        help="any error of an exercise cell fails the exercise (default: a "
                             "statement that does not parse is skipped, an error after the "
                             "answer is noted)")
    parser.add_argument("--standalone", action="store_true",
                        help="run each exercise's cells alone (default: the student's earlier "
                             "exercise cells first, as Jupyter's Run all)")
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
    if args.roster is not None and not args.roster.is_file():
        parser.error(f"--roster: no file {args.roster}")
    started = time.monotonic()
    try:
        rows = grade(args.submissions, args.out, timeout=args.timeout, jobs=args.jobs,
                     chapter_names=args.chapters, roster=args.roster,
                     partial_credit=args.partial_credit, strict=args.strict,
                     standalone=args.standalone)
    except ValueError as err:  # a roster without the columns it needs
        parser.error(str(err))
    counts = {status: sum(r.status == status for r in rows) for status in STATUSES}
    print(f"graded {len(rows)} rows: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
          + f" in {time.monotonic() - started:.0f} s")
    flagged = sum(bool(r.flags) for r in rows)
    if flagged:
        print(f"{flagged} rows flagged for the instructor (summary.md, last section)")
    print(f"reports in {args.out}/: results.csv, summary.md, results.json, gradebook.csv, "
          "feedback/, nbgrader_grades.csv, otter_final_grades_*.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
