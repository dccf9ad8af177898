"""A made-up class of students' notebooks, to try `make grade` before a real class hands in.

    python -m grading.made_up_class FOLDER [--students 40] [--chapters overflow beyond ...]
    make grade SUBMISSIONS=FOLDER GRADE_ARGS="--jobs 2"

Writes FOLDER/<student>/<chapter>.ipynb: the student edition (notebooks/student/) with each
exercise cell replaced by what a kind of student writes.  The students cycle through the
first seven profiles (``PROFILES``), so any class of 7 or more has one of each; with
``--hostile`` the last two students are a cheater and a destructive one:

    solution     the book's own solutions (the code in each "Solution to Exercise" block)
    blank        the notebooks as handed out, untouched
    partial      the solutions of the first half of each chapter's exercises
    mistake      an answer one step off: the solution's result nudged (a number + 1, an
                 array + 1, another letter), what a checker must fail
    crash        the solutions, but one exercise per chapter ends the process (os._exit)
    loop         the solutions, but one exercise per chapter loops forever
    parallel     the solutions, each call run in a multiprocessing pool that is never closed
                 (a ResourceWarning, not a numpy one)
    cheater      each exercise tries one trick on the grader (``CHEATS``), then gives up
    destructive  each exercise tries to damage the grader, the machine or a classmate
                 (``ATTACKS``), then answers right

The last two are written only with ``--hostile``: grade such a class only where `make grade`
says the students' code is confined at the namespaces level (bubblewrap), since without the
sandbox their code runs with your permissions (the attacks aim at the class's own hidden
``.canary`` folder only, but a fork bomb and 6 GiB of memory are what they are).

The cheats and attacks are those an instructor's review of the grader tried (issue 25): a
forged result, a patched checker or numpy, a classmate's answer, a result line appended, a
daemon that outlives its exercise, a parent kill, a fork bomb, 6 GiB of memory, 200 MiB of
files.  tests/grading/test_grade_attacks.py grades each one and checks that nothing but the
attacker's own exercise changes.
"""

from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path

import nbformat

from grading.chapters import exercise_cells, number_key, solutions
from tools import notebooks, toc
from tools.paths import ROOT

PROFILES = ("solution", "blank", "partial", "mistake", "crash", "loop", "parallel", "cheater",
            "destructive")
#: The profiles that attack the grader: written only when asked (``--hostile``).
HOSTILE = ("cheater", "destructive")
CHECK_CALL = re.compile(r"^(?P<call>check_\w+\(.*\))\s*$", re.MULTILINE)

#: Tricks on the grader's verdict.  Each is an exercise cell; ``{call}`` stands for the
#: exercise's checker call, ``{canary}`` for the folder that plays the instructor's files (the
#: class's hidden ``.canary`` folder, with a ``victim.txt`` to delete), ``{book}`` for the
#: book's sources; the tricks reach nothing else, so that a run without the sandbox damages
#: nothing but the class's own folder.
CHEATS = {
    "forged result": """
# write a "passed" record into every descriptor the process holds, then leave
import json, os
record = json.dumps({"status": "passed", "checks_passed": 9, "checks_total": 9})
for fd in range(3, 64):
    try:
        os.write(fd, record.encode() + b"\\n")
    except OSError:
        pass
os._exit(0)
""",
    "patched checker": """
from flashlib.book.exercises import Feedback
Feedback.passed = property(lambda self: True)
Feedback.fail = Feedback.ok
{call}
""",
    "patched numpy": """
import numpy as np
np.allclose = lambda *a, **k: True
np.array_equal = lambda *a, **k: True
np.isclose = lambda *a, **k: np.True_
{call}
""",
    "copied classmate": """
# look for a classmate's answer in the grader's memory and in the files around, and run it
import gc, glob
found = [o for o in gc.get_objects() if isinstance(o, dict) and "cells" in o]
for path in glob.glob("{canary}/../**/*.ipynb", recursive=True) + glob.glob(
        "/tmp/**/*.json", recursive=True):
    try:
        found.append(open(path).read())
    except OSError:
        pass
for task in found:
    for cell in (task.get("cells", []) if isinstance(task, dict) else []):
        try:
            exec(cell if isinstance(cell, str) else cell.get("source", ""), globals())
        except BaseException:
            pass
""",
    "appended result": """
# append "failed" lines for every task to any results file in reach
import glob, json
for path in glob.glob("{canary}/../**/results*", recursive=True) + glob.glob(
        "/tmp/**/results*", recursive=True):
    try:
        with open(path, "a") as f:
            for i in range(100):
                f.write(json.dumps({"id": str(i), "status": "failed"}) + "\\n")
    except OSError:
        pass
""",
}

