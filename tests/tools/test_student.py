"""tools/student.py: a chapter's cells without their solutions, whatever form they take."""

from __future__ import annotations

import jupytext

from tools import student


def _myst(body: str) -> str:
    return ("---\njupytext:\n  text_representation:\n    format_name: myst\nkernelspec:\n"
            "  name: python3\n  display_name: Python 3\n---\n\n" + body)


def test_without_solutions_on_every_form():
    text = _myst(
        "# T\n\n:::{exercise}\n:label: e1\n\nDo it.\n:::\n\n"
        "```{code-cell} ipython3\ncheck(f)\n```\n\n"
        "Prose kept.\n\n```{solution-start} e1\n:class: dropdown\n```\n\nSECRET one.\n\n"
        "```{code-cell} ipython3\nsecret_code()\n```\n\nSECRET two.\n\n```{solution-end}\n```"
        "\n\nAfter.\n\n````{solution} e1\nSECRET three.\n```python\nx = 1\n```\n````\n\n"
        "```text\n```{solution-start} e1\nnot a directive\n```\n")
    nb = jupytext.reads(text, fmt="md:myst")
    kept = student.without_solutions(nb.cells)
    joined = "\n".join(c.source for c in kept)
    assert "SECRET" not in joined and "secret_code" not in joined and "x = 1" not in joined
    for expected in ("Do it.", "check(f)", "Prose kept.", "After.", "not a directive"):
        assert expected in joined
    assert [c.cell_type for c in kept] == ["markdown", "code", "markdown", "markdown"]
    assert kept[2].source == "Prose kept." and kept[3].source.startswith("After.")
