"""grading/grade.py against the attacks of issue 25: each one, handed in by a student, changes no
grade but that student's own exercise, and is reported to the instructor.

The class: two honest students (alice answers everything right, bob answers 3.1 and hands
3.4 back wrong), graded once alone (the baseline) and once with an attacker per attack
(grading/made_up_class.py's CHEATS and ATTACKS).  Each attacker answers 3.1 to 3.3 right and
puts the attack in Exercise 3.4, the last of the chapter (so that no later exercise of theirs
runs it again as an earlier cell); a cheat is put after a wrong counterexample, which its trick
would have to turn into a pass, an attack before the right answer (which may then pass:
the attack changed nothing).  Attackers sort first, so their 3.4 runs before the
classmates' 3.4.  The attacks aim at the class's ``.canary`` folder and the book's sources
only, and the test runs only where the sandbox is complete (the ``sandbox`` marker: bubblewrap
with nested user namespaces), so a failure here cannot harm the machine.
"""

from __future__ import annotations

import copy
import csv
import time

import nbformat
import pytest

from grading import chapters, grade, made_up_class
from tools import notebooks

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]  # slow: a class graded in the sandbox

CHAPTER = grade.ROOT / "book" / "online-softmax.md"
BOOK_CANARY = grade.ROOT / "book" / "grade-canary.md"
TIMEOUT = 8.0
WRONG_COUNTEREXAMPLE = """
a = partial_attention(np.array([[0.0, 1.0]]), np.array([[1.0], [2.0]]))
b = partial_attention(np.array([[1.0, 0.0]]), np.array([[5.0], [6.0]]))
"""
ATTACKS = {**made_up_class.CHEATS, **made_up_class.ATTACKS}
#: What each attack's own exercise must show besides "not passed" (a phrase of its
#: first_problem or of its flags).
SIGNS = {
    "forged result": "raw file descriptor",
    "patched checker": "patches `Feedback.passed`",
    "patched numpy": "patches `np.allclose`",
    "copied classmate": "walks the interpreter's objects",
    "appended result": "names the path or file",
    "daemon": "left ",
    "parent kill": "sends a signal",
    "fork bomb": "left ",
    "memory": "hit the memory limit",
    "files": "hit the limit on files written",
    "outside": "deletes files",
}


def student(attack: str) -> str:
    return "aa-" + attack.replace(" ", "-")


def notebook(answers: dict[str, str]) -> nbformat.NotebookNode:
    nb = nbformat.read(notebooks.target(CHAPTER, student=True), as_version=4)
    nb = copy.deepcopy(nb)
    cells = chapters.exercise_cells(nb)
    for number, source in answers.items():
        (index,) = cells[number]
        nb.cells[index].source = source.strip("\n")
    return nb


def right_answers() -> dict[str, str]:
    official = nbformat.read(notebooks.target(CHAPTER, student=True), as_version=4)
    cells = chapters.exercise_cells(official)
    solutions = made_up_class.solutions(CHAPTER)
    answers = {}
    for number, (index,) in cells.items():
        call = made_up_class.CHECK_CALL.findall(official.cells[index].source)[-1]
        code = solutions[number]
        answers[number] = code if call in code else f"{code}\n\n\n{call}"
    return answers


def write_class(folder, attacks: list[str]) -> None:
    right = right_answers()
    honest = {"alice": right, "bob": {"3.1": right["3.1"], "3.4": WRONG_COUNTEREXAMPLE
                                      + "check_merge_counterexample(a, b)"}}
    for name, answers in honest.items():
        (folder / name).mkdir(parents=True)
        nbformat.write(notebook(answers), folder / name / "online-softmax.ipynb")
    for attack in attacks:
        code = ATTACKS[attack].replace("{call}", "check_merge_counterexample(a, b)")
        if attack in made_up_class.CHEATS:
            code = WRONG_COUNTEREXAMPLE + code
        else:
            code = code + "\n\n" + right["3.4"]
        code = made_up_class.hostile(code, folder)
        answers = {n: right[n] for n in ("3.1", "3.2", "3.3")} | {"3.4": code}
        (folder / student(attack)).mkdir()
        nbformat.write(notebook(answers), folder / student(attack) / "online-softmax.ipynb")


