"""The generated parts of the instructor guide (tools/instructor_files.py) are up to date:
the table of exercises matches the chapters' checkers, and the sample grading report shows
each kind of result the guide describes."""

from __future__ import annotations

from tools import instructor_files
from tools.paths import ROOT


def test_exercise_table_is_current():
    assert instructor_files.EXERCISES.read_text() == instructor_files.exercise_table(), (
        "book/instructor/exercises.md is out of date: run "
        ".venv/bin/python -m tools.instructor_files exercises")


def test_sample_report_shows_every_kind_of_result():
    report = instructor_files.REPORT.read_text()
    for student in instructor_files.STUDENTS:
        assert f"| {student} | {student}/beyond.ipynb |" in report
    for status in ("passed", "failed", "timeout", "not attempted"):
        assert status in report
    assert "you averaged the splits' outputs" in report  # a checker's diagnosis
    assert not report.lstrip().startswith("# "), "headings demoted under the guide's ##"
    assert "{include} instructor/sample-report.md" in (ROOT / "book" / "instructor.md").read_text()
