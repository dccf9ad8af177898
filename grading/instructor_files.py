"""The generated parts of the instructor guide (book/instructor.md includes them):

    .venv/bin/python -m grading.instructor_files exercises    # book/instructor/exercises.md
    .venv/bin/python -m grading.instructor_files course       # book/instructor/course.md
    .venv/bin/python -m grading.instructor_files report [--keep FOLDER]
                                                     # book/instructor/sample-report.md

``exercises``: every exercise of the book, its checker and what the checker checks.
``course``: the course plan (:data:`MEETINGS`), with each meeting's pre-reading counted from
the chapters (words of prose, outside code, math and solutions, read at :data:`WPM` words a
minute) and its exercises.  Both are fast; a test fails when a committed file is out of date.
``report``: a sample class, six students' notebooks of the chapter "Beyond
FlashAttention-1", graded by grading/grade.py; its Markdown summary, headings demoted to sit
under the guide's "##" heading.

The students (the student edition of the chapter with their answers in the exercise cells):
alice answers everything right; bob averages the splits, repeats K and V (in numpy) and
averages the gradient; carol's split-KV loops forever; dave's gqa raises and his gradient is
right; erin hands in the notebook untouched; frank calls the library for split-KV and gqa
and pastes the book's published solution for the gradient.  Takes a minute or two.
"""

from __future__ import annotations

import argparse
import copy
import re
import tempfile
from pathlib import Path

import nbformat

from grading import chapters as grading_chapters
from grading import grade
from tools import notebooks, toc
from tools.paths import ROOT

CHAPTER = ROOT / "book" / "beyond.md"
REPORT = ROOT / "book" / "instructor" / "sample-report.md"
EXERCISES = ROOT / "book" / "instructor" / "exercises.md"
COURSE = ROOT / "book" / "instructor" / "course.md"
#: Words a minute for the pre-reading: a careful pace for technical prose with equations (our
#: planning figure, not a measurement; the table shows the words, so scale it to your class).
WPM = 150
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
import numpy as np

def gqa(q, k, v):
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)  # a copy per query head
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v
"""
SPLIT_KV_LIBRARY = """
from flashlib import naive_attention

def split_kv(q, K, V, n_splits):
    return naive_attention(q, K, V)  # no split at all
"""
GQA_LIBRARY = """
from flashlib import flash_attention

def gqa(q, k, v):
    return flash_attention(q, k, v)  # the library does grouped-query attention
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
    "frank": (SPLIT_KV_LIBRARY, GQA_LIBRARY, "published"),
}


