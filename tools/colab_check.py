"""Run every notebook of notebooks/ as a learner on Colab would, in fresh virtual environments.

    .venv/bin/python -m tools.colab_check                  # both environments (.ci/run)
    .venv/bin/python -m tools.colab_check --env colab      # one of them
    .venv/bin/python -m tools.colab_check --keep           # keep the folder to look inside
    .venv/bin/python -m tools.colab_check --python .venv/bin/python   # no new venv: run the
                                                     # notebooks and checks in that one

For each environment: a new venv in a temporary folder outside the repository, the packages
Colab preinstalls that the book uses, at Colab's versions (``COLAB``: ipywidgets 7.7.1, IPython
7.34, ipykernel 6.17.1, ...), then flashlib installed *non-editable* from a copy of this checkout
with its ``book`` extra, exactly as the notebooks' set-up cell installs it on Colab (no ``-U``:
the check fails if that install changes any preinstalled package). Then:

- ``tests/book/test_widgets.py`` runs in that venv (the widget's display bundle under
  ipywidgets 7), copied into the temporary folder so that it imports the installed flashlib;
- every notebook runs with nbclient from a temporary working folder, in a kernel of that venv
  (the Japanese ones, notebooks/ja/, too, in the ``colab`` environment, where a checker's
  verdict in English is a problem);
  any cell error fails the check, and so does any of these after the run: a traceback or an
  error in a stream; a widget cell whose output is not a live widget view; a markdown cell
  that cites a glued number (``{glue}`` in book/) that no code cell before it printed as
  ``name = value``; without torch, a ladder chapter that does not say that torch is missing.

Environments: ``colab`` (with torch 2.13.0 CPU and threadpoolctl, as on Colab) and
``colab-no-torch`` (the same without either: what ``pip install "flashlib[book]"`` guarantees).
pip's cache is reused (nothing here passes ``--no-cache-dir``). Prints every package version
and the time of each step; exits 1 on any problem.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools import notebooks
from tools.convert import glue_citations
from tools.paths import ROOT
from tools.toc import chapters

#: What a Colab runtime preinstalls, at its versions, among the packages the book uses or that
#: shape how a notebook runs there (the kernel, IPython, the widget library, the old notebook
#: server that pins jupyter-client < 8). Python itself is this machine's.
COLAB = [
    "numpy==2.0.2",
    "matplotlib==3.10.0",
    "ipywidgets==7.7.1",
    "ipykernel==6.17.1",
    "ipython==7.34.0",
    "notebook==6.5.7",
    "tabulate==0.9.0",
    "pytest==8.3.5",
]
TORCH = ["torch==2.13.0", "threadpoolctl==3.6.0"]
ENVS = {"colab": COLAB + TORCH, "colab-no-torch": COLAB}
#: Packages whose versions the report lists (and that installing flashlib must not change).
WATCHED = ["numpy", "matplotlib", "ipywidgets", "ipykernel", "ipython", "jupyter-client",
           "notebook", "tabulate", "torch", "threadpoolctl", "pytest", "flashlib"]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: The widget tests run in each venv: flashlib.book.widgets' display bundles, without a kernel.
WIDGET_TESTS = ROOT / "tests" / "book" / "test_widgets.py"
CELL_TIMEOUT = 600


def log(message: str) -> None:
    print(message, flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Run ``cmd``; on failure print its output and raise."""
    result = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        sys.stdout.write(result.stdout + result.stderr)
        raise RuntimeError(f"command failed ({result.returncode}): {' '.join(cmd)}")
    return result


def installed(python: Path) -> dict[str, str]:
    """``{normalised name: version}`` of every package in the venv of ``python``."""
    out = run([str(python), "-m", "pip", "list", "--format", "json"]).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


