"""The students' notebooks: who handed in which (grading/gradebook.py names the student)
and which chapter each is (by its title, else its file name)."""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from datetime import datetime
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
    submitted: datetime | None = None  # when it was handed in, where known


@dataclass
class Skipped:
    """A file or folder of the submissions that is not graded as anyone's: a link."""

    path: str  # relative to the submissions folder
    why: str


def _walk(folder: Path, skipped: list[Skipped]) -> list[Path]:
    """The .ipynb files below ``folder`` that are its own: symbolic links (to files or
    folders), hard-linked files (more than one name for the same file: a classmate's or the
    instructor's file under a second name) and anything whose real path is outside
    ``folder`` are left out, each added to ``skipped``.  Hidden files and folders and
    .ipynb_checkpoints are passed over silently."""
    root = folder.resolve()
    found: list[Path] = []
    for here, dirs, files in os.walk(folder, followlinks=False):
        base = Path(here)
        keep = []
        for name in sorted(dirs):
            rel = (base / name).relative_to(folder)
            if name.startswith(".") or name == ".ipynb_checkpoints":
                continue
            if (base / name).is_symlink():
                skipped.append(Skipped(rel.as_posix(), "a symbolic link to a folder (to "
                                       f"{_target(base / name)}): not graded"))
                continue
            keep.append(name)
        dirs[:] = keep
        for name in sorted(files):
            if not name.endswith(".ipynb") or name.startswith("."):
                continue
            path = base / name
            rel = path.relative_to(folder)
            try:
                info = path.lstat()
            except OSError as err:
                skipped.append(Skipped(rel.as_posix(), f"cannot be read: {err.strerror}"))
                continue
            if stat.S_ISLNK(info.st_mode):
                skipped.append(Skipped(rel.as_posix(), "a symbolic link (to "
                                       f"{_target(path)}): not graded as anyone's"))
            elif not stat.S_ISREG(info.st_mode):
                skipped.append(Skipped(rel.as_posix(), "not a regular file: not graded"))
            elif info.st_nlink > 1:
                skipped.append(Skipped(rel.as_posix(), f"a hard link ({info.st_nlink} names "
                                       "for one file, which may be a classmate's or yours): "
                                       "not graded as anyone's"))
            elif not path.resolve().is_relative_to(root):
                skipped.append(Skipped(rel.as_posix(), "outside the submissions folder: "
                                       "not graded"))
            else:
                found.append(path)
    return sorted(found)


def _target(path: Path) -> str:
    try:
        return repr(os.readlink(path))
    except OSError:
        return "somewhere unreadable"


def find_submissions(folder: Path, roster: list[gradebook.Student] | None = None,
                     skipped: list[Skipped] | None = None) -> list[Submission]:
    """Every .ipynb below ``folder`` (not in hidden folders or .ipynb_checkpoints), with its
    student (grading/gradebook.py's ``owner``; the roster's id when ``roster`` matches it).
    Links and what resolves outside ``folder`` are not graded: they go to ``skipped``."""
    found = []
    skipped = [] if skipped is None else skipped
    for path in _walk(folder, skipped):
        rel = path.relative_to(folder)
        who = gradebook.owner(rel)
        student, on_roster = who.key, True
        if roster is not None:
            match = gradebook.match_roster(who, roster)
            student, on_roster = (match.id, True) if match else (who.key, False)
        found.append(Submission(student, path, rel.as_posix(), who.late, who.file_name,
                                on_roster, submission_time(path, folder, who)))
    return found


def submission_time(path: Path, folder: Path, who: gradebook.Owner) -> datetime | None:
    """When a notebook was handed in: nbgrader's ``timestamp.txt`` in its folder or one
    above it (below ``folder``), else the date in a Blackboard name; None when unknown (the
    file's own time is not used: copying a folder changes it)."""
    here = path.parent
    while here != folder and folder in here.parents:
        stamp = here / "timestamp.txt"
        if stamp.is_file() and not stamp.is_symlink():
            found = gradebook.parse_time(stamp.read_text(encoding="utf-8", errors="replace")[:64])
            if found is not None:
                return found
        here = here.parent
    return gradebook.parse_time(who.submitted) if who.submitted else None


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


#: Deeper than this, a notebook's JSON is refused (Python's parser would recurse too deep).
MAX_DEPTH = 200


