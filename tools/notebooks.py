"""Write and check notebooks/*.ipynb, the clean notebook copies of the book's chapters.

    python -m tools.notebooks write   # (make notebooks) regenerate notebooks/ from book/
    python -m tools.notebooks check   # fail if notebooks/ drifted from book/ (or from the
                                        # version in pyproject.toml, the URL in _config.yml)

Both also cover notebooks/student/*.ipynb, the student edition: the same notebooks without
their solutions (tools/student.py), committed so that the student site's "Open in Colab"
links and a teacher's hand-out have a URL; and the Japanese edition's, notebooks/ja/*.ipynb
and notebooks/ja/student/*.ipynb (the prose from locales/ja, tools/ja_edition.py).

book/*.md (MyST Markdown notebooks listed in _toc.yml, tools/toc.py) are the single source;
tools/convert.py turns each into its notebook (what the notebooks add to the chapters is
listed there). The check compares cell types, sources and metadata against the same
conversion, so a notebook also drifts when code shown with literalinclude, the version or the
repository URL changes; it also fails on a notebook with outputs, on a notebook without its
chapter, and on a chapter with a Colab set-up cell of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jupytext
import nbformat

from tools.colab import COLAB_CELL, has_setup_cell
from tools.convert import clean_notebook
from tools.paths import NOTEBOOKS, ROOT
from tools.toc import chapters

STUDENT_NOTEBOOKS = NOTEBOOKS / "student"
#: The editions' languages: English in notebooks/, the others in notebooks/<lang>/.
LANGUAGES = ("en", "ja")


def folder(*, student: bool = False, lang: str = "en") -> Path:
    base = NOTEBOOKS if lang == "en" else NOTEBOOKS / lang
    return base / "student" if student else base


def target(source: Path, *, student: bool = False, lang: str = "en") -> Path:
    """Where a chapter's notebook goes: notebooks/NAME.ipynb, or notebooks/student/, or
    notebooks/ja/ and notebooks/ja/student/ for the Japanese edition."""
    return folder(student=student, lang=lang) / f"{source.stem}.ipynb"


def notebook_text(source: Path, *, student: bool = False, lang: str = "en") -> str:
    """The chapter's notebook as `write` saves it (the student edition's with ``student``)."""
    return nbformat.writes(clean_notebook(source, student=student, lang=lang),
                           version=4) + "\n"


def cells_of(nb: nbformat.NotebookNode) -> list[tuple[str, str, str]]:
    """What makes two notebooks the same chapter: each cell's type, source and metadata."""
    return [(cell.cell_type, cell.source.strip(), json.dumps(cell.metadata, sort_keys=True))
            for cell in nb.cells]


def problems(*, student: bool = False, lang: str = "en") -> list[str]:
    """Everything `check` complains about in notebooks/ (notebooks/student/ with
    ``student``, notebooks/<lang>/ for another language); an empty list: all good."""
    found = []
    sources = chapters()
    where = folder(student=student, lang=lang)
    for source in sources:
        rel = source.relative_to(ROOT)
        if not student and has_setup_cell(jupytext.read(source, fmt="md:myst")):
            found.append(f"{rel}: has a Colab set-up cell; delete it (the notebooks get "
                         f"{COLAB_CELL.relative_to(ROOT)}, generated)")
        out = target(source, student=student, lang=lang)
        if not out.is_file():
            found.append(f"{out.relative_to(ROOT)}: missing; run `make notebooks`")
            continue
        existing = nbformat.read(out, as_version=4)
        if cells_of(existing) != cells_of(clean_notebook(source, student=student,
                                                         lang=lang)):
            found.append(f"{out.relative_to(ROOT)}: out of date with {rel}; run `make notebooks`")
        elif any(c.get("outputs") for c in existing.cells):
            found.append(f"{out.relative_to(ROOT)}: has outputs; run `make notebooks` (your "
                         "own runs belong in lab/: `make lab`)")
    expected = {target(source).name for source in sources}
    for stale in sorted(where.glob("*.ipynb")):
        if stale.name not in expected:
            found.append(f"{stale.relative_to(ROOT)}: no chapter in _toc.yml; delete it")
    return found


def write(*, student: bool = False, lang: str = "en") -> None:
    """Write every chapter's notebook that changed (into notebooks/student/ with ``student``,
    notebooks/<lang>/ for another language)."""
    folder(student=student, lang=lang).mkdir(parents=True, exist_ok=True)
    for source in chapters():
        out = target(source, student=student, lang=lang)
        text = notebook_text(source, student=student, lang=lang)
        if not out.is_file() or out.read_text(encoding="utf-8") != text:
            out.write_text(text, encoding="utf-8")
            print(f"wrote {out.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["write", "check"])
    args = parser.parse_args(argv)
    if args.command == "write":
        for lang in LANGUAGES:
            write(lang=lang)
            write(student=True, lang=lang)
        return 0
    found = [p for lang in LANGUAGES for student in (False, True)
             for p in problems(student=student, lang=lang)]
    for problem in found:
        print(problem, file=sys.stderr)
    if not found:
        print(f"notebooks/ in sync with {len(chapters())} chapters")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
