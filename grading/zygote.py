"""The judge's side of the sandboxed processes (grading/judge.py drives them): the *zygote*,
a chapter's sandboxed process (grading/worker.py) started and walked to each exercise, and the
*task link*, the socket to one student's exercise process, through which the checker's calls
of the student's function run there (grading/rpc.py) and come back as plain data."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from grading import rpc, sandbox

if TYPE_CHECKING:
    from grading.judge import Options

OUTPUT_TAIL = 4000  # characters of a student's output kept in results.json
#: Seconds the zygote may take to run a chapter's cells up to an exercise.
CHAPTER_BUDGET = 1800.0
#: Seconds for the zygote's own answers (fork, end).
CONTROL_TIMEOUT = 60.0


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
            conf, [sys.executable, "-m", "grading.worker", str(theirs.fileno())],
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
        #: each exercise in a cgroup of its own (its cap and its measured peak), where the
        #: machine allows it: "cgroup v1", "cgroup v2" or None (sandbox.task_cgroups)
        self.task_cgroups = sandbox.task_cgroups() if conf.cgroups else None
        self.limits = dict(options.limits)
        self.tasks: dict[str, sandbox.Cgroup] = {}
        #: the last ended exercise's cgroup: {"peak": bytes, "by": version, "limit_hit": bool}
        self.task_memory: dict[str, Any] | None = None
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

    def fork(self, task: str, fds: list[int]) -> sandbox.Cgroup | None:
        """Fork the process of one exercise; returns the cgroup it was born in (None where
        there is none).  The chapter's processes step into the exercise's new cgroup for the
        fork and back out after it, so that the exercise's process and everything it starts
        are in it from their first instruction (a child inherits its parent's cgroup, on v1
        and v2), while what the chapter's process holds stays charged to the chapter."""
        cgroup = None
        if self.task_cgroups:
            Zygote.made += 1
            cgroup = sandbox.Cgroup.make(
                f"flashlib-grade-{os.getpid()}-{Zygote.made}-task",
                {"memory": self.limits["memory"], "processes": self.limits["processes"]})
        members = [self.proc.pid, *sandbox.descendants(self.proc.pid)] if cgroup else []
        if cgroup is not None:
            cgroup.move(members)
        try:
            self.send({"op": "fork", "task": task}, fds)
            reply = self.recv(CONTROL_TIMEOUT)
        finally:
            if cgroup is not None:
                (self.cgroup or sandbox.Cgroup.home()).move(members)
        if reply.get("ev") != "forked":
            if cgroup is not None:
                cgroup.kill()
                cgroup.remove()
            raise ZygoteDied(f"the chapter's process could not fork: {reply.get('msg')}")
        if cgroup is not None:
            self.tasks[task] = cgroup
        return cgroup

    def end(self, task: str, wait: float = 0.0) -> tuple[int | None, int]:
        cgroup = self.tasks.pop(task, None)
        self.task_memory = None
        try:
            self.send({"op": "end", "task": task, "wait": wait})
            reply = self.recv(CONTROL_TIMEOUT)
        finally:
            if cgroup is not None:  # the exercise's processes are gone: its whole peak
                self.task_memory = {"peak": cgroup.whole_peak(), "by": cgroup.version,
                                    "limit_hit": cgroup.limit_hit()}
                cgroup.kill()
                cgroup.remove()
        #: (the exercise's peak resident memory, the chapter's process's own), bytes,
        #: read by the zygote from /proc before the exercise was ended (None: unknown)
        self.memory = (reply.get("peak"), reply.get("base"))
        return reply.get("status"), int(reply.get("survivors") or 0)

    def close(self) -> None:
        for cgroup in self.tasks.values():
            cgroup.kill()
            cgroup.remove()
        self.tasks.clear()
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
        #: the exercise's cgroup (Zygote.fork), which measures a checker's memory probe
        #: from outside the student's process; None: measured inside it (tracemalloc)
        self.cgroup: sandbox.Cgroup | None = None

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
        from flashlib.book.exercises import grader_adapter as adapter

        callbacks: list[Any] = []
        blob = rpc.dumps((tuple(args), dict(kwargs)), callbacks)
        # a checker's memory probe: measured by the exercise's cgroup, here, where there is
        # one (the student's process only says when its arguments are unpacked and when the
        # call has returned), and by tracemalloc in the student's process as well: the larger
        # counts (memory held before the call and freed inside it hides from the cgroup's
        # difference, not from tracemalloc, which the audit keeps the student's code from)
        outside = adapter.measuring() and self.cgroup is not None and self.cgroup.reset_peak()
        base, peak = (self.cgroup.usage() if outside else None), None
        self.send(header | {"watch": adapter.forbidden_names(),
                           "measure": adapter.measuring(),
                           "outside": bool(outside)}, [blob])
        while True:
            reply, buffers = self.recv()
            if reply.get("ev") == "callback":
                self._callback(reply, buffers, callbacks)
                continue
            if outside and reply.get("ev") == "ready" and peak is None:
                self.cgroup.reset_peak()
                base = self.cgroup.usage()
                self.send({"op": "go"})
                continue
            if outside and reply.get("ev") == "done" and peak is None:
                peak = self.cgroup.peak()
                self.send({"op": "go"})
                continue
            break
        if header["op"] == "call":  # the student's call, inside the checker's call_learner
            for w in reply.get("warnings", [])[:100]:
                _reemit(w)
        if outside:
            peak = peak if peak is not None else self.cgroup.peak()
            if peak is not None and base is not None:
                adapter.record_peak(max(0, peak - base, int(reply.get("peak") or 0)))
        elif reply.get("peak") is not None:
            adapter.record_peak(int(reply["peak"]))
        calls = [(str(name), [tuple(s) if isinstance(s, list) else None for s in shapes])
                 for name, shapes in reply.get("calls", []) if isinstance(shapes, list)]
        problem = adapter.library_call_problem(calls)
        if reply.get("ev") == "raised":
            raise self.decode(reply.get("exc"), buffers)
        if reply.get("ev") != "returned":
            raise rpc.Gone(f"unexpected answer {reply.get('ev')!r}")
        if problem is not None:
            raise adapter.LearnerError(problem)
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
