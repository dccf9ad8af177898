"""The process side of tools/grade.py: one worker per chapter runs the chapter's code cells
and, at each exercise, forks one child per student notebook (see grade.py's docstring).

    python -m tools.grade_worker JOB.json     # started by grade.py, not by hand

JOB.json (written by ``grade.grade_chapter``): ``cwd`` (the chapter's working directory),
``steps`` (``["code", source]`` or ``["exercise", number]``, in order), ``exercises``
(``{number: {"call", "name", "checker", "number"}}``), ``tasks`` (``[{"id", "exercise",
"cells"}]``: a student's exercise cells), ``timeout``, ``jobs`` and ``results`` (a file that
receives one JSON line per task result, and one per error of the chapter's own cells).

Kept apart from grade.py so that the worker imports only the standard library, IPython and
flashlib (nbformat's import alone takes seconds).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OUTPUT_TAIL = 4000  # characters of a child's output kept in results.json
FILE_LIMIT = 16 * 2**20  # bytes: the largest file a student's code may write


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."



def _describe(err: BaseException) -> str:
    if isinstance(err, SyntaxError):
        return f"{type(err).__name__}: {err.msg} (line {err.lineno})"
    return f"{type(err).__name__}: {err}"


def _ignore_own_checker_call(*args: Any, **kwargs: Any) -> None:
    """Stands for the checker while a student's cells run: their own call does nothing."""


def run_task(shell: Any, exercise: dict[str, str], cells: list[str]) -> dict[str, Any]:
    """In a child: the student's exercise cells, then the chapter's checker call."""
    from flashlib.book.exercises import NOT_ATTEMPTED, Feedback

    ns = shell.user_ns
    real = ns.get(exercise["name"])
    cell_error = None
    for source in cells:
        ns[exercise["name"]] = _ignore_own_checker_call
        result = shell.run_cell(source, store_history=False, silent=True)
        err = result.error_before_exec or result.error_in_exec
        if err is not None and cell_error is None:
            cell_error = f"the exercise cell raised {_describe(err)}"
    ns[exercise["name"]] = real
    try:
        fb = eval(compile(exercise["call"], "<checker call>", "eval"), ns)  # noqa: S307
    except BaseException as err:  # the call cannot run: e.g. the function is not defined
        problem = cell_error or f"{exercise['call']} raised {_describe(err)}"
        return {"status": "error", "first_problem": problem}
    if not isinstance(fb, Feedback):
        return {"status": "error",
                "first_problem": f"{exercise['call']} returned {type(fb).__name__}, "
                                 "not the checker's Feedback (was the checker replaced?)"}
    result = {"checks_passed": len(fb.passes), "checks_total": len(fb.passes) + len(fb.problems),
              "first_problem": fb.problems[0] if fb.problems else "", "feedback": str(fb)}
    if fb.problems == [NOT_ATTEMPTED]:
        result["status"] = "not attempted"
    elif cell_error is not None:
        result |= {"status": "error", "first_problem": cell_error}
    else:
        result["status"] = "passed" if fb.passed else "failed"
    return result


