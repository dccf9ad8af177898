"""A notebook run with another student's id (issue 35): the per-student variants are drawn
from the id of the folder a notebook is handed in under; a notebook whose id cell names, or
whose saved outputs show, a classmate's id (a copied notebook) is flagged for the instructor,
without changing its grade."""

from __future__ import annotations

import copy

import nbformat

from grading import grade, submissions
from tools import notebooks, toc

CHAPTER = next(s for s in toc.chapters() if s.stem == "online-softmax")


def handed_out() -> nbformat.NotebookNode:
    return nbformat.read(notebooks.target(CHAPTER, student=True), as_version=4)


def run_as(student: str, printed: str | None = None) -> nbformat.NotebookNode:
    """The student notebook with ``student`` in its id cell, and the line that cell prints
    when run with ``printed`` (by default the same id) among its saved outputs."""
    nb = copy.deepcopy(handed_out())
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and "STUDENT_ID = " in c.source]
    cell.source = cell.source.replace('STUDENT_ID = ""', f'STUDENT_ID = "{student}"', 1)
    shown = student if printed is None else printed
    cell.outputs = [nbformat.v4.new_output(
        "stream", name="stdout", text=f"Student {shown}: your variants of this chapter's "
                                      "exercises (the grader checks these):\n  Exercise 3.1")]
    return nb


def test_the_ids_a_notebook_was_run_with():
    assert submissions.notebook_ids(handed_out()) == []  # STUDENT_ID = "" as handed out
    assert submissions.notebook_ids(run_as("s2")) == [("s2", "STUDENT_ID in its code"),
                                                     ("s2", "its printed variants")]
    # the id changed after the cell ran: the outputs still show the id it ran with
    assert ("s9", "its printed variants") in submissions.notebook_ids(run_as("s2", "s9"))
    nb = handed_out()
    nb.cells.append(nbformat.v4.new_code_cell(
        'import os\nos.environ["FLASHLIB_STUDENT_ID"] = "s3"\nuse_student("s4", chapter="3")'))
    assert {who for who, _ in submissions.notebook_ids(nb)} == {"s3", "s4"}


def test_only_another_id_is_flagged():
    assert submissions.id_mismatch(handed_out(), "s1") == []
    assert submissions.id_mismatch(run_as("s1"), "s1") == []
    assert submissions.id_mismatch(run_as(" s1 "), "s1") == []
    (flag,) = submissions.id_mismatch(run_as("s2"), "s1")
    assert "'s2' (STUDENT_ID in its code, its printed variants)" in flag and "'s1'" in flag
    (flag,) = submissions.id_mismatch(run_as("s1", printed="s2"), "s1")
    assert "'s2' (its printed variants)" in flag


def test_a_classmates_notebook_is_flagged_in_the_report(tmp_path):
    """alice hands in bob's notebook (bob's id in its id cell and its outputs): her rows are
    flagged, in results and in the summary's section for the instructor; bob's are not, and
    neither grade changes (the exercises are as handed out: not attempted)."""
    for student in ("alice", "bob"):
        (tmp_path / "in" / student).mkdir(parents=True)
        nbformat.write(run_as("bob"), tmp_path / "in" / student / "online-softmax.ipynb")
    rows = grade.grade(tmp_path / "in", tmp_path / "out", chapter_names=["online-softmax"])
    flagged = {r.student for r in rows if any("another student id" in f for f in r.flags)}
    assert flagged == {"alice"}
    assert {r.status for r in rows} == {"not attempted"}
    summary = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert "| alice | 3.1 | not attempted | the notebook was run with another student id " \
        "than 'alice'" in summary
    feedback = (tmp_path / "out" / "feedback" / "alice.md").read_text(encoding="utf-8")
    assert "another student id" not in feedback  # for the instructor, not the student
