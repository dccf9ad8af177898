"""Confinement of the students' code for grading/grade.py: what the platform offers, the
bubblewrap command line, and the namespace and limit calls made inside the sandbox.

Three levels, the best the machine allows (:func:`probe`; `make grade` prints which one and
the report's summary.md says it):

``namespaces`` (Linux with bubblewrap and user namespaces)
    The chapter's process (the *zygote*, grading/worker.py) runs under bubblewrap
    (``bwrap``): a new user, PID, network, IPC and UTS namespace, no network, the system and
    the Python environment read-only, flashlib's package and the worker's own two files
    read-only, nothing else of the machine (not the submissions, not the reports, not the
    book's sources, not your home folder), a private ``/tmp``, every capability dropped;
    run as ``nobody`` when the grader runs as root.  Each student's exercise is a fork of
    it that enters namespaces of its own (:func:`enter_task_namespaces`): it is PID 1's
    child in a new PID namespace (it sees no other process; when its exercise ends the
    namespace's init exits and the kernel kills everything left in it), a private ``/tmp``
    tmpfs of :data:`LIMITS` ``["disk"]`` bytes is the only writable place, ``/proc`` shows
    its own processes only, and it holds no capability.
``bwrap`` (bubblewrap works, nested user namespaces do not)
    The same sandbox for the chapter; the students' exercises run one after the other in
    it, each in its own session and folder, and every process left when an exercise ends is
    killed (``kill(-1)``, inside the sandbox's PID namespace only).  A student's code could
    still disturb the next student's run of the same chapter (same user, same ``/tmp``).
``rlimits`` (no bubblewrap: macOS, or Linux without it or without user namespaces)
    No sandbox: the students' code runs with your permissions (it can read your files and
    use the network); each exercise in its own session, its process group killed at the
    end.  ``make grade`` warns.  Grade in a container or a throw-away account.

On every level: the verdict is computed by the judge, a process the student's code cannot
reach (grading/judge.py), and each exercise's process gets resource limits
(:data:`LIMITS`: address space, processes, open files, file size, no core dumps; and the
CPU time of :func:`limit_cpu`, the exercise's time limit).  Where this
process may make cgroups (root, or a delegated cgroup v2 subtree with the memory and pids
controllers; cgroup v1's memory and pids hierarchies as root), each chapter's sandbox also
gets one of its own (:class:`Cgroup`): at most :data:`CGROUP_LIMITS` for the sandbox as a
whole (a fork bomb whose processes each allocate stays bounded), and every process in it
killed when the sandbox ends; elsewhere the grader says it has none.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: Limits of one student's exercise (its process and everything it starts).
LIMITS = {
    "memory": 2 * 2**30,  # bytes of address space above the chapter's own
    "processes": 128,  # processes and threads of the sandbox's user
    "open_files": 256,
    "file_size": 16 * 2**20,  # bytes, the largest file
    "disk": 64 * 2**20,  # bytes, all files together (the private /tmp; namespaces level)
}
#: The uid and gid the sandbox runs as when the grader runs as root.
NOBODY = 65534
#: The files of the repository the sandbox sees (read-only), besides the flashlib package.
WORKER_FILES = ("grading/__init__.py", "grading/worker.py", "grading/rpc.py",
                "grading/sandbox.py")
#: Folders of the flashlib package the sandbox does not see: the exercises' declared mistakes
#: (flashlib/book/exercises/mistakes/), many of them a right answer with one change.
HIDDEN = ("flashlib/book/exercises/mistakes",)
#: Environment variables passed into the sandbox as they are (all others are cleared).
PASS_ENV = ("LANG", "LC_ALL", "TZ", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES",
            "FLASHLIB_REQUIRE_ALL")

LEVELS = ("namespaces", "bwrap", "rlimits")
WHAT = {
    "namespaces": "bubblewrap sandbox per chapter and private namespaces per exercise (no "
                  "network, no files of this machine but the Python environment, a private "
                  "/tmp, its own processes only)",
    "bwrap": "bubblewrap sandbox per chapter (no network, no files of this machine but the "
             "Python environment); the exercises of one chapter share it, one at a time",
    "rlimits": "resource limits and a session per exercise only: NO SANDBOX, the students' "
               "code runs with your permissions (your files, the network)",
}


@dataclass
class Confinement:
    """What :func:`probe` found: the level, the bwrap binary, the uid/gid to run as, and why
    a better level was not available (``reasons``)."""

    level: str
    bwrap: str | None = None
    user: int | None = None  # setuid to this before bwrap (None: stay as we are)
    group: int | None = None
    reasons: list[str] = field(default_factory=list)
    cgroups: bool = False  # each chapter's sandbox in a cgroup of its own (Cgroup)

    def describe(self) -> str:
        text = f"{self.level}: {WHAT[self.level]}"
        if self.cgroups:
            text += (f"; each chapter's sandbox in a cgroup of its own (at most "
                     f"{CGROUP_LIMITS['memory'] / 2**30:g} GiB of memory and "
                     f"{CGROUP_LIMITS['processes']} processes, all killed at its end)")
        tasks = task_cgroups() if self.cgroups else None
        if tasks:
            text += (f"; each exercise in a cgroup of its own ({tasks}, probed): its memory "
                     "limit holds its processes together, and the memory checks are measured "
                     "there, by the judge")
        else:
            text += ("; no cgroup per exercise (none can be made here): memory limited per "
                     "process (RLIMIT_AS), the checkers' memory checks measured in the "
                     "student's process")
        return text + (f" ({'; '.join(self.reasons)})" if self.reasons else "")

    def warning(self) -> str | None:
        if self.level == "namespaces":
            return None
        return (f"warning: students' code is confined at the '{self.level}' level only: "
                f"{WHAT[self.level]}. Why: {'; '.join(self.reasons) or 'see above'}. "
                "The grades are still decided outside the students' processes "
                "(grading/judge.py). See the instructor guide, 'What each platform gets'.")


# ---------------------------------------------------------------------------------------------
# The sandbox's command line (bubblewrap)
# ---------------------------------------------------------------------------------------------

def _python_paths() -> list[Path]:
    """What the sandboxed Python needs to read: its installation, the virtual environment and
    their library folders (sysconfig's and site's), the repository itself left out
    (:func:`_repo_paths`)."""
    paths = {Path(sys.base_prefix), Path(sys.prefix)}
    for entry in [*sysconfig.get_paths().values(), *site.getsitepackages()]:
        path = Path(entry or ".").resolve()
        if path.is_dir() and path != ROOT and not any(path.is_relative_to(p) for p in paths):
            paths.add(path)
    paths |= {Path(os.path.realpath(p)) for p in paths}
    outer = sorted(p for p in paths if p.exists())
    return [p for p in outer if not any(p != q and p.is_relative_to(q) for q in outer)]


def _repo_paths() -> list[Path]:
    return [ROOT / "flashlib", *(ROOT / f for f in WORKER_FILES)]


#: The sandbox's private /tmp, as the processes inside see it: a tmpfs of the sandbox, not
#: the folder of this machine.
INSIDE = Path("/tmp")


def inside(name: str) -> str:
    """A path of the sandbox's private /tmp (:data:`INSIDE`)."""
    return str(INSIDE / name)


