"""The judge's audit (grading/audit.py) against the attacks of issue 35 that defeated the checks
made in the student's process, and against the made-up class's honest students (no refusal,
no flag: the book's solutions and every honest profile pass it untouched).

The audit runs in the judge; these tests call it as the judge does (grading/judge.py's
``judge_audit``: this exercise's cells, the earlier exercises' cells, the checker's forbidden
functions and the names its call passes).  tests/grading/test_grade_attacks.py hands some of
the same attacks to the whole grader in the sandbox.
"""

from __future__ import annotations

import pytest

from grading import audit, chapters, judge, made_up_class
from grading.chapters import number_key
from tests.grading.fake import fake_chapter

ATTENTION = {"flashlib.fast.naive.naive_attention": None}

#: Each attack of issue 35's first item: (the exercise cell, what the refusal must say).
ATTACKS = {
    "copy from a code object": ("""
import types
from flashlib.fast import naive_attention
mine = types.FunctionType(naive_attention.__code__, naive_attention.__globals__)
def attention(q, k, v):
    return mine(q, k, v)
""", "code object"),
    "copy with the name built at run time": ("""
import types
make = getattr(types, "Function" + "Type")
mine = make(getattr(naive_attention, "__co" + "de__"), {})
def attention(q, k, v):
    return mine(q, k, v)
""", "code object"),
    "wrapper compiled under a flashlib file name": ("""
import flashlib.fast.naive as lib
source = "def attention(q, k, v):\\n    return naive_attention(q, k, v)\\n"
exec(compile(source, lib.__file__, "exec"))
""", "compiles code under a file name"),
    "wrapper under a literal library path": ("""
code = compile("def attention(q, k, v):\\n    return f(q, k, v)", "/x/flashlib/fast/naive.py",
               "exec")
""", "compiles code under a file name"),
    "library source executed": ("""
import inspect
from flashlib.fast import naive
namespace = {}
exec(inspect.getsource(naive), namespace)
attention = namespace["naive_attention"]
""", "source"),
    "the checker's call-watcher replaced": ("""
import contextlib
from flashlib.book.exercises import refusal
refusal.watching = lambda names: contextlib.nullcontext([])
def attention(q, k, v):
    return naive_attention(q, k, v)
""", "call-watcher"),
    "the watcher replaced through setattr": ("""
import contextlib, flashlib.book.exercises.grader_adapter as ga
setattr(ga, "wat" + "ching", lambda names: contextlib.nullcontext([]))
""", "grader"),
    "tracemalloc stopped": ("""
import tracemalloc
def attention(q, k, v):
    tracemalloc.stop()
    s = q @ k.T
    return s
""", "tracemalloc"),
    "measure_peak replaced": ("""
from flashlib.book.exercises import memory
memory.measure_peak = lambda fn, *a, **k: (fn(*a, **k), 0)
""", "measure_peak"),
    "module table written": ("""
import sys, types
sys.modules["flashlib.book.exercises.memory"] = types.SimpleNamespace()
""", "sys.modules"),
    "kernel helpers replaced so kernels do nothing": ("""
from flashlib.gpu import triton_attention
triton_attention.forward = lambda *a, **k: (a[0], None)
""", "changes `triton_attention.forward`"),
    "kernel launch replaced in the checker module": ("""
import flashlib.book.exercises.gpu as g
g._launch = lambda kernel, grid, *a, **k: None
""", "changes `g._launch`"),
    "a module written through an alias": ("""
import flashlib.book.exercises.refusal as r
x = r
y = x
y._resolve = lambda name: None
""", "changes `y._resolve`"),
    "code in a string, run by exec": ("""
exec("import tracemalloc\\ntracemalloc.stop()")
""", "tracemalloc"),
    "the watcher replaced by code in a string": ("""
exec("from flashlib.book.exercises import refusal\\nrefusal.watching = None")
""", "changes `refusal.watching`"),
    "the module table through getattr": ("""
import sys
table = getattr(sys, "modules")
""", "sys.modules"),
    "a module imported by a name given at run time": ("""
table = __import__("sys").modules
""", "__import__"),
    "the library reloaded (copies the watcher does not know)": ("""
import importlib
from flashlib.fast import naive
importlib.reload(naive)
""", "reload"),
    "memory the tracer does not see": ("""
import mmap
buffer = mmap.mmap(-1, 2**28)
""", "mmap"),
    "the chapter's checker patched": ("""
Feedback.passed = property(lambda self: True)
""", "changes `Feedback.passed`"),
    "grader detection by host name": ("""
import socket
def attention(q, k, v):
    if socket.gethostname() != "colab":
        return naive_attention(q, k, v)
    return q
""", "host name"),
    "grader detection by PID": ("""
import os
GRADER = os.getpid() < 10
""", "process id"),
    "grader detection by /proc/1": ("""
GRADER = "bwrap" in open("/proc/1/cmdline").read()
""", "/proc/1"),
}

