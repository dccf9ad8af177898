"""The student edition: the site of `make book-student` (_build/student/_build/html) and
notebooks/student/*.ipynb hold no solution, and still hold every exercise and checker call.

A solution's text is taken from the chapter's source (between ``{solution-start}`` and
``{solution-end}``, or a ``{solution}`` block) and compared as runs of 6 words, so that markup
(HTML tags, MathJax, backticks, notebook rewriting) does not matter; a run that the book also
shows outside solutions (any page, or flashlib's code that pages include) is not solution
text. The same runs are found in `make
book`'s site and in notebooks/, which shows the comparison would see a leak.
"""

from __future__ import annotations

import html
import re
from functools import cache
from pathlib import Path

import nbformat
import pytest

from tools import colab, convert, notebooks, project, toc
from tools.paths import ROOT

FULL_SITE = ROOT / "_build" / "html"
STUDENT_SITE = ROOT / "_build" / "student" / "_build" / "html"
CHAPTERS = toc.chapters()
RUN = 6  # words per compared run
SOLUTION = re.compile(
    r"^```\{solution-start\}[^\n]*\n(?P<gated>.*?)^```\{solution-end\}"
    r"|^(?P<fence>`{3,}|:{3,})\{solution\}[^\n]*\n(?P<block>.*?)^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL)
CHECKER_CALL = re.compile(r"^(check_\w+\(.*\))\s*$", re.MULTILINE)


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def runs(text: str) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + RUN]) for i in range(len(w) - RUN + 1)}


def html_text(text: str) -> str:
    text = re.sub(r"<[^>]+>", " ", text)
    return html.unescape(text)


@cache
def site_runs(site: Path) -> set[tuple[str, ...]]:
    """Every run of words in every text file that a built site writes (not _static/, the
    theme's and the vendored files)."""
    found: set[tuple[str, ...]] = set()
    for path in site.rglob("*"):
        if (path.suffix in (".html", ".js", ".json", ".txt", ".md", ".ipynb") and path.is_file()
                and "_static" not in path.relative_to(site).parts):
            text = path.read_text(encoding="utf-8", errors="replace")
            found |= runs(html_text(text) if path.suffix == ".html" else text)
    return frozenset(found)


def notebook_text(path: Path) -> str:
    return "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)


def solutions(source: Path) -> tuple[list[str], str]:
    """The chapter's solutions (their source text) and the chapter without them."""
    text = source.read_text(encoding="utf-8")
    found = [m["gated"] if m["gated"] is not None else m["block"]
             for m in SOLUTION.finditer(text)]
    return found, SOLUTION.sub("", text)


@cache
def elsewhere() -> frozenset[tuple[str, ...]]:
    """The runs of words that the book shows outside solutions: every page without its
    solutions, and flashlib's code (which pages show with literalinclude)."""
    found: set[tuple[str, ...]] = set()
    for page in toc.toc_files():
        found |= runs(solutions(page)[1])
    for path in (ROOT / "flashlib").rglob("*.py"):
        found |= runs(path.read_text(encoding="utf-8"))
    return frozenset(found)


def solution_runs(source: Path) -> list[set[tuple[str, ...]]]:
    """Per solution, its runs of words that the book has nowhere else."""
    return [runs(text) - elsewhere() for text in solutions(source)[0]]


@pytest.mark.site
@pytest.mark.student_site
def test_student_site_was_built():
    assert (STUDENT_SITE / "book" / "intro.html").is_file(), "run `make book-student`"
    assert (FULL_SITE / "book" / "intro.html").is_file(), "run `make book`"


@pytest.mark.site
@pytest.mark.student_site
@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_no_solution_text_in_the_student_site(source):
    per_solution = solution_runs(source)
    full, student = site_runs(FULL_SITE), site_runs(STUDENT_SITE)
    for i, unique in enumerate(per_solution, 1):
        assert unique, f"solution {i} of {source.name} has no text of its own"
        assert unique & full, f"solution {i} of {source.name} not found in the full site"
        leaked = unique & student
        assert not leaked, f"solution {i} of {source.name} in the student site: {leaked}"
    page = (STUDENT_SITE / "book" / f"{source.stem}.html").read_text(encoding="utf-8")
    assert "Solution to" not in page and "solution-content" not in page
    if per_solution:
        full_page = (FULL_SITE / "book" / f"{source.stem}.html").read_text(encoding="utf-8")
        assert "Solution to" in full_page


@pytest.mark.site
@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_no_solution_text_in_the_student_notebooks(source):
    student = runs(notebook_text(notebooks.target(source, student=True)))
    full = runs(notebook_text(notebooks.target(source)))
    for i, unique in enumerate(solution_runs(source), 1):
        assert unique & full, f"solution {i} of {source.name} not found in notebooks/"
        leaked = unique & student
        assert not leaked, f"solution {i} of {source.name} in notebooks/student/: {leaked}"
    text = notebook_text(notebooks.target(source, student=True))
    assert "Solution to Exercise" not in text and "<summary>Solution" not in text


@pytest.mark.site
@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_exercises_and_checker_calls_remain(source):
    text = source.read_text(encoding="utf-8")
    n_exercises = len(re.findall(r"^:::\{exercise\}", text, re.MULTILINE))
    _, rest = solutions(source)
    calls = CHECKER_CALL.findall(rest)  # the checker calls of the exercise cells
    assert len(calls) >= n_exercises
    student_nb = notebook_text(notebooks.target(source, student=True))
    student_page = (STUDENT_SITE / "book" / f"{source.stem}.html").read_text(encoding="utf-8")
    full_page = (FULL_SITE / "book" / f"{source.stem}.html").read_text(encoding="utf-8")
    assert student_page.count('class="exercise') == full_page.count('class="exercise')
    assert student_page.count('class="exercise') >= n_exercises
    assert len(convert.exercise_numbers(student_nb)) == n_exercises
    page_words = " ".join(words(html_text(student_page)))
    for call in calls:
        assert call in student_nb
        assert " ".join(words(call)) in page_words, call


