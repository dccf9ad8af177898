"""The judge of tools/grade.py: the trusted process that decides each exercise's status.

A judge takes tasks (one student's exercise each) from the grader, one at a time.  For a
chapter it starts the chapter's sandboxed process (the zygote, tools/grade_worker.py, under
bubblewrap where the machine allows: tools/grade_sandbox.py) and walks it to each exercise;
per task it has the zygote fork the student's process, sends that process the student's
cells over a socket of its own, and then runs the checker here, in the judge, with the
student's function as a handle (tools/grade_rpc.py): each call of it runs in the student's
process and only plain data comes back.  The verdict, the counts and the feedback are the
checker's, computed here; the student's code never shares a process with them, nor with the
grading state, the reports or another student's code.

When the exercise ends (its checker returned, its time ran out, its process died), the judge
has the zygote kill the student's process and everything it started, and reports what it
found (processes left running, a zygote that died: a student's code that killed its parent).
A zygote that died is started again for the next task: one student's kill, crash or hang
costs that student's exercise only.

Runs in a process of its own (``judge_main``, started by tools/grade.py), or in the
grader's (``Judge`` used directly, in tests).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tools import grade_rpc as rpc
from tools import grade_sandbox as sandbox
from tools.grade_worker import describe, one_line

OUTPUT_TAIL = 4000  # characters of a student's output kept in results.json
#: Seconds the zygote may take to run a chapter's cells up to an exercise.
CHAPTER_BUDGET = 1800.0
#: Seconds for the zygote's own answers (fork, end).
CONTROL_TIMEOUT = 60.0
#: Zygotes a judge starts again for one chapter before it gives the chapter up.
RESTARTS = 10


#: The time limit is CPU time (the student's process, all its threads: RLIMIT_CPU, see
#: tools/grade_sandbox.py's limit_cpu), so that it is the same on a busy machine as on a quiet
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
# The zygote: the chapter's sandboxed process
# ---------------------------------------------------------------------------------------------

class ZygoteDied(Exception):
    """The chapter's process is gone (or stopped answering)."""


class Zygote:
    """A chapter's process in its sandbox, driven over a control socket."""

    made = 0  # zygotes this judge started (names their cgroups)

    def __init__(self, name: str, steps: list[tuple[str, str]], options: Options):
        conf = options.confinement or sandbox.probe()
        self.name, self.conf, self.position = name, conf, None
        self.started = time.monotonic()
        ours, theirs = socket.socketpair()
        self.sock = ours
        log = None
        if options.logs is not None:
            options.logs.mkdir(parents=True, exist_ok=True)
            log = open(options.logs / f"{name}.log", "a", encoding="utf-8")  # noqa: SIM115
        self.log = log
        self.proc = sandbox.run_sandboxed(
            conf, [sys.executable, "-m", "tools.grade_worker", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), stdout=log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT, start_new_session=True,
            cwd=str(sandbox.ROOT) if conf.bwrap is None else None)
        theirs.close()
        self.cgroup = None
        if conf.cgroups:
            Zygote.made += 1
            self.cgroup = sandbox.Cgroup.make(f"flashlib-grade-{os.getpid()}-{Zygote.made}")
            if self.cgroup is not None:
                self.cgroup.add(self.proc.pid)
        count = conf.level == "namespaces" or (conf.level == "bwrap") or os.geteuid() == 0
        config = {"level": conf.level, "limits": options.limits, "count_processes": count}
        if conf.level == "rlimits" and os.geteuid() != 0:
            config["limits"] = dict(options.limits, processes=_my_processes()
                                    + options.limits["processes"])
        self.send({"op": "start", "steps": steps, "config": config,
                   "cwd": sandbox.inside("chapter") if conf.bwrap else None})

    def send(self, header: dict[str, Any], fds: list[int] | None = None) -> None:
        import json
        import struct

        data = json.dumps(header).encode()
        message = struct.pack("!II", len(data), 0) + data
        try:
            if fds:
                socket.send_fds(self.sock, [message], fds)
            else:
                self.sock.sendall(message)
        except OSError as err:
            raise ZygoteDied(f"the chapter's process is gone ({err})") from None

    def recv(self, timeout: float) -> dict[str, Any]:
        try:
            header, _ = rpc.recv(self.sock, time.monotonic() + timeout)
            return header
        except rpc.Deadline:
            raise ZygoteDied(f"the chapter's process did not answer in {timeout:g} s") from None
        except (rpc.Gone, rpc.WireError):
            raise ZygoteDied(self.exit_reason()) from None

    def exit_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "the chapter's process stopped answering"
        if code < 0:
            return f"the chapter's worker was killed by signal {-code}"
        return f"the chapter's worker exited with code {code}"

    def run_to(self, number: str) -> tuple[bool, list[str]]:
        """Run the chapter's cells up to Exercise ``number``: ``(reached it, context
        errors)``."""
        errors: list[str] = []
        try:
            self.send({"op": "run_to", "number": number})
        except ZygoteDied:
            return False, [self.exit_reason()]
        while True:
            try:
                reply = self.recv(CHAPTER_BUDGET)
            except ZygoteDied as err:
                return False, [*errors, str(err)]
            if reply.get("ev") == "context_error":
                errors.append(str(reply.get("msg")))
            elif reply.get("ev") == "at":
                self.position = number
                return True, errors
            else:
                return False, errors

    def fork(self, task: str, fds: list[int]) -> None:
        self.send({"op": "fork", "task": task}, fds)
        reply = self.recv(CONTROL_TIMEOUT)
        if reply.get("ev") != "forked":
            raise ZygoteDied(f"the chapter's process could not fork: {reply.get('msg')}")

    def end(self, task: str, wait: float = 0.0) -> tuple[int | None, int]:
        self.send({"op": "end", "task": task, "wait": wait})
        reply = self.recv(CONTROL_TIMEOUT)
        return reply.get("status"), int(reply.get("survivors") or 0)

    def close(self) -> None:
        with contextlib.suppress(ZygoteDied):
            self.send({"op": "quit"})
        with contextlib.suppress(OSError):
            self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.cgroup is not None:  # anything left in the sandbox's cgroup
            self.cgroup.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.log is not None:
            self.log.close()


