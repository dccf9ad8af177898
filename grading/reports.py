"""The reports of a graded class: results.csv and .json, summary.md, the gradebook and
feedback files (grading/gradebook.py), nbgrader's and otter-grader's CSVs."""

from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grading import gradebook
from grading.chapters import Chapter, number_key
from grading.worker import one_line

CSV_COLUMNS = ["student", "notebook", "chapter", "exercise", "status", "passed",
               "checks_passed", "checks_total", "first_problem", "runtime_s", "score",
               "notes", "flags"]


@dataclass
class Row:
    student: str
    notebook: str
    chapter: str
    exercise: str
    status: str
    checks_passed: int = 0
    checks_total: int = 0
    first_problem: str = ""
    runtime_s: float | None = None
    feedback: str = ""
    output: str = ""
    notes: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    late: bool = False
    late_days: int | None = None  # days late, where the due date and the time are known
    memory: dict[str, int] = field(default_factory=dict)  # peak_bytes, chapter_bytes
    partial: bool = False  # the score is checks passed / total (--partial-credit)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def score(self) -> float:
        return gradebook.score(self, self.partial) if self.exercise else 0.0

    def csv(self) -> dict[str, Any]:
        return {"student": self.student, "notebook": self.notebook, "chapter": self.chapter,
                "exercise": self.exercise, "status": self.status, "passed": self.passed,
                "checks_passed": self.checks_passed, "checks_total": self.checks_total,
                "first_problem": self.first_problem,
                "runtime_s": "" if self.runtime_s is None else f"{self.runtime_s:.2f}",
                "score": gradebook._num(self.score) if self.exercise else "",
                "notes": " | ".join(self.notes), "flags": " | ".join(self.flags)}