def write_class(folder: Path) -> None:
    """One folder per student holding their beyond.ipynb."""
    from grading.chapters import solutions

    official = nbformat.read(notebooks.target(CHAPTER, student=True), as_version=4)
    cells = grading_chapters.exercise_cells(official)
    numbers = sorted(cells, key=grading_chapters.number_key)
    published = solutions(CHAPTER)
    for student, answers in STUDENTS.items():
        nb = copy.deepcopy(official)
        for number, source in zip(numbers, answers, strict=True):
            if source == "published":
                source = published[number]
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
    checks), narrow enough for the page; ``python -m grading --list-exercises`` gives more."""
    lines = ["| chapter | exercise | checker | what it checks |", "| --- | --- | --- | --- |"]
    for chapter in grading_chapters.load_chapters().values():
        for number in sorted(chapter.exercises, key=grading_chapters.number_key):
            title, doc = grading_chapters.checker_description(chapter.exercises[number].checker)
            doc = doc.replace("|", "\\|")
            lines.append(f"| {{doc}}`{chapter.name}` | {number} | {title} | "
                         f"{doc} |")
        for number in chapter.ungraded:
            lines.append(f"| {chapter.name} | {number} | - | no checker (not graded) |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The course plan
# ---------------------------------------------------------------------------------------------

#: Five meetings of about 90 minutes (a 5-week module), balanced by reading and exercises.
#: Each: title, chapters, what to present (minutes), the exercises done in class (the rest of
#: the chapters' exercises are homework), and the outcomes, each with the exercises that
#: assess it.
MEETINGS = [
    {"title": "Attention, its cost, and the overflow of exp",
     "chapters": ["intro", "overflow"],
     "lecture": "20 min: Algorithm 0 and where its n x n matrices live ({term}`HBM`, "
                "{term}`SRAM`); "
                "exp's overflow threshold and the safe softmax",
     "in_class": ["1.1", "1.3", "2.1", "2.2"],
     "outcomes": [
         ("count the FLOPs and the HBM traffic of standard attention from its algorithm "
          "box, give the shape of each of its arrays, and find the block size at which "
          "FlashAttention's memory and compute times balance", ["1.1", "1.2", "1.3", "1.5"]),
         ("write attention in numpy that neither overflows nor warns, in float16, 32 and 64",
          ["1.4", "2.1"]),
         ("find the largest safe input of exp in each format, and the promotion numpy 2 "
          "does silently", ["2.2", "2.3", "2.4"])]},
    {"title": "The online softmax, and tiling",
     "chapters": ["online-softmax", "tiling"],
     "lecture": "20 min: the one-pass update and its proof; merging partial states; "
                "Algorithm 1 against FlashAttention-2's loop order",
     "in_class": ["3.1", "3.2", "3.4", "4.3"],
     "outcomes": [
         ("derive and write the online update and the merge of partial states, the empty "
          "state included", ["3.1", "3.2", "3.3"]),
         ("build a counterexample for a merge that forgets to rescale, and explain in words "
          "why the bug hides on many inputs", ["3.4"]),
         ("write FlashAttention-2's tiled loop (its running m, l and acc) without an n x n "
          "array, count its writes of O, and size square blocks for an SRAM with a pencil",
          ["4.1", "4.2", "4.3", "4.4", "4.5"])]},
    {"title": "Making it fast, and masks",
     "chapters": ["optimisation-ladder", "masking"],
     "lecture": "20 min: the ladder's rungs and the GPU technique each one mirrors; masks as "
                "predicates on (query, key), and the tiles they empty",
     "in_class": ["5.1", "5.4", "6.1", "6.4"],
     "outcomes": [
         ("name the GPU technique behind a rung, and fold the scale into exp2 or the row "
          "sum into the matmul", ["5.1", "5.2", "5.3"]),
         ("count the tiles causal attention computes and masks, and predict its time against "
          "non-causal", ["5.4", "6.1"]),
         ("write a masked forward that returns O = 0 and L = -inf on rows that see no key, "
          "with no NaN", ["6.2", "6.3", "6.4"]),
         ("draw a tile's dropout mask from a counter-based generator (Philox), so that any "
          "tiling regenerates the same bits", ["6.5"])]},
    {"title": "The backward pass, and precision",
     "chapters": ["backward", "precision"],
     "lecture": "25 min: D = rowsum(dO * O), recomputation, the base-2 trap; rounding to "
                "bfloat16 and {term}`FP8`, flash-attn's 2x rule",
     "in_class": ["7.1", "7.3", "8.1", "8.4"],
     "outcomes": [
         ("derive D (with a gradient of L too) and dS from the softmax's Jacobian, and "
          "check gradients by finite differences", ["7.1", "7.2", "7.3", "7.4"]),
         ("write FlashAttention-2's tiled backward with a mask, rows that see no key "
          "included, against autograd", ["7.5"]),
         ("write FlashAttention-1's backward (Algorithm 4) from m and l, with dQ_i read and "
          "written at every step, and say what FlashAttention-2 changed", ["7.6"]),
         ("write a backward tile with dropout: the mask regenerated from the forward's "
          "counters, dV and dP through it, dS from the undropped P", ["7.7"]),
         ("simulate rounding to p significant bits and a bfloat16 sum, and decide which "
          "quantities must stay float32", ["8.1", "8.2", "8.3"]),
         ("state flash-attn's 2x rule, with FlashAttention-3's allowance, as a test, and "
          "rotate outliers away before FP8",
          ["8.4", "8.5"])]},
    {"title": "The IO model, and beyond FlashAttention-1",
     "chapters": ["io-model", "beyond"],
     "lecture": "25 min: Theorem 2 against a counting memory, the {term}`roofline`; "
                "{term}`split-KV` decoding, {term}`grouped-query attention` and a "
                "{term}`KV cache` kept in pages",
     "in_class": ["9.1", "9.3", "11.1"],
     "outcomes": [
         ("count Algorithm 0's and Algorithm 1's HBM traffic, and find the SRAM size below "
          "which tiling loses", ["9.1", "9.2", "9.3"]),
         ("combine the split-KV shares of decoding queries (Flash-Decoding)",
          ["9.4", "11.1"]),
         ("write grouped-query attention and its K/V gradient without a copy of K and V per "
          "query head", ["11.2", "11.3"]),
         ("decode over a cache kept in pages: read each run of pages through the sequence's "
          "{term}`block table` and merge the runs", ["11.4"])]},
]
#: Chapters outside the five meetings: an extension for a class with a GPU, or reading.
OPTIONAL = ["gpu"]


def prose_words(source: Path) -> int:
    """Words of a chapter's prose: its text without solutions, code cells and blocks, math
    blocks, directive lines and front matter (what a student reads before class)."""
    text = source.read_text(encoding="utf-8")
    text = re.sub(r"^```\{solution-start\}.*?^```\{solution-end\}\n```", " ", text,
                  flags=re.S | re.M)
    text = re.sub(r"^---\n.*?\n---\n", " ", text, count=1, flags=re.S)
    text = re.sub(r"^(`{3,}|:{3,})\{solution\}.*?^\1\s*$", " ", text, flags=re.S | re.M)
    text = re.sub(r"^```.*?^```", " ", text, flags=re.S | re.M)
    text = re.sub(r"^:{3,}.*$|^:\w[\w-]*:.*$", " ", text, flags=re.M)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    return len(re.findall(r"[A-Za-z][A-Za-z'-]*", text))


def course_plan() -> str:
    """Markdown: the meetings, their pre-reading (computed), exercises and outcomes."""
    chapters = grading_chapters.load_chapters()
    titles = toc.page_titles()
    stats = {}
    for name in chapters:
        source = ROOT / "book" / f"{name}.md"
        stats[name] = (prose_words(source), sorted(chapters[name].exercises,
                                                   key=grading_chapters.number_key))
    planned = [c for m in MEETINGS for c in m["chapters"]] + OPTIONAL
    missing = sorted({n for n, c in chapters.items() if c.exercises} - set(planned))
    if missing:
        raise ValueError(f"MEETINGS leaves out the chapters {missing}")
    lines = [f"| meeting | pre-reading (words; minutes at {WPM} words a minute) | lecture | "
             "exercises in class | homework |", "| --- | --- | --- | --- | --- |"]
    for k, meeting in enumerate(MEETINGS, 1):
        words = sum(stats[c][0] for c in meeting["chapters"])
        reading = "; ".join(f"{{doc}}`{c}` ({stats[c][0]:,})" for c in meeting["chapters"])
        numbers = [n for c in meeting["chapters"] for n in stats[c][1]]
        homework = [n for n in numbers if n not in meeting["in_class"]]
        lines.append(f"| {k}. {meeting['title']} | {reading}: {words:,} words, about "
                     f"{round(words / WPM / 5) * 5} min | {meeting['lecture']} | "
                     f"{', '.join(meeting['in_class'])} | {', '.join(homework)} |")
    for name in OPTIONAL:
        words, numbers = stats[name]
        lines.append(f"| extension | {{doc}}`{name}` ({words:,} words, about "
                     f"{round(words / WPM / 5) * 5} min) | for a class with a GPU, or as "
                     f"reading | - | {', '.join(numbers)} |")
    lines += ["", "What a student can do after each meeting (the exercises that assess it):",
              ""]
    for k, meeting in enumerate(MEETINGS, 1):
        lines.append(f"{k}. *{meeting['title']}*:")
        for outcome, numbers in meeting["outcomes"]:
            lines.append(f"   - {outcome} ({', '.join(numbers)})")
    assessed = {n for m in MEETINGS for _, ns in m["outcomes"] for n in ns}
    unassessed = sorted({n for c in planned if c not in OPTIONAL for n in stats[c][1]}
                        - assessed, key=grading_chapters.number_key)
    if unassessed:
        raise ValueError(f"exercises no outcome names: {unassessed}")
    total = sum(stats[c][0] for m in MEETINGS for c in m["chapters"])
    lines += ["", f"In all, {total:,} words of prose and "
                  f"{sum(len(stats[c][1]) for m in MEETINGS for c in m['chapters'])} exercises "
                  f"over {len(MEETINGS)} meetings, plus the extension. Exercise numbers are "
                  f"those the book shows: {titles['book/intro'][0]}'s introduction is "
                  "chapter 1, so 2.1 is the first exercise of the overflow chapter."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["exercises", "course", "report"])
    parser.add_argument("--keep", type=Path, help="report: also keep the class and reports here")
    args = parser.parse_args(argv)
    if args.what == "exercises":
        EXERCISES.write_text(exercise_table())
        print(f"wrote {EXERCISES.relative_to(ROOT)}")
        return 0
    if args.what == "course":
        COURSE.write_text(course_plan())
        print(f"wrote {COURSE.relative_to(ROOT)}")
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
