"""grading/grade.py: students' notebooks through the book's checkers, each exercise in its own
process with a time limit, the reports checked row by row.

The class is made of copies of notebooks/student/online-softmax.ipynb (the chapter whose code
runs fastest) with the exercise cells edited: a correct student, one whose functions raise, one
that loops forever, one with a syntax error, one with an exercise deleted, one that crashes the
process, one that renamed a function, plus an unrelated and an unreadable notebook.
"""

from __future__ import annotations

import ast
import copy
import csv
import json
import re

import nbformat
import pytest

from grading import chapters, cli, grade, reports, submissions
from tests.grading.fake import fake_chapter
from tools import convert, notebooks, toc
from tools.paths import ROOT

CHAPTER = ROOT / "book" / "online-softmax.md"
TIMEOUT = 8.0  # seconds per exercise in these tests (3 timed out on a loaded 2-core machine)

CORRECT = {
    "3.1": """
def update(m, l, xs):
    if len(xs) == 0:  # an empty block: nothing read
        return m, l
    m_new = max(m, np.max(xs))
    if m_new == -np.inf:  # nothing seen yet, and every x masked: still empty
        return m_new, l
    return m_new, l * np.exp2(m - m_new) + np.sum(np.exp2(xs - m_new))


check_online_update(update)
""",
    "3.2": """
def merge(a, b):
    m = np.maximum(a[0], b[0])
    safe = np.where(np.isneginf(m), 0.0, m)  # two empty states: no -inf - -inf
    wa, wb = a[1] * np.exp(a[0] - safe), b[1] * np.exp(b[0] - safe)
    l = wa + wb
    o = wa[:, None] * a[2] + wb[:, None] * b[2]
    return m, l, np.where((l > 0)[:, None], o / np.where(l > 0, l, 1.0)[:, None], 0.0)


check_merge(merge)
""",
    "3.3": """
def empty(n_q, d_v):
    return np.full(n_q, -np.inf), np.zeros(n_q), np.zeros((n_q, d_v))


check_empty_partial(empty)
""",
    "3.4": """
a = partial_attention(np.array([[0.0, 5.0]]), np.array([[1.0], [2.0]]))
b = partial_attention(np.array([[1.0, 0.0]]), np.array([[3.0], [4.0]]))
check_merge_counterexample(a, b)
""",
}
RAISES = """
def update(m, l, x):
    return 1 / 0


check_online_update(update)
"""
RAISES_AT_TOP = """
def empty(n_q, d_v):
    return np.full(n_q, -np.inf), np.zeros(n_q), np.zeros((n_q, d_v))


raise ValueError("my own test failed")
"""
LOOPS = """
def merge(a, b):
    while True:
        pass


check_merge(merge)
"""
SYNTAX_ERROR = """
def empty(n_q, d_v)
    return None
"""
CRASHES = """
import os


def update(m, l, x):
    os._exit(3)


check_online_update(update)
"""
RENAMED = """
def my_merge(a, b):
    return a


check_merge(my_merge)
"""
CHEATS = """
def update(m, l, x):
    raise NotImplementedError


check_online_update(lambda m, l, x: online_softmax_update(SoftmaxState(m, l), x))
"""


def official() -> nbformat.NotebookNode:
    return nbformat.read(notebooks.target(CHAPTER, student=True), as_version=4)


