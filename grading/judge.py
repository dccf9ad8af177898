"""The judge of grading/grade.py: the trusted process that decides each exercise's status.

A judge takes tasks (one student's exercise each) from the grader, one at a time.  For a
chapter it starts the chapter's sandboxed process (the zygote, grading/worker.py, under
bubblewrap where the machine allows: grading/sandbox.py; its judge's side is
grading/zygote.py) and walks it to each exercise;
per task it has the zygote fork the student's process, sends that process the student's
cells over a socket of its own, and then runs the checker here, in the judge, with the
student's function as a handle (grading/rpc.py): each call of it runs in the student's
process and only plain data comes back.  The verdict, the counts and the feedback are the
checker's, computed here; the student's code never shares a process with them, nor with the
grading state, the reports or another student's code.

When the exercise ends (its checker returned, its time ran out, its process died), the judge
has the zygote kill the student's process and everything it started, and reports what it
found (processes left running, a zygote that died: a student's code that killed its parent).
A zygote that died is started again for the next task: one student's kill, crash or hang
costs that student's exercise only.

Runs in a process of its own (``judge_main``, started by grading/grade.py), or in the
grader's (``Judge`` used directly, in tests).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grading import audit, rpc, sandbox
from grading.worker import describe, one_line
from grading.zygote import TaskLink, Zygote, ZygoteDied

#: Zygotes a judge starts again for one chapter before it gives the chapter up.
RESTARTS = 10


#: The time limit is CPU time (the student's process, all its threads: RLIMIT_CPU, see
#: grading/sandbox.py's limit_cpu), so that it is the same on a busy machine as on a quiet
#: one; wall-clock time is limited too, to WALL_FACTOR times as much, for code that waits
#: instead of computing (a sleep, a blocked call) or a platform without RLIMIT_CPU.
WALL_FACTOR = 3.0
#: The default time limit per exercise and student, CPU seconds: the book's solutions take
#: under 2 seconds each (every checker's calls included; 1.7 s at most, measured), so a right
#: answer five times slower still passes; an infinite loop costs the class's grading this much.
TIMEOUT = 10.0


@dataclass
class Options:
    timeout: float = TIMEOUT
    strict: bool = False  # any error of the exercise cell fails the exercise
    run_earlier: bool = True  # run the student's earlier exercise cells first, as Jupyter
    confinement: sandbox.Confinement | None = None
    limits: dict[str, int] = field(default_factory=lambda: dict(sandbox.LIMITS))
    logs: Path | None = None


# ---------------------------------------------------------------------------------------------
# The judge
# ---------------------------------------------------------------------------------------------

def parse_call(call: str) -> tuple[str, list[str], dict[str, str]]:
    """``"check_merge(merge)"`` -> ``("check_merge", ["merge"], {})``: the checker's name and
    its arguments' sources, which the student's process evaluates."""
    node = ast.parse(call, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a checker call: {call!r}")
    return (node.func.id, [ast.unparse(a) for a in node.args],
            {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg})


class Judge:
    """Grades tasks of one chapter after another, one at a time."""

    def __init__(self, options: Options):
        self.options = options
        self.zygote: Zygote | None = None
        self.chapter: dict[str, Any] | None = None
        self.restarts = 0
        self.context_errors: list[str] = []
        self.context_s: dict[str, float] = {}
        self.gave_up: str | None = None

    def close(self) -> None:
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    def _zygote_at(self, chapter: dict[str, Any], number: str) -> Zygote:
        """The chapter's zygote at Exercise ``number``, started (again) if needed."""
        if self.chapter is None or self.chapter["name"] != chapter["name"]:
            self.close()
            self.chapter, self.restarts, self.gave_up = chapter, 0, None
        order = [v for k, v in chapter["steps"] if k == "exercise"]
        zyg = self.zygote
        if zyg is not None and zyg.position is not None and (
                number not in order or zyg.position not in order
                or order.index(number) < order.index(zyg.position)):
            self.close()
            zyg = None
        if zyg is None:
            if self.gave_up:
                raise ZygoteDied(self.gave_up)
            self.zygote = zyg = Zygote(chapter["name"], chapter["steps"], self.options)
        if zyg.position != number:
            first = zyg.position is None
            reached, errors = zyg.run_to(number)
            if first:  # how long the chapter's own cells take: the grader's scheduling uses it
                self.context_s[chapter["name"]] = time.monotonic() - zyg.started
            self.context_errors += errors
            if not reached:
                reason = errors[-1] if zyg.proc.poll() is not None and errors else (
                    f"the chapter has no place for Exercise {number}")
                if reason not in self.context_errors:
                    self.context_errors.append(reason)
                self.gave_up = reason
                self.close()
                raise ZygoteDied(reason)
        return zyg

    def grade(self, chapter: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
        """One task: ``{"id", "exercise", "cells", "prelude"}`` -> its result.  When the
        student's earlier cells (the prelude) end the process or hang before this exercise's
        own cells start, it is graded again without them, and a note says so."""
        exercise = chapter["exercises"][task["exercise"]]
        found = judge_audit(exercise, task, self.options.run_earlier)
        if found.refusals:  # decided here, from the code: the student's code does not run
            return refused(found)
        result = self._grade_once(chapter, task)
        result["flags"] = result.get("flags", []) + [
            f"audit: {f}" for f in found.flags if f"audit: {f}" not in result.get("flags", [])]
        notes = [f"your cells of Exercise {n} were not run before this one: they ended or "
                 "hung the process when that exercise was graded" for n in task.get(
                     "left_out", [])]
        if result.pop("in_prelude", False) and task.get("prelude"):
            retry = self._grade_once(chapter, task | {"prelude": []})
            retry.pop("in_prelude", None)
            how = "ran out of time" if result["status"] == "timeout" else "ended the process"
            notes.append(f"your earlier exercises' cells {how} before this exercise's cells "
                         "ran: it was graded again without them")
            retry["flags"] = retry.get("flags", []) + [
                f for f in result.get("flags", []) if f not in retry.get("flags", [])]
            result = retry
        result["notes"] = notes + result.get("notes", [])
        return result

    def _grade_once(self, chapter: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
        exercise = chapter["exercises"][task["exercise"]]
        try:
            zyg = self._zygote_at(chapter, task["exercise"])
        except ZygoteDied as err:
            return {"status": "grader-error",
                    "first_problem": f"no result: the chapter failed to run here ({err})"}
        # the checker's module imported before the clock starts: its first import (matplotlib,
        # widgets) is the judge's time, not the first student's (a failure: reported by _run)
        with contextlib.suppress(Exception):
            _import(exercise["checker"])
        start = time.monotonic()
        ours, theirs = socket.socketpair()
        out_read, out_write = os.pipe()
        link = TaskLink(ours, out_read)
        flags: list[str] = []
        try:
            link.cgroup = zyg.fork(task["id"], [theirs.fileno(), out_write])
        except ZygoteDied as err:
            theirs.close()
            os.close(out_write)
            link.close()
            self._lost_zygote(str(err))
            return {"status": "grader-error", "first_problem": f"no result: {err}"}
        theirs.close()
        os.close(out_write)
        result: dict[str, Any] = {"status": "crashed", "first_problem": ""}
        try:
            result = self._run(link, chapter, exercise, task, start)
        finally:
            try:
                ended = result.get("status") == "crashed"
                status, survivors = zyg.end(task["id"], wait=2.0 if ended else 0.0)
                peak, base = getattr(zyg, "memory", (None, None))
                if isinstance(peak, int) and isinstance(base, int):
                    result["memory"] = {"peak_bytes": peak, "chapter_bytes": base,
                                        "measured_by": "/proc VmHWM"}
                held = getattr(zyg, "task_memory", None) or {}
                if isinstance(held.get("peak"), int):  # the cgroup's: all its processes
                    result["memory"] = (result.get("memory") or {}) | {
                        "peak_bytes": held["peak"], "measured_by": held["by"],
                        "process_peak_bytes": peak}
                if held.get("limit_hit"):
                    flags.append(f"hit the memory limit ({self.options.limits['memory'] / 2**30:g}"
                                 " GiB for the exercise's processes together: its cgroup)")
            except ZygoteDied as err:
                status, survivors = None, 0
                flags.append("the chapter's grading process died during this exercise (did "
                             "its code kill its parent process?); it was started again for "
                             "the next exercise")
                self._lost_zygote(str(err))
            output = link.tail()
            link.close()
        if survivors:
            flags.append(f"left {survivors} process{'es' if survivors > 1 else ''} running "
                         "when its exercise ended (killed)")
        if link.malformed:
            flags.append(link.malformed)
        flags += _limits_hit(str(result.get("first_problem", "")) + "\n" + output,
                             self.options.limits)
        if result.get("status") == "crashed" and sandbox.ended_by_cpu_limit(status):
            result |= {"status": "timeout", "first_problem": (
                f"used its {self.options.timeout:g} s of CPU time: killed (an infinite loop, "
                "or far too slow)")}
        elif result.get("status") == "crashed" and not result.get("first_problem"):
            result["first_problem"] = _crash_message(status)
        result.setdefault("notes", [])
        result["flags"] = result.get("flags", []) + flags
        result["runtime_s"] = round(time.monotonic() - start, 3)
        result["output"] = output
        return result

    def _lost_zygote(self, reason: str) -> None:
        self.restarts += 1
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        if self.restarts > RESTARTS:
            self.gave_up = (f"the chapter's process died {self.restarts} times ({reason}); "
                            "the rest of the chapter was not graded")

    def _run(self, link: TaskLink, chapter: dict[str, Any], exercise: dict[str, Any],
             task: dict[str, Any], start: float) -> dict[str, Any]:
        timeout = self.options.timeout
        name, args, kwargs = parse_call(exercise["call"])
        prelude = task.get("prelude", []) if self.options.run_earlier else []
        budget = timeout if prelude else 0.0
        started = False
        try:
            link.deadline = start + WALL_FACTOR * (budget + timeout) + 1.0
            link.send({"op": "run", "prelude": prelude, "prelude_budget": budget,
                       "cpu_limit": timeout, "cells": task["cells"],
                       "checkers": chapter["checkers"], "args": args, "kwargs": kwargs,
                       "tolerant": not self.options.strict,
                       "student": str(task.get("student", ""))})
            ran, buffers = link.recv()
            if ran.get("ev") == "started":  # the earlier cells are done: the clock restarts
                started = True
                link.deadline = time.monotonic() + WALL_FACTOR * timeout
                ran, buffers = link.recv()
            if ran.get("ev") != "ran":
                raise rpc.Gone("unexpected answer")
            notes = [one_line(n) for n in ran.get("notes", []) if isinstance(n, str)][:10]
            errors = [ran.get("syntax_error"), ran.get("cell_error")]
            errors = [one_line(e) for e in errors if isinstance(e, str)]
            cell_error = errors[0] if errors else None
            if ran.get("arg_error") is not None:
                return {"status": "error", "notes": notes,
                        "first_problem": cell_error or one_line(
                            f"{exercise['call']} raised {ran['arg_error']}")}
            values = link.decode(ran.get("value"), buffers)
            checker = _import(exercise["checker"])
            from flashlib.book.exercises.grader_adapter import as_student

            with as_student(str(task.get("student", ""))):  # the student's own variant
                fb = checker(*values.get("args", []), **values.get("kwargs", {}))
        except rpc.Deadline:
            busy = machine_busy()
            return {"status": "timeout", "in_prelude": bool(prelude) and not started,
                    "first_problem": f"still running after {WALL_FACTOR * timeout:g} s of "
                                     f"wall-clock time ({timeout:g} s of CPU time allowed): "
                                     "killed (waiting for something that never came, or "
                                     "far too slow)", "notes": [busy] if busy else []}
        except rpc.Gone:
            return {"status": "crashed", "first_problem": "",
                    "in_prelude": bool(prelude) and not started}
        except Exception as err:  # noqa: BLE001 - the checker itself failed: report it
            return {"status": "error",
                    "first_problem": f"{exercise['call']} raised {describe(err)}"}
        return verdict(fb, cell_error, notes, strict=self.options.strict, call=exercise["call"])


def judge_audit(exercise: dict[str, Any], task: dict[str, Any],
                run_earlier: bool = True) -> audit.Audit:
    """The judge's audit of the task's cells (grading/audit.py): this exercise's, and the
    earlier exercises' that run before them, against the checker's forbidden functions and
    the names its call passes."""
    try:
        forbid = dict(getattr(_import(exercise["checker"]), "forbid", {}) or {})
    except Exception:  # noqa: BLE001 - the checker's own failure is reported by _run
        forbid = {}
    try:
        _, args, kwargs = parse_call(exercise["call"])
    except (SyntaxError, ValueError):
        args, kwargs = [], {}
    prelude = task.get("prelude", []) if run_earlier else []
    return audit.audit(task["cells"], prelude, forbid, [*args, *kwargs.values()])


def refused(found: audit.Audit) -> dict[str, Any]:
    """The result of an exercise the judge's audit refused: failed, 0 points, the reasons
    in the feedback and the flags."""
    why = "; ".join(found.refusals[:3])
    text = ("Refused by the grader before it ran: " + why + ". Exercises never need this; "
            "the score is 0 (see the grading rules).")
    return {"status": "failed", "checks_passed": 0, "checks_total": 1,
            "first_problem": one_line(f"refused: {why}"), "feedback": text, "notes": [],
            "flags": [f"refused by the judge's audit: {r}" for r in found.refusals[:5]]
            + [f"audit: {f}" for f in found.flags],
            "runtime_s": 0.0, "output": "", "refused": True}


def machine_busy() -> str | None:
    """A note for a wall-clock timeout when the machine had more work than cores (on a busy
    machine, right code can run out of it; the CPU-time limit does not depend on the load),
    else None."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    if load <= cores:
        return None
    return (f"the machine was busy when the time ran out (load average {load:.1f} on "
            f"{cores} cores): the code may be right; grade it again on a quiet machine or "
            "with a longer --timeout")


def verdict(fb: Any, cell_error: str | None, notes: list[str], *, strict: bool,
            call: str) -> dict[str, Any]:
    """The exercise's status from the checker's Feedback (computed in the judge) and what
    the student's cells did."""
    from flashlib.book.exercises.grader_adapter import NOT_ATTEMPTED, Feedback

    if not isinstance(fb, Feedback):
        return {"status": "error", "notes": notes,
                "first_problem": f"{call} returned {type(fb).__name__}, not a Feedback"}
    result = {"checks_passed": len(fb.passes), "notes": notes,
              "checks_total": len(fb.passes) + len(fb.problems),
              "first_problem": one_line(fb.problems[0]) if fb.problems else "",
              "feedback": str(fb)}
    if fb.problems == [NOT_ATTEMPTED]:
        result["status"] = "not attempted"
    elif cell_error is not None and (strict or not fb.passed):
        result |= {"status": "error", "first_problem": cell_error}
    elif cell_error is not None:
        result["status"] = "passed"
        if "SyntaxError" not in cell_error:
            result["notes"] = [*notes, f"{cell_error}: the checker graded what the cell "
                                       "defined, and it passed; fix the cell"]
    else:
        result["status"] = "passed" if fb.passed else "failed"
    return result


def _limits_hit(text: str, limits: dict[str, int]) -> list[str]:
    """Flags for the resource limits the exercise's code ran into, from what it raised and
    printed (grading/sandbox.py's LIMITS)."""
    found = []
    if "MemoryError" in text or "Cannot allocate memory" in text:
        found.append(f"hit the memory limit ({limits['memory'] / 2**30:g} GiB more than the "
                     "chapter's)")
    if "No space left on device" in text or "File too large" in text:
        found.append(f"hit the limit on files written ({limits['disk'] / 2**20:g} MiB in all, "
                     f"{limits['file_size'] / 2**20:g} MiB a file)")
    if "Resource temporarily unavailable" in text or "BlockingIOError" in text:
        found.append(f"hit the limit of {limits['processes']} processes")
    if "Too many open files" in text:
        found.append(f"hit the limit of {limits['open_files']} open files")
    return found


def _crash_message(status: int | None) -> str:
    if status is None:
        return "the process died before the checker answered"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig
        return f"the process was killed by signal {sig} ({name}) before the checker answered"
    return (f"the process exited with code {os.WEXITSTATUS(status)} before the checker "
            "answered")


def _import(full_name: str) -> Any:
    module, _, name = full_name.rpartition(".")
    if not module.startswith("flashlib.book.exercises"):
        raise ValueError(f"{full_name} is not one of the book's checkers")
    return getattr(importlib.import_module(module), name)


def judge_main(conn: Any, options: Options) -> None:
    """A judge process: asks the grader (``conn``, a multiprocessing Connection) for tasks,
    sends back each result, until told to stop."""
    os.environ.pop("FLASHLIB_STATIC_WIDGETS", None)  # feedback as in Jupyter, not the site's
    judge = Judge(options)
    chapter_name = None
    try:
        while True:
            conn.send(("next", chapter_name, judge.context_errors, judge.context_s))
            judge.context_errors = []
            message = conn.recv()
            if message[0] == "stop":
                break
            _, chapter, task = message
            chapter_name = chapter["name"]
            conn.send(("result", task["id"], judge.grade(chapter, task)))
    finally:
        judge.close()
