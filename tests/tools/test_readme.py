"""tools/README.md lists every file of tools/, one row each, in the table of its kind: the
commands (each with how to run it), the libraries, the Sphinx extensions, the shell scripts;
and every row names a file that exists."""

from __future__ import annotations

import re

from tests.tools.test_tools_start import COMMANDS, MODULES, SCRIPTS, WORKERS
from tools.paths import ROOT

README = ROOT / "tools" / "README.md"
EXTENSIONS = {"book_extension", "student_edition", "i18n_extension"}


def tables() -> dict[str, dict[str, list[str]]]:
    """``{section heading: {file named in the row's first cell: the row's other cells}}`` for
    every table of the README."""
    found: dict[str, dict[str, list[str]]] = {}
    heading = ""
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            heading = line[3:]
        elif match := re.match(r"^\| `([^`]+)` \|(.*)\|\s*$", line):
            found.setdefault(heading, {})[match[1]] = [c.strip() for c in match[2].split(" | ")]
    return found


def section(start: str) -> dict[str, list[str]]:
    (rows,) = [rows for heading, rows in tables().items() if heading.startswith(start)]
    return rows


def test_every_file_of_tools_has_one_row():
    listed = [name for rows in tables().values() for name in rows]
    assert len(listed) == len(set(listed)), "a file has two rows"
    files = {p.name for p in (ROOT / "tools").iterdir()
             if p.is_file() and p.suffix in (".py", ".sh", ".md")
             and p.name not in ("__init__.py", "README.md")}
    assert set(listed) == files, (f"no row: {sorted(files - set(listed))}; "
                                  f"no such file: {sorted(set(listed) - files)}")


def test_each_kind_in_its_table_and_each_command_says_how_to_run_it():
    commands = section("Commands")
    assert set(commands) == {p.name for p in COMMANDS}
    for name, (what, how) in commands.items():
        assert what and re.search(rf"python -m tools\.{name[:-3]}\b|make \w+", how), name
    assert set(section("Sphinx extensions")) == {f"{name}.py" for name in EXTENSIONS}
    libraries = {p.name for p in MODULES if p not in COMMANDS and p.stem not in EXTENSIONS}
    assert {n for n in section("Libraries") if n.endswith(".py")} == libraries
    assert {f"{name}.py" for name in WORKERS} <= libraries
    scripts = section("Shell scripts")
    assert set(scripts) == {p.name for p in SCRIPTS}
    for name, (_, how) in scripts.items():
        assert f"bash tools/{name}" in how, name