def sandbox_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment inside the sandbox: nothing of the grader's but :data:`PASS_ENV`."""
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    env |= {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": inside("home"), "TMPDIR": str(INSIDE), "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": str(ROOT), "PYTHONNOUSERSITE": "1", "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": inside("matplotlib"), "IPYTHONDIR": inside("ipython"),
            "TRITON_CACHE_DIR": inside("triton"), "XDG_CACHE_HOME": inside("cache"),
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "VECLIB_MAXIMUM_THREADS": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            "PYTHONHASHSEED": "0"}
    return env | (extra or {})


SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc/alternatives",
          "etc/ld.so.cache", "etc/ld.so.conf", "etc/ld.so.conf.d", "etc/fonts", "etc/localtime",
          "etc/passwd", "etc/group", "etc/nsswitch.conf", "etc/matplotlibrc")


def bwrap_command(bwrap: str, workdir: Path, mpl_cache: Path | None = None,
                  privileged: bool = False) -> list[str]:
    """bubblewrap's arguments for a chapter's sandbox (the command to run follows).

    ``privileged`` (the grader runs as root): bubblewrap makes the sandbox as root, without a
    user namespace, and keeps two capabilities, CAP_SETUID and CAP_SETGID, with which the
    worker's first act is to become ``nobody`` (:func:`become`): from then on the kernel
    counts its processes (RLIMIT_NPROC ignores root) and it owns no file of the machine."""
    cmd = [bwrap, "--die-with-parent", "--new-session", "--hostname", "grader"]
    if privileged:
        cmd += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
                "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-all", "--cap-drop", "ALL"]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    made: set[Path] = {Path("/"), Path("/tmp")}

    def bind(path: Path) -> None:
        for parent in reversed(path.parents):  # bubblewrap would make them 0700
            if parent not in made:
                made.add(parent)
                cmd.extend(["--perms", "0755", "--dir", str(parent)])
        cmd.extend(["--ro-bind", str(path), str(path)])

    for name in SYSTEM:
        path = Path("/") / name
        if path.is_symlink():
            cmd += ["--symlink", os.readlink(path), str(path)]
        elif path.exists():
            bind(path)
    for path in [*_python_paths(), *_repo_paths()]:
        if path.exists() and not any(path.is_relative_to(Path("/") / d) for d in SYSTEM):
            bind(path)
    for path in HIDDEN:  # an empty, read-only folder in their place
        if (ROOT / path).is_dir():
            cmd += ["--tmpfs", str(ROOT / path), "--remount-ro", str(ROOT / path)]
    if mpl_cache is not None and mpl_cache.is_dir():  # matplotlib's font list, read once
        cmd += ["--ro-bind", str(mpl_cache), inside("matplotlib")]
    for dev in sorted(Path("/dev").glob("nvidia*")):  # a GPU, for the GPU chapter
        cmd += ["--dev-bind", str(dev), str(dev)]
    cmd += ["--chdir", str(workdir)]
    return cmd