def write_reports(rows: list[Row], chapters: dict[str, Chapter], out: Path, *, timeout: float,
                  context_errors: dict[str, list[str]], chapter_names: list[str] | None,
                  roster: list[gradebook.Student] | None = None,
                  info: dict[str, Any] | None = None) -> None:
    info = {"timeout": timeout} | (info or {})
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(gradebook.csv_row(row.csv()) for row in rows)
    (out / "results.json").write_text(json.dumps(
        [row.csv() | {"feedback": row.feedback, "output": row.output, "notes": row.notes,
                      "flags": row.flags, "memory": row.memory} for row in rows],
        indent=1) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(summary(rows, chapters, timeout, context_errors, info),
                                    encoding="utf-8")
    assignments = [n for n in chapters if n in (chapter_names or [])
                   or any(r.chapter == n and r.exercise for r in rows)]
    partial = bool(info.get("partial_credit"))
    write_nbgrader_csv(rows, chapters, assignments, out / "nbgrader_grades.csv", roster)
    for name in assignments:
        write_otter_csv(rows, chapters[name], out / f"otter_final_grades_{name}.csv")
    people = [(s.id, s.name, s.email) for s in roster or []]
    known = {p[0] for p in people}
    people += [(key, "", "") for key in sorted({r.student for r in rows}) if key not in known]
    exercises = [(name, n) for name in assignments
                 for n in sorted(chapters[name].exercises, key=number_key)]
    late: dict[str, set[str]] = {}
    for row in rows:
        if row.late and row.chapter:
            late.setdefault(row.student, set()).add(row.chapter)
    gradebook.write_gradebook(out / "gradebook.csv", rows, people, exercises, late, partial)
    gradebook.write_long_gradebook(out / "gradebook_long.csv", rows, people, exercises, partial)
    roster_people = {s.id: s for s in roster or []}
    platform_people = [roster_people.get(p[0], p) for p in people]
    titled = [(name, chapters[name].title, len(chapters[name].exercises))
              for name in assignments]
    gradebook.write_canvas_import(out / "canvas_import.csv", rows, platform_people, titled,
                                  partial)
    gradebook.write_moodle_import(out / "moodle_import.csv", rows, platform_people, titled,
                                  partial)
    gradebook.write_feedback(out / "feedback", rows, people, chapters, partial, timeout)


def _cell(row: Row) -> str:
    if row.status in ("passed", "failed"):
        return f"{row.status} {row.checks_passed}/{row.checks_total}"
    return row.status


def _md(text: str) -> str:
    """Text for a Markdown table cell or list item: one line, no table breaks, no HTML."""
    return html.escape(one_line(text), quote=False).replace("|", "\\|")


def summary(rows: list[Row], chapters: dict[str, Chapter], timeout: float,
            context_errors: dict[str, list[str]], info: dict[str, Any] | None = None) -> str:
    """The readable report: how the code ran, per chapter students x exercises, then what
    went wrong, then the flags for the instructor."""
    from flashlib import __version__

    info = info or {}
    notebooks_graded = {(r.student, r.notebook) for r in rows if r.notebook}
    out = io.StringIO()
    out.write("# Grading report\n\n")
    out.write(f"{len(notebooks_graded)} notebooks of {len({r.student for r in rows})} "
              f"students, graded with the checkers of flashlib {__version__} "
              f"(`grading/grade.py`), each exercise in its own process with a time limit of "
              f"{timeout:g} s of CPU time. A cell shows the status and the checks passed; "
              "`results.csv` has every row, `results.json` the checkers' whole feedback, "
              "`gradebook.csv` "
              "one row per student and `feedback/` one file per student.\n")
    if info.get("confinement"):
        out.write(f"\nThe students' code ran confined: {_md(info['confinement'])}.\n")
    rules = ["each exercise's cells alone" if info.get("standalone") else
             "each student's earlier exercise cells first, as Jupyter's Run all would",
             "any error of an exercise cell fails it" if info.get("strict") else
             "a statement that does not parse is skipped, an error after the answer noted",
             "partial credit (checks passed / run)" if info.get("partial_credit") else
             "one point per exercise whose checks all pass"]
    if info.get("due"):
        rules.append(f"due {info['due']}: {gradebook.LATE_PER_DAY:.0%} off per day begun late "
                     f"(nbgrader's timestamp.txt, Blackboard's name), up to "
                     f"{gradebook.LATE_MAX_DAYS} days, then 0")
    out.write("Rules: " + "; ".join(rules) + ".\n")
    for name, chapter in chapters.items():
        chapter_rows = [r for r in rows if r.chapter == name]
        if not chapter_rows:
            continue
        numbers = sorted(chapter.exercises, key=number_key)
        out.write(f"\n## {chapter.title} (`{name}`)\n\n")
        if chapter.ungraded:
            out.write(f"Exercises without a checker (not graded): "
                      f"{', '.join(chapter.ungraded)}.\n\n")
        for error in context_errors.get(name, []):
            out.write(f"> **The chapter itself**: {_md(error)} (`logs/{name}.log`)\n\n")
        out.write("| student | notebook | " + " | ".join(f"Ex. {n}" for n in numbers)
                  + " | passed |\n")
        out.write("| --- | --- | " + " | ".join("---" for _ in numbers) + " | --- |\n")
        by_notebook: dict[tuple[str, str], dict[str, Row]] = {}
        for row in chapter_rows:
            by_notebook.setdefault((row.student, row.notebook), {})[row.exercise] = row
        for (student, notebook), cells in by_notebook.items():
            if "" in cells:  # no notebook for this chapter
                line = [cells[""].status] * len(numbers)
                passed = 0
            else:
                line = [_cell(cells[n]) if n in cells else "" for n in numbers]
                passed = sum(cells[n].passed for n in numbers if n in cells)
            out.write(f"| {_md(student)} | {_md(notebook) or '-'} | " + " | ".join(line)
                      + f" | {passed}/{len(numbers)} |\n")
        problems = [r for r in chapter_rows if r.status not in ("passed", "not attempted")]
        idle: dict[str, list[str]] = {}
        for row in chapter_rows:
            if row.status == "not attempted":
                idle.setdefault(row.student, []).append(row.exercise)
        if idle:
            out.write("\nNot attempted: " + "; ".join(
                f"{_md(student)} ({', '.join(numbers)})" for student, numbers in idle.items())
                + ".\n")
        if problems:
            out.write("\nWhat went wrong:\n\n")
            for row in problems:
                what = f"Exercise {row.exercise}" if row.exercise else "the chapter"
                checks = (f" ({row.checks_passed}/{row.checks_total} checks)"
                          if row.checks_total else "")
                out.write(f"- {_md(row.student)}, {what}: **{row.status}**{checks}: "
                          f"{_md(row.first_problem)}\n")
        noted = [r for r in chapter_rows if r.notes]
        if noted:
            out.write("\nNotes (graded anyway):\n\n")
            for row in noted:
                out.write(f"- {_md(row.student)}, Exercise {row.exercise}: "
                          f"{_md('; '.join(row.notes))}\n")
    other = [r for r in rows if not r.chapter]
    if other:
        out.write("\n## Notebooks not graded\n\n| student | notebook | status | why |\n"
                  "| --- | --- | --- | --- |\n")
        for row in other:
            out.write(f"| {_md(row.student)} | {_md(row.notebook)} | {row.status} | "
                      f"{_md(row.first_problem)} |\n")
    if info.get("skipped"):
        out.write("\n## Files not graded as anyone's\n\nLinks in the submissions folder "
                  "(symbolic or hard links: a second name for a classmate's or your own file) "
                  "and files outside it; none was graded. Look at each:\n\n"
                  "| path | why |\n| --- | --- |\n")
        for path, why in info["skipped"]:
            out.write(f"| {_md(path)} | {_md(why)} |\n")
    if info.get("unmatched"):
        out.write("\n## Notebooks of no one on the roster\n\nGraded under the name their "
                  "file gives:\n\n" + "".join(f"- `{_md(n)}`\n" for n in info["unmatched"]))
    flagged = [r for r in rows if r.flags]
    if flagged:
        out.write("\n## For the instructor: code worth a look\n\nFlags are not grades (the "
                  "checker decided each status above); they point at code that an exercise "
                  "does not need, or that another answer shares.\n\n"
                  "| student | exercise | status | flags |\n| --- | --- | --- | --- |\n")
        for row in flagged:
            out.write(f"| {_md(row.student)} | {row.exercise or '-'} | {row.status} | "
                      f"{_md('; '.join(row.flags))} |\n")
    return out.getvalue()


NBGRADER_COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name",
                    "first_name", "email", "raw_score", "late_submission_penalty", "score",
                    "max_score"]