def source_copy(dest: Path) -> Path:
    """What pip needs to build flashlib, copied out of the checkout (a build in the checkout
    itself would leave build/ and *.egg-info there)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(ROOT / "flashlib", dest / "flashlib", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, dest / name)
    return dest


def make_env(name: str, packages: list[str], tmp: Path) -> Path:
    """A fresh venv with ``packages`` and then flashlib[book]; returns its python."""
    venv = tmp / f"venv-{name}"
    t0 = time.perf_counter()
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages])
    before = installed(python)
    src = source_copy(tmp / f"src-{name}")
    run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         f"{src}[book]"])
    after = installed(python)
    changed = {p: (v, after.get(p)) for p, v in before.items() if after.get(p) != v}
    if changed:
        raise RuntimeError(f"installing flashlib[book] changed preinstalled packages: {changed}")
    location = run([str(python), "-c", "import flashlib; print(flashlib.__file__)"],
                   cwd=tmp).stdout.strip()
    if not location.startswith(str(venv)):
        raise RuntimeError(f"flashlib imported from {location}, not from the venv")
    versions = ", ".join(f"{p} {after[p]}" for p in WATCHED if p in after)
    log(f"[{name}] venv ready in {time.perf_counter() - t0:.0f} s: Python "
        f"{sys.version_info.major}.{sys.version_info.minor}, {versions}")
    return python


def widget_tests(name: str, python: Path, tmp: Path) -> list[str]:
    """tests/book/test_widgets.py in the venv, against the installed flashlib (not the
    checkout): a copy in ``tmp``, since pytest puts the root of a test's package (here the
    checkout, tests/ being a package) first on sys.path."""
    if "pytest" not in installed(python):
        return []
    ini = tmp / "pytest.ini"
    # warnings are errors, as in the suite, except the deprecations that Colab's older
    # packages raise among themselves (pyparsing's, under matplotlib 3.10.0)
    ini.write_text("[pytest]\nfilterwarnings =\n    error\n    ignore::DeprecationWarning\n",
                   encoding="utf-8")
    shutil.copy(WIDGET_TESTS, tmp / WIDGET_TESTS.name)
    t0 = time.perf_counter()
    result = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
         "-c", str(ini), "--rootdir", str(tmp), str(tmp / WIDGET_TESTS.name)],
        capture_output=True, text=True, cwd=tmp,
    )
    summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    label = WIDGET_TESTS.relative_to(ROOT)
    log(f"[{name}] {label}: {summary} ({time.perf_counter() - t0:.0f} s)")
    if result.returncode != 0:
        sys.stdout.write(result.stdout[-6000:] + result.stderr[-2000:])
        return [f"{name}: {label} failed"]
    return []


def kernel_manager(python: Path, tmp: Path):
    """A jupyter_client KernelManager whose kernel is ``python``'s ipykernel."""
    import zmq
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    kernels = tmp / "kernels"
    spec = kernels / "flashlib-check"
    spec.mkdir(parents=True, exist_ok=True)
    # the venv's own kernelspec says whether its ipykernel accepts encryption keys (7 does)
    prefix = run([str(python), "-c", "import sys; print(sys.prefix)"]).stdout.strip()
    own = Path(prefix) / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    metadata = json.loads(own.read_text(encoding="utf-8")).get("metadata", {}) if (
        own.is_file()) else {}
    env = {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}  # the debugger's start-up warning
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "flashlib check", "language": "python", "env": env,
        "metadata": metadata,
    }), encoding="utf-8")
    km = KernelManager(kernel_name="flashlib-check",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    if "transport_encryption" in km.trait_names() and zmq.has("curve"):
        km.transport_encryption = "auto"  # no "running over TCP without encryption" warning
    return km


def output_text(output) -> str:
    if output.output_type == "stream":
        return output.text
    data = output.get("data", {})
    return data.get("text/plain", "") + data.get("text/markdown", "")


def check_outputs(name: str, source: Path, nb, torch: bool, lang: str = "en") -> list[str]:
    """What must hold in an executed notebook (see the module docstring)."""
    problems = []
    english_verdict = re.compile(r"^(PASSED|NOT YET) ", re.MULTILINE)
    cited = glue_citations(source)
    printed: set[str] = set()
    for index, cell in enumerate(nb.cells):
        where = f"{name}: {source.stem} cell {index}"
        if cell.cell_type == "markdown":
            missing = [g for g in cited.get(cell.id, []) if g not in printed]
            if missing:
                problems.append(f"{where}: cites {missing}, not printed by a cell before it")
            continue
        if cell.cell_type != "code":
            continue
        for output in cell.outputs:
            text = output_text(output)
            printed.update(re.findall(r"^(\w+) = ", text, re.MULTILINE))
            if output.output_type == "stream" and output.name == "stderr":
                problems.append(f"{where}: wrote to stderr: {output.text.strip()[:300]}")
            if output.output_type == "error":
                problems.append(f"{where}: {output.ename}: {output.evalue[:300]}")
            elif "Traceback" in text or re.search(r"^\w+(Error|Warning):", text, re.MULTILINE):
                problems.append(f"{where}: an error in its output: {text.strip()[:300]}")
            elif lang == "ja" and english_verdict.search(text):
                problems.append(f"{where}: a checker's verdict in English in the Japanese "
                                f"notebook: {text.strip()[:200]}")
        if "interactive_figure(" in cell.source and not cell.source.lstrip().startswith("def"):
            views = [o for o in cell.outputs if WIDGET_VIEW in o.get("data", {})]
            if not views or not all(o.data[WIDGET_VIEW].get("model_id") for o in views):
                problems.append(f"{where}: no live widget view in its output")
        if "svg_figure(" in cell.source and not cell.source.lstrip().startswith("def"):
            drawn = [o for o in cell.outputs
                     if "flashlib-ifig-svg" in o.get("data", {}).get("text/html", "")]
            if not drawn:
                problems.append(f"{where}: no drawn figure (svg_figure's HTML) in its output")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    if not torch and re.search(r"torch_available|import torch", code):
        texts = [output_text(o) for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        if not any("torch is not installed" in t for t in texts):
            problems.append(f"{name}: {source.stem} does not say that torch is not installed")
    return problems


def run_notebooks(name: str, python: Path, tmp: Path, torch: bool,
                  lang: str = "en") -> list[str]:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    problems = []
    for source in chapters():
        path = notebooks.target(source, lang=lang)
        work = tmp / f"work-{name}-{lang}"  # outside the repository, as on Colab (/content)
        work.mkdir(exist_ok=True)
        nb = nbformat.read(path, as_version=4)
        km = kernel_manager(python, tmp)
        client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT,
                                resources={"metadata": {"path": str(work)}})
        t0 = time.perf_counter()
        try:
            client.execute()
        except CellExecutionError as error:
            problems.append(f"{name}: {path.name}: {str(error).strip()[-1500:]}")
            log(f"[{name}] {path.relative_to(notebooks.NOTEBOOKS)}: FAILED after "
                f"{time.perf_counter() - t0:.0f} s")
            continue
        finally:
            if km.has_kernel:  # nbclient leaves the kernel of a manager it was given
                km.shutdown_kernel(now=True)
        found = check_outputs(name, source, nb, torch, lang)
        problems += found
        log(f"[{name}] {path.relative_to(notebooks.NOTEBOOKS)}: ran in "
            f"{time.perf_counter() - t0:.0f} s"
            + (f", {len(found)} problems" if found else ""))
        nbformat.write(nb, work / path.name)  # executed copy, to look at with --keep
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=list(ENVS), action="append",
                        help="environment(s) to check (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--python", type=Path,
                        help="run in this existing environment instead (no venv, no install)")
    args = parser.parse_args(argv)
    os.environ.pop("FLASHLIB_STATIC_WIDGETS", None)  # the live widgets, as on Colab
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="flashlib-colab-check-"))
    problems: list[str] = []
    try:
        if args.python:
            python = args.python.absolute()
            torch = subprocess.run([str(python), "-c", "import torch"]).returncode == 0
            problems += run_notebooks("given", python, tmp, torch=torch)
            problems += run_notebooks("given", python, tmp, torch=torch, lang="ja")
        for name in [] if args.python else args.env or list(ENVS):
            python = make_env(name, ENVS[name], tmp)
            problems += widget_tests(name, python, tmp)
            with_torch = "torch==2.13.0" in ENVS[name]
            problems += run_notebooks(name, python, tmp, torch=with_torch)
            if with_torch:  # the Japanese notebooks (notebooks/ja/), in Colab's environment
                problems += run_notebooks(name, python, tmp, torch=True, lang="ja")
    finally:
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for problem in problems:
        print(f"PROBLEM {problem}", file=sys.stderr)
    log(f"colab check: {len(problems)} problems in {time.perf_counter() - start:.0f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