def become(uid: int | None, gid: int | None) -> None:
    """Drop to ``uid``/``gid`` (no supplementary group): the first thing the worker does in
    a sandbox that bubblewrap made as root; no capability survives it."""
    if uid is None:
        return
    os.setgroups([])
    os.setgid(gid if gid is not None else uid)
    os.setuid(uid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def matplotlib_cache() -> Path | None:
    """The grader's matplotlib cache folder (its font list), if it has one: bound read-only
    into the sandbox so that each chapter does not rebuild it."""
    candidates = [os.environ.get("MPLCONFIGDIR"), Path.home() / ".cache" / "matplotlib",
                  Path.home() / ".matplotlib"]
    for candidate in candidates:
        if candidate and any(Path(candidate).glob("fontlist-*.json")):
            return Path(candidate)
    return None


# ---------------------------------------------------------------------------------------------
# What the platform offers
# ---------------------------------------------------------------------------------------------

_PROBE = """
import sys
from grading import sandbox as s  # found through PYTHONPATH (sandbox_env)
s.become(*s.user_from_env())
pid = s.os.fork()
if pid == 0:
    try:
        s.enter_task_namespaces(8 * 2**20)
        s.os._exit(0 if s.os.getpid() == 2 else 3)
    except BaseException as err:
        print(err, file=sys.stderr)
        s.os._exit(4)
_, status = s.os.waitpid(pid, 0)
print(s.os.waitstatus_to_exitcode(status))
"""


@functools.cache
def probe() -> Confinement:
    """The best confinement this machine allows (see the module docstring), tried for real."""
    reasons = []
    if not sys.platform.startswith("linux"):
        return Confinement("rlimits", reasons=[f"{sys.platform} has no bubblewrap; "
                                               "use Linux, or a Linux container"])
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Confinement("rlimits", cgroups=cgroups_allowed(),
                           reasons=["bubblewrap is not installed (Debian/Ubuntu: "
                                    "apt-get install bubblewrap)"])
    user = group = NOBODY if os.geteuid() == 0 else None
    conf = Confinement("bwrap", bwrap=bwrap, user=user, group=group, reasons=reasons)
    try:
        out = run_sandboxed(conf, [sys.executable, "-c", _PROBE],
                            capture=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return Confinement("rlimits", cgroups=cgroups_allowed(),
                           reasons=[f"bubblewrap does not run here: {err}"])
    if out.returncode != 0:
        detail = (out.stderr or "").strip().splitlines()[-1:] or ["no message"]
        return Confinement("rlimits", cgroups=cgroups_allowed(),
                           reasons=[f"bubblewrap does not run here (exit "
                                    f"{out.returncode}: {detail[0]})"])
    if out.stdout.strip().splitlines()[-1:] == ["0"]:
        conf.level = "namespaces"
    else:
        conf.reasons.append("user namespaces cannot be nested inside bubblewrap here, so the "
                            "exercises of a chapter share its sandbox")
    conf.cgroups = cgroups_allowed()
    return conf


def reap_children() -> None:
    """Collect every child that has ended (no zombie left), without waiting for the others."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def run_sandboxed(conf: Confinement, command: list[str], *, capture: bool = False,
                  timeout: float | None = None, workdir: Path = Path("/tmp"),
                  extra_env: dict[str, str] | None = None, **popen: object
                  ) -> subprocess.CompletedProcess | subprocess.Popen:
    """Run ``command`` in the chapter sandbox of ``conf`` (``capture``: wait for it and
    return its CompletedProcess; else the Popen).  The command must call :func:`become`
    with ``conf.user`` first (the environment names it: FLASHLIB_GRADE_USER)."""
    env = sandbox_env(extra_env)
    if conf.bwrap is not None:
        command = [*bwrap_command(conf.bwrap, workdir, matplotlib_cache(),
                                  privileged=conf.user is not None), *command]
    if conf.user is not None:
        env["FLASHLIB_GRADE_USER"] = f"{conf.user}:{conf.group}"
    kwargs: dict = {"env": env, "stdin": subprocess.DEVNULL}
    if capture:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              **kwargs, **popen)
    return subprocess.Popen(command, **kwargs, **popen)


def user_from_env() -> tuple[int | None, int | None]:
    """The uid and gid :func:`run_sandboxed` asks the worker to become (None: stay)."""
    value = os.environ.get("FLASHLIB_GRADE_USER", "")
    if not value:
        return None, None
    uid, _, gid = value.partition(":")
    return int(uid), int(gid or uid)


# ---------------------------------------------------------------------------------------------
# Inside the sandbox: a student's exercise enters its own namespaces, limits, no capability
# ---------------------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
MS_BIND = 4096
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
PR_SET_CHILD_SUBREAPER = 36
PR_CAPBSET_DROP = 24


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, value: int) -> None:
    _check(_libc().prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(_libc().mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                         ctypes.c_ulong(flags), data.encode() if data else None),
           f"mount {target}")


def drop_capabilities() -> None:
    """No capability left, in the permitted, effective and inheritable sets, nor in the
    bounding set (so no executable can gain one)."""
    for cap in range(64):
        if _libc().prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    _check(_libc().capset(header, data), "capset")
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def enter_task_namespaces(disk: int, close: tuple[int, ...] = ()) -> None:
    """Called by the forked child of the zygote: new user, mount, PID, network, IPC and UTS
    namespaces.  This process (the *forker*) forks the namespace's init (PID 1) and waits
    for it, then ends as the exercise's process ended; it returns only in the init's child,
    the exercise's process (PID 2).  The init mounts a private ``/tmp`` (``disk`` bytes; a
    fresh ``/dev/shm`` too) and ``/proc``, forks the exercise's process, reaps every process
    of the namespace until that one exits, and exits: the kernel then kills whatever is left
    in the namespace.  The exercise's process holds no capability and dies with its init.
    ``close``: descriptors only the exercise's process keeps (its socket to the judge)."""
    uid, gid = os.getuid(), os.getgid()
    prctl(PR_SET_DUMPABLE, 1)  # a process that changed its uid may not write its uid_map
    _check(_libc().unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET
                           | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    report, told = os.pipe()  # the init tells the forker how the exercise's process ended
    init = os.fork()
    if init:  # the forker, outside the namespace
        os.close(told)
        for fd in close:
            os.close(fd)
        status = _wait(init)
        data = os.read(report, 32)
        _exit_as(int(data) if data.strip().isdigit() else status)
    os.close(report)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    # What the exercise's process must read and that lives under /tmp (a repository or a
    # virtual environment cloned there, as CI may): held open across the private /tmp's
    # mount, then bound again at its place inside it (read-only, as bubblewrap bound it).
    held = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY if path.is_dir() else os.O_PATH))
            for path in [*_python_paths(), *_repo_paths()]
            if path.is_relative_to(INSIDE) and path.exists()]
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={disk},nr_inodes=4096,mode=0755")
    for path, fd in held:
        path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            path.mkdir(exist_ok=True)
        else:
            path.touch()
        mount(f"/proc/self/fd/{fd}", str(path), None, MS_BIND | MS_REC, None)
        os.close(fd)
    if os.path.isdir("/dev/shm"):
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=1m,mode=1777")
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    except PermissionError:  # bubblewrap made as root covers parts of its /proc, and then
        pass  # a new one may not be mounted: this one lists the sandbox's processes, which
        # the exercise's cannot address (their numbers are not of its PID namespace)
    worker = os.fork()
    if worker:  # the init: reap everything until the exercise's process ends
        for fd in close:
            os.close(fd)
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                os._exit(70)
            except InterruptedError:
                continue
            if pid == worker:
                os.write(told, str(status).encode())
                os._exit(0)
    os.close(told)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    drop_capabilities()


