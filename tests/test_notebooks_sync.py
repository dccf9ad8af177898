"""notebooks/*.ipynb are the clean, generated copies of book/ (scripts/notebooks.py)."""

from __future__ import annotations

from pathlib import Path

import colab_link  # scripts/ is on sys.path (tests/conftest.py)
import pytest
import yaml

import notebooks

ROOT = Path(__file__).resolve().parent.parent


def test_every_chapter_is_a_notebook_in_the_toc():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    entries = [toc["root"], *(entry["file"] for entry in toc["chapters"])]
    pages = [path.relative_to(ROOT).with_suffix("").as_posix() for path in notebooks.toc_files()]
    assert pages == entries
    chapters = [path.relative_to(ROOT).with_suffix("").as_posix() for path in notebooks.chapters()]
    assert chapters == [e for e in entries if e != "book/references"], chapters
    assert chapters[0] == "book/intro"


def test_toc_entry_without_its_file_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "intro.md").write_text("# Intro\n", encoding="utf-8")
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nchapters:\n  - file: book/missing\n",
        encoding="utf-8")
    monkeypatch.setattr(notebooks, "ROOT", tmp_path)
    with pytest.raises(ValueError, match="book/missing.md"):
        notebooks.toc_files()
    (tmp_path / "_toc.yml").write_text(  # a book with parts is read too
        "format: jb-book\nroot: book/intro\nparts:\n  - chapters:\n    - file: book/intro\n",
        encoding="utf-8")
    assert notebooks.toc_files() == [tmp_path / "book" / "intro.md"] * 2


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
    assert f"git+{notebooks.repository()[0]}" in setup.source


def test_colab_url():
    url = colab_link.colab_url("https://github.com/org/repo", "main", "intro")
    assert url == "https://colab.research.google.com/github/org/repo/blob/main/notebooks/intro.ipynb"
    with pytest.raises(ValueError, match="github.com"):
        colab_link.colab_url("https://gitlab.com/org/repo", "main", "intro")


def test_colab_cell_installs_exactly_the_configured_repository():
    setup = notebooks.colab_cell()
    url, _ = notebooks.repository()
    assert notebooks.install_urls(setup.source) == [url]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for installed in notebooks.install_urls(readme):
        assert installed == url, "README.md installs from another repository"


def test_repository_is_the_configured_one():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    assert notebooks.repository() == (config["url"], config["branch"])
    assert colab_link.repository is notebooks.repository
    assert colab_link.is_notebook is notebooks.is_notebook


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
