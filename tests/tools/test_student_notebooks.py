"""No link a student is given reaches a solution (issue 35): the student edition's Colab links,
links between notebooks and set-up cells point at the student notebooks' repository
(``<repository>-student``, tools/student_notebooks.py), never at the reader's repository, and
that repository, built here as `make student-notebooks` builds it, holds no solution.

A link to the reader's repository, edited by hand ("drop student/ from the link"), opens
notebooks with every solution; a link into the student repository, edited, reaches only
student notebooks and the library's wheel.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import nbformat
import pytest

from tests.tools.test_student_edition import (
    CHAPTERS,
    STUDENT_SITE,
    notebook_text,
    runs,
    solution_runs,
)
from tools import colab, notebooks, project, student_notebooks

READER = project.repository()[0].rstrip("/").removesuffix(".git")
STUDENT = project.student_repository()
OWNER_REPO = READER.removeprefix("https://github.com/")
OWNER = OWNER_REPO.split("/")[0] + "/"  # the book's organisation: its repositories' links
#: Every way a URL can name the reader's repository: GitHub, Colab, raw files, pip's git+.
READER_FORMS = (f"github.com/{OWNER_REPO}/", f"github.com/{OWNER_REPO}@",
                f"github.com/{OWNER_REPO}.git", f"github/{OWNER_REPO}/",
                f"githubusercontent.com/{OWNER_REPO}/", f"github.com/{OWNER_REPO}\"",
                f"github.com/{OWNER_REPO}#")


def reader_links(text: str) -> list[str]:
    """The URLs in ``text`` that name the reader's repository (not the student one)."""
    urls = re.findall(r"""https?://[^\s"'<>)\]]+""", html.unescape(text))
    return [u for u in urls if any(form in u + '"' for form in READER_FORMS)
            or u.rstrip("/") == READER]


def student_links(text: str) -> list[str]:
    urls = re.findall(r"""https?://[^\s"'<>)\]]+""", html.unescape(text))
    return [u for u in urls if OWNER_REPO + project.STUDENT_SUFFIX in u]


def test_the_student_repository_is_not_the_readers():
    assert STUDENT != READER and STUDENT.startswith("https://github.com/")
    assert not reader_links(colab.colab_link("intro", student=True))
    assert reader_links(colab.colab_link("intro"))  # the check would see a reader's link


@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_the_student_notebooks_link_only_to_the_student_repository(source):
    """Colab links between notebooks and the set-up cell's install: the student repository at
    the release tag; nothing names the reader's repository."""
    text = notebook_text(notebooks.target(source, student=True))
    assert reader_links(text) == []
    prefix = f"{colab.COLAB}/{OWNER_REPO}{project.STUDENT_SUFFIX}/blob/{colab.release_ref()}/"
    wheel = colab.student_wheel_url()
    for url in student_links(text):
        assert url.startswith(prefix) or url == wheel, url
    nb = nbformat.read(notebooks.target(source, student=True), as_version=4)
    if any(c.cell_type == "code" for c in nb.cells):
        assert wheel in text
    raw = notebooks.target(source, student=True).read_text(encoding="utf-8")
    assert reader_links(raw.replace("\\", " ")) == []  # nor in any metadata


@pytest.mark.site
@pytest.mark.student_site
def test_no_link_of_the_student_site_reaches_a_solution():
    """Every link of every file the student site writes (pages, search index, scripts of its
    own): none names the reader's repository; every Colab link, GitHub link or notebook
    download goes to the student repository at the release tag; no download of a page's
    source or notebook is shipped."""
    assert (STUDENT_SITE / "book" / "intro.html").is_file(), "run `make book-student`"
    prefix = f"{colab.COLAB}/{OWNER_REPO}{project.STUDENT_SUFFIX}/blob/{colab.release_ref()}/"
    colab_links = 0
    for path in STUDENT_SITE.rglob("*"):
        if not path.is_file() or path.suffix not in (".html", ".js", ".json", ".txt"):
            continue
        if "_static" in path.relative_to(STUDENT_SITE).parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        assert reader_links(text) == [], path
        for url in re.findall(r"""https?://[^\s"'<>)\]]+""", html.unescape(text)):
            if "colab.research.google.com" in url:
                assert url.startswith(prefix), (path, url)
                colab_links += 1
            if url.split("#")[0].endswith((".ipynb", ".md", ".py")) and OWNER in url:
                assert url.startswith(prefix) or url.startswith(STUDENT), (path, url)
        for href in re.findall(r'(?:href|src)="([^"]+)"', text):
            local = href.split("#")[0].split("?")[0]
            if not local.startswith(("http:", "https:", "mailto:", "data:")):
                assert not local.endswith((".ipynb", ".md")), (path, href)
                assert "_sources" not in local, (path, href)
    assert colab_links >= len(CHAPTERS)
    shipped = [p for p in (*STUDENT_SITE.rglob("*.ipynb"), *STUDENT_SITE.rglob("*.md"))
               if "_static" not in p.relative_to(STUDENT_SITE).parts]  # not the vendored JS's
    assert shipped == []


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return student_notebooks.build(tmp_path_factory.mktemp("student-notebooks"))


@pytest.mark.slow  # builds flashlib's wheel with pip
def test_the_student_repository_holds_the_student_notebooks_and_the_wheel_only(built):
    assert student_notebooks.problems(built) == []
    names = sorted(p.name for p in built.glob("*.ipynb"))
    assert names == sorted(p.name for p in notebooks.STUDENT_NOTEBOOKS.glob("*.ipynb"))
    assert (built / "wheels" / colab.wheel_name()).is_file()


@pytest.mark.slow
@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_the_student_repository_holds_no_solution(built, source):
    text = notebook_text(built / f"{source.stem}.ipynb")
    assert "Solution to Exercise" not in text and "<summary>Solution" not in text
    found = runs(text)
    for i, unique in enumerate(solution_runs(source), 1):
        assert not unique & found, f"solution {i} of {source.name} in the student repository"


@pytest.mark.slow
def test_a_file_of_the_readers_repository_is_refused(built):
    """The check of the built repository sees a stray file and a link to the reader's."""
    (built / "stray.md").write_text("x", encoding="utf-8")
    intro = built / "intro.ipynb"
    original = intro.read_text(encoding="utf-8")
    intro.write_text(original.replace(colab.student_wheel_url(), f"git+{READER}@v1"),
                     encoding="utf-8")
    try:
        found = student_notebooks.problems(built)
    finally:
        intro.write_text(original, encoding="utf-8")
        (built / "stray.md").unlink()
    assert any("stray.md" in p for p in found)
    assert any("intro.ipynb: names the reader's repository" in p for p in found)
