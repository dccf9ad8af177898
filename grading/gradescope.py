"""The grader as a Gradescope autograder.

    python -m grading.gradescope FOLDER        # write the autograder's files into FOLDER
    python -m grading.gradescope run [--root /autograder]   # what run_autograder runs

FOLDER holds what Gradescope's autograder zip must hold (its "Autograder Specifications",
https://gradescope-autograders.readthedocs.io/en/latest/specs/): ``setup.sh`` (run once, as
root, when Gradescope builds the image: bubblewrap and a virtual environment with the book's
requirements), ``run_autograder`` (run per submission, in /autograder) and the checker files
(flashlib, the grader, the book's chapters and notebooks that the grader reads).  Zip the
folder's contents, not the folder.  Per submission, ``run`` grades the notebooks in
/autograder/submission with ``grading.grade`` (one student, every chapter it finds) and
writes /autograder/results/results.json in Gradescope's format: one test per exercise
(``name``, ``number``, ``score``, ``max_score``, ``status``, ``output``), the total ``score``
and ``execution_time``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.paths import ROOT

#: What the autograder needs of the repository (copied into the zip).
SOURCES = ("flashlib", "grading", "tools", "book", "notebooks", "_toc.yml", "_config.yml",
           "pyproject.toml", "requirements.txt", "constraints.txt", "references.bib",
           "README.md", "LICENSE")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "_build", ".ipynb_checkpoints")

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
set -euo pipefail
apt-get install -y python3 python3-venv bubblewrap
cd /autograder/source
python3 -m venv .venv
.venv/bin/python -m pip install --quiet -r requirements.txt -c constraints.txt
.venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this per submission; AUTOGRADER_ROOT and AUTOGRADER_PYTHON are for trying
# it outside Gradescope (a folder laid out like /autograder, another Python).
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
cd "$ROOT/source"
exec "${AUTOGRADER_PYTHON:-$ROOT/source/.venv/bin/python}" -m grading.gradescope run \\
    --root "$ROOT"
"""


def write_layout(folder: Path) -> None:
    """setup.sh, run_autograder and the checker files, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=IGNORED, dirs_exist_ok=True)
        elif source.is_file():
            shutil.copy2(source, folder / name)
    for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER)):
        (folder / name).write_text(text, encoding="utf-8")
        (folder / name).chmod(0o755)


def results_json(rows: list[Any], seconds: float) -> dict[str, Any]:
    """Gradescope's results.json of one student's graded rows: a test per exercise."""
    from grading.chapters import number_key

    exercises = sorted((r for r in rows if r.exercise), key=lambda r: (
        number_key(r.exercise), r.notebook))
    best: dict[str, Any] = {}
    for row in exercises:  # the best notebook's row of each exercise
        if row.exercise not in best or row.score > best[row.exercise].score:
            best[row.exercise] = row
    tests = []
    for number in sorted(best, key=number_key):
        row = best[number]
        said = row.first_problem or ("all checks passed" if row.passed else "")
        checks = (f" ({row.checks_passed}/{row.checks_total} checks)" if row.checks_total
                  else "")
        output = f"{row.status}{checks}: {said}" if said else row.status
        if row.notes:
            output += "\nNotes: " + "; ".join(row.notes)
        if not row.passed and row.feedback:
            output += "\n\n" + row.feedback.strip()
        tests.append({"name": f"Exercise {number}", "number": number,
                      "score": row.score, "max_score": 1.0,
                      "status": "passed" if row.passed else "failed",
                      "output": output, "visibility": "visible"})
    ungraded = [r for r in rows if not r.exercise]
    notes = [f"{r.notebook or r.chapter}: {r.status}: {r.first_problem}" for r in ungraded]
    return {"score": round(sum(t["score"] for t in tests), 4),
            "execution_time": int(round(seconds)),
            "output": ("Notebooks not graded:\n" + "\n".join(notes)) if notes else
            f"{sum(t['status'] == 'passed' for t in tests)} of {len(tests)} exercises passed.",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def student_id(root: Path) -> str:
    """The submitting student's id, from Gradescope's ``submission_metadata.json`` (its first
    user's ``sid``, else ``email``, else ``id``): the id their exercises' variants are drawn
    from (flashlib/book/exercises/variants.py); ``"student"`` when it names none."""
    try:
        meta = json.loads((root / "submission_metadata.json").read_text(encoding="utf-8"))
        user = meta["users"][0]
        found = str(user.get("sid") or user.get("email") or user.get("id") or "")
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        found = ""
    found = re.sub(r"[^\w.@+-]", "_", found).lstrip(".")[:100]
    return found or "student"


def run(root: Path, timeout: float | None = None) -> dict[str, Any]:
    """Grade ``root``/submission, write ``root``/results/results.json; its content.  The
    submission is graded as the student ``submission_metadata.json`` names (their id draws
    their variants)."""
    from grading.grade import grade

    started = time.monotonic()
    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        student = Path(tmp) / "submissions" / student_id(root)
        shutil.copytree(root / "submission", student, symlinks=True)
        rows = grade(Path(tmp) / "submissions", Path(tmp) / "report", timeout=timeout)
    found = results_json(rows, time.monotonic() - started)
    (results / "results.json").write_text(json.dumps(found, indent=1) + "\n",
                                          encoding="utf-8")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where to write the autograder's files, or `run`")
    parser.add_argument("--root", type=Path, default=Path("/autograder"),
                        help="with `run`: the autograder's folder (default /autograder)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="with `run`: CPU seconds per exercise")
    args = parser.parse_args(argv)
    if args.folder == "run":
        found = run(args.root, args.timeout)
        print(f"score {found['score']} of {len(found['tests'])}")
        return 0
    write_layout(Path(args.folder))
    print(f"wrote the autograder into {args.folder}/: zip its contents for Gradescope")
    return 0


if __name__ == "__main__":
    sys.exit(main())
