"""The class's side of grading/grade.py: who handed in what, and the files to hand back.

Who a notebook belongs to.  The submissions folder may hold one folder per student (any
depth: nbgrader's ``submitted/<student>/<assignment>/NAME.ipynb``), notebooks directly in
it (the file name is the student), or the files a learning platform exports, recognised by
their names (:func:`lms_name`):

    Canvas      smithalice_1001_5551_Copy of overflow.ipynb     (name, user id, submission id,
                smithalice_LATE_1001_5551_overflow-1.ipynb       the file; LATE: after the due
                                                                 date; -1: a resubmission)
    Moodle      Alice Smith_1234_assignsubmission_file_/overflow.ipynb   (a folder, or the
                Alice Smith_1234_assignsubmission_file_overflow.ipynb     file's prefix)
    Blackboard  Week 1_asmith_attempt_2026-01-20-10-31-00_overflow.ipynb

With a roster (``--roster roster.csv``: a column for the student id, one for the name, or
first and last names, and one for the email; the headers of Canvas's, Moodle's and most
platforms' exports are recognised, :func:`load_roster`), each notebook is matched to a
roster student by id, email, the email's user name, or name (in either order, accents and
case ignored); a student on the roster with no notebook is reported as missing them, and a
notebook that matches no one is graded under its own name and listed in the summary.

What it writes (:func:`write_gradebook`, :func:`write_feedback`):

    gradebook.csv       one row per student (the roster's order, then the unmatched), one
                        column per exercise (its score: 1 or 0; checks passed / total with
                        --partial-credit), then total, out of, percent, and the chapters
                        handed in late (Canvas's LATE)
    feedback/ID.md      one file per student to hand back: per chapter, each exercise's
                        status, score and what the checker said, and the grading rules
"""

from __future__ import annotations

import csv
import html
import io
import math
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CANVAS = re.compile(r"^(?P<name>[a-z]+?)(?P<late>_LATE)?_(?P<uid>\d+)_(?P<sid>\d+)_"
                    r"(?P<file>.+)$")
MOODLE = re.compile(r"^(?P<name>.+?)_(?P<uid>\d+)_assignsubmission_(?:file|onlinetext)_"
                    r"(?P<file>.*)$")
BLACKBOARD = re.compile(r"^(?P<assignment>.+?)_(?P<user>[^_\s]+)_attempt_"
                        r"(?P<date>\d{4}(?:-\d{2}){5})(?:_(?P<file>.+))?$")
#: Roster headers, lower case: what each column may be called.
HEADERS = {
    "id": ("student id", "student_id", "studentid", "id", "sis user id", "sis id", "sis_id",
           "user id", "userid", "username", "login", "sis login id", "id number", "number"),
    "name": ("name", "student", "student name", "full name", "fullname", "display name"),
    "first": ("first name", "first_name", "firstname", "given name", "given_name"),
    "last": ("last name", "last_name", "lastname", "surname", "family name", "family_name"),
    "email": ("email", "e-mail", "email address", "e-mail address", "mail"),
}


@dataclass
class Student:
    id: str
    name: str = ""
    email: str = ""
    keys: set[str] = field(default_factory=set)  # what a submission may be called
    canvas: dict[str, str] = field(default_factory=dict)  # Canvas's own columns, if given

    def __post_init__(self) -> None:
        self.keys |= {k for k in (_key(self.id), _key(self.email)) if k}
        if "@" in self.email:
            self.keys.add(_key(self.email.split("@")[0]))
        words = _words(self.name)
        if words:
            self.keys |= {"".join(words), "".join(reversed(words)),
                          "".join(words[-1:] + words[:-1])}


