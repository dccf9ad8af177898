"""The grader's package starts: its commands answer ``--help`` (``python -m grading``,
``python -m grading.made_up_class``, ``python -m grading.instructor_files``), every module
imports, every import written inside a function resolves, and grading/README.md has a row for
every module."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

from tests.tools.test_tools_start import deferred_imports
from tools.paths import ROOT

PACKAGE = ROOT / "grading"
MODULES = sorted(p for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
COMMANDS = ["grading", "grading.made_up_class", "grading.instructor_files",
            "grading.gradescope"]


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[int, str, str]]:
    """``{command: (exit code, stdout, stderr)}`` of ``python -m COMMAND --help``, started all
    at once (fresh interpreters)."""
    procs = {command: subprocess.Popen([sys.executable, "-m", command, "--help"], cwd=ROOT,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
             for command in COMMANDS}
    outputs = {command: proc.communicate(timeout=300) for command, proc in procs.items()}
    return {command: (procs[command].returncode, *outputs[command]) for command in procs}


@pytest.mark.parametrize("command", COMMANDS)
def test_command_answers_help(command, helps):
    code, out, err = helps[command]
    assert code == 0, err[-3000:]
    assert out.startswith("usage: "), out[:500]


@pytest.mark.parametrize("path", [p for p in MODULES if p.stem != "__main__"],
                         ids=lambda p: p.stem)
def test_module_imports_and_its_deferred_imports_resolve(path):
    importlib.import_module(f"grading.{path.stem}")
    for module_name, name in deferred_imports(path):
        module = importlib.import_module(module_name)
        if name is not None and not hasattr(module, name):
            importlib.import_module(f"{module_name}.{name}")


def test_the_readme_lists_every_module():
    readme = (PACKAGE / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w_]+\.py)` \|", readme, re.M))
    assert listed == {p.name for p in MODULES}, (sorted(listed), [p.name for p in MODULES])


def test_the_sandbox_sees_the_worker_files():
    """The files the sandbox binds for the worker exist, and the worker imports nothing else
    of the repository's but flashlib."""
    from grading import sandbox

    for name in sandbox.WORKER_FILES:
        assert (ROOT / name).is_file(), name
    bound = {f"grading.{(ROOT / n).stem}" for n in sandbox.WORKER_FILES} - {"grading.__init__"}
    for name in sandbox.WORKER_FILES:
        source = (ROOT / name).read_text(encoding="utf-8")
        for module in re.findall(r"^\s*from (grading\.\w+|tools\b)", source, re.M):
            assert module in bound, f"{name} imports {module}, which the sandbox cannot see"


def test_the_declared_mistakes_are_hidden_from_the_students_code():
    """The exercises' declared mistakes (right answers with one change) are not in the
    sandbox (an empty read-only folder in their place), and an import of them is flagged."""
    from grading import lint, sandbox

    cmd = sandbox.bwrap_command("/usr/bin/bwrap", ROOT)
    hidden = str(ROOT / "flashlib" / "book" / "exercises" / "mistakes")
    at = cmd.index(hidden)
    assert cmd[at - 1] == "--tmpfs" and cmd[at + 1:at + 3] == ["--remount-ro", hidden]
    assert cmd.index("--ro-bind") < at  # after the package's own bind
    flags = lint.flags(["from flashlib.book.exercises.mistakes.backward import _fd\n"])
    assert flags and "declared mistakes" in flags[0]
