"""The students' notebooks: who handed in which (grading/gradebook.py names the student)
and which chapter each is (by its title, else its file name)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grading import gradebook
from grading.chapters import Chapter


@dataclass
class Submission:
    student: str
    path: Path
    notebook: str  # the path relative to the submissions folder, as the reports show it
    late: bool = False
    file_name: str = ""  # the notebook's own name (a platform's prefix removed)
    on_roster: bool = True


def find_submissions(folder: Path, roster: list[gradebook.Student] | None = None
                     ) -> list[Submission]:
    """Every .ipynb below ``folder`` (not in hidden folders or .ipynb_checkpoints), with its
    student (grading/gradebook.py's ``owner``; the roster's id when ``roster`` matches it)."""
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") or part == ".ipynb_checkpoints" for part in rel.parts):
            continue
        who = gradebook.owner(rel)
        student, on_roster = who.key, True
        if roster is not None:
            match = gradebook.match_roster(who, roster)
            student, on_roster = (match.id, True) if match else (who.key, False)
        found.append(Submission(student, path, rel.as_posix(), who.late, who.file_name,
                                on_roster))
    return found


def notebook_title(nb: nbformat.NotebookNode) -> str | None:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^# (.+)$", cell.source, re.MULTILINE)
            if match:
                return match[1].strip()
    return None


def match_chapter(nb: nbformat.NotebookNode, path: Path, chapters: dict[str, Chapter],
                  file_name: str = "") -> Chapter | None:
    """The chapter of a student's notebook: by its title, else by its file name."""
    title = notebook_title(nb)
    for chapter in chapters.values():
        if title == chapter.title:
            return chapter
    stem = Path(file_name or path.name).stem.lower()
    stem = re.sub(r"^copy of ", "", stem)
    stem = re.sub(r"\s*\(\d+\)$", "", stem)
    return chapters.get(stem) or chapters.get(re.sub(r"-\d+$", "", stem))
