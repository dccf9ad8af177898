"""The book's table of contents (_toc.yml): its pages in order, which of them are notebook
chapters, each chapter's number and each page's title. The one reader of _toc.yml: the
notebooks, the site's extensions, the grader and the tests all ask it."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml

from tools.paths import ROOT


def toc_files(toc: Path | None = None) -> list[Path]:
    """Source files of every page of a Jupyter Book table of contents (default: the book's
    _toc.yml), in order: the ``root``, then the ``file:`` entries of ``chapters``, of
    ``parts``' chapters and of ``sections``, at any depth (``url:`` entries are not pages).
    An entry names its file relative to the toc's folder, ``.md`` implied.  ValueError for an
    entry without its file, or a ``glob:`` entry (the book lists its pages one by one)."""
    toc = ROOT / "_toc.yml" if toc is None else Path(toc)
    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    names = [data["root"]]

    def walk(entries: list[dict]) -> None:
        for entry in entries:
            if "glob" in entry:
                raise ValueError(f"{toc.name}: glob entries are not supported ({entry['glob']})")
            if "file" in entry:
                names.append(entry["file"])
            walk(entry.get("sections", []))

    walk(data.get("chapters", []))
    for part in data.get("parts", []):
        walk(part.get("chapters", []))
    paths = []
    for name in names:
        rel = Path(name) if Path(name).suffix in (".md", ".ipynb") else Path(f"{name}.md")
        path = toc.parent / rel
        if not path.is_file():
            raise ValueError(f"{toc.name} lists {name}, but there is no {rel.as_posix()}")
        paths.append(path)
    return paths


def is_notebook(path: Path) -> bool:
    """A MyST Markdown notebook (``.md``) declares a kernelspec in its YAML front matter."""
    text = path.read_text(encoding="utf-8")
    head = text.split("\n---", 1)[0]
    return path.suffix == ".md" and head.startswith("---") and "kernelspec:" in head


def chapters() -> list[Path]:
    """The pages of the toc that are notebooks (`is_notebook`), in order: the chapters."""
    return [path for path in toc_files() if is_notebook(path)]


def chapter_number(path: Path) -> int | None:
    """The chapter's number: its rank among the notebook chapters of _toc.yml, from 1 (the
    root, the Introduction, is chapter 1); None for a page that is not one.  Exercises are
    numbered "Exercise <chapter>.<k>" with it, on the site (tools/book_extension.py) and in
    the notebooks (tools/convert.py)."""
    resolved = Path(path).resolve()
    for number, chapter in enumerate(chapters(), 1):
        if chapter.resolve() == resolved:
            return number
    return None


@cache
def page_titles() -> dict[str, tuple[str, bool]]:
    """Every page of the toc, ``path relative to ROOT without .md -> (title, is a notebook)``."""
    titles = {}
    for path in toc_files():
        heading = re.search(r"^# (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
        rel = path.relative_to(ROOT).with_suffix("").as_posix()
        titles[rel] = (heading.group(1).strip() if heading else path.stem, is_notebook(path))
    return titles