def edited(answers: dict[str, str], drop: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    """The student notebook with exercise cells replaced (``answers``) or deleted (``drop``:
    the heading and the cell go)."""
    nb = copy.deepcopy(official())
    cells = chapters.exercise_cells(nb)
    for number, source in answers.items():
        (index,) = cells[number]
        nb.cells[index].source = source.strip("\n")
        nb.cells[index].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    doomed = set()
    for number in drop:
        doomed |= set(cells[number])
        doomed |= {i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                   and number in convert.exercise_numbers(c.source)}
    nb.cells = [c for i, c in enumerate(nb.cells) if i not in doomed]
    return nb


def expected_syntax_error() -> str:
    try:
        compile(SYNTAX_ERROR.strip("\n"), "<cell>", "exec")
    except SyntaxError as err:
        return f"the exercise cell raised SyntaxError: {err.msg} (line {err.lineno})"
    raise AssertionError("SYNTAX_ERROR compiles")


def first_problem(check_name: str, fn) -> str:
    """What the book's checker itself says first about ``fn``, run here."""
    from flashlib.book.exercises import online_softmax

    return getattr(online_softmax, check_name)(fn).problems[0]


def no_notebook(chapter: str) -> str:
    return f"no notebook of the chapter {chapter!r}"


#: A cell as it was handed out: not attempted, without running it.
NOT_ATTEMPTED = ("not attempted", 0, 0, grade.UNCHANGED)
#: A cell changed, whose function still raises NotImplementedError: the checker's words.
STILL_RAISES = ("not attempted", 0, 1,
                "not attempted yet: replace `raise NotImplementedError` with your code and run "
                "the cell again")
#: A counterexample changed, but still one on which the buggy merge is right.
WRONG_COUNTEREXAMPLE = """
a = partial_attention(np.array([[0.0, 1.0]]), np.array([[1.0], [2.0]]))
b = partial_attention(np.array([[1.0, 0.0]]), np.array([[5.0], [6.0]]))
check_merge_counterexample(a, b)
"""


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("report")
    class_ = {
        "alice": edited(CORRECT),
        "bob": edited({"3.1": RAISES, "3.3": RAISES_AT_TOP, "3.4": WRONG_COUNTEREXAMPLE}),
        "carol": edited({"3.2": LOOPS, "3.3": CORRECT["3.3"]}),
        "dave": edited({"3.3": SYNTAX_ERROR}),
        "erin": edited({"3.1": CORRECT["3.1"]}, drop=("3.4",)),
        "frank": edited({"3.1": CRASHES, "3.2": RENAMED}),
        "gina": edited({"3.1": CHEATS}),
    }
    for student, nb in class_.items():
        (folder / student).mkdir()
        nbformat.write(nb, folder / student / "online-softmax.ipynb")
    unrelated = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# My homework")])
    nbformat.write(unrelated, folder / "frank" / "homework.ipynb")
    (folder / "hal.ipynb").write_text("not a notebook", encoding="utf-8")
    (folder / "alice" / ".ipynb_checkpoints").mkdir()  # ignored
    nbformat.write(unrelated, folder / "alice" / ".ipynb_checkpoints" / "x-checkpoint.ipynb")
    rows = grade.grade(folder, out, timeout=TIMEOUT, jobs=2,
                       chapter_names=["online-softmax", "overflow"])
    return rows, out


@pytest.mark.slow  # a class graded in the sandbox
def test_every_row_of_the_report(graded):
    rows, out = graded
    with open(out / "results.csv", encoding="utf-8", newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == reports.CSV_COLUMNS
    assert len(table) == len(rows)
    nb = "{}/online-softmax.ipynb"
    raised = first_problem("check_online_update", lambda m, l, x: 1 / 0)
    expected = [
        # student, notebook, chapter, exercise, status, checks passed, total, first problem
        # (per student: notebooks not graded, then the chapters in the book's order)
        ("alice", "", "overflow", "", "missing", 0, 0, no_notebook("overflow")),
        *[("alice", nb.format("alice"), "online-softmax", n, "passed", None, None, "")
          for n in ("3.1", "3.2", "3.3", "3.4")],
        ("bob", "", "overflow", "", "missing", 0, 0, no_notebook("overflow")),
        ("bob", nb.format("bob"), "online-softmax", "3.1", "failed", None, None, raised),
        ("bob", nb.format("bob"), "online-softmax", "3.2", *NOT_ATTEMPTED),
        # the function is right and the checks pass; the cell's error is a note
        ("bob", nb.format("bob"), "online-softmax", "3.3", "passed", 3, 3, ""),
        ("bob", nb.format("bob"), "online-softmax", "3.4", "failed", 0, 1, None),
        ("carol", "", "overflow", "", "missing", 0, 0, no_notebook("overflow")),
        ("carol", nb.format("carol"), "online-softmax", "3.1", *NOT_ATTEMPTED),
        ("carol", nb.format("carol"), "online-softmax", "3.2", "timeout", 0, 0,
         f"used its {TIMEOUT:g} s of CPU time: killed (an infinite loop, or far too slow)"),
        ("carol", nb.format("carol"), "online-softmax", "3.3", "passed", None, None, ""),
        ("carol", nb.format("carol"), "online-softmax", "3.4", *NOT_ATTEMPTED),
        ("dave", "", "overflow", "", "missing", 0, 0, no_notebook("overflow")),
        ("dave", nb.format("dave"), "online-softmax", "3.1", *NOT_ATTEMPTED),
        ("dave", nb.format("dave"), "online-softmax", "3.2", *NOT_ATTEMPTED),
        ("dave", nb.format("dave"), "online-softmax", "3.3", "error", 0, 0,
         expected_syntax_error()),
        ("dave", nb.format("dave"), "online-softmax", "3.4", *NOT_ATTEMPTED),
        ("erin", "", "overflow", "", "missing", 0, 0, no_notebook("overflow")),
        ("erin", nb.format("erin"), "online-softmax", "3.1", "passed", None, None, ""),
        ("erin", nb.format("erin"), "online-softmax", "3.2", *NOT_ATTEMPTED),
        ("erin", nb.format("erin"), "online-softmax", "3.3", *NOT_ATTEMPTED),
        ("erin", nb.format("erin"), "online-softmax", "3.4", "missing", 0, 0,
         "no 'Exercise 3.4' heading in the notebook"),
        ("frank", "frank/homework.ipynb", "", "", "unrelated", 0, 0,
         "not a chapter of the book (title 'My homework', file 'homework.ipynb')"),
        ("frank", "", "overflow", "", "missing", 0, 0, no_notebook("overflow")),
        ("frank", nb.format("frank"), "online-softmax", "3.1", "crashed", 0, 0,
         "the process exited with code 3 before the checker answered"),
        ("frank", nb.format("frank"), "online-softmax", "3.2", "error", 0, 0,
         "check_merge(merge) raised NameError: name 'merge' is not defined"),
        ("frank", nb.format("frank"), "online-softmax", "3.3", *NOT_ATTEMPTED),
        ("frank", nb.format("frank"), "online-softmax", "3.4", *NOT_ATTEMPTED),
        ("gina", "", "overflow", "", "missing", 0, 0, no_notebook("overflow")),
        ("gina", nb.format("gina"), "online-softmax", "3.1", *STILL_RAISES),
        ("gina", nb.format("gina"), "online-softmax", "3.2", *NOT_ATTEMPTED),
        ("gina", nb.format("gina"), "online-softmax", "3.3", *NOT_ATTEMPTED),
        ("gina", nb.format("gina"), "online-softmax", "3.4", *NOT_ATTEMPTED),
        ("hal", "hal.ipynb", "", "", "unreadable", 0, 0, None),
        ("hal", "", "overflow", "", "missing", 0, 0, no_notebook("overflow")),
        ("hal", "", "online-softmax", "", "missing", 0, 0, no_notebook("online-softmax")),
    ]
    key = [(r["student"], r["notebook"], r["chapter"], r["exercise"]) for r in table]
    assert key == [e[:4] for e in expected]
    for row, (*_, status, passed, total, problem) in zip(table, expected, strict=True):
        where = f"{row['student']} {row['chapter']} {row['exercise']}"
        assert row["status"] == status, (where, row)
        assert row["passed"] == str(status == "passed"), where
        if passed is not None:
            assert (int(row["checks_passed"]), int(row["checks_total"])) == (passed, total), where
        if problem is not None:
            assert row["first_problem"] == problem, where
        if status == "passed":
            assert row["checks_passed"] == row["checks_total"] != "0", where
        if status == "timeout":
            assert TIMEOUT - 0.5 <= float(row["runtime_s"]) < TIMEOUT + 8, where
        elif row["exercise"] and status != "missing" and problem != grade.UNCHANGED:
            assert float(row["runtime_s"]) < TIMEOUT, where
        else:  # not run: no notebook, no cell, or a cell as handed out
            assert row["runtime_s"] == "", where
    unreadable = next(r for r in table if r["status"] == "unreadable")
    assert unreadable["first_problem"].startswith("not a readable notebook: ")


@pytest.mark.slow  # a class graded in the sandbox
def test_the_exercise_failing_the_book_way(graded):
    """The starter counterexample fails with the checker's own words, as in the notebook."""
    rows, _ = graded
    row = next(r for r in rows if r.student == "bob" and r.exercise == "3.4")
    import numpy as np

    from flashlib.book.exercises.online_softmax import check_merge_counterexample
    from flashlib.fast.online import partial_attention

    a = partial_attention(np.array([[0.0, 1.0]]), np.array([[1.0], [2.0]]))
    b = partial_attention(np.array([[1.0, 0.0]]), np.array([[5.0], [6.0]]))
    assert row.first_problem == grade.one_line(check_merge_counterexample(a, b).problems[0])
    assert row.feedback.startswith("NOT YET counterexample")


@pytest.mark.slow  # a class graded in the sandbox
def test_json_summary_and_exports(graded):
    rows, out = graded
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [d["status"] for d in data] == [r.status for r in rows]
    alice = next(d for d in data if d["student"] == "alice" and d["exercise"] == "3.1")
    assert alice["feedback"].startswith("PASSED online softmax update")
    bob = next(d for d in data if d["student"] == "bob" and d["exercise"] == "3.3")
    assert "ValueError: my own test failed" in bob["output"]  # the traceback the cell printed
    assert bob["notes"] == ["the exercise cell raised ValueError: my own test failed (line 5): "
                            "the checker graded what the cell defined, and it passed; fix "
                            "the cell"]

    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "| alice | alice/online-softmax.ipynb | passed" in summary
    assert re.search(r"\| carol \| carol/online-softmax.ipynb \| not attempted \| timeout \| "
                     r"passed \d+/\d+ \| not attempted \| 1/4 \|", summary)
    assert "- dave, Exercise 3.3: **error**: the exercise cell raised SyntaxError" in summary
    assert "| frank | frank/homework.ipynb | unrelated |" in summary
    assert "Not attempted: bob (3.2); carol (3.1, 3.4);" in summary
    assert "- bob, Exercise 3.3: the exercise cell raised ValueError" in summary  # a note
    assert "<" not in summary.replace("<br>", "")  # students' text is escaped

    with open(out / "nbgrader_grades.csv", encoding="utf-8", newline="") as f:
        nbgrader = list(csv.DictReader(f))
    assert list(nbgrader[0]) == reports.NBGRADER_COLUMNS
    scores = {(r["assignment"], r["student_id"]): (r["score"], r["max_score"])
              for r in nbgrader}
    assert scores[("online-softmax", "alice")] == ("4.0", "4.0")
    assert scores[("online-softmax", "carol")] == ("1.0", "4.0")
    assert scores[("online-softmax", "hal")] == ("0.0", "4.0")
    assert scores[("overflow", "alice")] == ("0.0", "4.0")
    assert len(nbgrader) == 2 * 8

    with open(out / "otter_final_grades_online-softmax.csv", encoding="utf-8",
              newline="") as f:
        otter = list(csv.DictReader(f))
    assert list(otter[0]) == ["file", "Exercise 3.1", "Exercise 3.2", "Exercise 3.3",
                              "Exercise 3.4", "total_points_earned", "percent_correct",
                              "grading_status"]
    assert otter[0]["file"] == "points-per-question"
    alice = next(r for r in otter if r["file"] == "alice/online-softmax.ipynb")
    assert (alice["total_points_earned"], alice["percent_correct"]) == ("4", "1.0")
    erin = next(r for r in otter if r["file"] == "erin/online-softmax.ipynb")
    assert (erin["Exercise 3.1"], erin["Exercise 3.4"], erin["percent_correct"]) == (
        "1", "0", "0.25")
    assert (out / "logs" / "online-softmax.log").is_file()


def test_every_exercise_of_the_book_can_be_graded():
    """What the grader assumes of the chapters: each exercise has one code cell ending in a
    call of a checker imported from flashlib.book.exercises, and uses no name that another
    exercise's cell defines (each exercise runs alone, in the chapter's namespace)."""
    for source in toc.chapters():
        chapter = chapters.load_chapter(source)
        nb = convert.clean_notebook(source, student=True)
        cells = chapters.exercise_cells(nb)
        assert not chapter.ungraded, f"{source.name}: exercises without a checker call"
        assert set(chapter.exercises) == set(cells)
        assert [v for k, v in chapter.steps if k == "exercise"] == list(cells)
        defined: dict[str, str] = {}
        for number, indices in cells.items():
            assert len(indices) == 1, f"{source.name} Exercise {number}: cells {indices}"
            tree = ast.parse(nb.cells[indices[0]].source)
            mine = {t.id for node in tree.body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
            mine |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - mine
            shared = {name: defined[name] for name in used if name in defined}
            assert not shared, (f"{source.name} Exercise {number} uses {shared} from other "
                                "exercises: grading/grade.py runs each exercise alone")
            defined |= dict.fromkeys(mine, number)
            assert chapter.exercises[number].checker.startswith("flashlib.book.exercises.")


def test_exercise_cells_ignore_the_students_own_markdown():
    nb = official()
    chapter = chapters.load_chapter(CHAPTER)
    (index,) = chapters.exercise_cells(nb)["3.2"]
    nb.cells.insert(index + 1, nbformat.v4.new_markdown_cell("My notes: merge is symmetric."))
    nb.cells.insert(index + 2, nbformat.v4.new_code_cell("print(merge)"))
    assert chapters.exercise_cells(nb, chapter.markdown)["3.2"] == [index, index + 2]
    assert chapters.exercise_cells(nb)["3.2"] == [index]


def test_chapter_found_by_title_then_by_file_name(tmp_path):
    found = chapters.load_chapters()
    nb = official()
    assert submissions.match_chapter(nb, tmp_path / "x.ipynb", found).name == "online-softmax"
    untitled = nbformat.v4.new_notebook()
    for name in ("overflow.ipynb", "Copy of overflow.ipynb", "overflow (1).ipynb"):
        assert submissions.match_chapter(untitled, tmp_path / name, found).name == "overflow"
    assert submissions.match_chapter(untitled, tmp_path / "mine.ipynb", found) is None


def test_list_exercises_describes_every_checker():
    table = chapters.exercise_table()
    lines = [line for line in table.splitlines()[2:]]
    n_exercises = sum(len(chapters.load_chapter(s).exercises) for s in toc.chapters())
    assert len(lines) == n_exercises
    for line in lines:
        *_, what = line.rstrip(" |").split(" | ")
        assert len(what) > 20, line  # the checker's docstring
    assert "`check_merge(merge)` | `flashlib.book.exercises.online_softmax.check_merge` " \
           "(merge of partial states)" in table


@pytest.mark.slow
def test_command_line(tmp_path, capsys):
    folder = tmp_path / "subs"
    folder.mkdir()
    nbformat.write(edited({"3.3": CORRECT["3.3"]}), folder / "ivy.ipynb")
    assert cli.main([str(folder), "--out", str(tmp_path / "out"), "--timeout", "20"]) == 0
    assert "graded 4 rows: 1 passed, 3 not attempted in" in capsys.readouterr().out
    with open(tmp_path / "out" / "results.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["student"], r["exercise"], r["status"]) for r in rows] == [
        ("ivy", "3.1", "not attempted"), ("ivy", "3.2", "not attempted"), ("ivy", "3.3", "passed"),
        ("ivy", "3.4", "not attempted")]
    with pytest.raises(SystemExit, match="--chapters: no chapter nope"):
        cli.main([str(folder), "--chapters", "nope", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        cli.main([str(tmp_path / "not-there")])
    assert cli.main(["--list-exercises"]) == 0
    assert "| online-softmax | 3.4 | `check_merge_counterexample(a, b)` |" in (
        capsys.readouterr().out)


def test_a_chapter_that_fails_here_is_reported_not_fatal(tmp_path):
    """The chapter's own cells: an error is reported and grading goes on; a worker that dies
    leaves its remaining tasks without result (grader-error rows, in grade())."""
    chapter = fake_chapter(("code", "1 / 0"), ("exercise", "1"),
                           ("code", "import os\nos._exit(7)"), ("exercise", "2"))
    tasks = [{"id": "a", "exercise": "1", "cells": [CORRECT["3.3"]]},
             {"id": "b", "exercise": "2", "cells": [CORRECT["3.3"]]}]
    found, errors = grade.grade_chapter(chapter, tasks, 20.0, 1, tmp_path / "logs")
    assert list(found) == ["a"] and found["a"]["status"] == "passed"
    assert errors == ["ZeroDivisionError: division by zero in the chapter's cell '1 / 0'",
                      "the chapter's worker exited with code 7"]
    assert (tmp_path / "logs" / "fake.log").is_file()
