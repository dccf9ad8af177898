"""The prose half of the student-spoiler test (tests/tools/test_student_spoilers.py) on the
chapters' sources, without a built student site: the student edition's text (each chapter
without its solutions) states no answer of an exercise whose answer is a number, a set, a
letter or a formula (issue 35).  With the student site built, test_student_spoilers.py runs
the same check on its pages too."""

from __future__ import annotations

import pytest

from grading import chapters
from tests.tools.test_student_spoilers import (
    BEFORE,
    KNOWN_STATED,
    STATED,
    stated_answers,
    student_text,
)


@pytest.mark.parametrize("number", sorted(STATED, key=chapters.number_key))
def test_the_student_text_does_not_state_the_answer(number):
    found = stated_answers(student_text(STATED[number].page, built=False), STATED[number])
    if number in KNOWN_STATED:
        assert found, f"{number} is no longer stated: remove it from KNOWN_STATED"
        return
    assert not found, f"the student edition states the answer of {number}: {found}"


@pytest.mark.parametrize("number", sorted(BEFORE, key=chapters.number_key))
def test_the_check_catches_the_answers_stated_before_issue_35(number):
    text, stated = BEFORE[number]
    assert stated_answers(text, stated)