#: Attacks on the grader, the machine and the classmates (the same bounds as ``CHEATS``).
ATTACKS = {
    "daemon": """
# a daemon that outlives the exercise and rewrites the reports
import glob, os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(3)
        for path in glob.glob("{canary}/../**/*.csv", recursive=True):
            try:
                open(path, "w").write("hacked\\n")
            except OSError:
                pass
        try:
            open("{canary}/daemon-was-here", "w").write("hacked")
        except OSError:
            pass
        os._exit(0)
    os._exit(0)
""",
    "parent kill": """
import os, signal
os.kill(os.getppid(), signal.SIGKILL)
""",
    "fork bomb": """
import os, time
for _ in range(2000):
    try:
        if os.fork() == 0:
            time.sleep(10)
            os._exit(0)
    except OSError:
        time.sleep(0.01)
""",
    "memory": """
import numpy as np
hog = np.ones(6 * 2**30, dtype=np.uint8)  # 6 GiB, touched
""",
    "files": """
# 20 files of 10 MiB, then one of 200 MiB
for i in range(20):
    with open(f"junk{i}.bin", "wb") as f:
        f.write(b"x" * (10 * 2**20))
with open("big.bin", "wb") as f:
    f.write(b"x" * (200 * 2**20))
""",
    "outside": """
# delete and write outside the exercise's folder: the instructor's files, the book
import os
try:
    os.remove("{canary}/victim.txt")
except OSError:
    pass
for path in ("{canary}/owned.txt", "{book}/grade-canary.md"):
    try:
        open(path, "w").write("owned")
    except OSError:
        pass
""",
}
CANARY = ".canary"


def canary(folder: Path) -> Path:
    """The class's stand-in for the instructor's files (a hidden folder: not graded)."""
    path = folder / CANARY
    path.mkdir(parents=True, exist_ok=True)
    (path / "victim.txt").write_text("the instructor's file\n", encoding="utf-8")
    return path


def hostile(code: str, folder: Path) -> str:
    """A cheat or attack with its placeholders filled in for the class in ``folder``."""
    return code.replace("{canary}", str(canary(folder).resolve())).replace(
        "{book}", str(ROOT / "book"))


#: What the "parallel" student wraps around each solution: the call runs in a pool's worker
#: thread (a process pool cannot pickle notebook functions), and the pool is never closed.
PARALLEL = """
from multiprocessing.pool import ThreadPool as _Pool
_solution_{name} = {name}
def {name}(*args, **kwargs):
    pool = _Pool(2)  # never closed: a ResourceWarning when it is collected
    return pool.apply(_solution_{name}, args, kwargs)
"""

#: What the "mistake" student wraps around each solution: the answer nudged.
MISTAKE = """
_solution_{name} = {name}
def _nudge(x):
    import numpy as np
    if isinstance(x, str):
        return "b" if x != "b" else "c"
    if isinstance(x, (tuple, list)):
        return type(x)(_nudge(v) for v in x)
    if isinstance(x, dict):
        return {{k: _nudge(v) for k, v in x.items()}}
    if isinstance(x, (set, frozenset)):
        return set(x) ^ {{"S"}}
    try:
        return x + 1
    except TypeError:
        return x
def {name}(*args, **kwargs):
    return _nudge(_solution_{name}(*args, **kwargs))
"""


def defined_name(code: str) -> str | None:
    """The last top-level function or variable the code defines (what the checker gets)."""
    names = re.findall(r"^(?:def (\w+)|(\w+) = )", code, re.MULTILINE)
    return next((a or b for a, b in reversed(names)), None)


