"""Tables in a chapter's output, rendered by ``tabulate``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["html_table"]


def html_table_markup(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """The HTML of :func:`html_table`: ``<table class="table">`` with a header row, in a
    ``<div class="flashlib-table">`` (book/_static/flashlib.css: it scrolls sideways on a
    phone, and the cells' text wraps)."""
    from tabulate import tabulate

    header = [str(h) for h in header]
    cells = []
    for i, row in enumerate(rows):
        row = [str(c) for c in row]
        if len(row) != len(header):
            raise ValueError(f"rows[{i}] has {len(row)} cells, header has {len(header)}")
        cells.append(row)
    # disable_numparse: cells are shown as given (no re-formatting of numbers); the "html"
    # format escapes every cell.
    markup = tabulate(cells, headers=header, tablefmt="html", disable_numparse=True)
    # The wrapper scrolls a table too wide for a phone inside its own box, not the page; as a
    # scrolling region it must be reachable from the keyboard (tabindex).
    from flashlib.book import i18n  # a Japanese notebook's headers and words in Japanese

    return i18n.translate_html('<div class="flashlib-table" tabindex="0">'
                               + markup.replace("<table>", '<table class="table">', 1)
                               + "</div>")


def html_table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> Any:
    """An ``IPython.display.HTML`` table: ``header`` (n_cols,) and ``rows`` of n_cols cells each.

    Cells are converted with ``str`` and HTML-escaped; a row of the wrong length is a
    ValueError.  As a cell's last expression it is shown as a table (site, Jupyter, Colab).
    """
    from IPython.display import HTML

    return HTML(html_table_markup(header, rows))
