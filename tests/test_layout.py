"""The repository's layout holds: flashlib's layers (one import-linter ``layers`` contract, run
here so that `make check` and `make test` run it), the numeric layers' dependencies (numpy
only), every subpackage in a layer, and ruff clean."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from flashlib.book.exercises.registry import CHAPTERS
from tools.paths import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
NUMERIC_LAYERS = ("flashlib.core", "flashlib.algorithms", "flashlib.fast", "flashlib.studies")


def _contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["importlinter"]["contracts"]


def _contract(kind: str, name_start: str = "") -> dict:
    (contract,) = [c for c in _contracts()
                   if c["type"] == kind and c["name"].startswith(name_start)]
    return contract


def _layer_modules() -> list[set[str]]:
    return [{m.strip() for m in re.split(r"[|:]", layer)}
            for layer in _contract("layers")["layers"]]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert f"{len(_contracts())} kept, 0 broken" in result.stdout


def test_one_layers_contract_names_every_part_of_the_tree():
    """Each subpackage and top-level module of flashlib (other than __init__) sits in exactly one
    layer, so that a new one cannot escape the contract."""
    assert len([c for c in _contracts() if c["type"] == "layers"]) == 1
    package = ROOT / "flashlib"
    parts = {f"flashlib.{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    parts |= {f"flashlib.{p.stem}" for p in package.glob("*.py") if p.name != "__init__.py"}
    layers = _layer_modules()
    named = [m for layer in layers for m in layer]
    assert sorted(named) == sorted(set(named)), "a module is named in two layers"
    assert set(named) == parts, (f"missing from the layers: {parts - set(named)}; "
                                 f"not in the tree: {set(named) - parts}")
    assert layers[-1] == {"flashlib.core"}, "core is the ground floor"


def test_the_numeric_layers_need_numpy_only():
    contract = _contract("forbidden", "the numeric layers")
    assert tuple(contract["source_modules"]) == NUMERIC_LAYERS
    assert {"matplotlib", "ipywidgets", "IPython", "torch", "threadpoolctl", "tqdm", "tabulate",
            "yaml", "triton", "flash_attn", "ml_dtypes"} <= set(contract["forbidden_modules"])
    # the exceptions, each optional at run time (the contract's comment says why)
    assert contract["ignore_imports"] == ["flashlib.core.threads -> threadpoolctl",
                                          "flashlib.studies.precision -> ml_dtypes",
                                          "flashlib.core.accuracy -> ml_dtypes"]


def test_optional_imports_stay_optional():
    """threadpoolctl is imported inside a try (flashlib runs on one thread without it), and
    ml_dtypes only lazily by flashlib.core.accuracy (inside the function that needs it)."""
    threads = (ROOT / "flashlib" / "core" / "threads.py").read_text(encoding="utf-8")
    assert re.search(r"try:\n(\s+.*\n)*?\s+from threadpoolctl import", threads)
    accuracy = (ROOT / "flashlib" / "core" / "accuracy.py").read_text(encoding="utf-8")
    assert not re.search(r"^import ml_dtypes|^from ml_dtypes", accuracy, re.M)


@pytest.mark.parametrize(("module", "line", "culprit"), [
    ("core/masks.py", "import matplotlib.pyplot", "matplotlib"),
    ("fast/naive.py", "import ml_dtypes", "ml_dtypes"),
    ("core/hbm.py", "import flashlib.algorithms", "flashlib.algorithms"),  # upward
    ("algorithms.py", "import flashlib.fast.forward", "flashlib.fast"),  # siblings
    ("fast/forward.py", "import flashlib.studies.tiling", "flashlib.studies"),  # upward
    ("studies/tiling.py", "import flashlib.gpu.grid", "flashlib.gpu"),  # siblings
    ("bench/report.py", "from flashlib.book import glue", "flashlib.book"),  # siblings
    ("gpu/grid.py", "import torch", "torch"),
    ("gpu/kernels.py", "from flashlib.book import glue", "flashlib.book"),  # upward
    ("book/exercises/intro.py", "import grading", "grading"),  # the grader's side
    ("core/measure.py", "import tools", "tools"),
])
def test_a_forbidden_import_breaks_the_contracts(tmp_path, module, line, culprit):
    """The contracts can fail: a copy of the package with one forbidden import is refused
    (the other root packages, grading, tools and tests, as empty packages)."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "flashlib", tmp_path / "flashlib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for package in ("grading", "tools", "tests"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("", encoding="utf-8")
    path = tmp_path / "flashlib" / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}  # noqa\n", encoding="utf-8")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "BROKEN" in result.stdout and culprit in result.stdout


def test_ruff_check_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"ruff check failed:\n{result.stdout}\n{result.stderr}"


def test_readme_layout_lists_every_module():
    """Every module of flashlib has its row in README.md's layout table (the exercises and the
    chapters' diagram modules and the widgets' renderers as one row each); every row names
    something that exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Layout"):]
    rows = re.findall(r"^\| `([^`]+)`", table, re.M)
    listed = set()
    for row in rows:
        for part in re.split(r"`, `", row):
            listed.add(part)
    for path in sorted((ROOT / "flashlib").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("flashlib/book/exercises/") and path.stem in CHAPTERS:
            rel = (f"{path.parent.relative_to(ROOT).as_posix()}/<chapter>.py")
        elif rel.startswith("flashlib/book/chapters/") and path.name != "__init__.py":
            rel = "flashlib/book/chapters/<chapter>.py"
        assert rel in listed, f"README.md's layout table has no row for {rel}"
    for row in listed:
        if "<" not in row and not row.startswith(("_config", "lab/")):
            assert (ROOT / row.rstrip("/")).exists(), f"README.md lists {row}, which is gone"


def _imports_and_path_edits(folder: Path) -> tuple[list[str], list[str]]:
    """``(modules imported, sys.path edits)`` of every Python file below ``folder``, each as
    ``file: what``."""
    imports, edits = [], []
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imports += [f"{rel}: {alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imports.append(f"{rel}: {node.module}")
            elif isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.path":
                edits.append(f"{rel}: line {node.lineno}")
    return imports, edits


def test_flashlib_never_imports_the_grader_the_tools_or_the_tests():
    imports, _ = _imports_and_path_edits(ROOT / "flashlib")
    wrong = [i for i in imports if re.search(r": (grading|tools|tests)(\.|$)", i)]
    assert not wrong, wrong


def test_no_sys_path_edits():
    """grading/, tools/ and tests/ find each other as packages from the repository root
    (python -m, pytest's pythonpath, the grader's sandbox's PYTHONPATH), never by editing
    sys.path; outside tests/ not even in code written as a string (the sandbox's probe)."""
    for folder in ("grading", "tools", "tests", "flashlib"):
        _, edits = _imports_and_path_edits(ROOT / folder)
        assert not edits, f"sys.path used in {edits}"
    for folder in ("grading", "tools", "flashlib"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            assert not re.search(r"sys\.path\.(insert|append)|sys\.path\s*=", text), path
