"""Grade students' notebooks with the book's own exercise checkers (``make grade``).

    python -m grading SUBMISSIONS [--out grading-report] [--timeout 10] [--jobs 1]
                      [--chapters overflow online-softmax ...] [--roster roster.csv]
                      [--partial-credit] [--strict] [--standalone]
    python -m grading --list-exercises   # every exercise, its checker, what it checks

SUBMISSIONS is a folder of the students' notebooks (the student edition, notebooks/student/,
with their code in the exercise cells): one sub-folder per student at any depth below it
(nbgrader's ``submitted/<student>/<assignment>/NAME.ipynb`` works as it is), notebooks
directly in it (the student is the file name), or a learning platform's export (Canvas's
``smithalice_1001_5551_Copy of overflow.ipynb``, Moodle's, Blackboard's: grading/gradebook.py).
``--roster`` maps them to a class list.  A notebook is matched to its chapter by its title
(its first ``# `` heading), else by its file name (``Copy of NAME.ipynb``, ``NAME (1)``,
``NAME-1`` too); any other notebook is reported as unrelated, an unreadable one as such.

The rules, the statuses and what it writes: grading/grade.py's docstring and grading/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

from grading.chapters import exercise_table
from grading.grade import STATUSES, grade


def _due(text: str) -> datetime:
    from grading.gradebook import parse_time

    found = parse_time(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"not a date and time: {text!r} (2026-01-20T23:59)")
    return found


def main(argv: list[str] | None = None) -> int:
    from grading.judge import TIMEOUT, WALL_FACTOR

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", nargs="?", type=Path,
                        help="folder of the students' notebooks")
    parser.add_argument("--out", type=Path, default=Path("grading-report"),
                        help="folder for the reports (default: grading-report)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT,
                        help="CPU seconds per exercise and student before it is killed "
                             f"(default {TIMEOUT:g}; wall-clock time: {WALL_FACTOR:g} times "
                             "as much)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="exercises graded at the same time (default 1)")
    parser.add_argument("--chapters", nargs="+", metavar="NAME",
                        help="the chapters assigned: a student without a notebook of one is "
                             "reported as missing it (default: the chapters found)")
    parser.add_argument("--roster", type=Path,
                        help="CSV of the class (student id, name, email): notebooks are "
                             "matched to it, and a student without a notebook is missing it")
    parser.add_argument("--partial-credit", action="store_true",
                        help="an exercise scores its checks passed / checks run")
    parser.add_argument("--strict", action="store_true",
                        help="any error of an exercise cell fails the exercise (default: a "
                             "statement that does not parse is skipped, an error after the "
                             "answer is noted)")
    parser.add_argument("--standalone", action="store_true",
                        help="run each exercise's cells alone (default: the student's earlier "
                             "exercise cells first, as Jupyter's Run all)")
    parser.add_argument("--due", type=_due, metavar="YYYY-MM-DDTHH:MM",
                        help="the deadline (UTC unless it names a zone): a notebook handed in "
                             "later, by nbgrader's timestamp.txt or Blackboard's name, loses "
                             "10%% a day begun, up to 3 days, then all (the guide's policy)")
    parser.add_argument("--list-exercises", action="store_true",
                        help="print every exercise, its checker and what it checks (Markdown)")
    args = parser.parse_args(argv)
    if args.list_exercises:
        print(exercise_table(), end="")
        return 0
    if args.submissions is None or not args.submissions.is_dir():
        parser.error("SUBMISSIONS must be a folder of notebooks")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.roster is not None and not args.roster.is_file():
        parser.error(f"--roster: no file {args.roster}")
    started = time.monotonic()
    try:
        rows = grade(args.submissions, args.out, timeout=args.timeout, jobs=args.jobs,
                     chapter_names=args.chapters, roster=args.roster,
                     partial_credit=args.partial_credit, strict=args.strict,
                     standalone=args.standalone, due=args.due)
    except ValueError as err:  # a roster without the columns it needs
        parser.error(str(err))
    counts = {status: sum(r.status == status for r in rows) for status in STATUSES}
    print(f"graded {len(rows)} rows: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
          + f" in {time.monotonic() - started:.0f} s")
    flagged = sum(bool(r.flags) for r in rows)
    if flagged:
        print(f"{flagged} rows flagged for the instructor (summary.md, last section)")
    print(f"reports in {args.out}/: results.csv, summary.md, results.json, gradebook.csv, "
          "gradebook_long.csv, feedback/, nbgrader_grades.csv, otter_final_grades_*.csv, "
          "canvas_import.csv, moodle_import.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
