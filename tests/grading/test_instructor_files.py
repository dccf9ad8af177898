"""The generated parts of the instructor guide (grading/instructor_files.py) are up to date:
the table of exercises matches the chapters' checkers, and the sample grading report shows
each kind of result the guide describes."""

from __future__ import annotations

from grading import instructor_files
from tools.paths import ROOT


def test_exercise_table_is_current():
    assert instructor_files.EXERCISES.read_text() == instructor_files.exercise_table(), (
        "book/instructor/exercises.md is out of date: run "
        ".venv/bin/python -m grading.instructor_files exercises")


def test_course_plan_is_current_and_balanced():
    """The meetings' pre-reading is counted from the chapters: the committed plan is the one
    the chapters give today, every chapter with exercises is in it, and no meeting holds
    more than twice the reading or the exercises of another."""
    plan = instructor_files.course_plan()
    assert instructor_files.COURSE.read_text() == plan, (
        "book/instructor/course.md is out of date: run "
        ".venv/bin/python -m grading.instructor_files course")
    from grading import chapters as grading_chapters

    chapters = grading_chapters.load_chapters()
    words, exercises = [], []
    for meeting in instructor_files.MEETINGS:
        words.append(sum(instructor_files.prose_words(ROOT / "book" / f"{c}.md")
                         for c in meeting["chapters"]))
        exercises.append(sum(len(chapters[c].exercises) for c in meeting["chapters"]))
        for number in meeting["in_class"]:
            assert number in plan
    assert max(words) <= 2 * min(words) and max(exercises) <= 2 * min(exercises)
    assert "{include} instructor/course.md" in (ROOT / "book" / "instructor.md").read_text()


def test_guide_holds_the_course_kit():
    guide = (ROOT / "book" / "instructor.md").read_text()
    for heading in ("A course plan", "a prerequisite check", "A rubric for the written parts",
                    "Deadlines and late work", "Academic integrity",
                    "Before the course: a release checklist", "What each platform gets",
                    "How long grading takes", "How students run the notebooks, and hand them in"):
        assert heading in guide, heading
    for exercise in ("3.3", "3.4", "4.3"):  # the rubric's written and pencil parts
        assert f"| {exercise}," in guide, exercise
    assert "(TIMING)" not in guide


def test_sample_report_shows_every_kind_of_result():
    report = instructor_files.REPORT.read_text()
    for student in instructor_files.STUDENTS:
        assert f"| {student} | {student}/beyond.ipynb |" in report
    for status in ("passed", "failed", "timeout", "not attempted"):
        assert status in report
    assert "refused: you called flash_attention" in report  # frank's library answers
    assert "the book's published solution, unchanged" in report  # a flag
    assert "The students' code ran confined:" in report
    assert "you averaged the splits' outputs" in report  # a checker's diagnosis
    assert not report.lstrip().startswith("# "), "headings demoted under the guide's ##"
    assert "{include} instructor/sample-report.md" in (ROOT / "book" / "instructor.md").read_text()
