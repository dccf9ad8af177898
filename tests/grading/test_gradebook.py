"""The class's files (grading/gradebook.py): a roster mapped to the notebooks, learning
platforms' export names recognised as one student, the wide gradebook.csv and one feedback
file per student; and the flags for the instructor (grading/lint.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import nbformat
import pytest

from grading import cli, grade, gradebook, lint
from tests.helpers import student_notebook

CHAPTER = grade.ROOT / "book" / "online-softmax.md"
RIGHT_EMPTY = """
def empty(n_q, d_v):
    return np.full(n_q, -np.inf), np.zeros(n_q), np.zeros((n_q, d_v))


check_empty_partial(empty)
"""
ROSTER = """Student,ID,SIS User ID,SIS Login ID,Email
Points Possible,,,,
"Smith, Alice",1001,S1,asmith,alice.smith@uni.edu
Bob Jones,1002,S2,bjones,bob@uni.edu
Chloé Núñez,1003,S3,cnunez,chloe@uni.edu
"""


@pytest.mark.parametrize(("path", "key", "late", "file"), [
    ("smithalice_1001_5551_Copy of overflow.ipynb", "smithalice", False,
     "Copy of overflow.ipynb"),
    ("smithalice_LATE_1001_5551_overflow-1.ipynb", "smithalice", True, "overflow-1.ipynb"),
    ("Alice Smith_1234_assignsubmission_file_/overflow.ipynb", "Alice Smith", False,
     "overflow.ipynb"),
    ("Alice Smith_1234_assignsubmission_file_overflow.ipynb", "Alice Smith", False,
     "overflow.ipynb"),
    ("Week 1_asmith_attempt_2026-01-20-10-31-00_overflow.ipynb", "asmith", False,
     "overflow.ipynb"),
    ("alice/overflow.ipynb", "alice", False, "overflow.ipynb"),
    ("submitted/alice/week1/overflow.ipynb", "submitted", False, "overflow.ipynb"),
    ("alice.ipynb", "alice", False, "alice.ipynb"),
])
def test_platform_names(path, key, late, file):
    who = gradebook.owner(Path(path))
    assert (who.key, who.late, who.file_name) == (key, late, file)


def test_one_student_for_all_their_files():
    """Issue 25: ``smithalice_1001_5551_Copy of overflow.ipynb`` was two students, each
    missing a chapter; now one student, both chapters, matched to the roster."""
    roster = gradebook.load_roster_text(ROSTER)
    assert [(s.id, s.name, s.email) for s in roster] == [
        ("1001", "Alice Smith", "alice.smith@uni.edu"), ("1002", "Bob Jones", "bob@uni.edu"),
        ("1003", "Chloé Núñez", "chloe@uni.edu")]
    names = ["smithalice_1001_5551_Copy of overflow.ipynb",
             "smithalice_LATE_1001_5552_online-softmax.ipynb", "jonesbob_1002_5553_x.ipynb",
             "Chloe Nunez_88_assignsubmission_file_/overflow.ipynb", "asmith/overflow.ipynb",
             "chloe@uni.edu/overflow.ipynb", "zed_9_9_overflow.ipynb"]
    matched = [gradebook.match_roster(gradebook.owner(Path(n)), roster) for n in names]
    assert [m.id if m else None for m in matched] == [
        "1001", "1001", "1002", "1003", "1001", "1003", None]


def test_roster_headers_and_errors(tmp_path):
    path = tmp_path / "moodle.csv"
    path.write_text("First name;Surname;ID number;Email address\nAlice;Smith;42;a@x.org\n",
                    encoding="utf-8")
    (alice,) = gradebook.load_roster(path)
    assert (alice.id, alice.name, alice.email) == ("42", "Alice Smith", "a@x.org")
    path.write_text("who,what\nx,y\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no column for the student id or email"):
        gradebook.load_roster(path)




@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A Canvas export of the online-softmax notebooks for a roster of three: Alice hands it
    in twice (the resubmission late and worse), Bob not at all, Chloé once, and someone
    not on the roster once."""
    folder = tmp_path_factory.mktemp("canvas")
    subs = folder / "submissions"
    subs.mkdir()
    roster = folder / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    good = student_notebook(CHAPTER, {"3.3": RIGHT_EMPTY})
    nbformat.write(good, subs / "smithalice_1001_5551_Copy of online-softmax.ipynb")
    nbformat.write(student_notebook(CHAPTER, {}),
                   subs / "smithalice_LATE_1001_5557_online-softmax-1.ipynb")
    nbformat.write(good, subs / "nunezchloe_1003_5552_online-softmax.ipynb")
    nbformat.write(good, subs / "stranger_2000_5553_online-softmax.ipynb")
    out = folder / "report"
    assert cli.main([str(subs), "--out", str(out), "--roster", str(roster), "--timeout",
                       "20"]) == 0
    with open(out / "gradebook.csv", encoding="utf-8", newline="") as f:
        book = list(csv.DictReader(f))
    return out, book


