"""tools/main_path.py: each chapter's main line (outside deep dives, code, outputs and
solutions) stays at about 3,500 words at most, as the chapter guide asks."""

from __future__ import annotations

import pytest

from tools import main_path, toc


def test_counts_only_the_main_line(tmp_path):
    source = tmp_path / "page.md"
    source.write_text(
        "---\njupytext: {}\n---\n# A title\n\nOne two three.\n\n"
        "```{code-cell} ipython3\nx = 1  # not prose\n```\n\n"
        ":::{dropdown} Deep dive: four words\nfive six seven\n:::\n\n"
        "$$\na + b\n$$\n\n"
        "::::{admonition} Note\n:class: dropdown\neight nine\n::::\n\n"
        "Inline `code` and $x$ and {term}`SM` count as one.\n\n"
        "## Exercises\n\n:::{exercise}\n:label: ex-a\nWrite it.\n:::\n\n"
        "```{solution-start} ex-a\n:class: dropdown\n```\nsecret words here\n"
        "```{solution-end}\n```\n", encoding="utf-8")
    counts = main_path.count(source)
    assert counts == {"main": 2 + 3 + 7, "deep": 4 + 3 + 1 + 2, "exercises": 1 + 2}


def test_every_chapter_is_counted():
    assert sorted(main_path.CHAPTERS) == sorted(p.stem for p in toc.chapters())


@pytest.mark.parametrize("name", main_path.CHAPTERS)
def test_main_line_is_at_most_about_3500_words(name):
    counts = main_path.count(main_path.ROOT / "book" / f"{name}.md")
    assert counts["main"] <= main_path.LIMIT, (
        f"{name}: {counts['main']:,} words on the main line, more than {main_path.LIMIT:,}: "
        "move experiments and listings into collapsed deep dives (:::{dropdown})")
