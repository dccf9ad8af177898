"""flashlib.book (glue without myst-nb, html_table rendered by tabulate) and the MyST -> Jupyter
rewriting of tools/notebooks.py that makes the generated notebooks readable in plain Jupyter
and Colab."""

from __future__ import annotations

import builtins
import re

import pytest

from flashlib import book
from tools import notebooks as nbgen
from tools.paths import ROOT

# flashlib.book ---------------------------------------------------------------------------------

@pytest.fixture
def no_myst_nb(monkeypatch):
    """Make ``import myst_nb`` fail, as on Colab."""
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "myst_nb" or name.startswith("myst_nb."):
            raise ImportError("No module named 'myst_nb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_glue_without_myst_nb_records_and_shows_only_when_asked(no_myst_nb, monkeypatch):
    shown = []
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda value: shown.append(value))
    book.glue("test_hidden", 1.5, display=False)
    assert shown == []
    book.glue("test_shown", 42)
    assert shown == [42]
    assert book.glued()["test_hidden"] == 1.5 and book.glued()["test_shown"] == 42
    book.glued()["test_hidden"] = 0  # a copy
    assert book.glued()["test_hidden"] == 1.5


def test_glue_with_myst_nb_delegates(monkeypatch):
    myst_nb = pytest.importorskip("myst_nb")
    calls = []
    monkeypatch.setattr(myst_nb, "glue", lambda *args: calls.append(args))
    book.glue("test_delegated", 3, display=False)
    assert calls == [("test_delegated", 3, False)]
    assert book.glued()["test_delegated"] == 3


def test_glue_rejects_bad_name():
    with pytest.raises(TypeError, match="name"):
        book.glue("", 1)


