"""Where a chapter runs: executed by the book build for the static website, or live.

The book's Sphinx extension (tools/book_extension.py) sets ``FLASHLIB_STATIC_WIDGETS=1`` for
the kernels that execute the chapters.  Then

- :mod:`flashlib.book.widgets` renders its kernel-free HTML (every frame precomputed, or drawn
  by the page from a JSON table) instead of ipywidgets;
- :mod:`flashlib.book.exercises` checkers show a neutral line ("run this cell in Jupyter or
  Colab to check your answer") instead of their verdict: the website never shows a verdict or
  a hint before the reader has tried.

In Jupyter, JupyterLab or Colab the variable is unset: live widgets, real verdicts.
"""

from __future__ import annotations

import os

__all__ = ["STATIC_ENV", "static_site"]

#: Environment variable that selects the static (website) rendering.
STATIC_ENV = "FLASHLIB_STATIC_WIDGETS"


def static_site() -> bool:
    """True while the book build executes the chapter for the static website."""
    return os.environ.get(STATIC_ENV, "") not in ("", "0")
