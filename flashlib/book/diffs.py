"""What changed between two versions of a function, shown as a diff (the ladder's lesson).

:func:`source_diff` reads both functions' source from flashlib (never pasted), drops their
docstrings, and returns a unified diff that renders as a highlighted ``diff`` code block on the
website (myst-nb renders the ``text/markdown`` output) and in Jupyter or Colab.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

__all__ = ["SourceDiff", "source_diff"]


def _body_lines(fn: Callable[..., Any]) -> list[str]:
    """fn's source lines without its docstring."""
    source = textwrap.dedent(inspect.getsource(fn))
    lines = source.splitlines()
    node = ast.parse(source).body[0]
    body = getattr(node, "body", [])
    if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        start, end = body[0].lineno, body[0].end_lineno or body[0].lineno
        lines = lines[: start - 1] + lines[end:]
    return lines


class SourceDiff:
    """A unified diff between two functions' sources (see :func:`source_diff`)."""

    def __init__(self, old: Callable[..., Any], new: Callable[..., Any], context: int):
        self.old_name, self.new_name = old.__name__, new.__name__
        self.lines = list(difflib.unified_diff(
            _body_lines(old), _body_lines(new), fromfile=self.old_name,
            tofile=self.new_name, n=context, lineterm=""))
        self.added = sum(line.startswith("+") and not line.startswith("+++")
                         for line in self.lines)
        self.removed = sum(line.startswith("-") and not line.startswith("---")
                           for line in self.lines)

    def text(self) -> str:
        return "\n".join(self.lines)

    def _repr_markdown_(self) -> str:
        return f"```diff\n{self.text()}\n```"

    def __repr__(self) -> str:
        return self.text()


def source_diff(old: Callable[..., Any], new: Callable[..., Any], *,
                context: int = 1) -> SourceDiff:
    """The lines that changed from ``old`` to ``new`` (two functions), ``context`` unchanged
    lines around each change, docstrings left out."""
    if not callable(old) or not callable(new):
        raise TypeError("old, new: expected two functions")
    if not isinstance(context, int) or context < 0:
        raise ValueError(f"context: expected an int >= 0, got {context!r}")
    return SourceDiff(old, new, context)
