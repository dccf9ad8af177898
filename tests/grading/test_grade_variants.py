"""Per-student variants in the grader (issue 35): each student's answer is checked against the
variant of their id (the name of their submission folder), in the judge and in the student's
process alike, so a classmate's literal answer fails and the id written in the notebook does
not choose the variant."""

from __future__ import annotations

import copy

import nbformat
import pytest

from flashlib.book.exercises.io_model import STANDARD_VARIANTS
from flashlib.book.exercises.variants import variant
from grading import chapters, grade
from tools import notebooks, toc

pytestmark = pytest.mark.slow  # grades a chapter (its cells run once per judge)

CHAPTER = next(s for s in toc.chapters() if s.stem == "io-model")
IDS = [f"s{n}" for n in range(100, 140)]


def count(p: dict) -> int:
    return 4 * p["N_q"] * p["N_k"] + (p["N_q"] + p["N_k"]) * (p["d"] + p["d_v"])


def submitted(answer: str, setup: str = "") -> nbformat.NotebookNode:
    nb = copy.deepcopy(nbformat.read(notebooks.target(CHAPTER, student=True), as_version=4))
    (index,) = chapters.exercise_cells(nb)["9.1"]
    nb.cells[index].source = f"{setup}answer = {answer}\n\ncheck_standard_count(answer)"
    return nb


def test_each_student_is_graded_on_their_own_variant(tmp_path):
    alice = IDS[0]
    bob = next(i for i in IDS if variant("9.1", i) != variant("9.1", alice))
    assert len(STANDARD_VARIANTS.choices) > 2
    mine = count(variant("9.1", alice))
    class_ = {
        alice: submitted(str(mine)),  # her own variant's number: passes
        bob: submitted(str(mine)),  # his classmate's number: fails
        # the notebook claims alice's id: the grader still asks carol's own variant
        "carol": submitted(str(mine), setup=f'import os\nos.environ["FLASHLIB_STUDENT_ID"] = '
                                            f'"{alice}"\n'),
        # a function reading the variant in the student's process: right for anyone
        "dave": submitted("count_mine()", setup=(
            "from flashlib.book.exercises.variants import variant\n\n\n"
            "def count_mine():\n    p = variant('9.1')\n"
            "    return 4 * p['N_q'] * p['N_k'] + (p['N_q'] + p['N_k']) * (p['d'] + p['d_v'])"
            "\n\n\n")),
    }
    for student, nb in class_.items():
        (tmp_path / "in" / student).mkdir(parents=True)
        nbformat.write(nb, tmp_path / "in" / student / "io-model.ipynb")
    rows = grade.grade(tmp_path / "in", tmp_path / "out", timeout=20.0,
                       chapter_names=["io-model"])
    status = {r.student: r.status for r in rows if r.exercise == "9.1"}
    assert status == {alice: "passed", bob: "failed", "carol": "failed" if variant(
        "9.1", "carol") != variant("9.1", alice) else "passed", "dave": "passed"}, status
