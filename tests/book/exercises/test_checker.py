"""The one checker idiom (flashlib.book.exercises): every checker of every chapter is built by
``@checker``, reports a learner that has not attempted the exercise, raised, returned the wrong
kind of thing or warned, and never raises because of the learner's code."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings

import pytest

from flashlib.book import exercises
from flashlib.book.exercises import (
    CHAPTERS,
    NOT_ATTEMPTED,
    Feedback,
    LearnerError,
    NotAttempted,
    call_learner,
    checker,
)

CHAPTER_MODULES = [importlib.import_module(f"flashlib.book.exercises.{name}")
                   for name in CHAPTERS]
#: The framework's modules, one concern each (flashlib.book.exercises' docstring).
FRAMEWORK = ["feedback", "grader_adapter", "learner", "memory", "mistakes", "refusal",
             "registry", "variants"]


def all_checkers():
    return [(module.__name__.rsplit(".", 1)[1], name, getattr(module, name))
            for module in CHAPTER_MODULES for name in module.__all__
            if name.startswith("check_")]


def test_one_module_per_chapter():
    assert sorted(CHAPTERS) == [
        "backward", "beyond", "gpu", "intro", "io_model", "ladder", "masking", "online_softmax",
        "overflow", "precision", "tiling"]
    found = sorted(m.name for m in pkgutil.iter_modules(exercises.__path__))
    assert found == sorted([*CHAPTERS, *FRAMEWORK]), found
    package = importlib.import_module("flashlib.book.exercises.mistakes")
    mistakes = sorted(m.name for m in pkgutil.iter_modules(package.__path__))
    assert set(mistakes) <= set(CHAPTERS), mistakes


@pytest.mark.parametrize(("module", "name", "check"), all_checkers(),
                         ids=[f"{m}.{n}" for m, n, _ in all_checkers()])
def test_every_checker_uses_the_idiom(module, name, check):
    assert inspect.unwrap(check) is not check, f"{module}.{name} is not built by @checker"
    params = list(inspect.signature(check).parameters)
    assert params and params[0] != "fb", params  # help() shows the learner's arguments only
    assert check.__doc__


@pytest.mark.parametrize(("module", "name", "check"), all_checkers(),
                         ids=[f"{m}.{n}" for m, n, _ in all_checkers()])
def test_every_checker_reports_not_attempted_and_errors(module, name, check):
    if name == "check_merge_counterexample":  # takes two states, not a function
        fb = check("a", "b")
        assert not fb.passed and "pass two states" in str(fb)
        return

    def todo(*args):
        raise NotImplementedError

    def crashes(*args):
        raise IndexError("boom")

    fb = check(todo)
    assert not fb.passed and fb.problems == [NOT_ATTEMPTED], str(fb)
    fb = check(crashes)
    assert not fb.passed and "your function raised IndexError: boom" in str(fb), str(fb)
    fb = check(lambda *args: None)  # the wrong kind of result: reported, never raised
    assert not fb.passed and "NOT YET" in str(fb)


def test_call_learner():
    def warns(x):
        warnings.warn("careful", UserWarning, stacklevel=1)
        return x + 1

    assert call_learner(warns, 1) == (2, ["UserWarning: careful"])
    with pytest.raises(NotAttempted):
        call_learner(lambda: (_ for _ in ()).throw(NotImplementedError()))
    with pytest.raises(LearnerError, match="your function raised ZeroDivisionError"):
        call_learner(lambda: 1 / 0)


def test_checker_cases_and_stopping():
    @checker("demo")
    def check_demo(fb: Feedback, fn, stop_at: int = 99) -> None:
        """A demo."""
        for i in range(3):
            with fb.case(f"case {i}", hint="(a hint)") as case:
                got, _ = call_learner(fn, i)
                if got == i:
                    fb.ok(f"case {i}: right")
                else:
                    fb.fail(f"case {i}: wrong")
            if case.failed and i >= stop_at:
                return
        raise LearnerError("outside any case")

    fb = check_demo(lambda i: i if i != 1 else 1 / i / 0)
    assert fb.problems == ["case 1: your function raised ZeroDivisionError: float division by "
                           "zero (a hint)", "outside any case"]
    assert fb.passes == ["case 0: right", "case 2: right"] and not fb
    assert len(check_demo(lambda i: 1 / 0, stop_at=0).problems) == 1
    assert list(inspect.signature(check_demo).parameters) == ["fn", "stop_at"]
    assert check_demo.__name__ == "check_demo" and check_demo.__doc__ == "A demo."

    def gives_up_later(i):
        if i == 2:
            raise NotImplementedError
        return i

    fb = check_demo(gives_up_later)
    assert fb.problems == [NOT_ATTEMPTED] and fb.passes == []
    assert "NOT YET demo" in repr(fb)


def test_feedback_text():
    fb = Feedback("x")
    assert not fb  # no checks at all is not a pass
    fb.ok("fine")
    assert fb and repr(fb) == "PASSED x: all 1 checks passed.\n  ok fine"
    fb.fail("bad")
    assert fb.messages == ["bad", "fine"] and str(fb).startswith("NOT YET x:")


def test_a_verdict_shows_wherever_the_call_is_in_its_cell(capsys, monkeypatch):
    """In a kernel the checker displays its Feedback itself: followed by another line, the
    call still shows its verdict; as the cell's last line it shows once, not twice; the
    Feedback shown again in a later cell shows again. On the website it is the neutral line."""
    from IPython.core.interactiveshell import InteractiveShell

    from flashlib.book import site

    monkeypatch.delenv(site.STATIC_ENV, raising=False)
    shell = InteractiveShell.instance()
    try:
        shell.run_cell("from flashlib.book.exercises.intro import check_attention_flops\n"
                       "flops = lambda n_q, n_k, d, d_v: 2 * n_q * n_k * d\n")
        capsys.readouterr()

        def shown(source: str) -> str:
            shell.run_cell(source, store_history=True)
            return capsys.readouterr().out

        assert shown("fb = check_attention_flops(flops)\nx = 1").count("NOT YET") == 1
        assert shown("check_attention_flops(flops)").count("NOT YET") == 1
        assert shown("fb").count("NOT YET") == 1  # a later cell: shown again
        assert shown("check_attention_flops(flops)\nprint('done')").count("NOT YET") == 1
        monkeypatch.setenv(site.STATIC_ENV, "1")
        out = shown("check_attention_flops(flops)\nx = 2")
        assert "Run this cell in Jupyter" in out and "NOT YET" not in out
    finally:
        InteractiveShell.clear_instance()
