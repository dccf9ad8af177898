"""tools/colab_check.py's checks of an executed notebook, on outputs made up here (the real
run, in fresh venvs, is in .ci/run): they pass for what a good run prints and fail for
placeholders, errors and widgets that do not display."""

from __future__ import annotations

import ast
import copy
import sys
from pathlib import Path

import nbformat
import pytest

from tools import colab_check, convert, toc

LADDER = next(s for s in toc.chapters() if s.stem == "optimisation-ladder")
VIEW = {"version_major": 2, "version_minor": 0, "model_id": "abc"}


def executed(source, *, numbers: bool = True, torch: bool = True):
    """The generated notebook with the outputs a good run gives: each numbers cell prints the
    names it was asked for, each widget cell shows a widget view."""
    nb = convert.clean_notebook(source)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if "print_glued(" in cell.source and numbers:
            call = ast.parse(cell.source).body[-1].value
            text = "".join(f"{arg.value.split(':')[0]} = 1.0\n" for arg in call.args)
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        if "interactive_figure(" in cell.source:
            cell.outputs = [nbformat.v4.new_output(
                "display_data", data={"text/plain": "<figure>", colab_check.WIDGET_VIEW: VIEW})]
        if "HAVE_TORCH = " in cell.source and not torch:
            cell.outputs = [nbformat.v4.new_output(
                "stream", name="stdout", text="torch is not installed: ...\n")]
    return nb


def test_a_good_run_passes():
    assert colab_check.check_outputs("t", LADDER, executed(LADDER), torch=True) == []
    assert colab_check.check_outputs("t", LADDER, executed(LADDER, torch=False),
                                     torch=False) == []


def test_placeholders_fail():
    problems = colab_check.check_outputs("t", LADDER, executed(LADDER, numbers=False),
                                         torch=True)
    assert problems and all("not printed by a cell before it" in p for p in problems)
    cited = convert.glue_citations(LADDER)
    assert len(problems) == len(cited)


def test_a_missing_number_fails():
    nb = executed(LADDER)
    numbers = next(c for c in nb.cells if "print_glued(" in c.source)
    numbers.outputs[0].text = numbers.outputs[0].text.split("\n", 1)[1]  # first line gone
    problems = colab_check.check_outputs("t", LADDER, nb, torch=True)
    assert len(problems) == 1 and "not printed" in problems[0]


@pytest.mark.parametrize("bad", ["error", "stderr", "traceback", "no widget", "no torch note"])
def test_errors_and_missing_widgets_fail(bad):
    nb = executed(LADDER, torch=bad != "no torch note")
    code = [c for c in nb.cells if c.cell_type == "code" and "print_glued" not in c.source]
    widget = next(c for c in code if "interactive_figure(" in c.source)
    if bad == "error":
        code[3].outputs.append(nbformat.v4.new_output(
            "error", ename="AttributeError", evalue="no _repr_mimebundle_", traceback=[]))
    elif bad == "stderr":
        code[3].outputs.append(nbformat.v4.new_output("stream", name="stderr", text="oops\n"))
    elif bad == "traceback":
        code[3].outputs.append(nbformat.v4.new_output(
            "stream", name="stdout", text="Traceback (most recent call last):\nKeyError: 1\n"))
    elif bad == "no widget":
        widget.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "x"},
                                                 execution_count=1)]
    else:
        for cell in code:
            cell.outputs = [o for o in cell.outputs if "torch" not in o.get("text", "")]
    problems = colab_check.check_outputs("t", LADDER, copy.deepcopy(nb),
                                         torch=bad != "no torch note")
    assert len(problems) == 1, problems


def test_colab_environment_is_colabs():
    packages = dict(p.split("==") for p in colab_check.ENVS["colab"])
    assert packages["ipywidgets"] == "7.7.1" and packages["torch"] == "2.13.0"
    assert "torch" not in dict(p.split("==") for p in colab_check.ENVS["colab-no-torch"])


def test_widget_tests_exist():
    assert colab_check.WIDGET_TESTS.is_file()  # the file moved once, and this went unnoticed


@pytest.mark.slow
def test_widget_tests_run_outside_the_checkout(tmp_path):
    """The widget tests that each Colab venv runs pass as a copy outside the checkout (here
    in this venv: the mechanics, not Colab's versions)."""
    assert colab_check.widget_tests("this-venv", Path(sys.executable), tmp_path) == []
    assert (tmp_path / colab_check.WIDGET_TESTS.name).is_file()
