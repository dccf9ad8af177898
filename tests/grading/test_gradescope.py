"""grading/gradescope.py: the autograder's files, and run_autograder run on a made-up student
in a folder laid out like Gradescope's /autograder, whose results.json has Gradescope's format
(https://gradescope-autograders.readthedocs.io/en/latest/specs/)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from grading import gradescope, made_up_class


@pytest.mark.sandbox
@pytest.mark.slow  # a chapter graded in the sandbox
def test_run_autograder_on_a_made_up_student(tmp_path):
    root = tmp_path / "autograder"
    gradescope.main([str(root / "source")])
    for name in ("setup.sh", "run_autograder"):
        assert os.access(root / "source" / name, os.X_OK)
    assert (root / "source" / "flashlib" / "book" / "exercises").is_dir()
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    made_up_class.write_class(tmp_path / "class", students=2, chapters=["online-softmax"],
                              profiles=["solution", "mistake"])
    results = {}
    for student in ("s01-solution", "s02-mistake"):
        (root / "submission").mkdir(parents=True)
        shutil.copy2(tmp_path / "class" / student / "online-softmax.ipynb",
                     root / "submission" / "online-softmax.ipynb")
        env = os.environ | {"AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
        done = subprocess.run([str(root / "run_autograder")], env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        results[student] = json.loads((root / "results" / "results.json").read_text())
        shutil.rmtree(root / "submission")
        shutil.rmtree(root / "results")
    for found in results.values():
        assert set(found) >= {"score", "execution_time", "output", "tests"}
        assert isinstance(found["score"], float) and isinstance(found["execution_time"], int)
        assert found["tests"], found
        for test in found["tests"]:
            assert set(test) >= {"name", "number", "score", "max_score", "status", "output",
                                 "visibility"}
            assert test["status"] in ("passed", "failed")
            assert 0 <= test["score"] <= test["max_score"] == 1.0
            assert test["visibility"] in ("hidden", "after_due_date", "after_published",
                                          "visible")
        assert found["score"] == round(sum(t["score"] for t in found["tests"]), 4)
    solution = results["s01-solution"]
    assert all(t["status"] == "passed" for t in solution["tests"]), solution
    assert solution["score"] == len(solution["tests"])
    assert results["s02-mistake"]["score"] < solution["score"]


def test_the_student_id_comes_from_gradescopes_metadata(tmp_path):
    """Issue 35: each submission is graded as its student (their variants), from
    submission_metadata.json's users (Gradescope's documented format)."""
    import json

    from grading.gradescope import student_id

    assert student_id(tmp_path) == "student"
    meta = tmp_path / "submission_metadata.json"
    meta.write_text(json.dumps({"users": [{"email": "ada@uni.edu", "id": 7, "name": "Ada",
                                           "sid": "s1234567"}]}), encoding="utf-8")
    assert student_id(tmp_path) == "s1234567"
    meta.write_text(json.dumps({"users": [{"email": "ada@uni.edu", "sid": None}]}),
                    encoding="utf-8")
    assert student_id(tmp_path) == "ada@uni.edu"
    meta.write_text(json.dumps({"users": [{"sid": "a/b\\c:d"}]}), encoding="utf-8")
    assert student_id(tmp_path) == "a_b_c_d"
    meta.write_text("not json", encoding="utf-8")
    assert student_id(tmp_path) == "student"
