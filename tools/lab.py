"""Keep lab/ (ignored by git), the learner's copies of the chapters' notebooks, up to date
without ever overwriting the learner's work. ``make lab`` runs it, then opens lab/ in
JupyterLab; the tracked notebooks/ are never opened, so running and editing cells leaves the
repository clean.

    python -m tools.lab            # sync lab/ with the chapters, say what changed
    python -m tools.lab --lang ja  # the Japanese edition's notebooks, in lab/ja/
    python -m tools.lab --dir DIR  # another folder

For each chapter (its notebook generated from book/, as `make notebooks` writes it):

- no ``lab/NAME.ipynb`` yet: written;
- one whose cells (types and sources) are still those it was written with (the learner ran
  cells, or nothing): replaced when the chapter changed (only outputs of earlier runs go);
- one the learner edited: kept as it is, and the chapter's new version written beside it as
  ``lab/NAME.book-<8 hex digits>.ipynb`` (once per version), with a message saying so.

``lab/.written.json`` records the hash of the cells of every notebook as written. A notebook it
does not know (a lab/ from before this script) counts as edited unless its cells are the
chapter's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import nbformat

from tools import notebooks
from tools.paths import ROOT
from tools.toc import chapters

LAB = ROOT / "lab"
RECORD = ".written.json"


def cells_hash(text: str) -> str:
    """Hash of a notebook's cell types and sources (not outputs, counts or metadata: running
    cells or expanding a collapsed one is not an edit)."""
    nb = nbformat.reads(text, as_version=4)
    cells = [[cell.cell_type, cell.source] for cell in nb.cells]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()


def chapter_notebooks(lang: str = "en") -> dict[str, str]:
    """``{file name: notebook text}`` of every chapter in ``lang``'s edition, generated from
    book/ (and, for another language, its catalogs in locales/) now."""
    return {notebooks.target(source, lang=lang).name: notebooks.notebook_text(source, lang=lang)
            for source in chapters()}


def lab_folder(lang: str = "en") -> Path:
    """Where ``make lab`` keeps the learner's copies: lab/, and lab/<lang>/ for another
    language (its own record of what was written)."""
    return LAB if lang == "en" else LAB / lang


def sync(lab: Path, chapters: dict[str, str]) -> list[str]:
    """Bring ``lab`` up to date with ``chapters`` (see the module docstring); returns one
    line per notebook written or kept."""
    lab.mkdir(parents=True, exist_ok=True)
    record_path = lab / RECORD
    record = json.loads(record_path.read_text(encoding="utf-8")) if record_path.is_file() else {}
    said = []
    for name, text in chapters.items():
        path = lab / name
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        new = cells_hash(text)
        if not path.is_file():
            path.write_text(text, encoding="utf-8")
            record[name] = new
            said.append(f"{shown}: written")
            continue
        current = cells_hash(path.read_text(encoding="utf-8"))
        if current == new:
            record[name] = new
            continue
        if record.get(name) == new:  # the learner's edits, and no new version of the chapter
            continue
        if current == record.get(name):  # not edited since written: the chapter changed
            path.write_text(text, encoding="utf-8")
            record[name] = new
            said.append(f"{shown}: updated to the book's new version (outputs cleared)")
            continue
        beside = path.with_name(f"{path.stem}.book-{new[:8]}.ipynb")
        if not beside.is_file():
            beside.write_text(text, encoding="utf-8")
        said.append(f"{shown}: kept, it has your edits; the book's new version is {beside.name}")
    record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n",
                           encoding="utf-8")
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lang", choices=notebooks.LANGUAGES, default="en",
                        help="the edition: en (lab/) or ja (lab/ja/)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="the learner's folder (default lab/, or lab/<lang>/)")
    args = parser.parse_args(argv)
    folder = args.dir or lab_folder(args.lang)
    for line in sync(folder, chapter_notebooks(args.lang)):
        print(line)
    print(f"{folder}: your copies of the notebooks (git ignores this folder)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