def _words(text: str) -> list[str]:
    """Lower-case ASCII words of a name ("Ana-María Núñez" -> ["ana", "maria", "nunez"])."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.findall(r"[a-z0-9]+", text.lower().replace(",", " "))


def _key(text: str) -> str:
    return "".join(_words(text))


def load_roster(path: Path) -> list[Student]:
    """The students of a roster CSV (see the module docstring); ValueError naming the
    columns found when there is no id or email column."""
    return load_roster_text(Path(path).read_text(encoding="utf-8-sig"), str(path))


def load_roster_text(text: str, path: str = "the roster") -> list[Student]:
    """:func:`load_roster` of the CSV's text (commas, semicolons or tabs)."""
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    rows = list(csv.DictReader(io.StringIO(text), dialect=dialect))
    if not rows:
        raise ValueError(f"{path}: the roster has no students")
    columns = {c.strip().lower(): c for c in rows[0] if c}
    pick = {role: next((columns[h] for h in names if h in columns), None)
            for role, names in HEADERS.items()}
    if pick["id"] is None and pick["email"] is None:
        raise ValueError(f"{path}: no column for the student id or email (columns: "
                         f"{', '.join(columns.values())}; expected one of "
                         f"{', '.join(HEADERS['id'])})")
    students = []
    for row in rows:
        name = (row.get(pick["name"]) or "").strip() if pick["name"] else ""
        if not name and (pick["first"] or pick["last"]):
            name = " ".join(p for p in ((row.get(pick["first"]) or "").strip() if pick["first"]
                                        else "", (row.get(pick["last"]) or "").strip()
                                        if pick["last"] else "") if p)
        if "," in name:  # "Smith, Alice"
            last, _, first = name.partition(",")
            name = f"{first.strip()} {last.strip()}"
        email = (row.get(pick["email"]) or "").strip() if pick["email"] else ""
        ident = (row.get(pick["id"]) or "").strip() if pick["id"] else ""
        ident = ident or email
        if not ident or name.lower() in ("points possible", "test student"):
            continue  # Canvas's "Points Possible" line, its test student
        others = {_key(row.get(columns[h]) or "") for h in HEADERS["id"] if h in columns}
        canvas = {c: (row.get(columns[c.lower()]) or "").strip() for c in CANVAS_COLUMNS[1:]
                  if c.lower() in columns}
        students.append(Student(ident, name, email, keys={k for k in others if k},
                                canvas=canvas))
    return students


@dataclass
class Owner:
    """Who a notebook belongs to, as its path says."""

    key: str  # the student, as the submission names them
    late: bool = False
    file_name: str = ""  # the notebook's own name, without the platform's prefix
    hints: tuple[str, ...] = ()  # other names to match against a roster (a user id)
    submitted: str = ""  # when, where the name says (Blackboard)


def lms_name(name: str) -> Owner | None:
    """A learning platform's export name (the module docstring), or None."""
    match = CANVAS.match(name)
    if match:
        return Owner(match["name"], bool(match["late"]), match["file"],
                     (match["uid"], match["name"]))
    match = MOODLE.match(name)
    if match:
        return Owner(match["name"].strip(), False, match["file"], (match["uid"],))
    match = BLACKBOARD.match(name)
    if match:
        return Owner(match["user"], False, match["file"] or "", (), match["date"])
    return None


def owner(rel: Path) -> Owner:
    """Who the notebook at ``rel`` (relative to the submissions folder) belongs to: the
    first folder below the submissions, or the platform's name of the file, or the file
    name."""
    for part in rel.parts[:-1]:
        found = lms_name(part)
        if found is not None:
            return Owner(found.key, found.late, rel.name, found.hints, found.submitted)
    if len(rel.parts) > 1:
        return Owner(rel.parts[0], False, rel.name)
    found = lms_name(rel.name)
    if found is not None:
        return found
    return Owner(rel.stem, False, rel.name)


def match_roster(who: Owner, roster: list[Student]) -> Student | None:
    """The roster's student a notebook belongs to, or None."""
    keys = {k for k in (_key(who.key), *(_key(h) for h in who.hints)) if k}
    for student in roster:
        if keys & student.keys:
            return student
    return None


# ---------------------------------------------------------------------------------------------
# Scores and files
# ---------------------------------------------------------------------------------------------

