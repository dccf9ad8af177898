"""The sandbox side of grading/grade.py: a chapter's process (the *zygote*) and, forked from
it, one process per student's exercise.  Neither decides a grade.

    python -m grading.worker CONTROL_FD     # started by grading/zygote.py, sandboxed

The zygote runs the chapter's own code cells in order (from the student notebook the book
generates, never a student's copy), as Jupyter would: IPython, matplotlib's Agg backend, one
BLAS thread, working directory an empty folder.  Its judge drives it over the control socket
(JSON messages framed by grading/rpc.py):

    {"op": "run_to", "number": "3.2"}   run the chapter's cells up to Exercise 3.2's place
                                        -> {"ev": "at", "number": ...} (or "context_error"s
                                        first, and {"ev": "end"} past the last cell)
    {"op": "fork", "task": ID} + 2 fds  fork the process of one student's exercise, handing
                                        it the two descriptors (its socket to the judge, the
                                        write end of its output pipe) -> {"ev": "forked"}
    {"op": "end", "task": ID}           kill that process and everything it started
                                        -> {"ev": "ended", "status": ..., "survivors": N}

The zygote never receives a student's code: each exercise's process gets its cells over its
own socket, after the fork, so no process holds another student's work.  The exercise's
process confines itself first (grading/sandbox.py: its own namespaces, a private /tmp,
resource limits, no capability), then serves its judge (:func:`serve`): it runs the
student's earlier exercise cells and this exercise's cells in the chapter's namespace, and
hands the judge what the checker call names (``merge``) as data or as handles; the judge
runs the checker and calls the student's function through the handle, one call at a time
(``{"op": "call"}``): the call runs here, the result goes back as plain data.

Standard library, IPython, numpy and flashlib only.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from grading import rpc, sandbox

#: Where the exercises' folders go when they share the chapter's sandbox (levels bwrap and
#: rlimits; at the namespaces level each has a private /tmp).
TASKS = "grade-tasks"


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(err: BaseException) -> str:
    if isinstance(err, SyntaxError):
        return f"{type(err).__name__}: {err.msg} (line {err.lineno})"
    return f"{type(err).__name__}: {err}"


def _ignore_own_checker_call(*args: Any, **kwargs: Any) -> None:
    """Stands for the checkers while a student's cells run: their own calls do nothing."""


# ---------------------------------------------------------------------------------------------
# Running a student's cells
# ---------------------------------------------------------------------------------------------

def parses(source: str) -> bool:
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        ast.parse(TransformerManager().transform_cell(source))
        return True
    except (SyntaxError, ValueError):
        return False


def without_syntax_errors(source: str) -> tuple[str, list[int]]:
    """The cell with its top-level statements that do not parse blanked out (line numbers
    kept), and the first line of each blanked statement: a typo in a scratch line does not
    stop the function above it from being graded."""
    if parses(source):
        return source, []
    lines = source.split("\n")
    starts = [i for i, line in enumerate(lines)
              if line.strip() and not line[0].isspace() and not line.startswith(
                  ("else", "elif", "except", "finally", ")", "]", "}", "#"))]
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    bounds = [*starts, len(lines)]
    kept, skipped, k = [""] * len(lines), [], 0
    while k < len(starts):
        for span in range(1, 4):  # a statement may run over the next "start" (a bracket)
            end = bounds[min(k + span, len(starts))]
            chunk = "\n".join(lines[bounds[k]:end])
            if parses(chunk):
                kept[bounds[k]:end] = lines[bounds[k]:end]
                k += span
                break
        else:
            skipped.append(bounds[k] + 1)
            k += 1
    return "\n".join(kept), skipped


def syntax_message(source: str) -> str:
    """What Python says of a cell that does not parse ("SyntaxError: ... (line N)")."""
    from IPython.core.inputtransformer2 import TransformerManager

    for text in (source, TransformerManager().transform_cell(source)):
        try:
            compile(text, "<cell>", "exec")
        except SyntaxError as err:
            return describe(err)
    return "SyntaxError"


class Interrupted(KeyboardInterrupt):
    """Raised by the alarm when an earlier exercise's cells run too long."""