def table(out) -> list[dict[str, str]]:
    with open(out / "results.csv", encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def verdicts(rows: list[dict[str, str]], who: set[str]) -> dict[tuple[str, str], tuple]:
    return {(r["student"], r["exercise"]): (r["status"], r["checks_passed"], r["checks_total"],
                                            r["first_problem"])
            for r in rows if r["student"] in who}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("baseline")
    write_class(base / "subs", [])
    grade.grade(base / "subs", base / "report", timeout=TIMEOUT, jobs=2)
    attacked = tmp_path_factory.mktemp("attacked")
    write_class(attacked / "subs", list(ATTACKS))
    report = attacked / "report"
    rows = grade.grade(attacked / "subs", report, timeout=TIMEOUT, jobs=2)
    right_after = (report / "results.csv").read_bytes()
    time.sleep(5)  # the daemon would have rewritten the reports by now
    try:
        yield {"baseline": table(base / "report"), "attacked": table(report), "rows": rows,
               "report": report, "canary": attacked / "subs" / made_up_class.CANARY,
               "right_after": right_after}
    finally:
        BOOK_CANARY.unlink(missing_ok=True)


def test_no_classmate_changes(runs):
    """alice and bob get the same statuses, counts and messages with the attackers as
    without them."""
    honest = {"alice", "bob"}
    assert verdicts(runs["attacked"], honest) == verdicts(runs["baseline"], honest)
    assert all(r["status"] == "passed" for r in runs["baseline"] if r["student"] == "alice")


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_attack_changes_its_own_exercise_only_and_is_reported(runs, attack):
    rows = {r["exercise"]: r for r in runs["attacked"] if r["student"] == student(attack)}
    assert sorted(rows) == ["3.1", "3.2", "3.3", "3.4"]
    for number in ("3.1", "3.2", "3.3"):  # the attacker's other exercises: right, passed
        assert rows[number]["status"] == "passed", (attack, rows[number])
    own = rows["3.4"]
    if attack in made_up_class.CHEATS:  # the trick would have to turn a wrong answer into a pass
        assert own["status"] != "passed", (attack, own)
    # an attack followed by a right answer may pass: it changed nothing, and it is flagged
    assert SIGNS[attack] in own["flags"], (attack, own)


def test_the_reports_are_the_graders_alone(runs):
    """No result line appended, no report rewritten by a daemon after grading, one row per
    student and exercise."""
    report = runs["report"]
    assert (report / "results.csv").read_bytes() == runs["right_after"]
    students = {"alice", "bob", *(student(a) for a in ATTACKS)}
    assert len(runs["attacked"]) == 4 * len(students)
    assert {r["student"] for r in runs["attacked"]} == students
    assert all(not line.startswith("{") for line in (report / "results.csv").read_text(
        encoding="utf-8").splitlines())


def test_nothing_outside_the_sandbox_was_touched(runs):
    canary = runs["canary"]
    assert (canary / "victim.txt").read_text(encoding="utf-8") == "the instructor's file\n"
    assert not (canary / "owned.txt").exists()
    assert not (canary / "daemon-was-here").exists()
    assert not BOOK_CANARY.exists(), "a student's code wrote into the book's sources"


def test_the_summary_lists_the_flags(runs):
    summary = (runs["report"] / "summary.md").read_text(encoding="utf-8")
    assert "## For the instructor: code worth a look" in summary
    for attack in ATTACKS:
        assert f"| {student(attack)} | 3.4 |" in summary, attack
    assert "The students' code ran confined: namespaces:" in summary