@pytest.mark.site
@pytest.mark.student_site
def test_no_solution_title_in_any_file_of_the_student_site():
    """Not in a page, the search index or anything else the build writes."""
    assert "Solution to" in (FULL_SITE / "searchindex.js").read_text(encoding="utf-8")
    for path in STUDENT_SITE.rglob("*"):
        if path.is_file() and "_static" not in path.relative_to(STUDENT_SITE).parts:
            text = path.read_text(encoding="utf-8", errors="replace")
            assert "Solution to" not in text, path


@pytest.mark.site
@pytest.mark.student_site
def test_student_site_links_to_student_notebooks_and_ships_no_sources():
    assert not (STUDENT_SITE / "_sources").exists()
    for source in CHAPTERS:
        page = (STUDENT_SITE / "book" / f"{source.stem}.html").read_text(encoding="utf-8")
        assert colab.colab_link(source.stem, student=True) in page
        assert notebooks.target(source, student=True).is_file()
        assert "_sources" not in page
        assert "(student edition)" in page


def _as_readers(text: str) -> str:
    """A student notebook's text with its links and set-up cell as the reader's notebook
    has them (the student's point at the student notebooks' repository)."""
    url = project.repository()[0]
    student = colab.colab_link("NAME", student=True).removesuffix("NAME.ipynb")
    reader = colab.colab_link("NAME").removesuffix("NAME.ipynb")
    return text.replace(student, reader).replace(
        colab.student_wheel_url(), f"git+{url}@v{project.version()}")


def test_student_notebook_equals_full_one_without_its_solutions():
    """Removing the solutions keeps every other cell: the full notebook's cells minus the
    solution cells, the "Numbers in the solution" cells and the <details> are the student's,
    beside the student's id cell (its exercises' variants) after the set-up cell."""
    for source in CHAPTERS:
        full = convert.clean_notebook(source)
        kept = []
        for cell in full.cells:
            body = re.sub(r"<details>\n<summary>Solution.*?</details>", "", cell.source,
                          flags=re.DOTALL).strip()
            if cell.source.startswith(("#@title Solution", "#@title Numbers in the solution")):
                continue
            if body:
                kept.append((cell.cell_type, body))
        student = [(c.cell_type, _as_readers(c.source.strip()))  # its links, its set-up
                   for c in convert.clean_notebook(source, student=True).cells
                   if not c.source.startswith("#@title Your student id")]  # its id cell
        assert student == kept, source.name
        ids = [c for c in convert.clean_notebook(source, student=True).cells
               if c.source.startswith("#@title Your student id")]
        if any(c.cell_type == "code" for c in full.cells) and convert.exercise_numbers(
                "\n".join(c.source for c in full.cells if c.cell_type == "markdown")):
            assert len(ids) == 1 and "STUDENT_ID" in ids[0].source, source.name


@pytest.mark.site
@pytest.mark.student_site
def test_student_site_has_no_instructor_page():
    """The guide (with its checker table and sample report: the accepted answers) is only in
    the teachers' edition; the students' page that states the grading rules is in both."""
    from tools.student_edition import INSTRUCTOR_PAGES

    for page in INSTRUCTOR_PAGES:
        assert (FULL_SITE / f"{page}.html").is_file(), page
        assert not (STUDENT_SITE / f"{page}.html").exists(), page
    assert (STUDENT_SITE / "book" / "grading.html").is_file()
    for path in STUDENT_SITE.rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        assert "instructor.html" not in text, path
        assert "Instructor guide" not in text, path
    assert "Instructor guide" not in (STUDENT_SITE / "searchindex.js").read_text(
        encoding="utf-8")


@pytest.mark.site
@pytest.mark.student_site
def test_student_site_links_to_no_source_and_opens_colab_at_the_release():
    """No repository button or link to the sources (they hold every solution); the only
    links naming a repository of the book are Colab's, to the student notebooks'
    repository at the release tag that their set-up cell installs
    (tests/tools/test_student_notebooks.py checks every link of the site)."""
    url, _ = project.repository()
    repo = url.removeprefix("https://github.com/")
    assert 'class="btn btn-sm btn-source-repository-button' not in (
        STUDENT_SITE / "book" / "intro.html").read_text(encoding="utf-8")
    for path in STUDENT_SITE.rglob("*.html"):
        if "_static" in path.relative_to(STUDENT_SITE).parts:
            continue
        for href in re.findall(r'href="([^"]+)"', path.read_text(encoding="utf-8")):
            if repo not in href:
                continue
            name = Path(href).stem
            assert href == colab.colab_link(name, student=True), (path, href)
    full = (FULL_SITE / "book" / "intro.html").read_text(encoding="utf-8")
    assert f"github.com/{repo}" in full  # the reader's edition keeps its repository button


@pytest.mark.parametrize("folder", ["notebooks", "notebooks/student"])
def test_links_between_notebooks_work_on_colab(folder):
    """Relative links do not work on Colab: every link to another notebook is an absolute
    Colab link to the same edition at the release tag."""
    student = folder.endswith("student")
    for source in CHAPTERS:
        nb = nbformat.read(ROOT / folder / f"{source.stem}.ipynb", as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "markdown":
                continue
            for target in re.findall(r"\]\(([^)\s]+)\)", cell.source):
                if ".ipynb" not in target:
                    continue
                name = target.split("#")[0].rsplit("/", 1)[-1].removesuffix(".ipynb")
                assert target.split("#")[0] == colab.colab_link(name, student), (
                    source.name, target)