def read_notebook(path: Path) -> tuple[nbformat.NotebookNode | None, str]:
    """``(the notebook, "")``, or ``(None, why it could not be read)`` in words for the
    student: not UTF-8 text, not JSON (where), nested too deep, not a notebook."""
    try:
        data = path.read_bytes()
    except OSError as err:
        return None, f"the file could not be read ({err.strerror})"
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        byte = data[err.start:err.start + 1].hex()
        guess = (" (it looks like Latin-1 or Windows-1252: save it again from Jupyter, "
                 "which writes UTF-8)" if _latin1_like(data) else "")
        return None, (f"the file is not UTF-8 text: byte 0x{byte} at position {err.start} is "
                      f"not UTF-8{guess}")
    depth = _depth(text)
    if depth > MAX_DEPTH:
        return None, (f"the file's JSON is nested {depth} levels deep (a notebook needs "
                      f"fewer than 10; at most {MAX_DEPTH} are read)")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        return None, (f"the file is not valid JSON: {err.msg} at line {err.lineno}, column "
                      f"{err.colno} (was it edited outside Jupyter or cut short?)")
    except RecursionError:
        return None, "the file's JSON is nested too deep to read"
    if not isinstance(raw, dict) or "cells" not in raw:
        return None, "the file is JSON but not a notebook (it has no cells)"
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception as err:  # noqa: BLE001 - any reason is the student's to know
        return None, f"the file is not a notebook nbformat can read ({type(err).__name__})"
    return nb, ""


def _depth(text: str) -> int:
    """How deep the brackets of a JSON text nest (outside its strings)."""
    depth = deepest = 0
    for bracket in re.findall(r"[\[\]{}]", STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _latin1_like(data: bytes) -> bool:
    return any(0xA0 <= b <= 0xFF for b in data)


# ---------------------------------------------------------------------------------------------
# The student id a notebook was run with
# ---------------------------------------------------------------------------------------------

#: What the student edition's id cell prints for the id it ran with
#: (flashlib.book.exercises.variants.use_student).
PRINTED_ID = re.compile(r"^Student (.+?): your variants of this chapter's exercises", re.M)


def _id_patterns() -> list[tuple[re.Pattern[str], str]]:
    from flashlib.book.exercises.grader_adapter import STUDENT_ENV

    text = r"""(?P<q>['"])(?P<id>[^'"\n]*)(?P=q)"""
    return [(re.compile(r"^\s*STUDENT_ID\s*=\s*" + text, re.M), "STUDENT_ID in its code"),
            (re.compile(r"\buse_student\(\s*(?:student\s*=\s*)?" + text),
             "use_student in its code"),
            (re.compile(r"\benviron\[\s*['\"]" + re.escape(STUDENT_ENV) + r"['\"]\s*\]\s*=\s*"
                        + text), f"{STUDENT_ENV} set in its code")]


def _output_text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output.get("text", ""))
        else:
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


def notebook_ids(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """The student ids a notebook was set up or run with, as ``(id, where)``: each
    ``STUDENT_ID = "..."`` (the student edition's id cell), ``use_student("...")`` and
    ``os.environ["FLASHLIB_STUDENT_ID"] = "..."`` in its code cells, and each id its id cell
    printed when it ran (the saved outputs: "Student ID: your variants ...").  Empty ids (the
    cell as handed out) are left out."""
    found: list[tuple[str, str]] = []
    patterns = _id_patterns()
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        for pattern, where in patterns:
            found += [(m["id"].strip(), where) for m in pattern.finditer(source)]
        found += [(m[1].strip(), "its printed variants")
                  for m in PRINTED_ID.finditer(_output_text(cell))]
    return [(who, where) for who, where in found if who]


def id_mismatch(nb: nbformat.NotebookNode, student: str) -> list[str]:
    """A flag for the instructor when the notebook was set up or run with another student's
    id than ``student`` (the id it is graded as, whose variants the checkers ask): a
    classmate's notebook handed in, or a wrong id typed.  Not a verdict: the grade stays the
    checkers'."""
    others: dict[str, list[str]] = {}
    for who, where in notebook_ids(nb):
        if who != student.strip():
            others.setdefault(who, [])
            if where not in others[who]:
                others[who].append(where)
    if not others:
        return []
    named = "; ".join(f"{who[:40]!r} ({', '.join(wheres)})"
                      for who, wheres in list(others.items())[:3])
    return [f"the notebook was run with another student id than {student[:40]!r}, the id "
            f"graded (whose variants the checkers asked): {named}; a classmate's notebook, "
            "or a wrong id?"]
