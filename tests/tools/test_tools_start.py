"""Every tool starts: each module of tools/ that has a command line answers
``python -m tools.<name> --help`` from the repository root (exit 0, argparse's usage), each
library or Sphinx extension imports, every import written inside a function (which neither
``--help`` nor an import runs) names a module and a name that exist, and each shell script
parses (``bash -n``) and answers ``--help`` before anything else. A tool whose import broke
(a moved helper, a renamed module) fails here, not the next time someone runs it.

The modules and scripts are found in tools/, not listed here, so a new tool is covered as
soon as it exists; tools/README.md must have a row for each (tests/tools/test_readme.py)."""

from __future__ import annotations

import ast
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.paths import ROOT

TOOLS = ROOT / "tools"
MODULES = sorted(p for p in TOOLS.glob("*.py") if p.name != "__init__.py")
SCRIPTS = sorted(TOOLS.glob("*.sh"))
#: Modules with a ``__main__`` block that people do not run: started by another tool, with
#: arguments that tool writes (so ``--help`` is not theirs to answer); imported instead.
WORKERS: dict[str, str] = {}  # none now (the grader's worker is grading/worker.py)


def has_command_line(path: Path) -> bool:
    """Whether the module runs something under ``if __name__ == "__main__":``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in tree.body)


COMMANDS = [p for p in MODULES if has_command_line(p) and p.stem not in WORKERS]
LIBRARIES = [p for p in MODULES if p not in COMMANDS]


def test_the_tools_are_found():
    names = {p.stem for p in COMMANDS}
    assert {"notebooks", "colab_check", "lab", "lab_widgets_check",
            "widget_redraw"} <= names, names
    assert {"toc", "convert", "colab", "book_extension", "student_edition"} <= {
        p.stem for p in LIBRARIES}
    assert {p.name for p in SCRIPTS} >= {"gpu_device_check.sh", "vendor_js.sh",
                                         "vendor_axe.sh"}
    assert set(WORKERS) <= {p.stem for p in MODULES}


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[int, str, str]]:
    """``{name: (exit code, stdout, stderr)}`` of ``python -m tools.<name> --help`` for every
    command, started all at once (each is a fresh interpreter: together they take about what
    the slowest one takes per core)."""
    procs = {path.stem: subprocess.Popen([sys.executable, "-m", f"tools.{path.stem}", "--help"],
                                         cwd=ROOT, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
             for path in COMMANDS}
    outputs = {name: proc.communicate(timeout=300) for name, proc in procs.items()}
    return {name: (procs[name].returncode, *outputs[name]) for name in procs}


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: p.stem)
def test_command_answers_help(path, helps):
    """``python -m tools.<name> --help`` from the root, in a fresh interpreter."""
    code, out, err = helps[path.stem]
    assert code == 0, f"tools.{path.stem} --help:\n{err[-3000:]}"
    assert out.startswith("usage: "), out[:500]


@pytest.mark.parametrize("path", LIBRARIES, ids=lambda p: p.stem)
def test_library_imports(path):
    module = importlib.import_module(f"tools.{path.stem}")
    if path.stem in ("book_extension", "student_edition"):  # Sphinx extensions
        assert callable(module.setup)


def deferred_imports(path: Path) -> list[tuple[str, str | None]]:
    """``(module, name)`` of every import inside a function or class of the module (name None
    for ``import module``): the imports that run only when that code does."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = set(tree.body)
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if node in top:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found += [(node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("path", [p for p in MODULES if deferred_imports(p)],
                         ids=lambda p: p.stem)
def test_deferred_imports_resolve(path):
    """lab_widgets_check.py imported ``CHROMIUM_ARGS`` inside main(), after parsing its
    arguments: ``--help`` passed while every real run failed. Each such import is resolved
    here (the module imported, the name looked up), without running the function."""
    for module_name, name in deferred_imports(path):
        module = importlib.import_module(module_name)
        if name is not None and not hasattr(module, name):
            importlib.import_module(f"{module_name}.{name}")  # a submodule, or ImportError


def test_a_missing_deferred_name_is_found(tmp_path):
    path = tmp_path / "tool.py"
    path.write_text("def main():\n    from tools.browser import NO_SUCH_NAME\n",
                    encoding="utf-8")
    assert deferred_imports(path) == [("tools.browser", "NO_SUCH_NAME")]
    with pytest.raises(ImportError):
        test_deferred_imports_resolve(path)


HELP_GUARD = 'if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then'


def first_command(text: str) -> str:
    """The first line of a script that does something: not a comment, not blank, not ``set``
    and not a variable's assignment."""
    for line in text.splitlines()[1:]:
        if line.strip() and not re.match(r"\s*(#|set\s|[A-Z_]+=)", line):
            return line
    return ""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_shell_script_parses_and_answers_help(path):
    """``bash -n`` parses it; its first command is the ``--help`` branch (so that asking for
    help never vendors, deletes or runs anything), and ``--help`` prints the header."""
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n")
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert first_command(text) == HELP_GUARD, f"{path.name}: --help is not its first command"
    proc = subprocess.run(["bash", str(path), "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    assert f"bash tools/{path.name}" in proc.stdout  # how to run it


def test_a_broken_tool_fails_to_start(tmp_path):
    """What the test sees when a tool's import is broken: exit code 1 and the ImportError
    (tools/lab_widgets_check.py once imported CHROMIUM_ARGS from a module that had lost it)."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "tools" / "broken.py").write_text(
        "import argparse\nfrom tools.paths import NO_SUCH_NAME\n\n"
        "if __name__ == '__main__':\n    argparse.ArgumentParser().parse_args()\n",
        encoding="utf-8")
    shutil.copy(TOOLS / "paths.py", tmp_path / "tools" / "paths.py")
    assert has_command_line(tmp_path / "tools" / "broken.py")
    proc = subprocess.run([sys.executable, "-m", "tools.broken", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "ImportError" in proc.stderr
