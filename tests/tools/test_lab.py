"""`make lab` (tools/lab.py): the learner works in lab/, ignored by git; a chapter that
changed replaces only copies the learner did not edit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import nbformat

from tools import lab
from tools.paths import ROOT


def chapter(text: str) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A chapter", id="title"),
                nbformat.v4.new_code_cell(text, id="code")]
    return nbformat.writes(nb)


def run_all(path: Path) -> None:
    """What JupyterLab saves after Run All: outputs, counts, a cell expanded."""
    nb = nbformat.read(path, as_version=4)
    code = nb.cells[1]
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="2\n")]
    code.execution_count = 1
    code.metadata["jupyter"] = {"source_hidden": False}
    nbformat.write(nb, path)


def edit(path: Path, source: str) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = source
    nbformat.write(nb, path)


def test_copy_run_refresh_edit_keep(tmp_path):
    folder = tmp_path / "lab"
    v1, v2, v3 = chapter("x = 1"), chapter("x = 2"), chapter("x = 3")
    said = lab.sync(folder, {"a.ipynb": v1, "b.ipynb": v1})
    assert (folder / "a.ipynb").read_text() == v1 and len(said) == 2
    assert lab.sync(folder, {"a.ipynb": v1, "b.ipynb": v1}) == []  # nothing to do

    run_all(folder / "a.ipynb")  # only ran: refreshed when the chapter changes
    edit(folder / "b.ipynb", "x = 1  # my answer")  # edited: never overwritten
    assert lab.sync(folder, {"a.ipynb": v1, "b.ipynb": v1}) == []  # the book did not change
    assert sorted(p.name for p in folder.iterdir()) == [".written.json", "a.ipynb", "b.ipynb"]
    said = lab.sync(folder, {"a.ipynb": v2, "b.ipynb": v2})
    assert (folder / "a.ipynb").read_text() == v2
    assert "my answer" in (folder / "b.ipynb").read_text()
    beside = folder / f"b.book-{lab.cells_hash(v2)[:8]}.ipynb"
    assert beside.read_text() == v2
    assert any("kept, it has your edits" in line and beside.name in line for line in said)

    edit(folder / "b.ipynb", "x = 1  # my answer, improved")  # still theirs, version 3 beside
    said = lab.sync(folder, {"a.ipynb": v3, "b.ipynb": v3})
    assert "improved" in (folder / "b.ipynb").read_text()
    assert (folder / f"b.book-{lab.cells_hash(v3)[:8]}.ipynb").read_text() == v3
    assert beside.read_text() == v2  # an earlier version beside it is left alone too


def test_unknown_copy_counts_as_edited_unless_it_is_the_chapter(tmp_path):
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "a.ipynb").write_text(chapter("mine"), encoding="utf-8")
    (folder / "b.ipynb").write_text(chapter("x = 1"), encoding="utf-8")
    lab.sync(folder, {"a.ipynb": chapter("x = 1"), "b.ipynb": chapter("x = 1")})
    assert "mine" in (folder / "a.ipynb").read_text()
    assert sorted(p.name for p in folder.glob("*.book-*.ipynb")) == [
        f"a.book-{lab.cells_hash(chapter('x = 1'))[:8]}.ipynb"]
    # b was the chapter: now known, so a later change of the chapter refreshes it
    lab.sync(folder, {"a.ipynb": chapter("x = 1"), "b.ipynb": chapter("x = 2")})
    assert (folder / "b.ipynb").read_text() == chapter("x = 2")


def test_lab_folder_is_ignored_and_holds_the_generated_chapters():
    paths = ["lab/intro.ipynb", "lab/.written.json", "lab/.ipynb_checkpoints/x.ipynb"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True,
                             text=True)
    assert ignored.stdout.split() == paths, "lab/ must be in .gitignore"
    assert lab.LAB == ROOT / "lab"
    generated = lab.chapter_notebooks()
    committed = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "notebooks").glob(
        "*.ipynb")}
    assert generated == committed  # the same notebooks as notebooks/ (when in sync)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    lab_recipe = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    assert "-m tools.lab" in lab_recipe and "jupyter lab lab/" in lab_recipe
    assert "notebooks/" not in lab_recipe


def test_make_lab_edition_ja_gives_the_japanese_notebooks_in_their_own_folder(tmp_path):
    """`make lab EDITION=ja`: the Japanese notebooks (notebooks/ja/, generated from the
    catalogs), kept in lab/ja/ with their own record, beside the English copies."""
    generated = lab.chapter_notebooks("ja")
    committed = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "notebooks" / "ja").glob(
        "*.ipynb")}
    assert generated == committed  # the same notebooks as notebooks/ja/ (when in sync)
    assert lab.lab_folder("ja") == lab.LAB / "ja"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "-m tools.lab --lang $(EDITION)" in makefile.split("\nlab:", 1)[1].split("\n\n")[0]
    english = {"intro.ipynb": chapter("x = 1")}
    lab.sync(tmp_path, english)
    lab.sync(tmp_path / "ja", {"intro.ipynb": chapter("x = 2")})
    assert nbformat.read(tmp_path / "intro.ipynb", as_version=4).cells[1].source == "x = 1"
    assert (tmp_path / "ja" / ".written.json").is_file()
