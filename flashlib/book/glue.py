"""Numbers from a chapter's code cells in its text: ``glue`` works with and without myst-nb.

glue        myst-nb's ``glue`` when myst-nb is installed (the book build); elsewhere (Colab, a
            plain Jupyter) it only records the value, so the chapters run without myst-nb
glued       the values recorded by :func:`glue` in this kernel, by name
"""

from __future__ import annotations

from typing import Any

__all__ = ["glue", "glued"]

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