def score(row: Any, partial: bool, late: bool = True) -> float:
    """An exercise row's score: 1 passed, 0 otherwise; with ``partial``, checks passed /
    total wherever the checker ran (passed, failed, an error after the checks ran); times
    the late policy's factor (:func:`late_factor`) unless ``late`` is False."""
    if row.status == "passed":
        raw = 1.0
    elif partial and row.status in ("failed", "error") and row.checks_total:
        raw = round(row.checks_passed / row.checks_total, 4)
    else:
        raw = 0.0
    factor = late_factor(getattr(row, "late_days", None)) if late else 1.0
    return round(raw * factor, 4)


#: The late policy the instructor guide suggests (book/instructor.md, "Deadlines and late
#: work"): 10% off per day late (a day begun counts), up to 3 days, then 0.
LATE_PER_DAY = 0.10
LATE_MAX_DAYS = 3


def late_factor(days: int | None) -> float:
    """What a score is multiplied by when handed in ``days`` days late (None: on time, or
    how late is unknown)."""
    if not days or days <= 0:
        return 1.0
    if days > LATE_MAX_DAYS:
        return 0.0
    return round(1.0 - LATE_PER_DAY * days, 4)


def days_late(submitted: datetime | None, due: datetime | None) -> int | None:
    """Whole days begun after ``due`` (0 when on time); None when either is unknown."""
    if submitted is None or due is None:
        return None
    seconds = (_utc(submitted) - _utc(due)).total_seconds()
    return max(0, math.ceil(seconds / 86400))


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def parse_time(text: str) -> datetime | None:
    """A submission time as nbgrader's timestamp.txt ("2026-01-20 10:31:00.123456 UTC"),
    Blackboard's file name ("2026-01-20-10-31-00") or ISO 8601 write it; None otherwise.
    Times without a zone are UTC."""
    text = text.strip().removesuffix(" UTC").removesuffix("Z")
    match = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})-(\d{2})-(\d{2})-(\d{2})", text)
    if match:
        return datetime(*map(int, match.groups()), tzinfo=timezone.utc)
    try:
        return _utc(datetime.fromisoformat(text))
    except ValueError:
        return None


def best_rows(rows: list[Any], partial: bool) -> dict[tuple[str, str, str], Any]:
    """``{(student, chapter, exercise): row}``: per student and chapter the rows of their
    best-scoring notebook (a resubmission does not lower a grade)."""
    totals: dict[tuple[str, str, str], float] = {}
    for row in rows:
        if row.exercise:
            key = (row.student, row.chapter, row.notebook)
            totals[key] = totals.get(key, 0.0) + score(row, partial)
    best: dict[tuple[str, str], str] = {}
    for (student, chapter, notebook), total in sorted(totals.items()):
        current = best.get((student, chapter))
        if current is None or total > totals[(student, chapter, current)]:
            best[(student, chapter)] = notebook
    return {(r.student, r.chapter, r.exercise): r for r in rows
            if r.exercise and best.get((r.student, r.chapter)) == r.notebook}


def write_gradebook(path: Path, rows: list[Any], students: list[tuple[str, str, str]],
                    exercises: list[tuple[str, str]], late: dict[str, set[str]],
                    partial: bool) -> None:
    """gradebook.csv: ``students`` = [(key, name, email)], ``exercises`` = [(chapter,
    number)] in order; ``late``: the chapters each student handed in late."""
    best = best_rows(rows, partial)
    columns = ["student_id", "name", "email", *(f"Exercise {n}" for _, n in exercises),
               "total", "out_of", "percent", "late"]
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for key, name, email in students:
            scores = []
            for chapter, number in exercises:
                row = best.get((key, chapter, number))
                scores.append(score(row, partial) if row is not None else 0.0)
            total = round(sum(scores), 4)
            writer.writerow(csv_row([key, name, email, *(_num(s) for s in scores),
                                     _num(total), len(exercises),
                                     f"{100 * total / len(exercises):.1f}" if exercises
                                     else "", " ".join(sorted(late.get(key, ())))]))


