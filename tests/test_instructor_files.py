"""The generated parts of the instructor guide (scripts/instructor_files.py) are up to date:
the table of exercises matches the chapters' checkers, and the sample grading report shows
each kind of result the guide describes."""

from __future__ import annotations

from pathlib import Path

import instructor_files  # scripts/ is on sys.path (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


def test_exercise_table_is_current():
    assert instructor_files.EXERCISES.read_text() == instructor_files.exercise_table(), (
        "book/instructor/exercises.md is out of date: run "
        ".venv/bin/python scripts/instructor_files.py exercises")


def test_sample_report_shows_every_kind_of_result():
    report = instructor_files.REPORT.read_text()
    for student in instructor_files.STUDENTS:
        assert f"| {student} | {student}/beyond.ipynb |" in report
    for status in ("passed", "failed", "timeout", "not attempted"):
        assert status in report
    assert "you averaged the splits' outputs" in report  # a checker's diagnosis
    assert not report.lstrip().startswith("# "), "headings demoted under the guide's ##"
    assert "{include} instructor/sample-report.md" in (ROOT / "book" / "instructor.md").read_text()
