"""The package's layering: numerics need numpy only (import-linter's contracts, run here so
that `make test` runs them), and every numeric module is under the contract."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
#: The subpackages of flashlib that are not numerics (each forbidden to the numeric modules).
NOT_NUMERICS = {"book", "bench", "gpu"}


def _contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["importlinter"]["contracts"]


def _numerics_contract() -> dict:
    (contract,) = [c for c in _contracts() if c["name"].startswith("numerics need numpy only")]
    return contract


def _ml_dtypes_contract() -> dict:
    (contract,) = [c for c in _contracts() if c["name"].startswith("ml_dtypes only")]
    return contract


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "5 kept, 0 broken" in result.stdout


def test_every_numeric_module_is_under_the_contract():
    """A new top-level module of flashlib is numerics, so it must be listed (a new subpackage
    must be listed or be one of the non-numeric ones)."""
    listed = set(_numerics_contract()["source_modules"])
    package = ROOT / "flashlib"
    modules = {"flashlib"} | {f"flashlib.{p.stem}" for p in package.glob("*.py")
                              if p.name != "__init__.py"}
    subpackages = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert modules <= listed, f"add to [tool.importlinter] source_modules: {modules - listed}"
    assert listed <= modules, f"listed but not a module of flashlib: {listed - modules}"
    assert subpackages == NOT_NUMERICS, (
        f"flashlib's subpackages are {sorted(subpackages)}; a numeric subpackage must be added "
        "to the contract's source_modules")
    forbidden = set(_numerics_contract()["forbidden_modules"])
    for name in NOT_NUMERICS:
        assert {f"flashlib.{name}", f"flashlib.{name}.**"} <= forbidden, name
    assert {"matplotlib", "ipywidgets", "IPython", "torch", "threadpoolctl", "tqdm", "tabulate",
            "yaml", "triton", "flash_attn"} <= forbidden


def test_ml_dtypes_stays_optional():
    """Only flashlib.precision and flashlib.fp8 import ml_dtypes (flashlib.accuracy lazily):
    every other numeric module is under the contract that forbids it."""
    contract = _ml_dtypes_contract()
    numerics = set(_numerics_contract()["source_modules"])
    optional = {"flashlib.precision", "flashlib.fp8", "flashlib.accuracy"}
    assert set(contract["source_modules"]) == numerics - optional
    assert {"ml_dtypes", "flashlib.precision", "flashlib.fp8"} <= set(
        contract["forbidden_modules"])


def test_threadpoolctl_is_the_one_optional_exception():
    """Only flashlib._threads may import threadpoolctl, and only inside a try: the numerics
    run without it (on one thread)."""
    assert _numerics_contract().get("ignore_imports") == ["flashlib._threads -> threadpoolctl"]
    for path in (ROOT / "flashlib").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path.name != "_threads.py":
            assert "threadpoolctl import" not in text and "import threadpoolctl" not in text
    text = (ROOT / "flashlib" / "_threads.py").read_text(encoding="utf-8")
    before = text.split("from threadpoolctl import", 1)[0].rstrip().splitlines()[-1]
    assert before.strip() == "try:", before


@pytest.mark.parametrize(("module", "line", "culprit"), [
    ("masks.py", "import matplotlib.pyplot", "matplotlib"),
    ("naive.py", "import ml_dtypes", "ml_dtypes"),
    ("__init__.py", "from flashlib.precision import round_to", "flashlib.precision"),
    ("flash.py", "import threadpoolctl", "threadpoolctl"),
    ("__init__.py", "from flashlib.book.widgets import interactive_figure", "flashlib.book"),
    ("bench/report.py", "from flashlib.book import glue", "flashlib.book"),
    ("flash.py", "import flashlib.gpu.device", "flashlib.gpu"),
    ("gpu/grid.py", "import torch", "torch"),
    ("gpu/kernels.py", "from flashlib.book import glue", "flashlib.book"),
])
def test_a_forbidden_import_breaks_the_contracts(tmp_path, module, line, culprit):
    """The contracts can fail: a copy of the package with one forbidden import is refused."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "flashlib", tmp_path / "flashlib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "flashlib" / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}  # noqa\n", encoding="utf-8")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "BROKEN" in result.stdout and culprit in result.stdout
