"""flashlib as a user installs it: in a fresh virtual environment, `pip install .` needs numpy
only and runs the README's example; `pip install ".[bench]"` runs the benchmark, without torch.

Slow (about a minute; pip's cache is reused): `make test` and CI run it, `pytest -m "not slow"`
leaves it out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.paths import ROOT


def _readme_example() -> str:
    """The ```python block of the README's "The package" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The package", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run(args, cwd, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_CONSTRAINT"] = str(ROOT / "constraints.txt")  # the pinned versions: cache hits
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900, **kwargs)


@pytest.mark.slow
def test_install_numpy_only_then_the_bench_extra(tmp_path):
    # A copy of what the package is built from, so the build leaves nothing in the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    shutil.copytree(ROOT / "flashlib", src / "flashlib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet"]
    work = tmp_path / "work"  # run outside the checkout: flashlib comes from the venv
    work.mkdir()

    installed = _run([*pip, src], cwd=work)
    assert installed.returncode == 0, installed.stderr[-3000:]
    absent = ("matplotlib", "ipywidgets", "IPython", "torch", "threadpoolctl", "tqdm",
              "tabulate")
    check = ("import importlib.util, flashlib\n"
             f"print(flashlib.__version__, flashlib.__file__)\n"
             f"present = [m for m in {absent!r} if importlib.util.find_spec(m)]\n"
             "assert not present, present\n"
             # the widgets' JavaScript is package data (pyproject.toml)
             "from importlib import resources\n"
             "js = resources.files('flashlib.book').joinpath('js')\n"
             "assert {'frames.js', 'drawn.js', 'tiling.js'} <= {f.name for f in js.iterdir()}\n"
             # the exercises' declared mistakes (right answers with one change) stay behind
             "assert importlib.util.find_spec('flashlib.book.exercises.mistakes') is None\n")
    ran = _run([python, "-c", check + _readme_example()], cwd=work)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    version, location = ran.stdout.split()
    assert version == __import__("flashlib").__version__
    assert Path(location).is_relative_to(venv)
    # the benchmark without its extra: a message naming the extra, not a traceback
    bench = _run([python, "-m", "flashlib.bench", "cpu"], cwd=work)
    assert bench.returncode == 2 and "Traceback" not in bench.stderr
    assert 'pip install "flashlib[bench]"' in bench.stderr

    extra = _run([*pip, f"{src}[bench]"], cwd=work)
    assert extra.returncode == 0, extra.stderr[-3000:]
    bench = _run([python, "-m", "flashlib.bench", "cpu", "--n", "64", "--heads", "1",
                  "--repeats", "1", "--blocks", "16x16", "--no-peak"], cwd=work)
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-3000:]
    assert "torch is not installed" in bench.stdout and "flash_16x16" in bench.stdout
    assert (work / "bench-results" / "cpu.json").is_file()
