"""What a reader of the generated notebooks (Jupyter, Colab) sees: the collapsed set-up cell,
the glued numbers printed before the text that cites them, solutions collapsed.

The numbers are also checked by running the notebooks: tools/colab_check.py (.ci/run) fails
when a markdown cell cites a glued name that no code cell before it printed as ``name = value``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jupytext
import nbformat
import pytest
from markdown_it import MarkdownIt

from flashlib import book
from tools import convert, notebooks, toc
from tools.colab import colab_cell

CHAPTERS = toc.chapters()
COLLAPSED = {"cellView": "form", "jupyter": {"source_hidden": True}}


def generated(source: Path):
    return convert.clean_notebook(source)


# the Colab set-up cell -------------------------------------------------------------------------

@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_setup_cell_follows_the_title(source):
    nb = generated(source)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    if not any(c.cell_type == "code" for c in jupytext.read(source).cells):
        # a page without code (the glossary) has nothing to install
        assert not any(c.cell_type == "code" for c in nb.cells)
        return
    assert nb.cells[1].source == colab_cell().source
    assert dict(nb.cells[1].metadata) == COLLAPSED
    assert [c for c in nb.cells if c.cell_type == "code"][0] is nb.cells[1]
    assert "google.colab" not in source.read_text(encoding="utf-8")  # not on the website


# glued numbers ----------------------------------------------------------------------------------

def printed_names(cell) -> list[str]:
    """The glue names a generated numbers cell prints (its print_glued arguments)."""
    call = next(node for node in ast.walk(ast.parse(cell.source))
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print_glued")
    return [arg.value.split(":", 1)[0] for arg in call.args]


@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_each_text_citing_numbers_follows_a_cell_printing_them(source):
    nb = generated(source)
    cited = convert.glue_citations(source)
    text = source.read_text(encoding="utf-8")
    assert cited or "{glue" not in text
    roles = set(re.findall(r"\{glue(?::\w+)?\}`([^`:]+)", text))
    assert {name for names in cited.values() for name in names} == roles
    for i, cell in enumerate(nb.cells):
        if cell.id not in cited:
            assert "print_glued" not in cell.source or nb.cells[i + 1].id in cited
            continue
        numbers = nb.cells[i - 1]
        assert numbers.cell_type == "code" and numbers.source.startswith("#@title Numbers in")
        assert printed_names(numbers) == cited[cell.id], cell.id
        assert numbers.metadata["cellView"] == "form"
        assert numbers.metadata["jupyter"]["source_hidden"] is True
        for name in cited[cell.id]:
            assert f"`{name}`" in cell.source  # the placeholder the printed line explains


def test_print_glued_formats_as_the_text_does(capsys):
    from IPython.display import Markdown

    book.glue("test_pg_ratio", 3.14159, display=False)
    book.glue("test_pg_count", 7, display=False)
    book.glue("test_pg_md", Markdown("rung 7 *wins*"), display=False)
    book.print_glued("test_pg_ratio:.2f", "test_pg_count", "test_pg_md", "test_pg_missing")
    assert capsys.readouterr().out.splitlines() == [
        "test_pg_ratio = 3.14",
        "test_pg_count = 7",
        "test_pg_md = rung 7 *wins*",
        "test_pg_missing: not computed yet (run the cells above first)",
    ]


# solutions -------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_solutions_start_collapsed(source):
    nb = generated(source)
    text = source.read_text(encoding="utf-8")
    n_solutions = len(re.findall(r"^```\{solution(?:-start)?\}", text, re.MULTILINE))
    md = MarkdownIt("commonmark")
    summaries = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            assert cell.source.count("<details>") == cell.source.count("</details>")
            html = md.render(cell.source)
            # nothing of a solution outside its <details>: no heading, no loose summary
            outside = re.sub(r"<details>.*?</details>", "", html, flags=re.S)
            assert "Solution" not in outside, outside[:300]
            for body in re.findall(r"<details>(.*?)</details>", html, flags=re.S):
                assert body.lstrip().startswith("<summary>")  # a solution or a deep dive
                assert "<p>" in body or "<pre>" in body  # markdown rendered inside
            summaries += re.findall(r"<summary>(Solution to Exercise [\d.]+)</summary>",
                                    cell.source)
        elif cell.source.startswith("#@title Solution"):
            assert dict(cell.metadata) == COLLAPSED
    assert len(summaries) == n_solutions
    chapter = toc.chapter_number(source)  # numbered per chapter, as on the site
    assert summaries == [f"Solution to Exercise {chapter}.{n}"
                         for n in range(1, n_solutions + 1)]


@pytest.mark.parametrize("source", CHAPTERS, ids=lambda p: p.stem)
def test_solution_code_cells_are_collapsed(source):
    """Every code cell between a solution's start and end is collapsed, and so is every cell
    the website hides (hide-input, remove-input), and no other one except the set-up and
    numbers cells."""
    nb = generated(source).cells
    original = jupytext.read(source, fmt="md:myst").cells
    in_solution, expected = False, []
    for cell in original:
        if cell.cell_type == "markdown":
            for mark in re.findall(r"^```\{(solution-start|solution-end)\}", cell.source,
                                   re.MULTILINE):
                in_solution = mark == "solution-start"
        else:
            hidden = bool(convert.HIDDEN_INPUT & set(cell.metadata.get("tags", [])))
            expected.append((in_solution, hidden))
    code = [c for c in nb if c.cell_type == "code"
            and not c.source.startswith(("#@title Set-up", "#@title Numbers in"))]
    assert [c.source.startswith("#@title Solution") for c in code] == [s for s, _ in expected]
    for cell, (solution, hidden) in zip(code, expected, strict=True):
        collapsed = (cell.metadata.get("cellView") == "form"
                     and cell.metadata.get("jupyter", {}).get("source_hidden") is True)
        assert collapsed == (solution or hidden), cell.source[:80]
        if hidden and not solution:
            assert cell.source.startswith("#@title "), cell.source[:80]


def test_committed_notebooks_are_the_generated_ones():
    """The collapsing metadata is what notebooks/ holds (notebooks.problems compares it)."""
    for source in CHAPTERS:
        committed = nbformat.read(notebooks.target(source), as_version=4)
        assert notebooks.cells_of(committed) == notebooks.cells_of(generated(source))
