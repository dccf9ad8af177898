"""What changed between two versions of a function, shown as a diff (the ladder's lesson).

:func:`source_diff` reads both functions' source from flashlib (never pasted), drops their
docstrings, and returns a unified diff that renders as a highlighted ``diff`` code block on the
website (myst-nb renders the ``text/markdown`` output; book/_static/flashlib.css shows removed
lines red and added lines green) and in Jupyter or Colab.

Only code counts as a change: lines that differ in their comments alone are shown as unchanged
context, in their new version, and a comment line added or removed on its own is no change
(the first is shown as context, the second left out).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import io
import textwrap
import tokenize
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


def _code_only(lines: list[str]) -> list[str]:
    """Each line without its comment and trailing blanks ("" for a comment or blank line):
    what a change must touch to count. Comments are found by Python's tokenizer, so a ``#``
    inside a string stays."""
    code = list(lines)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline))
    except (tokenize.TokenError, SyntaxError):  # not Python: compare the lines as they are
        return [line.rstrip() for line in lines]
    for token in tokens:
        if token.type == tokenize.COMMENT:
            row, col = token.start
            code[row - 1] = code[row - 1][:col]
    return [line.rstrip() for line in code]


class SourceDiff:
    """A unified diff between two functions' sources (see :func:`source_diff`)."""

    def __init__(self, old: Callable[..., Any], new: Callable[..., Any], context: int):
        self.old_name, self.new_name = old.__name__, new.__name__
        self.lines = _unified(_body_lines(old), _body_lines(new), self.old_name,
                              self.new_name, context)
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


def _unified(old: list[str], new: list[str], old_name: str, new_name: str,
             context: int) -> list[str]:
    """difflib.unified_diff's format, matching the lines by their code alone
    (:func:`_code_only`); see the module docstring."""
    old_code, new_code = _code_only(old), _code_only(new)
    matcher = difflib.SequenceMatcher(None, old_code, new_code, autojunk=False)
    out = [f"--- {old_name}", f"+++ {new_name}"]
    for group in matcher.get_grouped_opcodes(context):
        hunk, changed = [], False
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                hunk += [" " + line for line in new[j1:j2]]  # comments as they are now
            elif not any(old_code[i1:i2]) and not any(new_code[j1:j2]):
                hunk += [" " + line for line in new[j1:j2]]  # comment lines only: no change
            else:
                hunk += ["-" + line for line in old[i1:i2]] + ["+" + line for line in new[j1:j2]]
                changed = True
        if changed:
            first, last = group[0], group[-1]
            out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@")
            out += hunk
    return out


def _range(start: int, stop: int) -> str:
    """A hunk's line range as unified diffs write it (1-based start, count)."""
    length = stop - start
    if length == 1:
        return f"{start + 1}"
    return f"{start + 1 if length else start},{length}"


def source_diff(old: Callable[..., Any], new: Callable[..., Any], *,
                context: int = 1) -> SourceDiff:
    """The lines whose code changed from ``old`` to ``new`` (two functions), ``context``
    unchanged lines around each change, docstrings left out, changes of comments alone not
    counted (see the module docstring)."""
    if not callable(old) or not callable(new):
        raise TypeError("old, new: expected two functions")
    if not isinstance(context, int) or context < 0:
        raise ValueError(f"context: expected an int >= 0, got {context!r}")
    return SourceDiff(old, new, context)