#: The library function the exercise asks for, reached from the answer: flagged (a call of
#: it is refused by the checker when it runs, with its own message).
REACHED = {
    "through an alias": ("""
from flashlib.fast import naive_attention as helper
def attention(q, k, v):
    return helper(q, k, v)
""", "reaches flashlib's `naive_attention` (as `helper`)"),
    "through a helper, on a branch the checker may not take": ("""
def _inner(q, k, v):
    return naive_attention(q, k, v)
def attention(q, k, v):
    if q.shape[0] > 10_000:
        return _inner(q, k, v)
    return q
""", "reaches flashlib's `naive_attention`"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_attack_is_refused_by_the_judge(attack):
    cell, sign = ATTACKS[attack]
    found = audit.audit([cell], [], ATTENTION, ["attention"])
    assert found.refusals, attack
    assert any(sign in r for r in found.refusals), found.refusals


@pytest.mark.parametrize("case", list(REACHED))
def test_the_forbidden_function_reached_from_the_answer_is_flagged(case):
    cell, sign = REACHED[case]
    found = audit.audit([cell], [], ATTENTION, ["attention"])
    assert any(sign in f for f in found.flags), found.flags
    assert audit.audit([cell], [], {}, ["attention"]).flags == []  # another exercise's


def test_a_patch_hidden_in_an_earlier_exercise_refuses_the_later_one():
    earlier = [("3.1", ["import tracemalloc\ntracemalloc.stop()\n\ndef helper():\n    pass"])]
    found = audit.audit(["def attention(q, k, v):\n    return q"], earlier, ATTENTION,
                        ["attention"])
    assert found.refusals and found.refusals[0].startswith("Exercise 3.1's cell")


def test_the_judge_refuses_without_running_the_code():
    result = judge.refused(audit.audit([ATTACKS["tracemalloc stopped"][0]], [], {}, []))
    assert result["status"] == "failed" and result["checks_passed"] == 0
    assert result["first_problem"].startswith("refused: ")
    assert any("tracemalloc" in f for f in result["flags"])


@pytest.mark.parametrize("cell", [
    # the library in a scratch line, to test one's answer, is allowed
    "def attention(q, k, v):\n    return q\n\nimport numpy as np\n"
    "print(np.allclose(attention(1, 2, 3), naive_attention(1, 2, 3)))",
    # a student's own function of the library's name
    "def naive_attention(q, k, v):\n    return q @ k.T\n\ndef attention(q, k, v):\n"
    "    return naive_attention(q, k, v)",
    # attributes of the student's own objects
    "class State:\n    pass\n\ns = State()\ns.m = 1.0\n\ndef attention(q, k, v):\n"
    "    st = State()\n    st.acc = q\n    return st.acc",
    "out = {}\nout['x'] = 1\nprint('measuring the grading time')",
])
def test_honest_code_is_not_refused(cell):
    found = audit.audit([cell], [], ATTENTION, ["attention"])
    assert found.refusals == [] and found.flags == []


def _honest_tasks():
    honest = [p for p in made_up_class.PROFILES if p not in made_up_class.HOSTILE]
    for name, chapter in chapters.load_chapters().items():
        source = chapters.ROOT / "book" / f"{name}.md"
        for profile in honest:
            nb = made_up_class.student_notebook(source, profile)
            cells = chapters.exercise_cells(nb, chapter.markdown)
            order = sorted(cells, key=number_key)
            for number, exercise in chapter.exercises.items():
                if not cells.get(number):
                    continue
                prelude = [[n, [nb.cells[i].source for i in cells[n]]] for n in order
                           if number_key(n) < number_key(number) and cells[n]]
                task = {"cells": [nb.cells[i].source for i in cells[number]],
                        "prelude": prelude}
                yield profile, name, number, vars(exercise), task


@pytest.mark.slow
def test_no_honest_student_of_the_made_up_class_is_refused_or_flagged():
    """alice (the book's solutions) and every honest profile, every chapter and exercise."""
    problems, count = [], 0
    for profile, chapter, number, exercise, task in _honest_tasks():
        found = judge.judge_audit(exercise, task)
        count += 1
        if found.refusals or found.flags:
            problems.append((profile, chapter, number, found.refusals + found.flags))
    assert count > 200
    assert problems == []


def test_the_kernel_helpers_run_from_the_sealed_library():
    """The exercise's process seals the library before the student's first cell
    (grading/worker.py); a helper is taken from the seal, and the library's namespaces and
    ``sys.modules`` are put back before it runs: replacing a launcher changes nothing."""
    import sys

    import flashlib.book.exercises.gpu as gpu
    from grading import worker

    sealed = worker.seal()
    launch, module = gpu._launch, sys.modules["flashlib.book.exercises.gpu"]
    try:
        gpu._launch = lambda *a, **k: None  # kernels that do nothing
        gpu.len = lambda x: 0  # a builtin shadowed in the module
        sys.modules["flashlib.book.exercises.gpu"] = object()
        worker.restore(sealed)
        assert sys.modules["flashlib.book.exercises.gpu"] is module
        assert gpu._launch is launch and not hasattr(gpu, "len")
        assert sealed["flashlib.book.exercises.gpu"][1]["_launch"] is launch
    finally:
        sys.modules["flashlib.book.exercises.gpu"] = module
        gpu._launch = launch
        vars(gpu).pop("len", None)


EMPTY = ("import numpy as np\n\ndef empty(n_q, d_v):\n    return np.full(n_q, -np.inf), "
         "np.zeros(n_q), np.zeros((n_q, d_v))\n")


@pytest.mark.slow  # a chapter graded in the sandbox
def test_the_grader_refuses_in_the_judge_and_grades_the_honest(tmp_path):
    """Through the whole grader: the honest answer passes; the same answer after a patch in
    an earlier exercise's cell, or with grader detection, is refused (score 0, flagged)."""

    from grading import grade

    chapter = fake_chapter(("exercise", "1"), ("exercise", "2"))
    patch = "from flashlib.book.exercises import refusal\nrefusal.watching = None\n"
    detect = "import socket\nGRADER = socket.gethostname() != 'colab'\n"
    tasks = [{"id": "honest", "exercise": "2", "cells": [EMPTY], "prelude": [["1", [EMPTY]]]},
             {"id": "hidden", "exercise": "2", "cells": [EMPTY], "prelude": [["1", [patch]]]},
             {"id": "detect", "exercise": "1", "cells": [detect + EMPTY]}]
    found, errors = grade.grade_chapter(chapter, tasks, 20.0, 1, tmp_path / "logs")
    assert errors == []
    assert found["honest"]["status"] == "passed" and found["honest"]["flags"] == []
    for name, sign in (("hidden", "Exercise 1's cell"), ("detect", "the host name")):
        result = found[name]
        assert result["status"] == "failed" and result["checks_passed"] == 0
        assert result["first_problem"].startswith("refused: ")
        assert any("refused by the judge's audit" in f and sign in f for f in result["flags"])
