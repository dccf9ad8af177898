"""Grading a class: every student's notebooks, exercise by exercise, by the book's own
checkers (:func:`grade`; the command line is grading/cli.py, ``make grade``).

Who decides a grade.  The students' code never runs in a process that decides anything:

- the *judges* (grading/judge.py, ``--jobs`` of them, started by this process) run the
  checkers and decide each exercise's status; they are trusted and the students' code cannot
  reach them;
- each chapter runs in a sandboxed process (the *zygote*, grading/worker.py; bubblewrap,
  namespaces and resource limits where the machine allows them, grading/sandbox.py),
  which runs the chapter's own code cells in order (from the student notebook the book
  generates, never a student's copy), as Jupyter would;
- at each exercise, each student's notebook gets a process forked from the zygote, confined
  on its own (its own folder as the only writable place, limits on memory, processes, open
  files and bytes written, no network, killed with everything it started when the exercise
  ends); it receives that student's cells only, runs them in the chapter's namespace, and
  hands the judge the function the checker call names as a handle; the judge runs the
  checker (``check_merge(merge)``, as the chapter writes it) and each call of the student's
  function crosses to the student's process and back as plain data (grading/rpc.py);
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
reading sys.argv or other files (grading/lint.py), processes left running when the
exercise ended, a grading process the student's code killed, an answer identical to a
classmate's or to the book's published solution, a notebook set up or run with another
student id than the one it is graded as (its id cell's ``STUDENT_ID`` or the variants it
printed: a classmate's notebook; grading/submissions.py's ``id_mismatch``).

Why a package of its own beside flashlib, not in it: it reads the chapters (book/*.md,
through tools/convert.py, the one reader of the exercises' numbers), which only the repository
has; the checkers it runs are the package's (through flashlib.book.exercises.grader_adapter,
the one module of flashlib that knows a grader exists).  Grade with a checkout of the release
the students used.  It needs Linux or macOS (forking); the sandbox needs Linux with
bubblewrap (see grading/sandbox.py and the instructor guide for what each platform gets).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any

from grading import gradebook, lint
from grading.chapters import (
    Chapter,
    Exercise,
    checker_function,
    exercise_cells,
    load_chapters,
    number_key,
    solutions,
)
from grading.reports import Row, write_reports
from grading.submissions import (
    Skipped,
    find_submissions,
    id_mismatch,
    match_chapter,
    notebook_title,
    read_notebook,
)
from grading.worker import one_line
from tools.paths import ROOT

STATUSES = ("passed", "failed", "not attempted", "error", "timeout", "crashed", "missing",
            "unrelated", "unreadable", "grader-error")
#: A judge left without work helps with another chapter when it has this many tasks left
#: (the chapter's cells then run once more, in the helper's sandbox).
HELP_AT = 12
UNCHANGED = "not attempted: the exercise cell is as it was handed out"


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

    from grading.judge import judge_main

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
    from grading.judge import Options

    options = Options(timeout=timeout, logs=logs)
    tasks = [{"prelude": []} | t for t in tasks]
    found, errors = run_tasks({chapter.name: chapter}, {chapter.name: tasks}, options, jobs)
    return ({k: v for k, v in found.items() if v.get("status") != "grader-error"},
            errors.get(chapter.name, []))


def unchanged(cells: list[str], starters: list[str]) -> bool:
    """Whether the student's cells of an exercise are those handed out (comments and
    spacing aside)."""
    return bool(starters) and lint.fingerprint(cells) == lint.fingerprint(starters)


def grade(folder: Path, out: Path, *, timeout: float | None = None, jobs: int = 1,
          chapter_names: list[str] | None = None, roster: Path | None = None,
          partial_credit: bool = False, strict: bool = False, standalone: bool = False,
          confinement: Any = None, due: datetime | None = None) -> list[Row]:
    """Grade every notebook below ``folder``; write the reports into ``out``; the rows.
    ``timeout``: CPU seconds per exercise (None: grading.judge.TIMEOUT).  ``due``: the
    deadline; a notebook whose time is known (nbgrader's timestamp.txt, Blackboard's name)
    and later loses what the late policy says (grading/gradebook.py's ``late_factor``)."""
    from grading import sandbox
    from grading.judge import TIMEOUT, Options

    timeout = TIMEOUT if timeout is None else timeout

    if not hasattr(os, "fork"):
        raise SystemExit("grading/grade.py forks a process per exercise: run it on Linux or "
                         "macOS (on Windows, in WSL)")
    chapters = load_chapters()
    unknown = sorted(set(chapter_names or []) - set(chapters))
    if unknown:
        raise SystemExit(f"--chapters: no chapter {', '.join(unknown)} (chapters: "
                         f"{', '.join(chapters)})")
    students = gradebook.load_roster(roster) if roster is not None else None
    confinement = confinement or sandbox.probe()
    warning = confinement.warning()
    if warning:
        print(warning, file=sys.stderr)
    rows: list[Row] = []
    tasks: dict[str, list[dict[str, Any]]] = {name: [] for name in chapters}
    pending: dict[str, Row] = {}
    answers: dict[tuple[str, str], list[tuple[str, str, Row]]] = {}  # identical answers
    graded: dict[str, set[str]] = {}  # chapter -> students with a notebook for it
    skipped: list[Skipped] = []
    subs = find_submissions(folder, students, skipped)
    for sub in subs:
        nb, why = read_notebook(sub.path)
        if nb is None:
            rows.append(Row(sub.student, sub.notebook, "", "", "unreadable",
                            first_problem=f"not a readable notebook: {why}"))
            continue
        chapter = match_chapter(nb, sub.path, chapters, sub.file_name)
        if chapter is None:
            rows.append(Row(sub.student, sub.notebook, "", "", "unrelated",
                            first_problem=f"not a chapter of the book (title "
                                          f"{notebook_title(nb)!r}, file {sub.path.name!r})"))
            continue
        graded.setdefault(chapter.name, set()).add(sub.student)
        other_id = id_mismatch(nb, sub.student)  # a classmate's notebook? (flag, no verdict)
        cells = exercise_cells(nb, chapter.markdown)
        order = sorted(cells, key=number_key)
        for number in sorted(chapter.exercises, key=number_key):
            days = gradebook.days_late(sub.submitted, due)
            row = Row(sub.student, sub.notebook, chapter.name, number, "missing",
                      late=sub.late or bool(days), late_days=days, partial=partial_credit,
                      flags=list(other_id))
            rows.append(row)
            if number not in cells:
                row.first_problem = f"no 'Exercise {number}' heading in the notebook"
                continue
            if not cells[number]:
                row.first_problem = f"no code cell under Exercise {number}"
                continue
            sources = [nb.cells[i].source for i in cells[number]]
            forbid = _forbidden(chapter.exercises[number])
            row.flags += lint.flags(sources, forbid)
            if unchanged(sources, chapter.starters.get(number, [])):
                row.status, row.first_problem = "not attempted", UNCHANGED
                continue
            answers.setdefault((chapter.name, number), []).append(
                (lint.fingerprint(sources), _without_calls(sources), row))
            prelude = [[n, [nb.cells[i].source for i in cells[n]]] for n in order
                       if number_key(n) < number_key(number) and cells[n]]
            task_id = f"{len(pending)}"
            pending[task_id] = row
            tasks[chapter.name].append({"id": task_id, "exercise": number, "owner": sub.notebook,
                                        "cells": sources, "prelude": prelude,
                                        "student": sub.student})  # whose variant
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
        row.memory = dict(result.get("memory") or {})
        row.flags = row.flags + [f for f in result.get("flags", []) if f not in row.flags]
    order = {name: i for i, name in enumerate(chapters)}
    rows.sort(key=lambda r: (r.student, order.get(r.chapter, -1), r.notebook,
                             number_key(r.exercise) if r.exercise else ()))
    info = {"timeout": timeout, "confinement": confinement.describe(), "strict": strict,
            "standalone": standalone, "partial_credit": partial_credit, "jobs": jobs,
            "due": due.isoformat() if due else "",
            "seconds": time.monotonic() - started,
            "unmatched": sorted({s.notebook for s in subs if not s.on_roster})
            if students is not None else [],
            "skipped": [(s.path, s.why) for s in skipped]}
    write_reports(rows, chapters, out, timeout=timeout, context_errors=context_errors,
                  chapter_names=assigned, roster=students, info=info)
    return rows


def _forbidden(exercise: Exercise) -> list[str]:
    """The library functions an exercise's checker forbids (its ``forbid``)."""
    try:
        return list(checker_function(exercise.checker).forbid)
    except (ImportError, AttributeError, ValueError):
        return []


def _without_calls(sources: list[str]) -> str:
    """The fingerprint of the cells without their checker calls (to compare with the
    book's solution, which a student pastes above the call)."""
    return lint.fingerprint([re.sub(r"^check_\w+\(.*\)\s*$", "", s, flags=re.MULTILINE)
                                   for s in sources])


def _flag_identical(answers: dict[tuple[str, str], list[tuple[str, str, Row]]],
                    chapters: dict[str, Chapter]) -> None:
    """Flag answers identical to a classmate's (comments and spacing aside), or to the book's
    published solution."""
    published: dict[str, dict[str, str]] = {}
    for (chapter, number), entries in answers.items():
        if chapter not in published:
            try:
                published[chapter] = solutions(ROOT / "book" / f"{chapter}.md")
            except (OSError, ValueError):
                published[chapter] = {}
        code = published[chapter].get(number)
        solution = lint.fingerprint([code]) if code else None
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