def _wait(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue


def _exit_as(status: int) -> None:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # pragma: no cover - the signal did not end this process
    os._exit(os.WEXITSTATUS(status))


def virtual_memory() -> int:
    """This process's address space in bytes (Linux: /proc; elsewhere the max RSS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def set_limits(limits: dict[str, int], count_processes: bool = True) -> None:
    """The exercise's resource limits (:data:`LIMITS`), on this process and what it starts.
    ``count_processes``: also RLIMIT_NPROC (which counts the user's processes, so only
    where the sandbox has a user of its own)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
    wanted = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, limits["file_size"]),
              (resource.RLIMIT_NOFILE, limits["open_files"])]
    if hasattr(resource, "RLIMIT_AS"):
        wanted.append((resource.RLIMIT_AS, virtual_memory() + limits["memory"]))
    if count_processes and hasattr(resource, "RLIMIT_NPROC"):
        wanted.append((resource.RLIMIT_NPROC, limits["processes"]))
    for which, value in wanted:
        try:
            soft, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):  # pragma: no cover - the platform refuses one
            pass


#: CPU seconds between the soft limit of :func:`limit_cpu` (SIGXCPU, which ends the process)
#: and the hard one (SIGKILL), for code that catches SIGXCPU.
CPU_GRACE = 2


