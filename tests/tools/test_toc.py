"""tools/toc.py: the one reader of _toc.yml (its pages, the notebook chapters, their numbers;
parts and sections included)."""

from __future__ import annotations

import pytest
import yaml

from tools import toc
from tools.paths import ROOT


def test_every_chapter_is_a_notebook_in_the_toc():
    toc_data = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    entries = [toc_data["root"],
               *(entry["file"] for part in toc_data["parts"] for entry in part["chapters"])]
    pages = [path.relative_to(ROOT).with_suffix("").as_posix() for path in toc.toc_files()]
    assert pages == entries
    chapters = [path.relative_to(ROOT).with_suffix("").as_posix() for path in toc.chapters()]
    plain = {"book/references", "book/instructor", "book/pitfalls", "book/faq",
             "book/grading"}  # no code
    assert chapters == [e for e in entries if e not in plain], chapters
    assert chapters[0] == "book/intro" and chapters[-1] == "book/glossary"
    assert [toc.chapter_number(p) for p in toc.chapters()] == list(
        range(1, len(chapters) + 1))
    assert toc.chapter_number(ROOT / "book" / "references.md") is None


def test_toc_entry_without_its_file_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "intro.md").write_text("# Intro\n", encoding="utf-8")
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nchapters:\n  - file: book/missing\n",
        encoding="utf-8")
    monkeypatch.setattr(toc, "ROOT", tmp_path)
    with pytest.raises(ValueError, match="book/missing.md"):
        toc.toc_files()
    (tmp_path / "_toc.yml").write_text(  # a book with parts is read too
        "format: jb-book\nroot: book/intro\nparts:\n  - chapters:\n    - file: book/intro\n",
        encoding="utf-8")
    assert toc.toc_files() == [tmp_path / "book" / "intro.md"] * 2


def test_toc_files_walks_parts_and_sections(tmp_path):
    for name in ("intro", "a", "b", "c"):
        (tmp_path / f"{name}.md").write_text("# x\n")
    (tmp_path / "_toc.yml").write_text(
        "# root: commented.md\nformat: jb-book\nroot: intro\nparts:\n"
        "  - caption: One\n    chapters:\n      - file: a\n        sections:\n"
        "          - file: b.md\n          - url: https://example.org\n"
        "  - caption: Two\n    chapters:\n      - file: c  # last\n")
    toc_yml = tmp_path / "_toc.yml"
    assert toc.toc_files(toc_yml) == [tmp_path / f"{n}.md" for n in ("intro", "a", "b", "c")]
    toc_yml.write_text(toc_yml.read_text() + "      - file: missing\n")
    with pytest.raises(ValueError, match="missing.md"):
        toc.toc_files(toc_yml)
    toc_yml.write_text("root: intro\nchapters:\n  - glob: '*'\n")
    with pytest.raises(ValueError, match="glob"):
        toc.toc_files(toc_yml)