def _child(shell: Any, exercise: dict[str, str], task: dict[str, Any], write_fd: int,
           scratch: Path, others: list[int]) -> None:
    """The forked child: closes the parent's ends of the pipes (``others``), runs the task,
    writes its result to ``write_fd``; never returns."""
    try:
        for fd in others:
            os.close(fd)
        os.chdir(scratch)
        out = os.open(scratch / "output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        try:
            import resource

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails
            resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
        except (ImportError, ValueError, OSError):  # pragma: no cover - not on this platform
            pass
        result = run_task(shell, exercise, task["cells"])
    except BaseException as err:  # noqa: BLE001 - a child must always answer
        result = {"status": "crashed", "first_problem": f"the grader's child failed: "
                                                        f"{_describe(err)}"}
    try:
        data = json.dumps(result).encode()
        while data:
            data = data[os.write(write_fd, data):]
    finally:
        os._exit(0)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - OUTPUT_TAIL))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def run_exercise(shell: Any, exercise: dict[str, str], tasks: list[dict[str, Any]],
                 timeout: float, jobs: int, emit: Any) -> None:
    """Fork a child per task (``jobs`` at a time); ``emit(result)`` for each."""
    pending, running = list(tasks), {}
    while pending or running:
        while pending and len(running) < jobs:
            task = pending.pop(0)
            scratch = Path(tempfile.mkdtemp(prefix="grade-"))
            read_fd, write_fd = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            start = time.monotonic()
            pid = os.fork()
            if pid == 0:  # the child: never leaves _child
                _child(shell, exercise, task, write_fd, scratch, [read_fd, *running])
            os.close(write_fd)
            running[read_fd] = (pid, {"task": task, "start": start, "data": b"",
                                      "scratch": scratch})
        now = time.monotonic()
        wait = max(0.0, min(s["start"] + timeout for _, s in running.values()) - now)
        ready, _, _ = select.select(list(running), [], [], wait)
        for fd in ready:
            pid, state = running[fd]
            chunk = os.read(fd, 1 << 16)
            if chunk:
                state["data"] += chunk
                continue
            _, status = os.waitpid(pid, 0)
            runtime = time.monotonic() - state["start"]
            del running[fd]
            os.close(fd)
            try:
                result = json.loads(state["data"].decode())
            except ValueError:
                how = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                       else f"exited with code {os.WEXITSTATUS(status)}")
                result = {"status": "crashed",
                          "first_problem": f"the process {how} before the checker answered"}
            _finish(emit, state, result, runtime)
        now = time.monotonic()
        for fd in [fd for fd, (_, s) in running.items() if now - s["start"] >= timeout]:
            pid, state = running.pop(fd)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
            result = {"status": "timeout",
                      "first_problem": f"still running after {timeout:g} s: killed (an "
                                       "infinite loop, or far too slow)"}
            _finish(emit, state, result, time.monotonic() - state["start"])


def _finish(emit: Any, state: dict[str, Any], result: dict[str, Any], runtime: float) -> None:
    result |= {"id": state["task"]["id"], "runtime_s": round(runtime, 3),
               "output": _tail(state["scratch"] / "output.txt")}
    shutil.rmtree(state["scratch"], ignore_errors=True)
    emit(result)


def make_shell() -> Any:
    """An IPython shell as a notebook kernel has one (magics, ``display``), without history."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"  # plain tracebacks in the logs
    return InteractiveShell.instance(config=config)


def worker(job_path: Path) -> int:
    """Run one chapter's job (written by :func:`grade_chapter`): its code cells in order, and at
    each exercise the students' tasks in forked children; one JSON line per result."""
    job = json.loads(job_path.read_text(encoding="utf-8"))
    os.chdir(job["cwd"])
    shell = make_shell()
    tasks: dict[str, list[dict[str, Any]]] = {}
    for task in job["tasks"]:
        tasks.setdefault(task["exercise"], []).append(task)
    with open(job["results"], "a", encoding="utf-8") as results:
        def emit(result: dict[str, Any]) -> None:
            results.write(json.dumps(result) + "\n")
            results.flush()

        for kind, value in job["steps"]:
            if kind == "code":
                outcome = shell.run_cell(value, store_history=False, silent=True)
                if not outcome.success:
                    err = outcome.error_before_exec or outcome.error_in_exec
                    emit({"context_error": f"{_describe(err)} in the chapter's cell "
                                           f"{one_line(value, 80)!r}"})
            elif value in tasks:
                run_exercise(shell, job["exercises"][value], tasks[value], job["timeout"],
                             job["jobs"], emit)
    return 0



if __name__ == "__main__":
    sys.exit(worker(Path(sys.argv[1])))
