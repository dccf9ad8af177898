"""The generated parts of the instructor guide (book/instructor.md includes them):

    .venv/bin/python -m tools.instructor_files exercises    # book/instructor/exercises.md
    .venv/bin/python -m tools.instructor_files report [--keep FOLDER]
                                                     # book/instructor/sample-report.md

``exercises``: every exercise of the book, its checker and what the checker checks (fast; a
test fails when the committed table is out of date).  ``report``: a sample class, five
students' notebooks of the chapter "Beyond FlashAttention-1", graded by tools/grade.py; its
Markdown summary, headings demoted to sit under the guide's "##" heading.

The students (the student edition of the chapter with their answers in the exercise cells):
alice answers everything right; bob averages the splits, repeats K and V and averages the
gradient; carol's split-KV loops forever; dave's gqa raises and his gradient is right; erin
hands in the notebook untouched.  Takes a minute or two (the chapter runs once).
"""

from __future__ import annotations

import argparse
import copy
import re
import tempfile
from pathlib import Path

import nbformat

from tools import grade, notebooks
from tools.paths import BOOK, ROOT

CHAPTER = BOOK / "beyond.md"
REPORT = BOOK / "instructor" / "sample-report.md"
EXERCISES = BOOK / "instructor" / "exercises.md"
TIMEOUT = 10.0

SPLIT_KV = """
import numpy as np
from flashlib import flash_attention

def split_kv(q, K, V, n_splits):
    size = -(-len(K) // n_splits)
    parts = [flash_attention(q, K[s:s + size], V[s:s + size], return_lse=True)
             for s in range(0, len(K), size)]
    O = np.stack([o for o, _ in parts])
    L = np.stack([lse for _, lse in parts])
    return np.sum(np.exp(L - np.logaddexp.reduce(L, axis=0))[..., None] * O, axis=0)
"""
SPLIT_KV_MEAN = """
import numpy as np
from flashlib import flash_attention

def split_kv(q, K, V, n_splits):
    size = -(-len(K) // n_splits)
    return np.mean([flash_attention(q, K[s:s + size], V[s:s + size])
                    for s in range(0, len(K), size)], axis=0)
"""
SPLIT_KV_LOOPS = """
def split_kv(q, K, V, n_splits):
    s = 0
    while s < len(K):  # forgot to advance s
        pass
"""
GQA = """
import numpy as np

def gqa(q, k, v):
    *lead, h_q, n_q, d = q.shape
    h_kv = k.shape[-3]
    q = q.reshape(*lead, h_kv, h_q // h_kv, n_q, d)
    s = q @ k[..., None, :, :].swapaxes(-1, -2) / np.sqrt(d)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ v[..., None, :, :]).reshape(*lead, h_q, n_q, v.shape[-1])
"""
GQA_REPEAT = """
from flashlib import naive_attention
import numpy as np

def gqa(q, k, v):
    g = q.shape[-3] // k.shape[-3]
    return naive_attention(q, np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3))
"""
GQA_RAISES = """
def gqa(q, k, v):
    return q @ k.swapaxes(-1, -2)  @ v  # heads do not match
"""
KV_GRAD = """
def kv_grad(dk_rep, h_kv):
    *lead, h_q, n_k, d = dk_rep.shape
    return dk_rep.reshape(*lead, h_kv, h_q // h_kv, n_k, d).sum(axis=-3)
"""
KV_GRAD_MEAN = KV_GRAD.replace(".sum(axis=-3)", ".mean(axis=-3)")

STUDENTS = {
    "alice": (SPLIT_KV, GQA, KV_GRAD),
    "bob": (SPLIT_KV_MEAN, GQA_REPEAT, KV_GRAD_MEAN),
    "carol": (SPLIT_KV_LOOPS, None, None),
    "dave": (None, GQA_RAISES, KV_GRAD),
    "erin": (None, None, None),
}


def write_class(folder: Path) -> None:
    """One folder per student holding their beyond.ipynb."""
    official = nbformat.read(notebooks.target(CHAPTER, student=True), as_version=4)
    cells = grade.exercise_cells(official)
    numbers = sorted(cells, key=grade.number_key)
    for student, answers in STUDENTS.items():
        nb = copy.deepcopy(official)
        for number, source in zip(numbers, answers, strict=True):
            if source is not None:
                (index,) = cells[number]
                call = nb.cells[index].source.strip().splitlines()[-1]  # the checker call
                nb.cells[index].source = source.strip("\n") + "\n\n\n" + call
        (folder / student).mkdir(parents=True)
        nbformat.write(nb, folder / student / "beyond.ipynb")


def demoted(markdown: str) -> str:
    """The summary with its headings two levels lower, to sit under a ## heading."""
    return re.sub(r"^(#+) ", lambda m: "#" * (len(m[1]) + 2) + " ", markdown, flags=re.M)


def exercise_table() -> str:
    """Markdown: one row per exercise (chapter, number, the checker's title and what it
    checks), narrow enough for the page; ``tools/grade.py --list-exercises`` gives more."""
    lines = ["| chapter | exercise | checker | what it checks |", "| --- | --- | --- | --- |"]
    for chapter in grade.load_chapters().values():
        for number in sorted(chapter.exercises, key=grade.number_key):
            title, doc = grade.checker_description(chapter.exercises[number].checker)
            doc = doc.replace("|", "\\|")
            lines.append(f"| {{doc}}`{chapter.name}` | {number} | {title} | "
                         f"{doc} |")
        for number in chapter.ungraded:
            lines.append(f"| {chapter.name} | {number} | - | no checker (not graded) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["exercises", "report"])
    parser.add_argument("--keep", type=Path, help="report: also keep the class and reports here")
    args = parser.parse_args(argv)
    if args.what == "exercises":
        EXERCISES.write_text(exercise_table())
        print(f"wrote {EXERCISES.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        write_class(base / "submissions")
        grade.grade(base / "submissions", base / "report", timeout=TIMEOUT)
        summary = (base / "report" / "summary.md").read_text()
    REPORT.write_text(demoted(summary))
    print(f"wrote {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