def cpu_seconds() -> float:
    """CPU time this process has used, all its threads together (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def limit_cpu(seconds: float, *, final: bool = False) -> None:
    """Let this process use ``seconds`` more CPU time (all its threads together; to the
    nearest whole second of its total), then end it:
    RLIMIT_CPU, whose soft limit sends SIGXCPU (which ends a process that does not catch it)
    and whose hard limit, :data:`CPU_GRACE` seconds later, SIGKILL.  ``final``: lower the hard
    limit too, so that the process cannot raise the soft one again; later calls may only
    lower it.  A time limit in CPU time is the same on a quiet machine and on a busy one,
    where a wall-clock limit fails right but slower code.  A process it starts gets the same
    limit on its own CPU time.  Where the platform has no RLIMIT_CPU: nothing (the judge's
    wall-clock limit still holds)."""
    if not hasattr(resource, "RLIMIT_CPU"):  # pragma: no cover - not POSIX
        return
    # whole seconds (RLIMIT_CPU's unit), the nearest: rounding up would give every loop of a
    # class up to a second more than the limit it was told
    soft = max(1, round(cpu_seconds() + max(0.0, seconds)))
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if final:
            hard = soft + CPU_GRACE if hard == resource.RLIM_INFINITY else min(
                hard, soft + CPU_GRACE)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):  # pragma: no cover - the platform refuses it
        pass


def ended_by_cpu_limit(status: int | None) -> bool:
    """Whether a wait status is that of a process ended by :func:`limit_cpu`'s soft limit."""
    return (status is not None and os.WIFSIGNALED(status)
            and os.WTERMSIG(status) == signal.SIGXCPU)