#: What a spreadsheet reads as the start of a formula (OWASP's "CSV injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A value for a CSV cell that a spreadsheet will not run: text starting with a formula
    character gets a leading apostrophe (numbers are left as they are)."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def csv_row(row: Any) -> Any:
    """:func:`csv_cell` of every cell of a list or of a dict's values."""
    if isinstance(row, dict):
        return {k: csv_cell(v) for k, v in row.items()}
    return [csv_cell(v) for v in row]


def text(value: Any) -> str:
    """What a student wrote (a name, a message, output), for a Markdown file: its HTML
    escaped, so that it is shown and never run by the page that shows the file."""
    return html.escape(str(value), quote=True)


def cell(value: Any) -> str:
    """:func:`text` for a Markdown table cell: one line, no column breaks."""
    return text(" ".join(str(value).split())).replace("|", "\\|")


LONG_COLUMNS = ["student", "chapter", "exercise", "points", "max_points", "status", "late"]


def write_long_gradebook(path: Path, rows: list[Any], students: list[tuple[str, str, str]],
                         exercises: list[tuple[str, str]], partial: bool) -> None:
    """gradebook_long.csv: one row per student and exercise (the student's best notebook
    of the chapter), with its points, the points possible (1), its status ("missing" where
    the student handed in no notebook of the chapter) and whether it was handed in late."""
    best = best_rows(rows, partial)
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(LONG_COLUMNS)
        for key, _, _ in students:
            for chapter, number in exercises:
                row = best.get((key, chapter, number))
                writer.writerow(csv_row([
                    key, chapter, number, _num(score(row, partial)) if row else "0", 1,
                    row.status if row else "missing",
                    "yes" if row is not None and row.late else "no"]))


#: Canvas's gradebook columns before the assignments (its export's, which its import reads
#: back: the student is matched by ID, else SIS User ID, else SIS Login ID).
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def write_canvas_import(path: Path, rows: list[Any], people: list[Any],
                        chapters: list[tuple[str, str, int]], partial: bool) -> None:
    """canvas_import.csv, for Canvas's Grades > Import: Canvas's export layout (the columns
    of :data:`CANVAS_COLUMNS`, then one column per chapter named by its title, then a
    "Points Possible" row); ``people``: the roster's students (with the Canvas columns of a
    Canvas roster) or (key, name, email); ``chapters``: [(name, title, exercises)]."""
    best = best_rows(rows, partial)
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CANVAS_COLUMNS + [title for _, title, _ in chapters])
        writer.writerow(["Points Possible", "", "", "", ""] + [n for _, _, n in chapters])
        for person in people:
            key, name, canvas = _person(person)
            points = [_num(round(sum(score(r, partial) for (s, c, _), r in best.items()
                                     if s == key and c == chapter), 4))
                      for chapter, _, _ in chapters]
            last_first = ", ".join(reversed(name.rsplit(" ", 1))) if name else key
            writer.writerow(csv_row([last_first, canvas.get("ID", ""),
                                     canvas.get("SIS User ID") or key,
                                     canvas.get("SIS Login ID", ""),
                                     canvas.get("Section", ""), *points]))


def write_moodle_import(path: Path, rows: list[Any], people: list[Any],
                        chapters: list[tuple[str, str, int]], partial: bool) -> None:
    """moodle_import.csv, for Moodle's Grades > Import > CSV file: a column to identify the
    student by ("Email address" where the roster gives one, else "ID number"), then one
    column per chapter (its title), points as plain numbers; each column is mapped to a grade
    item in Moodle's import form."""
    best = best_rows(rows, partial)
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["ID number", "Email address", "Full name"]
                        + [title for _, title, _ in chapters])
        for person in people:
            key, name, _ = _person(person)
            email = person.email if isinstance(person, Student) else person[2]
            points = [_num(round(sum(score(r, partial) for (s, c, _), r in best.items()
                                     if s == key and c == chapter), 4))
                      for chapter, _, _ in chapters]
            writer.writerow(csv_row([key, email, name, *points]))


def _person(person: Any) -> tuple[str, str, dict[str, str]]:
    if isinstance(person, Student):
        return person.id, person.name, person.canvas
    return person[0], person[1], {}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.4g}"