def test_the_wide_gradebook(graded):
    out, book = graded
    assert list(book[0]) == ["student_id", "name", "email", "Exercise 3.1", "Exercise 3.2",
                             "Exercise 3.3", "Exercise 3.4", "total", "out_of", "percent",
                             "late"]
    rows = {r["student_id"]: r for r in book}
    assert list(rows) == ["1001", "1002", "1003", "stranger"]  # roster order, then others
    alice = rows["1001"]
    assert (alice["name"], alice["email"]) == ("Alice Smith", "alice.smith@uni.edu")
    assert (alice["Exercise 3.3"], alice["total"], alice["out_of"]) == ("1", "1", "4")
    assert alice["late"] == "online-softmax"  # her resubmission came late: best one counts
    assert rows["1002"]["total"] == "0"  # nothing handed in
    assert rows["1003"]["Exercise 3.3"] == "1"
    with open(out / "results.csv", encoding="utf-8", newline="") as f:
        results = list(csv.DictReader(f))
    bob = [r for r in results if r["student"] == "1002"]
    assert [(r["chapter"], r["status"]) for r in bob] == [("online-softmax", "missing")]
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "## Notebooks of no one on the roster" in summary
    assert "stranger_2000_5553_online-softmax.ipynb" in summary


def test_nbgrader_and_otter_files_use_the_roster(graded):
    out, _ = graded
    with open(out / "nbgrader_grades.csv", encoding="utf-8", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert (rows["1001"]["first_name"], rows["1001"]["last_name"]) == ("Alice", "Smith")
    assert rows["1001"]["email"] == "alice.smith@uni.edu"
    assert rows["1001"]["score"] == "1.0" and rows["1002"]["score"] == "0.0"
    assert (out / "otter_final_grades_online-softmax.csv").is_file()


def test_one_feedback_file_per_student(graded):
    out, _ = graded
    files = sorted(p.name for p in (out / "feedback").iterdir())
    assert files == ["1001.md", "1002.md", "1003.md", "stranger.md"]
    alice = (out / "feedback" / "1001.md").read_text(encoding="utf-8")
    assert alice.startswith("# Feedback: Alice Smith")
    assert "| 3.3 | passed | 1 |" in alice
    assert "How your notebook was graded" in alice
    assert "Chloé" not in alice and "stranger" not in alice  # nobody else's results
    assert "flag" not in alice.lower()  # the instructor's flags stay in summary.md
    assert "Not handed in" in (out / "feedback" / "1002.md").read_text(encoding="utf-8")


def test_flags_for_the_instructor():
    flags = lint.flags([
        "import numpy as np\nnp.allclose = lambda *a, **k: True\n",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
        "import sys\nprint(sys.argv)\nopen('/proc/self/status').read()\n",
        "from flashlib.fast.online import merge_partials\nsetattr(Feedback, 'passed', 1)\n",
    ], forbidden=["flashlib.fast.online.merge_partials"])
    text = "\n".join(flags)
    for phrase in ("patches `np.allclose`", "sends a signal to a process (os.kill)",
                   "imports signal", "reads sys.argv", "names the path or file '/proc/self",
                   "imports flashlib's `merge_partials`", "patches `Feedback` (setattr)"):
        assert phrase in text, phrase
    assert lint.flags(["def merge(a, b):\n    return np.maximum(a[0], b[0])\n"]) == []


def test_same_answer_typed_again_has_the_same_fingerprint():
    a = "def f(x):\n    return x + 1  # mine\n"
    b = "def f(x):\n\n    return x+1\n"
    assert lint.fingerprint([a]) == lint.fingerprint([b])
    assert lint.fingerprint([a]) != lint.fingerprint(["def f(x):\n    return x\n"])


@pytest.mark.parametrize("number", ["1.1", "6.1", "9.2"])
def test_a_students_own_function_of_a_library_name_is_not_flagged(number):
    """The starter and the book's solution of an exercise whose function shares its name with
    the library's (the student's own `attention_flops`, `tile_class`, `io_count`)."""
    from grading import chapters

    chapter = next(c for c in chapters.load_chapters().values() if number in c.exercises)
    forbid = grade._forbidden(chapter.exercises[number])
    name = chapter.exercises[number].call.partition("(")[2].rstrip(")")
    assert name in {f.rpartition(".")[2] for f in forbid}  # the library's name too
    assert lint.flags(chapter.starters[number], forbid) == []
    solution = chapters.solutions(grade.ROOT / "book" / f"{chapter.name}.md")[number]
    assert lint.flags([solution + f"\n\ncheck_x({name})\n"], forbid) == []


@pytest.mark.parametrize(("cell", "why"), [
    ("copy = io_count\ndef io_count(*a):\n    return copy(*a)\n", "uses flashlib's `io_count`"),
    ("def f(*a):\n    return io_count(*a)\ncheck(f)\n", "uses flashlib's `io_count`"),
    ("from flashlib.studies.io import io_count\ncheck(io_count)\n", "imports flashlib's"),
    ("import flashlib.studies.io as m\ncheck(m.io_count)\n", "uses flashlib's `io_count`"),
    ("io_count = getattr(m, 'io_count')\n", "names flashlib's `io_count` in a string"),
    ("def io_count(*a, lib=io_count):\n    return lib(*a)\n", "uses flashlib's `io_count`"),
])
def test_the_library_function_under_its_own_name_is_still_flagged(cell, why):
    found = lint.flags([cell], ["flashlib.studies.io.io_count"])
    assert any(why in f for f in found), found


def test_long_gradebook_and_the_platforms_import_files(tmp_path):
    """gradebook_long.csv: one row per student and exercise; canvas_import.csv in Canvas's
    gradebook layout (its export's columns, a Points Possible row, one column per
    assignment); moodle_import.csv with a column to identify users by."""
    from grading import chapters, reports

    chapter = chapters.load_chapters()["online-softmax"]
    numbers = sorted(chapter.exercises, key=chapters.number_key)
    roster = gradebook.load_roster_text(
        "Student,ID,SIS User ID,SIS Login ID,Section,Email\n"
        "\"Smith, Alice\",1001,S1,asmith,Sec A,alice@uni.edu\n"
        "\"Jones, Bob\",1002,S2,bjones,Sec A,bob@uni.edu\n")
    alice = roster[0].id
    rows = [reports.Row(alice, "a.ipynb", "online-softmax", n,
                        "passed" if i < 2 else "failed", late=True)
            for i, n in enumerate(numbers)]
    out = tmp_path / "out"
    reports.write_reports(rows, {"online-softmax": chapter}, out, timeout=5, context_errors={},
                          chapter_names=["online-softmax"], roster=roster)
    with open(out / "gradebook_long.csv", encoding="utf-8", newline="") as f:
        long = list(csv.DictReader(f))
    assert list(long[0]) == gradebook.LONG_COLUMNS
    assert len(long) == 2 * len(numbers)
    assert long[0] == {"student": alice, "chapter": "online-softmax", "exercise": numbers[0],
                       "points": "1", "max_points": "1", "status": "passed", "late": "yes"}
    assert {r["status"] for r in long if r["student"] != alice} == {"missing"}
    with open(out / "canvas_import.csv", encoding="utf-8", newline="") as f:
        canvas = list(csv.reader(f))
    assert canvas[0] == gradebook.CANVAS_COLUMNS + [chapter.title]
    assert canvas[1] == ["Points Possible", "", "", "", "", str(len(numbers))]
    assert canvas[2] == ["Smith, Alice", "1001", "S1", "asmith", "Sec A", "2"]
    assert canvas[3][-1] == "0"
    with open(out / "moodle_import.csv", encoding="utf-8", newline="") as f:
        moodle = list(csv.DictReader(f))
    assert moodle[0]["Email address"] == "alice@uni.edu" and moodle[0][chapter.title] == "2"


def test_the_late_policy_of_the_guide():
    """10% off per day begun, up to 3 days, then 0 (book/instructor.md)."""
    from datetime import datetime, timezone

    due = datetime(2026, 1, 20, 23, 59, tzinfo=timezone.utc)
    at = gradebook.parse_time
    assert gradebook.days_late(at("2026-01-20 22:00:00.123456 UTC"), due) == 0
    assert gradebook.days_late(at("2026-01-21T00:01"), due) == 1
    assert gradebook.days_late(at("2026-01-23-23-59-00"), due) == 3
    assert gradebook.days_late(at("2026-01-24T00:00"), due) == 4
    assert gradebook.days_late(None, due) is None
    assert [gradebook.late_factor(d) for d in (None, 0, 1, 2, 3, 4)] == [1, 1, 0.9, 0.8,
                                                                         0.7, 0]


def test_late_work_loses_points_in_every_report(tmp_path):
    """A notebook with nbgrader's timestamp.txt two days after --due: 0.8 of each point, in
    the gradebooks, nbgrader's file (raw score and penalty) and the student's feedback."""
    from datetime import datetime, timezone

    from grading import chapters, reports, submissions

    folder = tmp_path / "subs" / "alice" / "online-softmax"
    folder.mkdir(parents=True)
    (folder / "online-softmax.ipynb").write_text("{}", encoding="utf-8")
    (folder / "timestamp.txt").write_text("2026-01-22 10:00:00.000000 UTC", encoding="utf-8")
    (sub,) = submissions.find_submissions(tmp_path / "subs")
    due = datetime(2026, 1, 20, 23, 59, tzinfo=timezone.utc)
    days = gradebook.days_late(sub.submitted, due)
    assert days == 2
    chapter = chapters.load_chapters()["online-softmax"]
    rows = [reports.Row("alice", sub.notebook, "online-softmax", n, "passed", late=True,
                        late_days=days) for n in chapter.exercises]
    out = tmp_path / "out"
    reports.write_reports(rows, {"online-softmax": chapter}, out, timeout=5, context_errors={},
                          chapter_names=["online-softmax"])
    n = len(chapter.exercises)
    with open(out / "gradebook_long.csv", encoding="utf-8", newline="") as f:
        assert {r["points"] for r in csv.DictReader(f)} == {"0.8"}
    with open(out / "nbgrader_grades.csv", encoding="utf-8", newline="") as f:
        (row,) = csv.DictReader(f)
    assert float(row["raw_score"]) == n and float(row["score"]) == round(0.8 * n, 4)
    assert float(row["late_submission_penalty"]) == round(0.2 * n, 4)
    feedback = (out / "feedback" / "alice.md").read_text(encoding="utf-8")
    assert "Handed in 2 days late: each exercise's score is multiplied by 0.8" in feedback
