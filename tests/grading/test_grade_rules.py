"""grading/grade.py's rules (issue 25, "fair rules"): earlier exercise cells run first as in
Jupyter, a typo in a scratch line does not zero a right answer, partial credit, a warning
named after its source, library answers refused; and the same grades at every level of
confinement the machine may offer (grading/sandbox.py).

The class is the online-softmax notebook (the fastest chapter), with benign students only:
the levels below the full sandbox run their code with the tests' permissions.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from grading import grade, sandbox
from tests.helpers import student_notebook

pytestmark = pytest.mark.slow  # notebooks graded in the sandbox: `make test`, not `make check`

CHAPTER = grade.ROOT / "book" / "online-softmax.md"
TIMEOUT = 8.0
RIGHT_MERGE = """
def merge(a, b):
    m = np.maximum(a[0], b[0])
    safe = np.where(np.isneginf(m), 0.0, m)
    wa, wb = a[1] * np.exp(a[0] - safe), b[1] * np.exp(b[0] - safe)
    l = wa + wb
    o = wa[:, None] * a[2] + wb[:, None] * b[2]
    return m, l, np.where((l > 0)[:, None], o / np.where(l > 0, l, 1.0)[:, None], 0.0)
"""
#: 3.1 defines a helper that 3.2 uses: fine in Jupyter, so fine here (not with --standalone)
HELPER_31 = """
def my_rescale(l, m_old, m_new):
    return l * np.exp(m_old - m_new)


def update(m, l, xs):
    if len(xs) == 0:
        return m, l
    m_new = max(m, np.max(xs))
    if m_new == -np.inf:
        return m_new, l
    return m_new, l * np.exp2(m - m_new) + np.sum(np.exp2(xs - m_new))


check_online_update(update)
"""
HELPER_32 = """
def merge(a, b):
    m = np.maximum(a[0], b[0])
    safe = np.where(np.isneginf(m), 0.0, m)
    wa, wb = a[1] * my_rescale(1.0, a[0], safe), b[1] * my_rescale(1.0, b[0], safe)
    l = wa + wb
    o = wa[:, None] * a[2] + wb[:, None] * b[2]
    return m, l, np.where((l > 0)[:, None], o / np.where(l > 0, l, 1.0)[:, None], 0.0)


check_merge(merge)
"""
#: a right merge, then a scratch line with a typo (a name error), then one that does not parse
TYPO_RUNTIME = RIGHT_MERGE + "\nprint(merg(1, 2))  # scratch\n\ncheck_merge(merge)\n"
TYPO_SYNTAX = RIGHT_MERGE + "\nprint(merge(1, 2)  # scratch, unclosed\n\ncheck_merge(merge)\n"
#: the right merge, run in a pool that is never closed: Python's ResourceWarning
POOL = RIGHT_MERGE.replace("def merge(", "def merge0(") + """
import gc
from multiprocessing.pool import ThreadPool


def merge(a, b):
    pool = ThreadPool(2)
    result = pool.apply(merge0, (a, b))
    del pool
    gc.collect()  # the unclosed pool's warning now, not whenever the collector next runs
    return result


check_merge(merge)
"""
LIBRARY = """
from flashlib.fast.online import merge_partials


def merge(a, b):
    return merge_partials(a, b)


check_merge(merge)
"""
#: right but for the masked block into the empty state (NaN): 6 of the 7 first checks
HALF = """
def update(m, l, xs):
    m_new = max(m, np.max(xs)) if len(xs) else m
    return m_new, l * np.exp2(m - m_new) + np.sum(np.exp2(xs - m_new))