def _cells(html: str, tag: str) -> list[str]:
    return [c.strip() for c in re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", html)]


def test_html_table_escapes_keeps_cells_and_checks_row_length():
    table = book.html_table(["x", "a<b"], [[1, "<i>"], [2.5, "&"], ["1.50", "0012"]])
    html = table.data
    assert html.startswith('<div class="flashlib-table" tabindex="0"><table class="table">')
    assert html.rstrip().endswith("</table></div>")
    assert _cells(html, "th") == ["x", "a&lt;b"]
    # escaped, and shown as given: no re-formatting of numbers ("1.50" stays "1.50")
    assert _cells(html, "td") == ["1", "&lt;i&gt;", "2.5", "&amp;", "1.50", "0012"]
    empty = book.html_table(["a"], []).data
    assert _cells(empty, "th") == ["a"] and _cells(empty, "td") == []
    with pytest.raises(ValueError, match=r"rows\[1\] has 1 cells, header has 2"):
        book.html_table(["a", "b"], [[1, 2], [3]])


# MyST -> Jupyter markdown ----------------------------------------------------------------------

def page(name="online-softmax"):
    return nbgen.Page(ROOT / "book" / f"{name}.md")


def test_literalinclude_pyobject_is_the_current_source():
    import inspect

    from flashlib.fast.online import merge_partials

    text = "```{literalinclude} ../flashlib/fast/online.py\n:pyobject: merge_partials\n```"
    out = nbgen.jupyter_markdown(text, page())
    assert out == "```python\n" + inspect.getsource(merge_partials).rstrip("\n") + "\n```"


def test_pyobject_source_methods_decorators_and_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(nbgen, "ROOT", tmp_path)
    src = tmp_path / "m.py"
    src.write_text("import f\n\nclass A:\n    @f.deco\n    def g(self):\n        return 1\n")
    assert nbgen.pyobject_source(src, "A.g") == "@f.deco\ndef g(self):\n    return 1"
    with pytest.raises(ValueError, match="has no B"):
        nbgen.pyobject_source(src, "B")


def test_roles_doc_cite_glue_math():
    p = page("intro")
    text = ("See {doc}`overflow`, {doc}`the ladder <optimisation-ladder>` and {doc}`references`;"
            " {cite:p}`dao2022flashattention,milakov2018online` {cite}`dao2023flashattention2`"
            " {cite:t}`rabe2021selfattention`: {glue:text}`mem_ratio:.0f` and {math}`x^2`.")
    out = nbgen.jupyter_markdown(text, p)
    assert "[The overflow problem](overflow.ipynb)" in out
    assert "[the ladder](optimisation-ladder.ipynb)" in out
    assert "*References* (on the book's website)" in out
    assert ("([Dao et al., 2022](https://arxiv.org/abs/2205.14135); "
            "[Milakov and Gimelshein, 2018](https://arxiv.org/abs/1805.02867))") in out
    assert "([Dao, 2023](https://arxiv.org/abs/2307.08691))" in out
    assert "[Rabe and Staats](https://arxiv.org/abs/2112.05682) (2021)" in out
    assert "`mem_ratio` and $x^2$." in out
    assert p.glue_names == ["mem_ratio"]
    with pytest.raises(ValueError, match="references.bib"):
        nbgen.jupyter_markdown("{cite:p}`no_such_key`", p)
    with pytest.raises(ValueError, match="_toc.yml"):
        nbgen.jupyter_markdown("{doc}`no-such-page`", p)


def test_exercises_solutions_labels_and_plain_code_untouched():
    p = page()
    text = "\n".join([
        "(my-label)=",
        "% a MyST comment",
        ":::{exercise}",
        ":label: ex-a",
        "",
        "Do {glue:text}`n_long`.",
        ":::",
        "",
        "```{solution-start} ex-a",
        ":class: dropdown",
        "```",
        "",
        "```python",
        "x = {doc}`not a role inside code`",
        "```",
        "",
        "Uses {glue:text}`gib_long:.1f`.",
        "",
        "```{solution-end}",
        "```",
        "",
        ":::{exercise} A title",
        "Second.",
        ":::",
    ])
    out = nbgen.markdown_cell(text, p)
    assert out == "\n".join([
        "### Exercise 3.1",
        "",
        "> Do `n_long`.",
        "",
        "<details>",
        "<summary>Solution to Exercise 3.1</summary>",
        "",
        "```python",
        "x = {doc}`not a role inside code`",
        "```",
        "",
        "Uses `gib_long`.",
        "",
        "</details>",
        "",
        "### Exercise 3.2: A title",
        "",
        "> Second.",
    ])
    assert p.exercises == {"ex-a": "3.1"} and p.n_exercises == 2
    assert p.cited == [("n_long", False), ("gib_long:.1f", True)]
    assert p.solution is None


def test_solution_across_cells_reopens_and_closes():
    """A solution whose code cell splits it: each markdown part is a <details> of its own."""
    p = page()
    nbgen.markdown_cell(":::{exercise}\n:label: ex-a\nDo it.\n:::", p)
    first = nbgen.markdown_cell("```{solution-start} ex-a\n:class: dropdown\n```\n\nHint.", p)
    assert first == ("<details>\n<summary>Solution to Exercise 3.1</summary>\n\nHint.\n\n"
                     "</details>")  # online softmax is chapter 3: numbered as on the site
    assert p.solution == "3.1"  # still open: the code cell after it is part of the solution
    second = nbgen.markdown_cell("More.\n\n```{solution-end}\n```\n\nAfter.", p)
    assert second == ("<details>\n<summary>Solution to Exercise 3.1 (continued)</summary>\n\n"
                      "More.\n\n</details>\n\nAfter.")
    assert p.solution is None
    # only the end mark in a cell: no empty <details>
    nbgen.markdown_cell("```{solution-start} ex-a\n```\n\nText.", p)
    assert nbgen.markdown_cell("```{solution-end}\n```\n\nNext.", p) == "Next."


def test_other_directives():
    p = page()
    assert nbgen.jupyter_markdown("```{math}\na = b\n```", p) == "$$\na = b\n$$"
    note = nbgen.jupyter_markdown("```{note}\nCareful.\n```", p)
    assert note == "> **Note**\n>\n> Careful."
    figure = nbgen.jupyter_markdown("```{figure} _static/x.png\n:alt: An x\n\nThe x.\n```", p)
    assert figure.startswith("![An x](https://raw.githubusercontent.com/")
    assert figure.endswith("/book/_static/x.png)\n\n*The x.*")
    deep = nbgen.jupyter_markdown(":::{dropdown} Deep dive: `f`\nBecause {math}`x`.\n:::", p)
    assert deep == ("<details>\n<summary>Deep dive: <code>f</code></summary>\n\nBecause $x$."
                    "\n\n</details>")
    tip = nbgen.jupyter_markdown("```{tip} More\n:class: dropdown\nText.\n```", p)
    assert tip == "<details>\n<summary>More</summary>\n\nText.\n\n</details>"


def test_glossary_terms_link_to_the_glossary_notebook():
    p = page()
    assert nbgen.inline("in {term}`HBM` and {term}`warps <warp>`", p) == (
        "in [HBM](glossary.ipynb#HBM) and [warps](glossary.ipynb#warp)")
    assert nbgen.inline("{term}`tensor core`", page("glossary")) == "[tensor core](#tensor-core)"
    glossary = nbgen.jupyter_markdown(
        "```{glossary}\nHBM\n  Slow memory {cite:p}`dao2022flashattention`.\n"
        "tensor core\n  A unit.\n  Fast.\n```", p)
    assert glossary.startswith("#### HBM\n\nSlow memory ([Dao et al., 2022](")
    assert glossary.endswith("#### tensor core\n\nA unit.\nFast.")
    # every {term} of the book names a term of the glossary
    terms = set(re.findall(r"^(\S[^\n]*)$", re.search(
        r"```\{glossary\}\n(.*?)\n```", (ROOT / "book" / "glossary.md").read_text(), re.S)[1],
        re.M))
    for source in nbgen.toc_files():
        for text in re.findall(r"\{term\}`([^`]*)`", source.read_text(encoding="utf-8")):
            target = re.fullmatch(r".*?<(.+)>", text)
            assert (target[1] if target else text) in terms, (source.name, text)


def test_hidden_cells_are_collapsed_under_a_title():
    assert nbgen.collapsed_source("# Bookkeeping: numbers\nx = 1") == (
        "#@title Bookkeeping: numbers\nx = 1")
    assert nbgen.collapsed_source("x = 1") == "#@title Show the code\nx = 1"
    assert nbgen.collapsed_source("#@title Kept\nx = 1") == "#@title Kept\nx = 1"


def test_generated_notebooks_have_no_myst_left():
    import re

    leftovers = re.compile(r"```\{|:::\{|\{[\w:-]+\}`|^\([\w.:-]+\)=\s*$", re.MULTILINE)
    for source in nbgen.chapters():
        nb = nbgen.clean_notebook(source)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                found = leftovers.findall(cell.source)
                assert not found, f"{source.name}: MyST left in a markdown cell: {found}"
        first = next(c for c in nb.cells if c.cell_type == "markdown")
        if "{glue" in source.read_text(encoding="utf-8"):
            assert "flashlib.book.glued()" in first.source


def test_backward_diagram_draws_the_five_matmuls_and_the_footprint():
    from flashlib.book.diagrams import BACKWARD_MATMULS, backward_diagram
    from flashlib.studies.io_model import sram_footprint

    assert len(BACKWARD_MATMULS) == 5  # one tile's products: S, dV, dP, dQ, dK
    dg = backward_diagram(B_r=64, B_c=32, d=16, itemsize=4)
    svg = dg.svg()
    kib = sum(sram_footprint("backward", 64, 32, 16).values()) * 4 / 2**10
    assert f"{kib:.0f} KiB" in dg.caption and "five matmuls" in dg.caption
    assert svg.count("<text") >= 30 and 'viewBox="0 0 360 ' in svg
    for name in ("dQ", "dK", "dV", "pass 1", "pass 2"):
        assert name in svg

def test_hierarchy_diagram_states_the_cited_a100_figures():
    from flashlib.book.diagrams import hierarchy_diagram
    from flashlib.studies import io_model as io

    gpu = io.GPUS["A100 (1.5 TB/s)"]
    dg = hierarchy_diagram(io.A100_HBM_BYTES, (1.5e12, 2.0e12), gpu.sram_per_sm, gpu.sms,
                           io.A100_SRAM_BANDWIDTH)
    for text in ("40 to 80 GB", "1.5 to 2 TB/s", "108 streaming", "192 KB", "19 TB/s"):
        assert text in dg.alt
    assert "<svg" in dg.svg() and dg.caption

def test_source_diff_shows_only_changed_lines_without_docstrings():
    from flashlib.book.diffs import source_diff
    from flashlib.studies.ladder import rung6_stale_max, rung7_kt_tiles

    diff = source_diff(rung6_stale_max, rung7_kt_tiles)
    text = diff.text()
    assert text.startswith("--- rung6_stale_max\n+++ rung7_kt_tiles")
    assert "transposed_tiles" in text and '"""' not in text
    assert diff.added and diff.removed
    assert diff._repr_markdown_().startswith("```diff\n")
    with pytest.raises(TypeError, match="old, new"):
        source_diff(1, rung7_kt_tiles)
    with pytest.raises(ValueError, match="context"):
        source_diff(rung6_stale_max, rung7_kt_tiles, context=-1)


def test_chapter_diagrams_render_with_alt_and_caption():
    from flashlib.book.diagrams import ladder_diagram, merge_diagram, softmax_passes_diagram

    for dg in (softmax_passes_diagram(4096, 4), merge_diagram(256, 64), merge_diagram(100, 64),
               ladder_diagram(64, 128, 64, 64)):
        html = dg._repr_html_()
        assert html.startswith('<figure class="flashlib-diagram"><svg') and "aria-label" in html
        assert "<figcaption" in html


def _before(x, y):
    z = x + y  # the sum
    # a note
    return z * 2


def _after(x, y):
    z = x + y  # the sum, now explained at length
    w = "a # inside a string"
    return z * 3 + len(w)


def test_source_diff_ignores_changes_of_comments_alone():
    """A line whose comment alone changed is context (in its new version), a comment line
    removed on its own is no change; a code change, and a # inside a string, still count."""
    from flashlib.book.diffs import source_diff

    lines = source_diff(_before, _after, context=5).lines
    assert "     z = x + y  # the sum, now explained at length" in lines
    assert not any("the sum" in line for line in lines if line[:1] in "+-")
    assert '+    w = "a # inside a string"' in lines
    assert "-    return z * 2" in lines and "+    return z * 3 + len(w)" in lines
    assert "-    # a note" in lines  # removed together with code: part of the change
    only_comments = source_diff(_before, _before_commented, context=0)  # and the name
    assert only_comments.added == only_comments.removed == 1
    assert only_comments.lines[2:] == [
        "@@ -1 +1 @@", "-def _before(x, y):", "+def _before_commented(x, y):"]


def _before_commented(x, y):
    z = x + y  # the total
    # a note
    # and a second note
    return z * 2