@contextlib.contextmanager
def alarm(seconds: float):
    def ring(signum: int, frame: Any) -> None:
        raise Interrupted(f"interrupted after {seconds:.3g} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cell(shell: Any, source: str) -> BaseException | None:
    """One cell in the chapter's namespace; the exception it raised, if any."""
    try:
        result = shell.run_cell(source, store_history=False, silent=True)
    except BaseException as err:  # noqa: BLE001 - e.g. the alarm outside the cell's code
        return err
    return result.error_before_exec or result.error_in_exec


def run_student(shell: Any, request: dict[str, Any], started: Any = None) -> dict[str, Any]:
    """The ``run`` request: the student's earlier exercise cells (``prelude``, their errors
    theirs, each interrupted when the budget is spent), then this exercise's cells
    (``cells``; with ``tolerant``, top-level statements that do not parse are skipped), the
    checkers' names standing for a function that does nothing; then the names the checker
    call passes (``args``, ``kwargs``: expressions), evaluated."""
    from flashlib.book.exercises.grader_adapter import STUDENT_ENV

    os.environ[STUDENT_ENV] = str(request.get("student", ""))  # the student's own variants
    ns = shell.user_ns
    checkers = {name: ns.get(name) for name in request.get("checkers", [])}
    notes: list[str] = []
    for name in checkers:
        ns[name] = _ignore_own_checker_call
    budget = float(request.get("prelude_budget", 0))
    end = time.monotonic() + budget
    cpu = request.get("cpu_limit")  # CPU seconds: the earlier cells', then the exercise's
    if cpu is not None:
        sandbox.limit_cpu(budget + float(cpu), final=True)
    for number, sources in request.get("prelude", []):
        for source in sources:
            left = end - time.monotonic()
            if left <= 0:
                notes.append(f"your cells of Exercise {number} were not run: the time for "
                             "earlier exercises' cells was spent")
                break
            with alarm(left):
                err = run_cell(shell, source if parses(source) else
                               without_syntax_errors(source)[0])
            if isinstance(err, Interrupted):
                notes.append(f"your cell of Exercise {number} was interrupted (still running "
                             "after the time for earlier exercises' cells)")
    if cpu is not None:  # the exercise's own time starts now
        sandbox.limit_cpu(float(cpu))
    if started is not None:
        started()
    cell_error = syntax_error = None
    skipped: list[int] = []
    for source in request["cells"]:
        if request.get("tolerant", True) and not parses(source):
            if syntax_error is None:
                syntax_error = f"the exercise cell raised {syntax_message(source)}"
            source, lines = without_syntax_errors(source)
            skipped += lines
        err = run_cell(shell, source)
        if err is not None and cell_error is None:
            cell_error = f"the exercise cell raised {describe(err)}"
            if not isinstance(err, SyntaxError):
                tb = traceback.extract_tb(err.__traceback__)
                ipython = ("<ipython-input", sandbox.inside("ipy"))
                cell_lines = [f.lineno for f in tb if f.filename.startswith(ipython)
                              or "ipykernel" in f.filename]
                if cell_lines:
                    cell_error += f" (line {cell_lines[-1]})"
    if skipped:
        notes.append("a syntax error on line " + ", ".join(map(str, skipped)) + " of the "
                     "exercise cell: that statement was skipped, the rest ran")
    for name, value in checkers.items():
        ns[name] = value
    reply: dict[str, Any] = {"ev": "ran", "cell_error": cell_error, "notes": notes,
                             "syntax_error": syntax_error}
    try:
        reply["values"] = {"args": [eval(compile(src, "<checker call>", "eval"), ns)  # noqa: S307
                                    for src in request.get("args", [])],
                           "kwargs": {k: eval(compile(src, "<checker call>", "eval"), ns)  # noqa: S307
                                      for k, src in request.get("kwargs", {}).items()}}
    except BaseException as err:  # noqa: BLE001 - e.g. the function is not defined
        reply["arg_error"] = describe(err)
    return reply


# ---------------------------------------------------------------------------------------------
# Serving the judge: one student's exercise
# ---------------------------------------------------------------------------------------------

#: The modules the GPU checkers' helpers import when they first run (imported by the zygote
#: before it forks, so that the exercise's private copy below holds them).
HELPER_MODULES = ("flashlib.gpu.exercise_kernels", "flashlib.gpu.triton_attention",
                  "flashlib.gpu.watch")


def preload_helpers() -> None:
    """Import what the checkers' helpers need, where the chapter's checkers hold helpers."""
    if "flashlib.book.exercises.gpu" in sys.modules:
        for name in HELPER_MODULES:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


def seal() -> dict[str, tuple[Any, dict[str, Any]]]:
    """The library as the chapter left it, before any student's code runs: ``{module name:
    (module, copy of its namespace)}`` of flashlib's modules.  The checkers' helpers are
    taken from this private copy, never from ``sys.modules`` (which the student's code can
    replace), and the namespaces are put back before each helper runs."""
    return {name: (module, dict(vars(module))) for name, module in list(sys.modules.items())
            if name.startswith("flashlib") and module is not None}


def restore(sealed: dict[str, tuple[Any, dict[str, Any]]]) -> None:
    """Put the sealed modules back in ``sys.modules``, with their namespaces as sealed."""
    # Triton's interpreter adds its own globals (interpreter_semantic, ...) to a kernel's
    # module when it first rewrites the kernel, and keeps the rewritten kernel: they stay
    interpreter = sys.modules.get("triton.runtime.interpreter")
    triton_globals = vars(interpreter) if interpreter is not None else {}
    for name, (module, namespace) in sealed.items():
        sys.modules[name] = module
        current = vars(module)
        for key in [k for k in current if k not in namespace]:
            value = current[key]
            if key == "__flashlib_watch__" or (isinstance(value, type(sys)) and getattr(
                    value, "__name__", "") == f"{name}.{key}"):  # the watcher, a submodule
                continue
            if key in triton_globals and triton_globals[key] is value:
                continue
            del current[key]
        for key, value in namespace.items():
            if current.get(key, namespace) is not value:
                current[key] = value


def release_free_memory() -> None:
    """Give the memory the allocator keeps after ``free`` back to the system (glibc's
    ``malloc_trim``): reused, it would not show in the cgroup's peak."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)


class Server:
    """The exercise's process: answers the judge's requests on ``sock`` until it leaves."""

    def __init__(self, shell: Any, sock: socket.socket):
        self.shell, self.sock = shell, sock
        self.objects: dict[int, Any] = {}
        self.sealed = seal()  # before the student's first cell

    def handle(self, obj: Any) -> int:
        ident = len(self.objects)
        self.objects[ident] = obj
        return ident

    def send(self, header: dict[str, Any], value: Any = None, key: str = "value") -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        tree, buffers = rpc.encode(value, self.handle)
        rpc.send(self.sock, header | {key: tree}, buffers)

    def callback(self, ident: int) -> Any:
        def call_the_judge(*args: Any, **kwargs: Any) -> Any:
            self.send({"ev": "callback", "id": ident}, (args, kwargs), key="args")
            header, buffers = rpc.recv(self.sock)
            if header.get("op") == "callback_result":
                return rpc.loads(buffers[0], self.objects, self.callback)
            raise rpc.exception_from_tree(header.get("exc", {}))

        return call_the_judge

    def serve(self) -> None:
        while True:
            header, buffers = rpc.recv(self.sock)
            op = header.get("op")
            if op == "run":
                reply = run_student(self.shell, header,
                                    lambda: rpc.send(self.sock, {"ev": "started"}))
                values = reply.pop("values", None)
                self.send(reply, values)
            elif op in ("call", "helper"):
                self.call(header, buffers)
            elif op == "bye":
                return
            else:
                rpc.send(self.sock, {"ev": "error", "msg": f"unknown request {op!r}"})

    def step(self, event: str) -> None:
        """Tell the judge where a measured call is (``ready``: its arguments unpacked;
        ``done``: it returned) and wait for its go: the judge reads the cgroup meanwhile."""
        rpc.send(self.sock, {"ev": event})
        header, _ = rpc.recv(self.sock)
        if header.get("op") != "go":
            raise rpc.Gone(f"expected the judge's go, got {header.get('op')!r}")

    def call(self, header: dict[str, Any], buffers: list[bytes]) -> None:
        import numpy as np

        from flashlib.book.exercises.grader_adapter import (
            CHECKER_PACKAGE,
            measure_peak,
            watching,
        )

        if header["op"] == "call":
            fn = self.objects[header["ref"]]
        else:
            module, name = header["module"], header["qualname"]
            if not module.startswith(CHECKER_PACKAGE):
                raise ValueError(f"{module} is not a checker module")
            if module not in self.sealed:
                raise ValueError(f"{module} was not loaded by the chapter")
            restore(self.sealed)  # the library as the chapter left it, whatever was replaced
            fn = self.sealed[module][1][name]  # the private copy, not sys.modules
            fn = getattr(fn, "__wrapped__", fn)
        args, kwargs = rpc.loads(buffers[0], self.objects, self.callback)
        before = [(i, a, a.tobytes()) for i, a in enumerate(args)
                  if isinstance(a, np.ndarray) and a.nbytes <= 64 * 2**20]
        watched = [str(n) for n in header.get("watch", []) if str(n).startswith("flashlib.")]
        peak = None
        outside = bool(header.get("outside"))  # the judge measures the call from its cgroup
        if outside:
            gc.collect()
            release_free_memory()  # so that memory freed before cannot hide the call's
            self.step("ready")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with watching(watched) as calls:
                    if header.get("measure"):
                        result, peak = measure_peak(fn, *args, **kwargs)
                    else:
                        result = fn(*args, **kwargs)
                    if outside:
                        self.step("done")
                    # what the call left behind in a cycle (an unclosed pool) is finalised
                    # now, its ResourceWarning recorded with this call, whatever the moment
                    # the garbage collector would have chosen (the young generations: cheap)
                    gc.collect(1)
                error = None
            except BaseException as err:  # noqa: BLE001 - the student's code raised
                error, calls = err, locals().get("calls", [])
        report = {"warnings": [{"category": w.category.__name__,
                                "category_module": w.category.__module__,
                                "message": str(w.message)[:2000], "filename": str(w.filename),
                                "lineno": w.lineno} for w in caught[:100]],
                  "calls": [[name, shapes] for name, shapes in calls[:100]], "peak": peak}
        if error is not None:
            self.send({"ev": "raised"} | report, error, key="exc")
            return
        sync = [[i, a] for i, a, data in before if a.tobytes() != data]
        sync += [[i, a.__grade_state__()] for i, a in enumerate(args)
                 if hasattr(type(a), "__grade_state__")]
        self.send({"ev": "returned"} | report, {"value": result, "sync": sync})


# ---------------------------------------------------------------------------------------------
# The exercise's process: confinement, then serve
# ---------------------------------------------------------------------------------------------

def exercise_process(shell: Any, config: dict[str, Any], sock_fd: int, out_fd: int) -> None:
    """In the forked child of the zygote: confine, then serve the judge; never returns."""
    code = 0
    try:
        _close_all_but((sock_fd, out_fd))
        level = config["level"]
        if level == "namespaces":
            sandbox.enter_task_namespaces(config["limits"]["disk"], close=(sock_fd, out_fd))
            os.setsid()
            work = Path(sandbox.inside("work"))
        else:
            os.setsid()
            work = Path(config["tasks"]) / f"task-{os.getpid()}"
        work.mkdir(parents=True, exist_ok=True)
        os.chdir(work)
        os.environ["HOME"] = str(work)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        for stream in (sys.stdout, sys.stderr):  # what the student prints goes out at once
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=True, write_through=True)
        sandbox.set_limits(config["limits"], count_processes=config["count_processes"])
        sock = socket.socket(fileno=sock_fd)
        Server(shell, sock).serve()
    except rpc.Gone:
        code = 0
    except BaseException:  # noqa: BLE001 - anything else: say it on the output, exit
        traceback.print_exc()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _close_all_but(keep: tuple[int, ...]) -> None:
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:  # not Linux: the usual range
        fds = list(range(3, 256))
    for fd in fds:
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


# ---------------------------------------------------------------------------------------------
# The zygote
# ---------------------------------------------------------------------------------------------

class Control:
    """The zygote's end of the control socket: JSON messages, descriptors collected."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer, self.fds = sock, b"", []

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 8)
            self.fds += fds
            if not data:
                raise rpc.Gone("the judge closed the control socket")
            self.buffer += data
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def recv(self) -> dict[str, Any]:
        import json
        import struct

        size, count = struct.unpack("!II", self._take(8))
        if count:
            raise rpc.WireError("the control channel carries no buffers")
        return json.loads(self._take(size))

    def send(self, header: dict[str, Any]) -> None:
        rpc.send(self.sock, header)