def _my_processes() -> int:
    """How many processes this user runs (Linux; 0 elsewhere): RLIMIT_NPROC counts them."""
    uid, count = os.getuid(), 0
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            with contextlib.suppress(OSError):
                if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
    return count


# ---------------------------------------------------------------------------------------------
# One student's exercise: the link to its process, and the checker's calls through it
# ---------------------------------------------------------------------------------------------

class TaskLink:
    """The judge's end of one student's exercise: the socket to its process, its output."""

    def __init__(self, sock: socket.socket, output_fd: int):
        self.sock, self.output_fd = sock, output_fd
        self.output = bytearray()
        self.deadline: float | None = None
        self.malformed: str | None = None

    # -- the output pipe, drained while waiting ---------------------------------------------
    def drain(self, wait: float = 0.0) -> None:
        while self.output_fd is not None:
            ready, _, _ = select.select([self.output_fd], [], [], wait)
            if not ready:
                return
            chunk = os.read(self.output_fd, 1 << 16)
            if not chunk:
                os.close(self.output_fd)
                self.output_fd = None
                return
            self.output += chunk
            del self.output[: max(0, len(self.output) - 4 * OUTPUT_TAIL)]
            wait = 0.0

    def tail(self) -> str:
        self.drain()
        return self.output.decode("utf-8", errors="replace")[-OUTPUT_TAIL:]

    def close(self) -> None:
        self.drain()
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.output_fd is not None:
            os.close(self.output_fd)
            self.output_fd = None

    # -- messages ----------------------------------------------------------------------------
    def send(self, header: dict[str, Any], buffers: list[bytes] = ()) -> None:
        try:
            rpc.send(self.sock, header, list(buffers))
        except OSError as err:
            raise rpc.Gone(str(err)) from None

    def recv(self) -> tuple[dict[str, Any], list[bytes]]:
        while True:
            waiting = [self.sock] + ([self.output_fd] if self.output_fd is not None else [])
            left = None if self.deadline is None else self.deadline - time.monotonic()
            if left is not None and left <= 0:
                raise rpc.Deadline
            ready, _, _ = select.select(waiting, [], [], left)
            if self.output_fd is not None and self.output_fd in ready:
                self.drain()
            if self.sock in ready:
                try:
                    return rpc.recv(self.sock, self.deadline)
                except rpc.WireError as err:
                    self.malformed = ("its process wrote data the grader could not read into "
                                      f"its socket ({err})")
                    raise rpc.Gone(self.malformed) from None

    def decode(self, tree: Any, buffers: list[bytes]) -> Any:
        try:
            return rpc.decode(tree, buffers, self)
        except Exception as err:  # noqa: BLE001 - whatever the student's process sent
            self.malformed = f"its process sent data the grader could not read ({err})"
            raise rpc.Gone(self.malformed) from None

    # -- the checker's calls of the student's function ------------------------------------
    def call(self, remote: rpc.Remote, args: tuple, kwargs: dict) -> Any:
        return self._request({"op": "call", "ref": remote._ref}, args, kwargs)

    def helper(self, module: str, qualname: str, args: tuple, kwargs: dict) -> Any:
        return self._request({"op": "helper", "module": module, "qualname": qualname},
                             args, kwargs)

    def _request(self, header: dict[str, Any], args: tuple, kwargs: dict) -> Any:
        from flashlib.book.exercises import forbidden_names, library_call_problem
        from flashlib.core import measure

        callbacks: list[Any] = []
        blob = rpc.dumps((tuple(args), dict(kwargs)), callbacks)
        self.send(header | {"watch": forbidden_names(), "measure": measure.measuring()},
                  [blob])
        while True:
            reply, buffers = self.recv()
            if reply.get("ev") == "callback":
                self._callback(reply, buffers, callbacks)
                continue
            break
        if header["op"] == "call":  # the student's call, inside the checker's call_learner
            for w in reply.get("warnings", [])[:100]:
                _reemit(w)
        if reply.get("peak") is not None:
            measure.record_peak(int(reply["peak"]))
        calls = [(str(name), [tuple(s) if isinstance(s, list) else None for s in shapes])
                 for name, shapes in reply.get("calls", []) if isinstance(shapes, list)]
        problem = library_call_problem(calls)
        if reply.get("ev") == "raised":
            raise self.decode(reply.get("exc"), buffers)
        if reply.get("ev") != "returned":
            raise rpc.Gone(f"unexpected answer {reply.get('ev')!r}")
        if problem is not None:
            from flashlib.book.exercises import LearnerError

            raise LearnerError(problem)
        value = self.decode(reply.get("value"), buffers)
        if not isinstance(value, dict) or "value" not in value:
            raise rpc.Gone("malformed answer")
        _sync(args, value.get("sync", []))
        return value["value"]

    def _callback(self, reply: dict[str, Any], buffers: list[bytes], callbacks: list) -> None:
        """The student's code called a function the checker passed it: run it here."""
        try:
            fn = callbacks[int(reply["id"])]
            args, kwargs = self.decode(reply.get("args"), buffers)
            result = fn(*args, **kwargs)
            self.send({"op": "callback_result"}, [rpc.dumps(result, callbacks)])
        except (rpc.Gone, rpc.Deadline):
            raise
        except Exception as err:  # noqa: BLE001 - the callback's own failure, sent back
            self.send({"op": "callback_error", "exc": rpc.exception_tree(err)})


