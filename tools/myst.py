"""The MyST Markdown syntax that the tools read in the chapters' markdown cells, as regular
expressions (one line each): a directive's opening fence (```` ```{name} arg ```` or
``:::{name} arg``), its ``:option: value`` lines, a plain code fence, an inline role
(``{name}`text```) and a ``(label)=`` line. tools/convert.py rewrites what they match for
Jupyter; tools/student.py finds the solutions with them."""

from __future__ import annotations

import re

DIRECTIVE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[\w:-]+)\}[ \t]*(?P<arg>.*?)\s*$")
OPTION = re.compile(r"^:(?P<key>[\w-]+):[ \t]*(?P<value>.*?)\s*$")
CODE_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?!\{)")
ROLE = re.compile(r"\{(?P<name>[\w:-]+)\}`(?P<text>[^`]*)`")
LABEL = re.compile(r"^\([\w.:-]+\)=\s*$")
