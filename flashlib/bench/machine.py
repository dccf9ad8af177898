"""The machine a benchmark runs on: CPU, BLAS, threads, library versions, the matmul peak.

threadpoolctl (the ``bench`` extra) is imported by the functions that need it, torch only when
it is already imported: flashlib's numerics never need either.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from flashlib.core.checks import check_int
from flashlib.core.measure import median_times

__all__ = [
    "CPU_FLAGS",
    "SGEMM_SIZES",
    "LIBRARIES",
    "set_threads",
    "thread_count",
    "torch_available",
    "sgemm_peak",
    "sgemm_peaks",
    "own_library",
    "cpu_details",
    "flashlib_source",
    "machine_info",
]

#: CPU flags worth recording: the vector and matrix extensions BLAS and numpy's loops use.
CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "neon", "asimd", "sve")
#: Square sizes whose best single-thread float32 matmul rate is the peak (:func:`sgemm_peak`).
SGEMM_SIZES = (256, 512, 1024, 2048)

_threadpool_limiter = None  # keeps threadpoolctl's limit alive
_threads: int | None = None  # set by set_threads


def set_threads(n: int = 1) -> bool:
    """Pin BLAS (threadpoolctl) and torch (now if it is imported, else when
    :func:`flashlib.bench.suites.torch_calls` imports it) to ``n`` threads.

    Returns whether BLAS is pinned: False when threadpoolctl (the ``bench`` extra) is not
    installed, in which case only torch is pinned; a chapter then says that its times are not
    one-thread times.
    """
    global _threadpool_limiter, _threads
    _threads = check_int(n, "threads", minimum=1)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(_threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    _threadpool_limiter = threadpool_limits(_threads)
    return True


def thread_count() -> int | None:
    """The thread count set by :func:`set_threads` (None before it was called)."""
    return _threads


def torch_available() -> bool:
    """Whether torch is installed (without importing it)."""
    return importlib.util.find_spec("torch") is not None


#: The matrix libraries whose peaks the benchmark measures: numpy's BLAS (flashlib's and the
#: numpy baselines' library) and torch's (MKL or OpenBLAS, as torch was built).
LIBRARIES = ("numpy", "torch")


def own_library(impl: str) -> str:
    """The matrix library an implementation of the benchmark runs on: ``"torch"`` for the
    PyTorch baselines (names starting with ``torch``), else ``"numpy"`` (flashlib and the
    numpy baselines, on numpy's BLAS)."""
    return "torch" if impl.startswith("torch") else "numpy"


def _square_matmuls(library: str, sizes: Sequence[int]) -> dict[int, Any]:
    """One n x n float32 product per size, as a zero-argument call on ``library``."""
    rng = np.random.default_rng(0)
    calls: dict[int, Any] = {}
    for n in sizes:
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        c = np.empty_like(a)
        if library == "numpy":
            calls[n] = lambda a=a, b=b, c=c: np.matmul(a, b, out=c)
        elif library == "torch":
            import torch

            ta, tb, tc = (torch.from_numpy(x) for x in (a, b, c))
            calls[n] = lambda ta=ta, tb=tb, tc=tc: torch.mm(ta, tb, out=tc)
        else:
            raise ValueError(f"library must be one of {LIBRARIES}, got {library!r}")
    return calls


def sgemm_peaks(
    libraries: Sequence[str] = ("numpy",), sizes: Sequence[int] = SGEMM_SIZES,
    repeats: int = 5, *, clock: str = "cpu",
) -> dict[str, float]:
    """Each library's float32 matmul peak in FLOP/s, on the threads set now: the best, over
    square sizes n, of the median rate of ``repeats`` n x n products (small products run from
    cache, large ones amortise the packing; the fastest of them is the peak a tile can hope
    for).  The libraries take turns at each size (round-robin), so that a change of load hits
    them alike: the benchmark measures its peaks once per run, with this."""
    calls = {lib: _square_matmuls(lib, sizes) for lib in libraries}
    best = dict.fromkeys(libraries, 0.0)
    for n in sizes:
        reps = max(repeats, int(4e9 // (2 * n**3)))  # at least ~0.05 s per size
        med = median_times({lib: calls[lib][n] for lib in libraries}, reps, clock=clock)
        for lib in libraries:
            best[lib] = max(best[lib], 2.0 * n**3 / med[lib])
    return best


def sgemm_peak(
    sizes: Sequence[int] = SGEMM_SIZES, repeats: int = 5, *, clock: str = "cpu"
) -> float:
    """This machine's float32 matmul peak on numpy's BLAS, FLOP/s (:func:`sgemm_peaks`)."""
    return sgemm_peaks(("numpy",), sizes, repeats, clock=clock)["numpy"]


def _lscpu() -> dict[str, str]:
    """``lscpu``'s "key: value" lines (empty where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                             env=dict(os.environ, LC_ALL="C")).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_details() -> dict[str, Any]:
    """CPU model, vendor, family/model/stepping, cache sizes and the relevant flags."""
    lscpu, cpuinfo = _lscpu(), _cpuinfo()
    flags = set((lscpu.get("Flags") or cpuinfo.get("flags") or cpuinfo.get("Features")
                 or "").split())
    details: dict[str, Any] = {
        "cpu_model": (lscpu.get("Model name") or cpuinfo.get("model name")
                      or platform.processor() or platform.machine()),
        "vendor": lscpu.get("Vendor ID") or cpuinfo.get("vendor_id"),
        "family": lscpu.get("CPU family") or cpuinfo.get("cpu family"),
        "model": lscpu.get("Model") or cpuinfo.get("model"),
        "stepping": lscpu.get("Stepping") or cpuinfo.get("stepping"),
        "architecture": platform.machine(),
        "hypervisor": lscpu.get("Hypervisor vendor"),
        "caches": {key: value for key, value in lscpu.items() if key.endswith(" cache")},
        "flags": {flag: flag in flags for flag in CPU_FLAGS} if flags else None,
    }
    return {key: value for key, value in details.items() if value not in (None, "", {})}


def _dist_version(name: str) -> str | None:
    """Installed version of a distribution, without importing it (None if absent)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def flashlib_source() -> dict[str, Any]:
    """flashlib's version and, when it runs from a git checkout, the commit (and whether the
    working tree has changes)."""
    import flashlib

    info: dict[str, Any] = {"version": getattr(flashlib, "__version__", None)}
    here = os.path.dirname(os.path.abspath(flashlib.__file__))
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        if commit.returncode == 0:
            info["git_commit"] = commit.stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True, timeout=30)
            if dirty.returncode == 0:
                info["git_dirty"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def machine_info(threads: int, clock: str) -> dict[str, Any]:
    """The CPU (:func:`cpu_details`), core count, BLAS (threadpoolctl: library, version,
    kernel), flashlib's version and commit, library versions, threads and clock."""
    from threadpoolctl import threadpool_info

    info: dict[str, Any] = {
        **cpu_details(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "flashlib": flashlib_source(),
        "numpy": np.__version__,
        "threadpoolctl": _dist_version("threadpoolctl"),
        "matplotlib": _dist_version("matplotlib"),
        "threads": threads,
        "clock": clock,
        "blas": [
            {key: pool.get(key) for key in ("internal_api", "version", "architecture",
                                              "num_threads", "threading_layer")}
            for pool in threadpool_info()
        ],
        "env": {
            key: os.environ[key]
            for key in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS",
                        "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
            if key in os.environ
        },
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return info
