"""notebooks/*.ipynb are the clean, generated copies of book/ (tools/notebooks.py)."""

from __future__ import annotations

import pytest
import yaml

from tools import book_extension, notebooks
from tools.paths import ROOT


def test_every_chapter_is_a_notebook_in_the_toc():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    entries = [toc["root"],
               *(entry["file"] for part in toc["parts"] for entry in part["chapters"])]
    pages = [path.relative_to(ROOT).with_suffix("").as_posix() for path in notebooks.toc_files()]
    assert pages == entries
    chapters = [path.relative_to(ROOT).with_suffix("").as_posix() for path in notebooks.chapters()]
    plain = {"book/references", "book/instructor", "book/pitfalls", "book/faq"}  # no code
    assert chapters == [e for e in entries if e not in plain], chapters
    assert chapters[0] == "book/intro" and chapters[-1] == "book/glossary"
    assert [notebooks.chapter_number(p) for p in notebooks.chapters()] == list(
        range(1, len(chapters) + 1))
    assert notebooks.chapter_number(ROOT / "book" / "references.md") is None


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


def test_colab_url():
    url = book_extension.colab_url("https://github.com/org/repo", "main", "intro")
    assert url == "https://colab.research.google.com/github/org/repo/blob/main/notebooks/intro.ipynb"
    with pytest.raises(ValueError, match="github.com"):
        book_extension.colab_url("https://gitlab.com/org/repo", "main", "intro")


def test_colab_cell_installs_exactly_the_configured_repository():
    setup = notebooks.colab_cell()
    url, _ = notebooks.repository()
    assert notebooks.install_urls(setup.source) == [url]
    assert "{url}" in notebooks.COLAB_CELL.read_text(encoding="utf-8")  # never written out
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for installed in notebooks.install_urls(readme):
        assert installed == url, "README.md installs from another repository"


def test_repository_is_the_configured_one():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    assert notebooks.repository() == (config["url"], config["branch"])
    assert book_extension.repository is notebooks.repository
    assert book_extension.is_notebook is notebooks.is_notebook


def test_install_urls():
    text = ('"git+https://github.com/a/b", `pip install git+https://github.com/c/d`) '
            '"x[book] @ git+https://github.com/e/f@v1.2.0"')
    assert notebooks.install_urls(text) == ["https://github.com/a/b", "https://github.com/c/d",
                                            "https://github.com/e/f"]


def test_a_pasted_setup_cell_is_found():
    chapter = next(p for p in notebooks.chapters() if p.stem == "online-softmax")
    nb = notebooks.jupytext.read(chapter, fmt="md:myst")
    assert not notebooks.has_setup_cell(nb)
    nb.cells.insert(1, notebooks.nbformat.v4.new_code_cell(
        'import sys\n\nif "google.colab" in sys.modules:\n    pass'))
    assert notebooks.has_setup_cell(nb)