def write_nbgrader_csv(rows: list[Row], chapters: dict[str, Chapter], assignments: list[str],
                       path: Path, roster: list[gradebook.Student] | None = None) -> None:
    """Scores in the columns of ``nbgrader export`` (its CsvExportPlugin): one row per chapter
    (the assignment) and student; the score is the student's best notebook of the chapter
    (exercises passed, or checks passed / total with --partial-credit), 0 without one;
    names and email from the roster, dates empty, penalties 0."""
    people = {s.id: s for s in roster or []}
    students = sorted({r.student for r in rows} | set(people))
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, NBGRADER_COLUMNS)
        writer.writeheader()
        for name in assignments:
            for student in students:
                per_notebook: dict[str, tuple[float, float]] = {}
                for row in rows:
                    if row.chapter == name and row.student == student and row.exercise:
                        raw, final = per_notebook.get(row.notebook, (0.0, 0.0))
                        per_notebook[row.notebook] = (
                            raw + gradebook.score(row, row.partial, late=False),
                            final + row.score)
                raw, score = max(per_notebook.values(), key=lambda p: p[1],
                                 default=(0.0, 0.0))
                raw, score = float(round(raw, 4)), float(round(score, 4))
                person = people.get(student)
                first, _, last = (person.name.rpartition(" ")[::-1] if person and person.name
                                  else ("", "", ""))
                writer.writerow(gradebook.csv_row({
                    "assignment": name, "duedate": "", "timestamp": "", "student_id": student,
                    "last_name": first if person else "", "first_name": last if person else "",
                    "email": person.email if person else "", "raw_score": raw,
                    "late_submission_penalty": round(raw - score, 4), "score": score,
                    "max_score": float(len(chapters[name].exercises))}))


def write_otter_csv(rows: list[Row], chapter: Chapter, path: Path) -> None:
    """The chapter's scores in the layout of otter-grader's final_grades.csv: ``file``, one
    column per exercise (1 point each: all or nothing, or checks passed / total with
    --partial-credit), ``total_points_earned``, ``percent_correct``, ``grading_status``; the
    first row gives the points per question."""
    numbers = sorted(chapter.exercises, key=number_key)
    questions = [f"Exercise {n}" for n in numbers]
    columns = ["file", *questions, "total_points_earned", "percent_correct", "grading_status"]
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerow({"file": "points-per-question", **dict.fromkeys(questions, 1),
                         "total_points_earned": len(numbers), "percent_correct": 1,
                         "grading_status": "--"})
        by_notebook: dict[str, dict[str, Row]] = {}
        for row in rows:
            if row.chapter == chapter.name and row.exercise:
                by_notebook.setdefault(row.notebook, {})[row.exercise] = row
        for notebook, cells in by_notebook.items():
            scores = {f"Exercise {n}": gradebook._num(cells[n].score) if n in cells else 0
                      for n in numbers}
            total = round(sum(float(v) for v in scores.values()), 4)
            writer.writerow(gradebook.csv_row({
                "file": notebook, **scores, "total_points_earned": gradebook._num(total),
                "percent_correct": round(total / len(numbers), 4) if numbers else 0,
                "grading_status": "Completed"}))
