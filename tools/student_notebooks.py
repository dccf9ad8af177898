"""The student notebooks' repository: what the student edition's Colab links and set-up cells
point at (``<repository>-student``, tools/project.py's ``student_repository``), a place that
holds no solution, so that no edit of a link a student is given reaches one.

    python -m tools.student_notebooks build [OUT]   # default _build/student-notebooks
    python -m tools.student_notebooks check [OUT]   # what `build` wrote holds no solution
    make student-notebooks                          # both

OUT is laid out as the repository is published (its whole content, one commit per release,
tagged ``v<version>`` like the book's repository):

    README.md                 what it is, and where the book is
    NAME.ipynb                notebooks/student/NAME.ipynb, the student edition (no solution)
    ja/NAME.ipynb             notebooks/ja/student/NAME.ipynb, the same in Japanese
    wheels/flashlib-<version>-py3-none-any.whl
                              the library the set-up cell installs (the package only: no
                              chapter, notebook or declared mistake)

Publish it with the release (book/instructor.md's checklist): ``git init`` in OUT (or a clone
of the student repository with its files replaced), commit, ``git tag v<version>``, push with
the tag.  The reader's repository keeps notebooks/student/ too (a test compares them with the
chapters), but no link of the student edition names it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tools.colab import colab_link, release_ref, student_wheel_url, wheel_name
from tools.notebooks import STUDENT_NOTEBOOKS, folder
from tools.paths import ROOT
from tools.project import repository, student_repository, version

OUT = ROOT / "_build" / "student-notebooks"
#: What the wheel may hold: flashlib's package and its metadata.
WHEEL_PARTS = ("flashlib/", f"flashlib-{'{version}'}.dist-info/")
#: What the wheel must never hold: the checkers' declared mistakes (most of them a right
#: answer with one change), and any chapter or notebook.
WHEEL_NEVER = ("flashlib/book/exercises/mistakes/", ".md", ".ipynb")

README = """# {name}: the student notebooks

The notebooks of *FlashAttention from Scratch*, student edition (no solutions), release
{ref}, and the flashlib wheel their first cell installs on Colab.

Open a chapter in Colab: {first}

This repository is generated from the book's (`make student-notebooks`); do not edit it.
"""


def build(out: Path = OUT) -> Path:
    """Write the student notebooks' repository into ``out`` (emptied first)."""
    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    names = sorted(p.stem for p in STUDENT_NOTEBOOKS.glob("*.ipynb"))
    if not names:
        raise SystemExit("no notebooks/student/*.ipynb: run `make notebooks`")
    for name in names:
        shutil.copyfile(STUDENT_NOTEBOOKS / f"{name}.ipynb", out / f"{name}.ipynb")
    japanese = folder(student=True, lang="ja")
    if japanese.is_dir():
        (out / "ja").mkdir()
        for path in sorted(japanese.glob("*.ipynb")):
            shutil.copyfile(path, out / "ja" / path.name)
    with open(out / "README.md", "w", encoding="utf-8") as f:
        f.write(README.format(name=student_repository().rsplit("/", 1)[-1], ref=release_ref(),
                              first=colab_link("intro" if "intro" in names else names[0],
                                               student=True)))
    build_wheel(out / "wheels")
    return out


def build_wheel(folder: Path) -> Path:
    """flashlib's wheel (pip, no dependencies, the environment's setuptools; setuptools'
    build/ folder removed after, when it made one)."""
    scratch = ROOT / "build"
    had_scratch = scratch.exists()
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(folder), str(ROOT)], check=True)
    finally:
        if not had_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    wheel = folder / wheel_name()
    if not wheel.is_file():
        raise SystemExit(f"pip wrote no {wheel.name} into {folder}")
    return wheel


def problems(out: Path = OUT) -> list[str]:
    """What is wrong with the built repository: a file that should not be there, a wheel
    holding more than flashlib, a link or set-up cell pointing elsewhere than here."""
    found = []
    main = repository()[0].rstrip("/").removesuffix(".git")
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if path.is_dir():
            continue
        if not (rel == "README.md" or rel == f"wheels/{wheel_name()}"
                or (rel.removeprefix("ja/").count("/") == 0 and rel.endswith(".ipynb"))):
            found.append(f"{rel}: not a file of the student notebooks' repository")
            continue
        if rel.endswith(".ipynb"):
            text = path.read_text(encoding="utf-8")
            for start in (f"{main}/", f"{main}@", f"{main}.git",
                          "github/" + main.removeprefix("https://github.com/") + "/"):
                if start in text:
                    found.append(f"{rel}: names the reader's repository ({start})")
            if student_wheel_url() not in text and '"cell_type": "code"' in text:
                found.append(f"{rel}: its set-up cell does not install {student_wheel_url()}")
    wheel = out / "wheels" / wheel_name()
    if wheel.is_file():
        allowed = tuple(p.replace("{version}", version()) for p in WHEEL_PARTS)
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if not name.startswith(allowed) or any(
                        name.startswith(n) or name.endswith(n) for n in WHEEL_NEVER):
                    found.append(f"wheels/{wheel.name}: holds {name}")
    else:
        found.append(f"no wheels/{wheel_name()}")
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tools.student_notebooks",
        description="The student notebooks' repository (no solutions): build it, or check "
                    "what was built.")
    parser.add_argument("command", choices=["build", "check"])
    parser.add_argument("out", nargs="?", type=Path, default=OUT,
                        help="the folder (default _build/student-notebooks)")
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.out)
        print(f"wrote {args.out}")
    found = problems(args.out)
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