check_online_update(update)
"""
#: a process left behind, harmless (it sleeps): killed when the exercise ends
SLEEPER = """
import subprocess
subprocess.Popen(["sleep", "31415"], start_new_session=True)
""" + RIGHT_MERGE + "\ncheck_merge(merge)\n"
LOOP = "def merge(a, b):\n    while True:\n        pass\n\n\ncheck_merge(merge)\n"
CRASH = "import os\n\n\ndef merge(a, b):\n    os._exit(3)\n\n\ncheck_merge(merge)\n"
#: waits without computing: only the wall-clock limit (3 x the CPU limit) ends it
NAPPER = "import time\n\n\ndef merge(a, b):\n    time.sleep(1000)\n\n\ncheck_merge(merge)\n"


def notebook(answers: dict[str, str]) -> nbformat.NotebookNode:
    return student_notebook(CHAPTER, answers)


CLASS = {
    "helper": {"3.1": HELPER_31, "3.2": HELPER_32},
    "typo": {"3.2": TYPO_RUNTIME},
    "syntax": {"3.2": TYPO_SYNTAX},
    "pool": {"3.2": POOL},
    "library": {"3.2": LIBRARY},
    "half": {"3.1": HALF},
    "sleeper": {"3.2": SLEEPER},
}


def write(folder, students: dict[str, dict[str, str]]) -> None:
    for name, answers in students.items():
        (folder / name).mkdir(parents=True)
        nbformat.write(notebook(answers), folder / name / "online-softmax.ipynb")


def rows_of(out) -> dict[tuple[str, str], dict[str, str]]:
    with open(out / "results.csv", encoding="utf-8", newline="") as f:
        return {(r["student"], r["exercise"]): r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rules")
    write(folder / "subs", CLASS)
    runs = {}
    for name, options in {"default": {}, "strict": {"strict": True, "standalone": True},
                          "partial": {"partial_credit": True}}.items():
        grade.grade(folder / "subs", folder / name, timeout=TIMEOUT, jobs=2, **options)
        runs[name] = rows_of(folder / name)
    runs["folder"] = folder
    return runs


def test_earlier_cells_run_first_as_in_jupyter(graded):
    assert graded["default"][("helper", "3.2")]["status"] == "passed"
    standalone = graded["strict"][("helper", "3.2")]  # --standalone: the helper is missing
    assert standalone["status"] == "failed"
    assert "your function raised NameError: name 'my_rescale' is not defined" in (
        standalone["first_problem"])


def test_a_typo_in_a_scratch_line_does_not_zero_a_right_answer(graded):
    typo = graded["default"][("typo", "3.2")]
    assert typo["status"] == "passed"
    assert "NameError: name 'merg' is not defined" in typo["notes"]
    syntax = graded["default"][("syntax", "3.2")]
    assert syntax["status"] == "passed"
    assert "a syntax error on line" in syntax["notes"]
    for student in ("typo", "syntax"):  # --strict: the old rule, any error fails
        strict = graded["strict"][(student, "3.2")]
        assert strict["status"] == "error", strict
        assert strict["first_problem"].startswith("the exercise cell raised")


def test_a_warning_is_named_after_its_source(graded):
    pool = graded["default"][("pool", "3.2")]
    assert pool["status"] == "failed"
    assert "Python's multiprocessing warned 'ResourceWarning: unclosed running " \
           "multiprocessing pool" in pool["first_problem"]
    assert "numpy warned" not in pool["first_problem"]


def test_a_library_answer_is_refused(graded):
    library = graded["default"][("library", "3.2")]
    assert library["status"] == "failed"
    assert "refused: your code calls flashlib's `merge_partials`" in library["first_problem"]
    assert "merge_partials" in library["flags"]


def test_partial_credit(graded):
    half = graded["partial"][("half", "3.1")]
    passed, total = int(half["checks_passed"]), int(half["checks_total"])
    assert 0 < passed < total
    assert float(half["score"]) == pytest.approx(passed / total, abs=1e-4)
    assert graded["default"][("half", "3.1")]["score"] == "0"
    with open(graded["folder"] / "partial" / "gradebook.csv", encoding="utf-8") as f:
        book = {r["student_id"]: r for r in csv.DictReader(f)}
    assert float(book["half"]["Exercise 3.1"]) == pytest.approx(passed / total, abs=1e-4)
    assert book["helper"]["Exercise 3.1"] == book["helper"]["Exercise 3.2"] == "1"
    assert book["helper"]["total"] == "2" and book["helper"]["out_of"] == "4"


def test_a_process_left_running_is_killed_and_flagged(graded):
    sleeper = graded["default"][("sleeper", "3.2")]
    assert sleeper["status"] == "passed"
    assert "left 1 process running when its exercise ended (killed)" in sleeper["flags"]
    assert "31415" not in _processes()


def _processes() -> str:
    """Every process's command line (from /proc: ps is not on a minimal Debian)."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # the process ended meanwhile
            continue
    return "\n".join(lines)


LEVEL_CLASS = {"alice": {"3.2": RIGHT_MERGE + "\ncheck_merge(merge)\n"}, "carol": {"3.2": LOOP},
               "frank": {"3.2": CRASH}, "sleeper": {"3.2": SLEEPER}, "napper": {"3.2": NAPPER},
               "helper": {"3.1": HELPER_31, "3.2": HELPER_32}}


def _levels() -> list[sandbox.Confinement]:
    found = [sandbox.Confinement("rlimits", reasons=["forced by the test"])]
    best = sandbox.probe()
    if best.bwrap is not None:
        found.append(sandbox.Confinement("bwrap", bwrap=best.bwrap, user=best.user,
                                               group=best.group, reasons=["forced"]))
    if best.level == "namespaces":
        found.append(best)
    return found


