"""tools/notebooks.py: notebooks/*.ipynb and notebooks/student/*.ipynb are the clean, generated
copies of book/ (the drift check `python -m tools.notebooks check` runs here)."""

from __future__ import annotations

import pytest

from tools import convert, notebooks, toc


def test_notebooks_in_sync_with_book():
    problems = notebooks.problems()
    assert not problems, "\n".join(problems) + "\n(fix: make notebooks)"


@pytest.mark.parametrize("source", toc.chapters(), ids=lambda p: p.stem)
def test_generated_notebook_is_deterministic_and_clean(source):
    text = notebooks.notebook_text(source)
    assert notebooks.notebook_text(source) == text
    nb = convert.clean_notebook(source)
    assert nb.metadata.kernelspec.name == "python3"
    assert all(not c.get("outputs") for c in nb.cells)
    ids = [c.id for c in nb.cells]
    assert len(set(ids)) == len(ids)


def test_student_notebooks_in_sync_with_book():
    problems = notebooks.problems(student=True)
    assert not problems, "\n".join(problems) + "\n(fix: make notebooks)"
