"""Every path the repository's files name is a path of the repository.

A clone must work anywhere, so no tracked text file may name a place outside it:

- an absolute path of a developer's machine (a home folder, the system's temporary folder or
  a work folder as the place where project files live);
- a relative path that climbs out of the repository (``../`` past its root), or lands beside
  the repository's own top-level entries (a sibling checkout's shared folder);

and a repository path that the documentation names (``tools/README.md``,
``tests/site/test_site.py``, in Markdown, shell scripts, the configuration, and Python
docstrings and comments) must exist, so that moving a file cannot leave a guide pointing at
nothing. Only paths below the repository's own folders (flashlib/, tools/, tests/, book/,
notebooks/, .ci/) with a file's extension are checked; placeholders (``book/NAME.md``,
``<chapter>``, ``*``) and plain string literals in code (a test's fixture files) are not.
Vendored files and binary files are skipped.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from functools import cache
from pathlib import Path

import pytest

from tools.paths import ROOT

VENDORED = ("book/_static/vendor/", "tests/vendor/")
#: An absolute path below a machine's home, temporary or work folders.
ABSOLUTE = re.compile(r"(?<![\w.:/~$-])/(?:ho" r"me|ro" r"ot|tm" r"p|wo" r"rk)/[\w.-]+")
#: A relative path that starts by climbing out of its folder (one or more parent steps).
CLIMBING = re.compile(r"(?<![\w./-])((?:\.\./)+)([\w.-]+)")
#: A path written from the repository root, with the extension of a file.
REPO_PATH = re.compile(
    r"(?<![\w./<{-])((?:flashlib|tools|tests|book|notebooks|\.ci)/[\w./-]*?"
    r"\.(?:py|md|sh|js|ipynb|ya?ml|toml|json|css|bib|txt))(?![\w/-])")
#: Files whose every line is documentation (the others: only docstrings and comments).
DOC_SUFFIXES = (".md", ".sh", ".toml", ".yml", ".yaml", ".cfg", ".txt")


@cache
def tracked_files() -> list[str]:
    """Tracked files and new files git does not ignore, relative to the root."""
    try:
        proc = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
            capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return []
    if proc.returncode != 0:
        return []
    return sorted({name for name in proc.stdout.splitlines()
                   if not name.startswith(VENDORED) and (ROOT / name).is_file()})


@cache
def text_of(name: str) -> str | None:
    """The file's text, None for a binary file (a NUL byte, or not UTF-8)."""
    data = (ROOT / name).read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def text_files() -> list[tuple[str, str]]:
    files = tracked_files()
    if not files:
        pytest.skip("not a git checkout: no list of tracked files")
    return [(name, text) for name in files if (text := text_of(name)) is not None]


def outside_paths(name: str, text: str, top_level: set[str]) -> list[str]:
    """What in ``text`` (the file ``name``) names a place outside the repository."""
    found = [m.group(0) for m in ABSOLUTE.finditer(text)]
    depth = len(Path(name).parent.parts)
    for match in CLIMBING.finditer(text):
        ups, first = match.group(1).count("../"), match.group(2)
        if ups > depth or (ups == depth and first not in top_level):
            found.append(match.group(0))
    return found


def documentation(name: str, text: str) -> str:
    """The parts of a file that document: all of a Markdown file, shell script or
    configuration file; a Python file's docstrings and comments; nothing of the rest."""
    if name.endswith(DOC_SUFFIXES) or name in ("Makefile", ".ci/run"):
        return text
    if not name.endswith(".py"):
        return ""
    parts, previous = [], tokenize.INDENT
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            parts.append(token.string)
        elif token.type == tokenize.STRING and previous in (
                tokenize.INDENT, tokenize.NEWLINE, tokenize.NL, tokenize.DEDENT):
            parts.append(token.string)  # a string statement: a docstring
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token.type
    return "\n".join(parts)


def missing_paths(name: str, text: str) -> list[str]:
    """Repository paths that the documentation of ``name`` names and that do not exist."""
    named = {m.group(1).rstrip(".") for m in REPO_PATH.finditer(documentation(name, text))}
    named = {p for p in named if not re.search(r"[A-Z]{3,}|\bx\.py$", p)}  # NAME, CHAPTER
    return sorted(p for p in named if not (ROOT / p).exists())


def test_no_path_leaves_the_repository():
    top_level = {Path(name).parts[0] for name in tracked_files()}
    problems = [f"{name}: {path}" for name, text in text_files()
                for path in outside_paths(name, text, top_level)]
    assert not problems, "paths outside the repository:\n" + "\n".join(problems)


def test_named_repository_paths_exist():
    problems = [f"{name}: {path}" for name, text in text_files()
                if not name.startswith("notebooks/")  # generated from book/, checked there
                for path in missing_paths(name, text)]
    assert not problems, "paths that do not exist:\n" + "\n".join(problems)


def test_the_checks_can_fail():
    top = {"book", "flashlib", "tools", "tests", "README.md"}
    up = ".." + "/"  # written so, this file names no such path itself
    home, scratch = "/ho" + "me/dev/flashlib/x.py", "/tm" + "p/run/out.json"
    text = (f"see {home} and {scratch}, {up}shared/guide.md, {up}{up}x.md and "
            f"{up}flashlib/a.py")
    assert outside_paths("tools/README.md", text, top) == [
        "/ho" + "me/dev", "/tm" + "p/run", f"{up}shared", f"{up}{up}x.md"]
    assert outside_paths("tools/README.md", "https://example.org/ho" + "me/x", top) == []
    assert outside_paths("README.md", f"{up}flashlib", top) == [f"{up}flashlib"]
    assert outside_paths("tests/tools/t.py", f"{up}{up}flashlib/a.py", top) == []
    doc = '"""Run tests/gone.py."""\n\nx = "tests/fixture.py"  # see tools/gone.sh\n'
    assert missing_paths("tools/t.py", doc) == ["tests/gone.py", "tools/gone.sh"]
    assert missing_paths("README.md", "`tools/README.md`, book/NAME.md, tests/<x>/a.py") == []
