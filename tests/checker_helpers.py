"""What the exercise-checker tests share: a learner's function that was not attempted or that
crashes, and the assertion that a checker failed saying the given phrases."""

from __future__ import annotations

from flashlib.book.exercises import Feedback


def text(fb: Feedback) -> str:
    return repr(fb)


def assert_fails_with(fb: Feedback, *phrases: str) -> None:
    assert not fb.passed, text(fb)
    for phrase in phrases:
        assert phrase in text(fb), (phrase, text(fb))


def not_attempted(*args):
    raise NotImplementedError


def crashing(*args):
    raise ValueError("oops")
