"""notebooks/*.ipynb are the clean, generated copies of book/ (scripts/notebooks.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


notebooks = load("notebooks")


def test_every_chapter_is_a_notebook_in_the_toc():
    names = [path.stem for path in notebooks.chapters()]
    assert "intro" in names, names


def test_notebooks_in_sync_with_book():
    problems = notebooks.problems()
    assert not problems, "\n".join(problems) + "\n(fix: make notebooks)"


@pytest.mark.parametrize("source", notebooks.chapters(), ids=lambda p: p.stem)
def test_generated_notebook_is_deterministic_and_clean(source):
    text = notebooks.notebook_text(source)
    assert notebooks.notebook_text(source) == text
    nb = notebooks.clean_notebook(source)
    assert nb.metadata.kernelspec.name == "python3"
    assert all(not c.get("outputs") for c in nb.cells)
    ids = [c.id for c in nb.cells]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("source", notebooks.chapters(), ids=lambda p: p.stem)
def test_colab_setup_cell_installs_only_on_colab(source):
    setup = notebooks.colab_cell()
    nb = notebooks.clean_notebook(source)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert cells and cells[0].source == setup.source, "the set-up cell must be the first code cell"
    assert cells[0].metadata["tags"] == ["remove-cell"]
    assert 'if "google.colab" in sys.modules' in setup.source
    assert f"git+{notebooks.repository_url()}" in setup.source


def test_colab_url():
    colab_link = load("colab_link")
    url = colab_link.colab_url("https://github.com/org/repo", "main", "intro")
    assert url == "https://colab.research.google.com/github/org/repo/blob/main/notebooks/intro.ipynb"
    with pytest.raises(ValueError, match="github.com"):
        colab_link.colab_url("https://gitlab.com/org/repo", "main", "intro")


def test_colab_cell_installs_exactly_the_configured_repository():
    setup = notebooks.colab_cell()
    assert notebooks.install_urls(setup.source) == [notebooks.repository_url()]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for url in notebooks.install_urls(readme):
        assert url == notebooks.repository_url(), "README.md installs from another repository"


def test_install_urls():
    text = '"git+https://github.com/a/b", `pip install git+https://github.com/c/d`)'
    assert notebooks.install_urls(text) == ["https://github.com/a/b", "https://github.com/c/d"]


@pytest.mark.parametrize("source", notebooks.chapters(), ids=lambda p: p.stem)
def test_notebooks_run_without_myst_nb(source):
    """Colab has no myst-nb: chapters glue through flashlib.book.glue."""
    nb = notebooks.clean_notebook(source)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert "myst_nb" not in cell.source, (
                f"{source.name}: use `from flashlib.book import glue`"
            )
