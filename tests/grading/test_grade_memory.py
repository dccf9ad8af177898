"""Memory from outside the student's process (issue 35): each exercise in a cgroup of its own
where the machine allows one (grading/sandbox.py's ``task_cgroups``, probed with usage > 0),
which caps the exercise's processes together and measures them; the checkers' memory probes
measured by the judge from that cgroup, not by tracemalloc in the student's process.

Where no cgroup can be made (not root and nothing delegated), the tests that need one are
skipped, and the grader falls back to /proc's VmHWM and RLIMIT_AS (see book/instructor.md).
"""

from __future__ import annotations

import dataclasses

import pytest

from grading import chapters, grade, made_up_class, sandbox
from grading.judge import Options

CGROUPS = sandbox.task_cgroups() if sandbox.probe().cgroups else None
needs_cgroups = pytest.mark.skipif(CGROUPS is None, reason="no cgroup can be made here")

TILING = chapters.ROOT / "book" / "tiling.md"


def fake_chapter(checker: str, call: str, numbers: str = "123") -> chapters.Chapter:
    module, _, name = checker.rpartition(".")
    exercise = chapters.Exercise("1", call, name, checker)
    return chapters.Chapter(
        "fake", "Fake", [("code", f"import numpy as np\nfrom {module} import {name}"),
                         *[("exercise", n) for n in numbers]],
        {n: dataclasses.replace(exercise, number=n) for n in numbers}, [])


def test_the_probe_says_what_it_found():
    """The probe puts a child in a new cgroup and sees its 16 MiB (usage > 0), or says
    None; it never claims a cgroup it could not measure."""
    assert CGROUPS in (None, "cgroup v1", "cgroup v2")


EMPTY = ("def empty(n_q, d_v):\n    return np.full(n_q, -np.inf), np.zeros(n_q), "
         "np.zeros((n_q, d_v))\n")
#: Two processes of 300 MB each, together: the exercise's own and a child it forks.
TWO_PROCESSES = """
import os, time
block = np.ones(300 * 2**20 // 8)
pid = os.fork()
if pid == 0:
    child = np.ones(300 * 2**20 // 8)
    os._exit(0)
os.waitpid(pid, 0)
""" + EMPTY


@needs_cgroups
def test_the_cgroup_measures_the_exercises_processes_together(tmp_path):
    chapter = fake_chapter("flashlib.book.exercises.online_softmax.check_empty_partial",
                           "check_empty_partial(empty)", "12")
    tasks = [{"id": "small", "exercise": "1", "cells": [EMPTY]},
             {"id": "two", "exercise": "2", "cells": [TWO_PROCESSES]}]
    found, errors = grade.grade_chapter(chapter, tasks, 20.0, 1, tmp_path / "logs")
    assert errors == []
    small, two = found["small"]["memory"], found["two"]["memory"]
    assert small["measured_by"] == two["measured_by"] == CGROUPS
    assert small["peak_bytes"] > 0  # usage > 0: the cgroup holds the student's process
    assert two["peak_bytes"] > 550e6  # both processes: the child is in it too
    assert two["process_peak_bytes"] < 500e6  # what /proc saw of one process alone
    assert found["two"]["status"] == "passed"


@needs_cgroups
def test_the_cap_holds_the_exercises_processes_together(tmp_path):
    """Each process stays under its RLIMIT_AS, but together they would pass the cgroup's
    cap: the kernel stops them there (the peak never passes it), and it is flagged."""
    chapter = fake_chapter("flashlib.book.exercises.online_softmax.check_empty_partial",
                           "check_empty_partial(empty)", "1")
    cells = """
import os, time
pid = os.fork()  # first, so that neither process inherits the other's memory
if pid == 0:
    held = np.ones(200 * 2**20 // 8)
    time.sleep(3)
    os._exit(0)
time.sleep(1)
held = np.ones(200 * 2**20 // 8)
os.waitpid(pid, 0)
""" + EMPTY
    limits = dict(sandbox.LIMITS, memory=320 * 2**20)
    options = Options(timeout=20.0, logs=tmp_path / "logs", limits=limits)
    found, _ = grade.run_tasks({"fake": chapter}, {"fake": [
        {"id": "over", "exercise": "1", "cells": [cells], "prelude": []}]}, options, 1)
    over = found["over"]
    # the kernel's out-of-memory killer ended one of them (the checker graded what was left)
    assert any("its cgroup" in f for f in over["flags"]), over["flags"]
    assert over["memory"]["peak_bytes"] <= 330 * 2**20


def _tiled_state_exercise() -> tuple[str, str]:
    chapter = chapters.load_chapter(TILING)
    (number,) = [n for n, e in chapter.exercises.items()
                 if e.checker.endswith("check_tiled_state")]
    return number, made_up_class.solutions(TILING)[number]


#: The whole (N, N) score matrix, in memory tracemalloc does not see (an anonymous mmap):
#: the check made inside the student's process passes it; the cgroup does not.
HIDDEN_MATRIX = """
import tempfile
def _hidden(shape):  # a file mapping: no allocation tracemalloc sees (mmap itself is refused)
    with tempfile.TemporaryFile() as file:  # the mapping keeps its own handle
        return np.memmap(file, dtype=np.float64, mode="w+", shape=shape)
def tiled_state(Q, K, V, B_r, B_c):
    S = _hidden((Q.shape[0], K.shape[0]))
    np.matmul(Q, K.T, out=S)
    S /= np.sqrt(Q.shape[1])
    m = S.max(axis=1)
    np.subtract(S, m[:, None], out=S)
    np.exp(S, out=S)
    return m, S.sum(axis=1), S @ V
"""


@needs_cgroups
def test_the_memory_probe_is_measured_by_the_judge(tmp_path):
    """The book's solution passes the O(N) memory probe measured from the cgroup; the whole
    matrix hidden from tracemalloc fails it."""
    number, solution = _tiled_state_exercise()
    chapter = fake_chapter("flashlib.book.exercises.tiling.check_tiled_state",
                           "check_tiled_state(tiled_state)", "12")
    tasks = [{"id": "book", "exercise": "1", "cells": [solution]},
             {"id": "hidden", "exercise": "2", "cells": [HIDDEN_MATRIX]}]
    found, errors = grade.grade_chapter(chapter, tasks, 30.0, 1, tmp_path / "logs")
    assert errors == []
    assert found["book"]["status"] == "passed", found["book"]["feedback"]
    assert found["hidden"]["status"] == "failed", found["hidden"]["feedback"]
    assert "as much as an (N, N) matrix" in found["hidden"]["feedback"]
