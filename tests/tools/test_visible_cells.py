"""Every code cell a reader sees works when copied alone into a fresh kernel.

A chapter hides its bookkeeping (``remove-input``, ``hide-input``, ...); a visible cell that
needs a name only a hidden cell defines (an import, a helper, a variable) fails for the reader
who copies the page's code into their own notebook. Here each chapter's visible cells run in
order, alone, in a fresh kernel (the tags are read from the MyST sources with jupytext), and
any error fails the test with the cell that raised it.

Slow (each chapter runs its visible experiments):
``pytest -m slow tests/tools/test_visible_cells.py``.
"""

from __future__ import annotations

import pytest

from tools import toc

#: Tags that hide a cell's code from the reader (the cell's output may still show).
HIDDEN = {"remove-cell", "hide-cell", "remove-input", "hide-input"}


def visible_notebook(source):
    """The chapter as a notebook of its visible code cells only, in order."""
    import jupytext
    import nbformat

    nb = jupytext.read(source, fmt="md:myst")
    cells = [nbformat.v4.new_code_cell(cell.source, metadata={"tags": tags})
             for cell in nb.cells if cell.cell_type == "code"
             and not HIDDEN & set(tags := list(cell.metadata.get("tags", [])))]
    out = nbformat.v4.new_notebook(cells=cells)
    out.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}
    return out


def test_visible_cells_are_read_from_the_tags(tmp_path):
    source = tmp_path / "page.md"
    source.write_text(
        "---\njupytext:\n  text_representation:\n    format_name: myst\n---\n# Page\n\n"
        "```{code-cell} ipython3\n:tags: [remove-input]\n\nhidden = 1\n```\n\n"
        "```{code-cell} ipython3\nshown = 2\n```\n\n"
        "```{code-cell} ipython3\n:tags: [hide-input]\n\nalso_hidden = 3\n```\n",
        encoding="utf-8")
    nb = visible_notebook(source)
    assert [c.source for c in nb.cells] == ["shown = 2"]


@pytest.mark.slow
@pytest.mark.parametrize("source", toc.chapters(), ids=lambda p: p.stem)
def test_visible_cells_run_alone_in_a_fresh_kernel(source):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = visible_notebook(source)  # a cell tagged raises-exception may raise (nbclient)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(source.parent)}})
    try:
        client.execute()
    except CellExecutionError as error:
        text = str(error)
        pytest.fail(f"{source.name}: a visible cell fails without the hidden ones "
                    f"(show the import or the helper it needs, or make it self-sufficient):"
                    f"\n{text[-3000:]}")