def answer(profile: str, number: str, k: int, n: int, starter: str, solution: str | None,
           name: str | None, call: str) -> str | None:
    """The exercise cell a student of ``profile`` hands in (None: the starter, untouched);
    ``k`` is the exercise's rank in the chapter (from 0), ``n`` their number."""
    right = (solution or starter).strip("\n")
    with_call = right if CHECK_CALL.search(right) else f"{right}\n\n\n{call}"
    fn = name if name and re.search(rf"^def {name}\(", right, re.MULTILINE) else None
    if profile == "solution":
        return with_call
    if profile == "partial":
        return with_call if k < (n + 1) // 2 else None
    if profile == "mistake":
        if fn is None:
            return None
        return f"{right}\n{MISTAKE.format(name=fn)}\n\n{call}"
    if profile in ("crash", "loop") and k != n // 2:  # one exercise per chapter goes wrong
        return with_call
    if profile == "crash":
        return f"import os\n\n\ndef {fn}(*args, **kwargs):\n    os._exit(3)\n\n\n{call}" \
            if fn else "import os\nos._exit(3)"
    if profile == "loop":
        return f"def {fn}(*args, **kwargs):\n    while True:\n        pass\n\n\n{call}" \
            if fn else "while True:\n    pass"
    if profile == "parallel":
        return f"{right}\n{PARALLEL.format(name=fn)}\n\n{call}" if fn else with_call
    if profile == "cheater":
        tricks = list(CHEATS.values())
        return tricks[k % len(tricks)].replace("{call}", call).strip("\n")
    if profile == "destructive":
        attacks = list(ATTACKS.values())
        return attacks[k % len(attacks)].strip("\n") + f"\n\n\n{with_call}"
    return None


def student_notebook(source: Path, profile: str, folder: Path | None = None
                     ) -> nbformat.NotebookNode:
    """The chapter's student notebook as a student of ``profile`` hands it in (``folder``:
    the class's, whose ``.canary`` the hostile profiles aim at)."""
    nb = nbformat.read(notebooks.target(source, student=True), as_version=4)
    cells = exercise_cells(nb)
    found = solutions(source)
    numbers = sorted(cells, key=number_key)
    for k, number in enumerate(numbers):
        if not cells[number]:
            continue
        index = cells[number][0]
        starter = nb.cells[index].source
        calls = CHECK_CALL.findall(starter)
        call = calls[-1] if calls else ""
        solution = found.get(number)
        name = defined_name(solution or starter)
        code = answer(profile, number, k, len(numbers), starter, solution, name, call)
        if code is not None and profile in HOSTILE:
            if folder is None:
                raise ValueError(f"the {profile} profile needs the class's folder")
            code = hostile(code, folder)
        if code is not None:
            nb.cells[index] = copy.deepcopy(nb.cells[index])
            nb.cells[index].source = code
    return nb


def class_profiles(students: int, hostile: bool) -> list[str]:
    """The profile of each student: the honest profiles in turn; with ``hostile``, the last
    two students are the cheater and the destructive one (one each, as in the class of issue
    25)."""
    honest = [p for p in PROFILES if p not in HOSTILE]
    extra = list(HOSTILE) if hostile else []
    count = max(0, students - len(extra))
    return [honest[i % len(honest)] for i in range(count)] + extra[:students]


def write_class(folder: Path, students: int = 40, chapters: list[str] | None = None,
                profiles: tuple[str, ...] | list[str] | None = None) -> dict[str, str]:
    """Write the class; ``{student: profile}``.  Students are named ``s01-solution``...;
    ``profiles``: one per student (default: :func:`class_profiles`, honest only), or fewer,
    taken in turn."""
    sources = [s for s in toc.chapters() if chapters is None or s.stem in chapters]
    profiles = list(profiles or class_profiles(students, hostile=False))
    roster = {}
    for i in range(students):
        profile = profiles[i % len(profiles)]
        student = f"s{i + 1:02d}-{profile}"
        roster[student] = profile
        (folder / student).mkdir(parents=True, exist_ok=True)
        for source in sources:
            nbformat.write(student_notebook(source, profile, folder),
                           folder / student / f"{source.stem}.ipynb")
    return roster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--chapters", nargs="+", metavar="NAME")
    parser.add_argument("--profiles", nargs="+", choices=PROFILES,
                        help="the kinds of students, in turn (default: all but the hostile)")
    parser.add_argument("--hostile", action="store_true",
                        help="the last two students are a cheater and a destructive one: grade "
                             "such a class only where `make grade` reports the namespaces "
                             "level")
    args = parser.parse_args(argv)
    profiles = args.profiles or class_profiles(args.students, args.hostile)
    roster = write_class(args.folder, args.students, args.chapters, profiles)
    print(f"wrote {len(roster)} students' notebooks into {args.folder}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
