"""Numbers from a chapter's code cells in its text: ``glue`` works with and without myst-nb.

glue        myst-nb's ``glue`` when myst-nb is installed (the book build); elsewhere (Colab, a
            plain Jupyter) it only records the value, so the chapters run without myst-nb
glued       the values recorded by :func:`glue` in this kernel, by name
print_glued prints ``name = value`` for glued values as the text formats them: the generated
            notebooks call it before each text cell that cites them (tools/convert.py)
span        "between 0.0015 and 0.0021", or "at 0.0015" when both ends print the same: a range
            in prose that is never "between X and X"
"""

from __future__ import annotations

from typing import Any

__all__ = ["glue", "glued", "print_glued", "span"]

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


def print_glued(*references: str) -> None:
    """Print ``name = value`` for each reference ``name`` or ``name:format`` (a glue role's
    text: ``{glue:text}`name:.2f``` -> ``name = 1.23``); a Markdown value prints its text.
    A name not glued yet says so (the cells above it have not run), without an exception."""
    for reference in references:
        name, _, spec = reference.partition(":")
        if name not in _GLUED:
            print(f"{name}: not computed yet (run the cells above first)")
            continue
        value = _GLUED[name]
        text = getattr(value, "data", None)  # IPython's Markdown, HTML, ...
        if not isinstance(text, str):
            try:
                text = format(value, spec)
            except (TypeError, ValueError):
                text = str(value)
        print(f"{name} = {text}")


def span(lo: float, hi: float, spec: str = ".3g") -> str:
    """A range as prose: ``"between {lo} and {hi}"`` formatted with ``spec``, or ``"at {lo}"``
    when the two ends print the same (a range is never "between X and X").  Glue it as
    Markdown: ``glue("name", Markdown(span(lo, hi)), display=False)``, cited with
    ``{glue:md}`name```."""
    a, b = format(lo, spec), format(hi, spec)
    return f"at {a}" if a == b else f"between {a} and {b}"
