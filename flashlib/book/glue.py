"""Helpers for the book's chapters as notebooks (no numerics here).

glue        myst-nb's ``glue`` when myst-nb is installed (the book build); elsewhere (Colab, a
            plain Jupyter) it only records the value, so the chapters run without myst-nb
glued       the values recorded by :func:`glue` in this kernel, by name
html_table  a small HTML table (header + rows) for a cell's output
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["glue", "glued", "html_table"]

_GLUED: dict[str, Any] = {}


def glue(name: str, value: Any, display: bool = True) -> None:
    """Make ``value`` available to the chapter's text as ``{glue:text}`name```.

    In the book build this is ``myst_nb.glue(name, value, display)``.  Without myst-nb (Colab,
    a plain Jupyter) the text cannot show glued values, so it shows ``value`` only when
    ``display`` is true, as myst-nb would; either way :func:`glued` lists it afterwards.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    _GLUED[name] = value
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display:
            try:
                from IPython.display import display as show
            except ImportError:
                print(repr(value))
            else:
                show(value)
        return
    myst_glue(name, value, display)


def glued() -> dict[str, Any]:
    """Every value passed to :func:`glue` in this kernel so far, by name (a copy)."""
    return dict(_GLUED)


def _html_table_markup(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    width = len(header)
    body = []
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != width:
            raise ValueError(f"rows[{i}] has {len(row)} cells, header has {width}")
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    head = "<tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in header) + "</tr>"
    return '<table class="table">' + head + "".join(body) + "</table>"


def html_table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> Any:
    """An ``IPython.display.HTML`` table: ``header`` (n_cols,) and ``rows`` of n_cols cells each.

    Cells are converted with ``str`` and HTML-escaped; a row of the wrong length is a
    ValueError.  As a cell's last expression it is shown as a table (site, Jupyter, Colab).
    """
    from IPython.display import HTML

    return HTML(_html_table_markup(header, rows))