def sweep_processes() -> int:
    """Kill every other process of this PID namespace but its init (``kill(-1)``), until none
    is left; how many there were.  Only inside the sandbox's own PID namespace."""
    me, found = os.getpid(), 0
    for _ in range(50):
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        others = [p for p in others if _state(p) not in ("Z", None)]
        if not others:
            break
        found = max(found, len(others))
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reap_children()
    return found


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """``pid``'s descendants, from /proc (empty where there is no /proc)."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found


def kill_descendants() -> int:
    """Kill every descendant of this process (a subreaper: orphans of its descendants are
    its children), until none is left; how many there were at most."""
    found = 0
    for _ in range(50):
        alive = [p for p in descendants(os.getpid()) if _state(p) not in ("Z", None)]
        found = max(found, len(alive))
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        reap_children()
        if not alive:
            break
    return found


# ---------------------------------------------------------------------------------------------
# cgroups, where this process may make them: one per chapter sandbox, bounding it as a whole
# ---------------------------------------------------------------------------------------------

#: Bounds of one chapter's sandbox as a whole (the chapter's process and the exercise it runs,
#: with everything that exercise starts), where cgroups can be made.
CGROUP_LIMITS = {"memory": 6 * 2**30, "processes": 512}
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroups() -> dict[str, str]:
    """``{controller or "": path}`` of this process (/proc/self/cgroup)."""
    found = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                found[controller] = path
    except (OSError, ValueError):
        pass
    return found


class Cgroup:
    """A cgroup (v2, or v1's memory and pids hierarchies) holding one chapter's sandbox, with
    :data:`CGROUP_LIMITS`; ``kill`` ends every process in it, ``remove`` deletes it."""

    def __init__(self, folders: dict[str, Path]):
        self.folders = folders  # {"v2": path} or {"memory": path, "pids": path}
        self._before_reset = 0  # the highest peak :meth:`reset_peak` started again from
        self._peak_file: Any = None  # cgroup v2's memory.peak, held open once reset

    @classmethod
    def make(cls, name: str, limits: dict[str, int] | None = None) -> Cgroup | None:
        """A new cgroup named ``name`` under this process's, or None where that is not
        allowed (not root and nothing delegated, read-only cgroupfs, no controllers);
        ``limits``: its memory in bytes and processes (default :data:`CGROUP_LIMITS`)."""
        limits = dict(CGROUP_LIMITS, **(limits or {}))
        own = _own_cgroups()
        folders: dict[str, Path] = {}
        try:
            if (CGROUP_ROOT / "cgroup.controllers").is_file():  # the unified hierarchy
                parent = CGROUP_ROOT / own.get("", "/").lstrip("/")
                enabled = (parent / "cgroup.subtree_control").read_text().split()
                if not {"memory", "pids"} <= set(enabled):
                    return None
                folders["v2"] = parent / name
                folders["v2"].mkdir()
                (folders["v2"] / "memory.max").write_text(str(limits["memory"]))
                (folders["v2"] / "pids.max").write_text(str(limits["processes"]))
                with contextlib.suppress(OSError):  # no swap beyond the cap
                    (folders["v2"] / "memory.swap.max").write_text("0")
                return cls(folders)
            for controller, limit_file, value in (
                    ("memory", "memory.limit_in_bytes", limits["memory"]),
                    ("pids", "pids.max", limits["processes"])):
                parent = CGROUP_ROOT / controller / own.get(controller, "/").lstrip("/")
                if not parent.is_dir():
                    raise OSError(f"no cgroup v1 {controller} hierarchy")
                folders[controller] = parent / name
                folders[controller].mkdir()
                (folders[controller] / limit_file).write_text(str(value))
            return cls(folders)
        except OSError:
            cls(folders).remove()
            return None

    @classmethod
    def home(cls) -> Cgroup:
        """This process's own cgroups (to move a process back into)."""
        own = _own_cgroups()
        if (CGROUP_ROOT / "cgroup.controllers").is_file():
            return cls({"v2": CGROUP_ROOT / own.get("", "/").lstrip("/")})
        return cls({c: CGROUP_ROOT / c / own.get(c, "/").lstrip("/") for c in ("memory", "pids")})

    def move(self, pids: list[int]) -> None:
        """Put exactly these processes in the cgroup (not their descendants)."""
        for folder in self.folders.values():
            for pid in pids:
                with contextlib.suppress(OSError):
                    (folder / "cgroup.procs").write_text(str(pid))

    @property
    def version(self) -> str:
        return "cgroup v2" if "v2" in self.folders else "cgroup v1"

    def _memory_file(self, v2: str, v1: str) -> Path:
        return self.folders["v2"] / v2 if "v2" in self.folders else self.folders["memory"] / v1

    def usage(self) -> int | None:
        """Bytes charged to the cgroup now (memory.current, memory.usage_in_bytes)."""
        try:
            return int(self._memory_file("memory.current", "memory.usage_in_bytes")
                       .read_text().split()[0])
        except (OSError, ValueError, IndexError, KeyError):
            return None

    def peak(self) -> int | None:
        """The most bytes charged to the cgroup since it was made or :meth:`reset_peak`
        (memory.peak, memory.max_usage_in_bytes); None where the kernel has no such file."""
        try:
            if self._peak_file is not None:
                self._peak_file.seek(0)
                return int(self._peak_file.read().split()[0])
            return int(self._memory_file("memory.peak", "memory.max_usage_in_bytes")
                       .read_text().split()[0])
        except (OSError, ValueError, IndexError, KeyError):
            return None

    def whole_peak(self) -> int | None:
        """The most bytes charged since the cgroup was made, across :meth:`reset_peak`."""
        peak = self.peak()
        return None if peak is None else max(peak, self._before_reset)

    def reset_peak(self) -> bool:
        """Start the peak again from the usage now: cgroup v1 takes a write of 0 to
        memory.max_usage_in_bytes; v2 (Linux 6.12 and later) a write to memory.peak, for
        reads through the same open file.  False where the kernel cannot.
        :meth:`whole_peak` keeps what came before."""
        self._before_reset = max(self._before_reset, self.peak() or 0)
        try:
            if "v2" in self.folders:
                if self._peak_file is None:
                    self._peak_file = open(self.folders["v2"] / "memory.peak", "r+")  # noqa: SIM115
                self._peak_file.seek(0)
                self._peak_file.write("reset\n")
                self._peak_file.flush()
                return True
            (self.folders["memory"] / "memory.max_usage_in_bytes").write_text("0")
            return True
        except (OSError, KeyError):
            if self._peak_file is not None:
                with contextlib.suppress(OSError):
                    self._peak_file.close()
                self._peak_file = None
            return False

    def limit_hit(self) -> bool:
        """Whether the cgroup's memory cap was reached (an allocation refused or a process
        killed by the kernel's out-of-memory killer)."""
        try:
            if "v2" in self.folders:
                events = dict(line.split() for line in (
                    self.folders["v2"] / "memory.events").read_text().splitlines())
                return int(events.get("max", 0)) > 0 or int(events.get("oom_kill", 0)) > 0
            return int((self.folders["memory"] / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError, KeyError):
            return False

    def add(self, pid: int) -> None:
        """Put ``pid`` and its descendants (a sandbox just started) in the cgroup."""
        for folder in self.folders.values():
            for member in (pid, *descendants(pid)):
                try:
                    (folder / "cgroup.procs").write_text(str(member))
                except OSError:
                    pass

    def pids(self) -> list[int]:
        found: set[int] = set()
        for folder in self.folders.values():
            try:
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
        return sorted(found)

    def kill(self) -> None:
        """End every process in the cgroup (``cgroup.kill`` where the kernel has it)."""
        for folder in self.folders.values():
            kill_file = folder / "cgroup.kill"
            if kill_file.exists():
                try:
                    kill_file.write_text("1")
                except OSError:
                    pass
        for _ in range(50):
            alive = self.pids()
            if not alive:
                return
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            import time

            time.sleep(0.02)

    def remove(self) -> None:
        if self._peak_file is not None:
            with contextlib.suppress(OSError):
                self._peak_file.close()
            self._peak_file = None
        for folder in self.folders.values():
            try:
                folder.rmdir()
            except OSError:
                pass


@functools.cache
def cgroups_allowed() -> bool:
    """Whether this process may make the cgroups :class:`Cgroup` needs (tried for real)."""
    cgroup = Cgroup.make(f"flashlib-grade-probe-{os.getpid()}")
    if cgroup is None:
        return False
    cgroup.remove()
    return True


@functools.cache
def task_cgroups() -> str | None:
    """Whether each exercise can have a cgroup of its own that holds its processes and
    measures them: tried for real (a child put in a new cgroup touches 16 MiB; the cgroup's
    peak must show it, usage > 0).  ``"cgroup v1"`` or ``"cgroup v2"``, else None."""
    cgroup = Cgroup.make(f"flashlib-grade-probe-task-{os.getpid()}",
                         {"memory": 256 * 2**20, "processes": 16})
    if cgroup is None:
        return None
    try:
        pid = os.fork()
        if pid == 0:  # the child: into the cgroup, then 16 MiB touched
            code = 1
            try:
                cgroup.move([os.getpid()])
                block = bytearray(16 * 2**20)
                block[::4096] = b"x" * len(block[::4096])
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        peak = cgroup.peak()
        ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and (peak or 0) >= 8 * 2**20
        return cgroup.version if ok else None
    finally:
        cgroup.kill()
        cgroup.remove()
