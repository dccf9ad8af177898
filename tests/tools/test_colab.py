"""tools/colab.py: the "Open in Colab" URL and the set-up cell every notebook runs first."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import types

import jupytext
import nbformat
import pytest

from tools import colab, project, toc
from tools.paths import ROOT

COLLAPSED = {"cellView": "form", "jupyter": {"source_hidden": True}}


def install_urls(text: str) -> list[str]:
    """Every ``git+URL`` that ``text`` installs from (the Colab cell, the README), without
    the ``@ref`` that may follow the repository."""
    return [url.split("@", 1)[0]
            for url in re.findall(r"git\+(https?://[^\s\"'`)]+)", text)]


def test_colab_url():
    url = colab.colab_url("https://github.com/org/repo", "main", "intro")
    assert url == "https://colab.research.google.com/github/org/repo/blob/main/notebooks/intro.ipynb"
    with pytest.raises(ValueError, match="github.com"):
        colab.colab_url("https://gitlab.com/org/repo", "main", "intro")


def test_colab_cell_installs_exactly_the_configured_repository():
    setup = colab.colab_cell()
    url, _ = project.repository()
    assert install_urls(setup.source) == [url]
    assert "{url}" in colab.COLAB_CELL.read_text(encoding="utf-8")  # never written out
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for installed in install_urls(readme):
        assert installed == url, "README.md installs from another repository"


def test_the_student_set_up_cell_installs_from_the_student_repository():
    """The student notebooks install flashlib's wheel from the student notebooks' repository
    at the release tag: their set-up cell names no repository with solutions."""
    cell = colab.colab_cell(student=True)
    url, _ = project.repository()
    wheel = colab.student_wheel_url()
    assert wheel.startswith(project.student_repository() + f"/raw/{colab.release_ref()}/")
    assert f'"flashlib[book] @ {wheel}"' in cell.source
    assert f"{url}@" not in cell.source and f"{url}/" not in cell.source
    ast.parse(cell.source)


def test_install_urls():
    text = ('"git+https://github.com/a/b", `pip install git+https://github.com/c/d`) '
            '"x[book] @ git+https://github.com/e/f@v1.2.0"')
    assert install_urls(text) == ["https://github.com/a/b", "https://github.com/c/d",
                                            "https://github.com/e/f"]


def test_a_pasted_setup_cell_is_found():
    chapter = next(p for p in toc.chapters() if p.stem == "online-softmax")
    nb = jupytext.read(chapter, fmt="md:myst")
    assert not colab.has_setup_cell(nb)
    nb.cells.insert(1, nbformat.v4.new_code_cell(
        'import sys\n\nif "google.colab" in sys.modules:\n    pass'))
    assert colab.has_setup_cell(nb)


def test_setup_cell_installs_the_books_release_without_upgrading_colab():
    cell = colab.colab_cell()
    url, _ = project.repository()
    version = project.version()  # pyproject.toml's (tests/tools/test_project.py)
    assert cell.source.splitlines()[0].startswith("#@title ")  # Colab's form: one line
    assert version in cell.source.splitlines()[0]
    assert dict(cell.metadata) == COLLAPSED
    spec = f"flashlib[book] @ git+{url}@v{version}"
    assert f'"{spec}"' in cell.source
    ast.parse(cell.source)
    # nothing that would upgrade or pin Colab's own packages
    for forbidden in ("-U", "--upgrade", "--force", "==", "ipywidgets", "torch", "numpy"):
        assert forbidden not in cell.source.replace(spec, ""), forbidden


def run_setup_cell(monkeypatch, *, on_colab: bool, installed: bool) -> tuple[list, str]:
    """Execute the set-up cell's code with subprocess.run recorded, on Colab or not."""
    import importlib.util
    import io

    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append((a, k)))
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if not installed:
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "flashlib" else real(name, *a))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    exec(compile(colab.colab_cell().source, "<set-up cell>", "exec"), {})
    monkeypatch.undo()
    return calls, out.getvalue()


def test_setup_cell_on_colab_runs_pip_install_once(monkeypatch):
    calls, printed = run_setup_cell(monkeypatch, on_colab=True, installed=True)
    url, _ = project.repository()
    spec = f"flashlib[book] @ git+{url}@v{project.version()}"
    assert calls == [(([sys.executable, "-m", "pip", "install", "-q", spec],), {"check": True})]
    assert printed == ""


def test_setup_cell_elsewhere_installs_nothing(monkeypatch):
    calls, printed = run_setup_cell(monkeypatch, on_colab=False, installed=True)
    assert calls == [] and printed == ""
    calls, printed = run_setup_cell(monkeypatch, on_colab=False, installed=False)
    assert calls == []
    assert printed.startswith("flashlib is not installed") and "pip install '" in printed


def test_the_student_id_cell_sets_the_id_and_prints_the_variants(capsys, monkeypatch):
    """Issue 35: the student edition's second cell takes the student's id (STUDENT_ID, or the
    environment variable when it is empty) and prints the chapter's variants."""
    from flashlib.book.exercises import variants

    cell = colab.student_cell(4)
    assert cell.metadata == colab.COLLAPSED_CODE and 'chapter="4"' in cell.source
    monkeypatch.setenv(variants.ENV, "")
    namespace: dict = {}
    exec(compile(cell.source.replace('STUDENT_ID = ""', 'STUDENT_ID = "s42"', 1),  # noqa: S102
                 "<id cell>", "exec"), namespace)
    out = capsys.readouterr().out
    assert namespace["STUDENT_ID"] == "s42" and "Student s42" in out and "Exercise 4.5" in out
    monkeypatch.setenv(variants.ENV, "s43")
    exec(compile(cell.source, "<id cell>", "exec"), namespace)  # noqa: S102
    assert namespace["STUDENT_ID"] == "s43"