def make_shell() -> Any:
    """An IPython shell as a notebook kernel has one (magics, ``display``), without history."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"  # plain tracebacks in the logs
    return InteractiveShell.instance(config=config)


def zygote(control_fd: int) -> int:
    sandbox.become(*sandbox.user_from_env())
    with contextlib.suppress(OSError):
        sandbox.prctl(sandbox.PR_SET_DUMPABLE, 0)  # no exercise may ptrace or read it
    with contextlib.suppress(OSError):  # orphans of the exercises come back here (Linux)
        sandbox.prctl(sandbox.PR_SET_CHILD_SUBREAPER, 1)
    control = Control(socket.socket(fileno=control_fd))
    start = control.recv()
    config = start["config"]
    if config["level"] != "namespaces":
        config["tasks"] = tempfile.mkdtemp(prefix=f"{TASKS}-")
    workdir = Path(start.get("cwd") or tempfile.mkdtemp(prefix="chapter-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)
    Path(os.environ.get("HOME", workdir)).mkdir(parents=True, exist_ok=True)
    shell = make_shell()
    steps = list(start["steps"])
    children: dict[str, int] = {}
    while True:
        try:
            request = control.recv()
        except rpc.Gone:
            return 0
        op = request.get("op")
        if op == "run_to":
            while steps:
                kind, value = steps[0]
                if kind == "exercise" and value == request["number"]:
                    break
                steps.pop(0)
                if kind == "code":
                    err = run_cell(shell, value)
                    if err is not None:
                        control.send({"ev": "context_error",
                                      "msg": f"{describe(err)} in the chapter's cell "
                                             f"{one_line(value, 80)!r}"})
            control.send({"ev": "at", "number": request["number"]} if steps
                         else {"ev": "end"})
        elif op == "fork":
            preload_helpers()
            if len(control.fds) < 2:
                control.send({"ev": "error", "msg": "fork without its two descriptors"})
                continue
            sock_fd, out_fd = control.fds[:2]
            del control.fds[:2]
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                exercise_process(shell, config, sock_fd, out_fd)
            os.close(sock_fd)
            os.close(out_fd)
            children[request["task"]] = pid
            control.send({"ev": "forked", "task": request["task"]})
        elif op == "end":
            pid = children.pop(request["task"], None)
            status = survivors = None
            peak = base = None
            if pid is not None:
                peak, base = peak_memory(pid), _vm("VmRSS", os.getpid())
                status, survivors = end_exercise(pid, config, float(request.get("wait", 0)))
            if not children:  # no exercise running: reap every orphan that came back here
                reap_all()
            control.send({"ev": "ended", "task": request["task"], "status": status,
                          "survivors": survivors, "peak": peak, "base": base})
        elif op == "quit":
            return 0


def end_exercise(pid: int, config: dict[str, Any], wait: float = 0.0) -> tuple[int, int]:
    """Kill the exercise's process and all it started (after ``wait`` seconds for it to end
    by itself: it closed its socket); ``(wait status, processes that were still running
    besides it)``."""
    level = config["level"]
    survivors = 0
    end = time.monotonic() + wait
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if level != "namespaces":
                survivors = (sandbox.sweep_processes() if level == "bwrap"
                             else sandbox.kill_descendants())
                shutil.rmtree(Path(config["tasks"]) / f"task-{pid}", ignore_errors=True)
            return status, survivors
        time.sleep(0.01)
    if level == "namespaces":  # the processes of its PID namespace are its descendants
        found = _descendants(pid)
        survivors = max(0, len(found) - 2)  # the init and the exercise's process
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # namespaces: the init dies with it, and its namespace
    if level != "namespaces":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if level == "bwrap":  # one exercise at a time: every other process of the sandbox is its
        survivors = sandbox.sweep_processes()
    elif level == "rlimits":  # the zygote is their subreaper: all are its descendants
        survivors = sandbox.kill_descendants()
    if level != "namespaces":
        shutil.rmtree(Path(config["tasks"]) / f"task-{pid}", ignore_errors=True)
    return status, survivors


def peak_memory(pid: int) -> int | None:
    """The most resident memory (bytes) any process of the exercise has held so far: the
    largest ``VmHWM`` of its processes, read from /proc by the zygote, outside the student's
    process (which cannot change it); None when none can be read (they have ended)."""
    found = [_vm("VmHWM", p) for p in [pid, *_descendants(pid)]]
    found = [f for f in found if f is not None]
    return max(found) if found else None


def _vm(field: str, pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def reap_all() -> None:
    """Reap every child of this process that has ended (the orphans of exercises, which
    come back to the zygote, their subreaper): no zombie outlives its exercise."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _descendants(pid: int) -> list[int]:
    return sandbox.descendants(pid)


if __name__ == "__main__":
    sys.exit(zygote(int(sys.argv[1])))