RULES = """\
How your notebook was graded: each exercise's checker ran on your code, as the checker cell
in the notebook does. Your earlier exercise cells ran first, in order, as Jupyter's "Run all"
would (code you put outside the exercise cells did not run); a statement with a syntax error
in an exercise cell was skipped and the rest of the cell ran; an exercise whose cell is still
as it was handed out counts as not attempted. An answer that calls the library function the
exercise asks you to write is refused. Each exercise had {timeout:g} seconds of CPU time.
"""


def write_feedback(folder: Path, rows: list[Any], students: list[tuple[str, str, str]],
                   chapters: dict[str, Any], partial: bool, timeout: float) -> None:
    """feedback/<student>.md, one per student (see the module docstring).  Everything the
    student wrote (names, notebook names, messages, output) is HTML-escaped."""
    folder.mkdir(parents=True, exist_ok=True)
    best = best_rows(rows, partial)
    for key, name, _ in students:
        mine = [r for r in rows if r.student == key]
        lines = [f"# Feedback: {text(name or key)}", ""]
        if name:
            lines += [f"Student: {text(name)} ({text(key)})", ""]
        graded = [r for r in best.values() if r.student == key]
        total = sum(score(r, partial) for r in graded)
        lines += [f"Score: {_num(round(total, 4))} of {len(graded)} exercises graded"
                  + (" (partial credit: checks passed / checks run)" if partial else ""), ""]
        ungraded = [r for r in mine if not r.chapter]
        if ungraded:
            lines += ["## Notebooks that could not be graded", "",
                      "| notebook | status | why |", "| --- | --- | --- |"]
            lines += [f"| {cell(r.notebook)} | {r.status} | {cell(r.first_problem)} |"
                      for r in ungraded]
            lines.append("")
        for chapter_name, chapter in chapters.items():
            chapter_rows = [r for r in mine if r.chapter == chapter_name]
            if not chapter_rows:
                continue
            lines += [f"## {chapter.title}", ""]
            missing = [r for r in chapter_rows if not r.exercise]
            if missing:
                lines += [f"Not handed in: {text(missing[0].first_problem)}.", ""]
                continue
            notebooks = sorted({r.notebook for r in chapter_rows})
            lines += [f"Notebook: {text(notebooks[0])}" if len(notebooks) == 1 else
                      "Notebooks: " + ", ".join(text(n) for n in notebooks)
                      + " (the best one counts)", ""]
            days = next((r.late_days for r in chapter_rows if r.late_days), None)
            if days:
                lines += [f"Handed in {days} day{'s' * (days > 1)} late: each exercise's score "
                          f"is multiplied by {_num(late_factor(days))} (the late policy: "
                          f"{LATE_PER_DAY:.0%} off per day begun, up to {LATE_MAX_DAYS} days, "
                          "then 0).", ""]
            lines += ["| exercise | status | score | what the checker said first |",
                      "| --- | --- | --- | --- |"]
            ordered = sorted((r for r in chapter_rows if best.get(
                (key, chapter_name, r.exercise)) is r),
                key=lambda r: tuple(int(p) for p in r.exercise.split(".")))
            for row in ordered:
                problem = cell(row.first_problem) or "-"
                lines.append(f"| {row.exercise} | {row.status} | "
                             f"{_num(score(row, partial))} | {problem} |")
            lines.append("")
            for row in ordered:
                if row.notes:
                    lines += [f"Exercise {row.exercise}: " + text("; ".join(row.notes)) + ".",
                              ""]
                if row.status != "passed" and row.feedback:
                    lines += [f"Exercise {row.exercise}, the checker's whole answer:", "",
                              "<pre>", text(row.feedback.strip()), "</pre>", ""]
        lines += ["---", "", RULES.format(timeout=timeout)]
        safe = re.sub(r"[^\w.@-]+", "_", key).strip("_") or "student"
        (folder / f"{safe}.md").write_text("\n".join(lines), encoding="utf-8")
