"""Generate and check notebooks/*.ipynb, the clean notebook copies of the book's chapters.

    python scripts/notebooks.py write   # (make notebooks) regenerate notebooks/ from book/
    python scripts/notebooks.py check   # fail if notebooks/ drifted from book/, or a chapter
                                        # lacks the Colab set-up cell (scripts/colab_cell.md)

book/*.md (MyST Markdown notebooks listed in _toc.yml) are the single source. The generated
notebooks have no outputs and deterministic cell ids and metadata, so regenerating an unchanged
chapter gives a byte-identical file. The check compares cell types and sources only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
COLAB_CELL = ROOT / "scripts" / "colab_cell.md"
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def toc_files() -> list[Path]:
    """Source files of every page in _toc.yml, in order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    names = [toc["root"]]

    def walk(entries: list[dict]) -> None:
        for entry in entries:
            if "file" in entry:
                names.append(entry["file"])
            walk(entry.get("chapters", []) + entry.get("sections", []))
            for part in entry.get("parts", []):
                walk(part.get("chapters", []))

    walk(toc.get("chapters", []))
    for part in toc.get("parts", []):
        walk(part.get("chapters", []))
    return [ROOT / f"{name}.md" for name in names if (ROOT / f"{name}.md").is_file()]


def is_notebook(path: Path) -> bool:
    """A MyST Markdown notebook declares a kernelspec in its YAML front matter."""
    text = path.read_text(encoding="utf-8")
    return text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]


def chapters() -> list[Path]:
    return [path for path in toc_files() if is_notebook(path)]


def clean_notebook(source: Path) -> nbformat.NotebookNode:
    """The chapter as a notebook: no outputs, only the metadata Jupyter/Colab need."""
    nb = jupytext.read(source, fmt="md:myst")
    nb.metadata = nbformat.from_dict(
        {
            "kernelspec": KERNELSPEC,
            "language_info": {"name": "python"},
            "colab": {"provenance": []},
        }
    )
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
        tags = cell.metadata.get("tags")
        cell.metadata = nbformat.from_dict({"tags": tags} if tags else {})
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


def notebook_text(source: Path) -> str:
    return nbformat.writes(clean_notebook(source), version=4) + "\n"


def target(source: Path) -> Path:
    return NOTEBOOKS / f"{source.stem}.ipynb"


def cells_of(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in nb.cells]


def colab_cell() -> nbformat.NotebookNode:
    """The canonical set-up cell (scripts/colab_cell.md)."""
    (cell,) = jupytext.reads(COLAB_CELL.read_text(encoding="utf-8"), fmt="md:myst").cells
    return cell


def repository_url() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    return config["repository"]["url"]


def problems() -> list[str]:
    """Everything `check` complains about (empty list: all good)."""
    found = []
    setup = colab_cell()
    if f"git+{repository_url()}" not in setup.source:
        found.append(f"{COLAB_CELL.name}: does not install git+{repository_url()} (_config.yml)")
    sources = chapters()
    for source in sources:
        rel = source.relative_to(ROOT)
        nb = jupytext.read(source, fmt="md:myst")
        code = [c for c in nb.cells if c.cell_type == "code"]
        if not (
            code
            and code[0].source.strip() == setup.source.strip()
            and "remove-cell" in code[0].metadata.get("tags", [])
        ):
            found.append(
                f"{rel}: missing the Colab set-up cell; paste scripts/colab_cell.md verbatim "
                "as the first code cell"
            )
        out = target(source)
        if not out.is_file():
            found.append(f"{out.relative_to(ROOT)}: missing; run `make notebooks`")
            continue
        existing = nbformat.read(out, as_version=4)
        if cells_of(existing) != cells_of(clean_notebook(source)):
            found.append(f"{out.relative_to(ROOT)}: out of date with {rel}; run `make notebooks`")
        elif any(c.get("outputs") for c in existing.cells):
            found.append(f"{out.relative_to(ROOT)}: has outputs; run `make notebooks`")
    expected = {target(source).name for source in sources}
    for stale in sorted(NOTEBOOKS.glob("*.ipynb")):
        if stale.name not in expected:
            found.append(f"{stale.relative_to(ROOT)}: no chapter in _toc.yml; delete it")
    return found


def write() -> None:
    NOTEBOOKS.mkdir(exist_ok=True)
    for source in chapters():
        out = target(source)
        text = notebook_text(source)
        if not out.is_file() or out.read_text(encoding="utf-8") != text:
            out.write_text(text, encoding="utf-8")
            print(f"wrote {out.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["write", "check"])
    args = parser.parse_args(argv)
    if args.command == "write":
        write()
        return 0
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    if not found:
        print(f"notebooks/ in sync with {len(chapters())} chapters")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