def _reemit(w: dict[str, Any]) -> None:
    """A warning of the student's call, raised again here as it was there (category, message,
    file and line), so that the checker's :func:`call_learner` records it."""
    import builtins

    name, module = str(w.get("category", "Warning")), str(w.get("category_module", ""))
    category = getattr(builtins, name, None) if module == "builtins" else None
    if not (isinstance(category, type) and issubclass(category, Warning)):
        category = type(name if name.isidentifier() else "Warning", (UserWarning,),
                        {"__module__": module or "sandbox"})
    lineno = w.get("lineno")
    warnings.warn_explicit(str(w.get("message", "")), category, str(w.get("filename", "?")),
                           lineno if isinstance(lineno, int) else 0)


def _sync(args: tuple, sync: Any) -> None:
    """Arguments the student's call changed, changed here too (an array it wrote into; a
    checker's counting array's log)."""
    if not isinstance(sync, list):
        return
    for entry in sync:
        if not (isinstance(entry, list | tuple) and len(entry) == 2):
            continue
        index, value = entry
        if not isinstance(index, int) or not 0 <= index < len(args):
            continue
        target = args[index]
        if hasattr(type(target), "__grade_sync__"):
            with contextlib.suppress(Exception):
                target.__grade_sync__(value)
        elif (isinstance(target, np.ndarray) and isinstance(value, np.ndarray)
              and value.shape == target.shape and target.flags.writeable):
            with contextlib.suppress(Exception):
                np.copyto(target, value, casting="unsafe")


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
        result = self._grade_once(chapter, task)
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
            zyg.fork(task["id"], [theirs.fileno(), out_write])
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
                       "tolerant": not self.options.strict})
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
    from flashlib.book.exercises import NOT_ATTEMPTED, Feedback

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
    printed (tools/grade_sandbox.py's LIMITS)."""
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