@pytest.mark.skipif(not hasattr(os, "fork") or not shutil.which("sleep"),
                    reason="needs fork and sleep(1)")
def test_every_level_gives_the_same_grades(tmp_path):
    """The grades do not depend on the confinement: rlimits only, bubblewrap, bubblewrap with
    namespaces (what this machine has of them)."""
    write(tmp_path / "subs", LEVEL_CLASS)
    seen = {}
    for conf in _levels():
        out = tmp_path / conf.level
        grade.grade(tmp_path / "subs", out, timeout=4.0, jobs=1, confinement=conf)
        rows = rows_of(out)
        seen[conf.level] = {k: (r["status"], r["checks_passed"], r["checks_total"])
                            for k, r in rows.items()}
        assert rows[("alice", "3.2")]["status"] == "passed", conf.level
        assert rows[("helper", "3.2")]["status"] == "passed", conf.level
        assert rows[("carol", "3.2")]["status"] == "timeout", conf.level
        assert rows[("carol", "3.2")]["first_problem"] == (  # the CPU-time limit
            "used its 4 s of CPU time: killed (an infinite loop, or far too slow)"), conf.level
        assert 3.5 <= float(rows[("carol", "3.2")]["runtime_s"]) < 9, conf.level
        assert rows[("napper", "3.2")]["status"] == "timeout", conf.level
        assert rows[("napper", "3.2")]["first_problem"].startswith(  # the wall-clock limit
            "still running after 12 s of wall-clock time (4 s of CPU time allowed)"), conf.level
        assert rows[("frank", "3.2")]["first_problem"] == (
            "the process exited with code 3 before the checker answered"), conf.level
        assert "left 1 process running" in rows[("sleeper", "3.2")]["flags"], conf.level
        summary = (out / "summary.md").read_text(encoding="utf-8")
        assert f"The students' code ran confined: {conf.level}:" in summary
        assert "31415" not in _processes(), conf.level
    assert len({tuple(sorted(v.items())) for v in seen.values()}) == 1, seen


def test_the_time_limit_is_cpu_time():
    """limit_cpu ends a process that computes past it with SIGXCPU (what the judge reports as
    a timeout), counting its CPU time, not the clock: a process that sleeps is not ended."""
    for work, ended in (("spin", True), ("sleep", False)):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            sandbox.limit_cpu(1, final=True)
            end = time.monotonic() + 4
            while time.monotonic() < end:
                if work == "sleep":
                    time.sleep(0.1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert sandbox.ended_by_cpu_limit(status) is ended, (work, status)


def test_the_levels_are_described_and_degrade_with_a_warning(capsys):
    conf = sandbox.Confinement("rlimits", reasons=["bubblewrap is not installed"])
    assert "NO SANDBOX" in conf.describe()
    assert conf.warning().startswith("warning: students' code is confined at the 'rlimits' "
                                     "level only")
    assert sandbox.probe().warning() is None or sandbox.probe().level != (
        "namespaces")


@pytest.mark.skipif(not sandbox.cgroups_allowed(), reason="no cgroups may be made here")
def test_a_chapter_sandbox_cgroup_bounds_and_ends_everything_in_it():
    """Where cgroups may be made, each chapter's sandbox has one: its processes are in it, and
    killing it ends them all, however they detached themselves."""
    cgroup = sandbox.Cgroup.make("flashlib-grade-test")
    assert cgroup is not None
    try:
        proc = subprocess.Popen(["sh", "-c", "setsid sleep 31416 & sleep 31416"])
        cgroup.add(proc.pid)
        import time

        time.sleep(0.3)
        assert len(cgroup.pids()) >= 2
        cgroup.kill()
        proc.wait(timeout=10)
        assert cgroup.pids() == []
        assert "31416" not in _processes()
    finally:
        cgroup.kill()
        cgroup.remove()
    assert not any(sandbox.CGROUP_ROOT.rglob("flashlib-grade-test"))
    assert "cgroup of its own" in sandbox.probe().describe()


def test_a_timeout_on_a_busy_machine_says_so(monkeypatch):
    """A wall-clock timeout while the machine has more work than cores gets a note saying
    the code may be right."""
    from grading import judge

    monkeypatch.setattr(judge.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(judge.os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    assert judge.machine_busy() is None
    monkeypatch.setattr(judge.os, "getloadavg", lambda: (12.3, 9.0, 8.0))
    note = judge.machine_busy()
    assert note.startswith("the machine was busy when the time ran out (load average 12.3 on "
                           "2 cores)"), note
