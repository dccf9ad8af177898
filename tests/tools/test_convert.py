"""tools/convert.py: the MyST -> CommonMark rewriting that makes the generated notebooks
readable in plain Jupyter and Colab, and the exercise headings it writes (read back by
`exercise_numbers`)."""

from __future__ import annotations

import re

import pytest

from tools import colab, project, toc
from tools import convert as nbgen
from tools.paths import ROOT


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
    assert f"[The overflow problem]({colab.colab_link('overflow')})" in out
    assert f"[the ladder]({colab.colab_link('optimisation-ladder')})" in out
    assert colab.colab_link("overflow") == (  # links between notebooks must work on Colab
        "https://colab.research.google.com/github/" + project.repository()[0].removeprefix(
            "https://github.com/") + f"/blob/{colab.release_ref()}/notebooks/overflow.ipynb")
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
    glossary_url = colab.colab_link("glossary")  # absolute: relative links fail on Colab
    assert glossary_url.endswith(f"/blob/{colab.release_ref()}/notebooks/glossary.ipynb")
    assert nbgen.inline("in {term}`HBM` and {term}`warps <warp>`", p) == (
        f"in [HBM]({glossary_url}#HBM) and [warps]({glossary_url}#warp)")
    student = nbgen.Page(p.source, student=True)
    assert nbgen.inline("{term}`HBM`", student) == (
        f"[HBM]({colab.colab_link('glossary', student=True)}#HBM)")
    assert colab.colab_link("glossary", student=True).endswith(
        f"/{project.student_repository().removeprefix('https://github.com/')}/blob/"
        f"{colab.release_ref()}"
        "/glossary.ipynb")
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
    for source in toc.toc_files():
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
    for source in toc.chapters():
        nb = nbgen.clean_notebook(source)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                found = leftovers.findall(cell.source)
                assert not found, f"{source.name}: MyST left in a markdown cell: {found}"
        first = next(c for c in nb.cells if c.cell_type == "markdown")
        if "{glue" in source.read_text(encoding="utf-8"):
            assert "flashlib.book.glued()" in first.source


def test_exercise_numbers_read_the_headings_directive_writes():
    for source in toc.chapters():
        nb = nbgen.clean_notebook(source, student=True)
        numbers = [n for c in nb.cells if c.cell_type == "markdown"
                   for n in nbgen.exercise_numbers(c.source)]
        n_exercises = len(re.findall(r"^:::\{exercise\}", source.read_text(encoding="utf-8"),
                                     re.MULTILINE))
        assert len(numbers) == len(set(numbers)) == n_exercises, (source.name, numbers)
    assert nbgen.exercise_numbers("### Exercise 1.2: tiles\n\n> text") == ["1.2"]
    assert nbgen.exercise_numbers("## Exercises\n\n### Exercise 3\n") == ["3"]
    assert nbgen.exercise_numbers("Exercise 3 is above") == []
