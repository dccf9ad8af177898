"""The student edition's transform: a chapter without its solutions.

:func:`without_solutions` drops every solution from a chapter's cells; tools/convert.py applies
it for ``clean_notebook(source, student=True)``, which ``python -m tools.notebooks write``
saves as notebooks/student/<name>.ipynb and grading/grade.py reads the exercises from. (The
student edition of the *site* is tools/student_edition.py, a Sphinx extension.)"""

from __future__ import annotations

import nbformat

from tools.myst import CODE_FENCE, DIRECTIVE


def without_solutions(cells: list[nbformat.NotebookNode]) -> list[nbformat.NotebookNode]:
    """A chapter's jupytext cells without its solutions: everything from a
    ``{solution-start}`` directive to its ``{solution-end}`` (markdown and code cells, across
    cells) and every ``{solution}`` directive; markdown cells left empty are dropped.
    Plain code blocks are copied as they are (a directive inside one is text)."""
    kept, inside = [], False
    for cell in cells:
        if cell.cell_type != "markdown":
            if not inside:
                kept.append(cell)
            continue
        lines, out, i = cell.source.split("\n"), [], 0
        while i < len(lines):
            code, opened = CODE_FENCE.match(lines[i]), DIRECTIVE.match(lines[i])
            fence = code["fence"] if code else opened["fence"] if opened else None
            end = i if fence is None else next(
                (k for k in range(i + 1, len(lines)) if lines[k].strip() == fence),
                len(lines) - 1)
            name = opened["name"] if opened else None
            if name in ("solution-start", "solution-end"):
                inside = name == "solution-start"
            elif name != "solution" and not inside:  # a {solution} block: skipped whole
                out.extend(lines[i : end + 1])
            i = end + 1
        text = "\n".join(out).strip("\n")
        if text:
            kept.append(nbformat.from_dict({**cell, "source": text}))
    return kept
