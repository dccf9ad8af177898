"""CPU benchmark: naive attention, FlashAttention (v1 and v2 loop orders), PyTorch SDPA.

    python -m flashlib.bench cpu                        # n = 1024 4096, 8 heads, d = 64
    python -m flashlib.bench cpu --n 4096 16384 --causal --repeats 5
    python -m flashlib.bench cpu --n 64 --heads 1 --repeats 1 --blocks 16x16   # tiny (CI)
    python -m flashlib.bench ladder --n 4096            # the rungs of flashlib.ladder
    python -m flashlib.bench widgets                    # live redraw time of every widget
    python -m flashlib.bench widgets book/overflow.md   # ... of one chapter's widgets

Every implementation runs on the same inputs, one thread (BLAS via threadpoolctl, torch via
``torch.set_num_threads``), round-robin (one call of each per repeat, so drift hits all alike);
the table shows medians and ratios from one run.  The default clock is the process CPU time,
which on a shared machine leaves out the time other processes hold the core; ``--clock wall``
uses ``time.perf_counter``.  With ``--threads`` above 1 the wall clock is forced (the process
CPU time adds up the time of every thread).  PyTorch's SDPA is pinned to its FlashAttention
backend (``torch.nn.attention.sdpa_kernel``) when that backend runs here, else left to choose,
and the JSON says which.  A JSON file records the machine (CPU model, family, flags, caches,
BLAS and its kernel, threads, library versions, flashlib's git commit), the single-thread sgemm
peak, every time and the ratios.

``widgets`` times the live redraw of every widget of the chapters given or of those of
``./_toc.yml`` (the repository root); ``cpu`` and ``ladder`` do the same only with ``--redraw``
(it executes whole chapters).  Without a ``_toc.yml`` the widgets are skipped: flashlib does not
need the book.

torch is imported only here and only when asked for: flashlib's numerics never need it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from flashlib.flash import BLOCK_K, BLOCK_Q, flash_attention
from flashlib.flash_v1 import flash_attention_v1
from flashlib.ladder import RUNGS, naive_inplace
from flashlib.masks import causal_tiles
from flashlib.naive import naive_attention

__all__ = [
    "attention_flops",
    "sgemm_peak",
    "set_threads",
    "time_calls",
    "median_times",
    "cpu_details",
    "flashlib_source",
    "machine_info",
    "cpu_calls",
    "ladder_calls",
    "torch_available",
    "torch_calls",
    "tile_breakdown",
    "toc_chapters",
    "widget_redraw_times",
    "summarise",
    "run",
    "report",
    "main",
]

#: The naive baselines run on all heads at once while the (heads, n, n) float32 matrix stays
#: below this many bytes, head by head beyond it (n = 16384 would need 8 GiB for 8 heads).
NAIVE_BATCH_BYTES = 1 << 30

#: Square sizes whose best single-thread float32 matmul rate is the peak (:func:`sgemm_peak`).
SGEMM_SIZES = (256, 512, 1024, 2048)
#: Sequence lengths timed by ``python -m flashlib.bench cpu`` when ``--n`` is not given.
DEFAULT_NS = (1024, 4096)
#: Tile sizes (B_r, B_c) of flash_attention timed by ``python -m flashlib.bench cpu`` when
#: ``--blocks`` is not given: the sweep cited where flashlib.flash chooses BLOCK_Q x BLOCK_K.
#: The default tile among them is the row "flash", not timed twice.
DEFAULT_BLOCKS = ((64, 64), (64, 128), (128, 64), (128, 128), (256, 256))

_CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
_threadpool_limiter = None  # keeps threadpoolctl's limit alive
_threads = 1


def attention_flops(heads: int, n_q: int, n_k: int, d: int, causal: bool = False) -> float:
    """Matmul FLOPs of one attention forward: 4 heads n_q n_k d (Q K^T and P V, 2 each per
    multiply-add), halved for causal, the accounting of the Triton tutorial and flash-attn."""
    flops = 4.0 * heads * n_q * n_k * d
    return flops / 2 if causal else flops


def set_threads(threads: int = 1) -> None:
    """Pin BLAS (threadpoolctl) and, if it is already imported, torch to ``threads`` threads."""
    global _threadpool_limiter, _threads
    from threadpoolctl import threadpool_limits

    _threads = threads
    _threadpool_limiter = threadpool_limits(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


def time_calls(
    calls: Mapping[str, Callable[[], object]],
    repeats: int = 5,
    *,
    clock: str = "cpu",
    warmup: bool = True,
    progress: Any = None,
) -> dict[str, list[float]]:
    """Seconds per call of each zero-argument function, ``repeats`` times, round-robin.

    One call of every function per repeat, so slow drifts of the machine hit all of them alike.
    ``progress``: an object with ``update(1)`` (a tqdm bar) called after every call.
    """
    if clock not in _CLOCKS:
        raise ValueError(f"clock must be one of {sorted(_CLOCKS)}, got {clock!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    now = _CLOCKS[clock]
    if warmup:
        for fn in calls.values():
            fn()
            if progress is not None:
                progress.update(1)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = now()
            fn()
            times[name].append(now() - t0)
            if progress is not None:
                progress.update(1)
    return times


def _medians(times: Mapping[str, Sequence[float]]) -> dict[str, float]:
    return {name: float(statistics.median(ts)) for name, ts in times.items()}


def median_times(
    calls: Mapping[str, Callable[[], object]], repeats: int = 5, *, clock: str = "cpu"
) -> dict[str, float]:
    """Median seconds per call of each zero-argument function: :func:`time_calls` (a warm-up
    call each, then ``repeats`` round-robin calls), reduced to the median."""
    return _medians(time_calls(calls, repeats, clock=clock))


def sgemm_peak(
    sizes: Sequence[int] = SGEMM_SIZES, repeats: int = 5, *, clock: str = "cpu"
) -> float:
    """This machine's float32 matmul peak in FLOP/s: the best, over square sizes n, of the
    median rate of ``repeats`` n x n products (small products run from cache, large ones
    amortise the packing; the fastest of them is the peak a tile can hope for)."""
    rng = np.random.default_rng(0)
    best = 0.0
    for n in sizes:
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        c = np.empty_like(a)
        reps = max(repeats, int(4e9 // (2 * n**3)))  # at least ~0.05 s per size
        t = median_times({"sgemm": lambda a=a, b=b, c=c: np.matmul(a, b, out=c)}, reps,
                         clock=clock)["sgemm"]
        best = max(best, 2.0 * n**3 / t)
    return best


#: CPU flags worth recording: the vector and matrix extensions BLAS and numpy's loops use.
CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "neon", "asimd", "sve")


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
            for key in ("OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                        "MKL_NUM_THREADS")
            if key in os.environ
        },
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return info


def _per_head(fn: Callable[..., np.ndarray], q, k, v, **kw) -> np.ndarray:
    """Run ``fn`` on all heads at once, or head by head when the n x n matrices would not fit
    NAIVE_BATCH_BYTES."""
    heads, n_q, n_k = q.shape[0], q.shape[-2], k.shape[-2]
    if heads * n_q * n_k * 4 <= NAIVE_BATCH_BYTES:
        return fn(q, k, v, **kw)
    return np.stack([fn(q[h], k[h], v[h], **kw) for h in range(heads)])


def torch_available() -> bool:
    """Whether torch is installed (without importing it)."""
    return importlib.util.find_spec("torch") is not None


def torch_calls(q, k, v, causal: bool = False) -> dict[str, Callable[[], object]]:
    """PyTorch's fused SDPA and a naive torch attention on q, k, v: (heads, n, d) float32.

    Imports torch (lazily, only here) and pins it to the threads set by :func:`set_threads`.
    SDPA runs inside ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` when that backend accepts these
    inputs here (tried once), else with torch's own choice; ``calls["torch_sdpa"].backend``
    says which, with the reason for a fallback.
    """
    import torch

    if _threadpool_limiter is not None:
        torch.set_num_threads(_threads)

    tq, tk, tv = (torch.from_numpy(x)[None] for x in (q, k, v))  # (1, heads, n, d): 4-D
    sdpa = torch.nn.functional.scaled_dot_product_attention
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    n_q, n_k = q.shape[-2], k.shape[-2]

    def torch_naive():
        with torch.no_grad():
            for h in range(tq.shape[1]):  # head by head, like the numpy naive baselines
                s = (tq[:, h] * scale) @ tk[:, h].transpose(-1, -2)
                if causal:
                    s.masked_fill_(torch.ones(n_q, n_k, dtype=torch.bool).triu_(1), -torch.inf)
                torch.softmax(s, dim=-1) @ tv[:, h]

    pin: Callable[[], Any] = contextlib.nullcontext
    backend = "default (torch's choice)"
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def pin():
            return sdpa_kernel(SDPBackend.FLASH_ATTENTION)

        with torch.no_grad(), pin():  # one tiny call: does the backend run here?
            sdpa(tq[..., :1, :], tk[..., :1, :], tv[..., :1, :], is_causal=causal)
        backend = "FLASH_ATTENTION"
    except (ImportError, RuntimeError) as exc:
        pin = contextlib.nullcontext
        backend += f"; FLASH_ATTENTION unavailable: {str(exc).splitlines()[0][:200]}"

    def torch_sdpa():
        with torch.no_grad(), pin():
            sdpa(tq, tk, tv, is_causal=causal)

    torch_sdpa.backend = backend  # type: ignore[attr-defined]
    return {"torch_sdpa": torch_sdpa, "torch_naive": torch_naive}


def cpu_calls(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool,
    blocks: Sequence[tuple[int, int]],
    with_torch: bool = True,
) -> dict[str, Callable[[], object]]:
    """The benchmark's implementations as zero-argument calls on q, k, v: (heads, n, d)."""
    calls: dict[str, Callable[[], object]] = {
        "naive": lambda: _per_head(naive_attention, q, k, v, causal=causal),
        "naive_inplace": lambda: naive_inplace(q, k, v, causal=causal),
        "flash_v1": lambda: flash_attention_v1(q, k, v, causal=causal),
        "flash": lambda: flash_attention(q, k, v, causal=causal),
    }
    for b_r, b_c in blocks:
        if (b_r, b_c) != (BLOCK_Q, BLOCK_K):
            calls[f"flash_{b_r}x{b_c}"] = (
                lambda b_r=b_r, b_c=b_c: flash_attention(
                    q, k, v, block_q=b_r, block_k=b_c, causal=causal
                )
            )
    if with_torch:
        calls.update(torch_calls(q, k, v, causal))
    return calls


def ladder_calls(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False
) -> dict[str, Callable[[], object]]:
    """naive_inplace and every rung of :mod:`flashlib.ladder` at its default blocks."""
    calls: dict[str, Callable[[], object]] = {
        "naive_inplace": lambda: naive_inplace(q, k, v, causal=causal)
    }
    for label, fn in RUNGS:
        calls[label] = lambda fn=fn: fn(q, k, v, causal=causal)
    return calls


def tile_breakdown(
    heads: int, n: int, d: int, block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
    repeats: int = 20, *, clock: str = "cpu",
) -> dict[str, float]:
    """Where a non-causal flash_attention's time should go, measured on one tile and scaled by
    the number of tiles (n / B_r) x (n / B_c): the two matmuls at the tile's shapes
    ((B_r, d + 1) @ (d + 1, B_c) and (B_r, B_c) @ (B_c, d)), and the non-matmul work on the
    (heads, B_r, B_c) tile (exp2 and the row sum s @ 1).  Seconds, medians of ``repeats``."""
    rng = np.random.default_rng(0)
    b_r, b_c = min(block_q, n), min(block_k, n)
    q_aug = rng.standard_normal((heads, b_r, d + 1), dtype=np.float32)
    k_aug = rng.standard_normal((heads, d + 1, b_c), dtype=np.float32)
    v = rng.standard_normal((heads, b_c, d), dtype=np.float32)
    s = np.empty((heads, b_r, b_c), dtype=np.float32)
    pv = np.empty((heads, b_r, d), dtype=np.float32)
    scores = rng.uniform(-8.0, 0.0, s.shape).astype(np.float32)  # typical s - m_i

    ones = np.ones((b_c, 1), dtype=np.float32)

    def elementwise():
        np.exp2(scores, out=s)
        np.matmul(s, ones)  # the row sums, as flash_attention computes them

    med = median_times({
        "matmuls": lambda: (np.matmul(q_aug, k_aug, out=s), np.matmul(s, v, out=pv)),
        "exp2 + row sum": elementwise,
    }, repeats, clock=clock)
    tiles = causal_tiles(n, n, b_r, b_c, causal=False)[2]
    return {name: t * tiles for name, t in med.items()}


def summarise(
    times: Mapping[str, Sequence[float]], flops: float, peak: float | None
) -> list[dict[str, Any]]:
    """One row per implementation: median and min seconds, GFLOP/s, fraction of the sgemm
    peak, and ratios to naive_inplace and torch_sdpa (when they were timed)."""
    med = _medians(times)
    rows = []
    for name, ts in times.items():
        row: dict[str, Any] = {
            "impl": name,
            "median_s": med[name],
            "min_s": min(ts),
            "times_s": list(ts),
            "gflops": flops / med[name] / 1e9,
        }
        if peak:
            row["peak_fraction"] = flops / med[name] / peak
        for base in ("naive_inplace", "torch_sdpa"):
            if base in med:
                row[f"vs_{base}"] = med[name] / med[base]
        rows.append(row)
    return rows


def _parse_blocks(text: str) -> list[tuple[int, int]]:
    blocks = []
    for item in text.split(","):
        if item.strip():
            b_r, _, b_c = item.strip().partition("x")
            blocks.append((int(b_r), int(b_c or b_r)))
    return blocks


def _format_table(title: str, rows: list[dict[str, Any]]) -> str:
    head = f"{'implementation':<24}{'median s':>10}{'GFLOP/s':>9}{'% peak':>8}"
    head += f"{'/naive_inpl':>12}{'/sdpa':>8}"
    lines = [title, head, "-" * len(head)]
    for r in rows:
        pct = f"{100 * r['peak_fraction']:7.1f}%" if "peak_fraction" in r else f"{'':>8}"
        ratios = "".join(
            f"{r[key]:{w}.2f}" if key in r else " " * w
            for key, w in (("vs_naive_inplace", 12), ("vs_torch_sdpa", 8))
        )
        lines.append(f"{r['impl']:<24}{r['median_s']:>10.4f}{r['gflops']:>9.1f}{pct}{ratios}")
    return "\n".join(lines)


def _toc_files(node: object) -> list[str]:
    """The ``root`` and ``file`` entries of a parsed table of contents, in order, at any depth
    (``chapters``, ``parts``, ``sections``)."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("root", "file") and isinstance(value, str):
                found.append(value)
            else:
                found.extend(_toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_toc_files(item))
    return found


def toc_chapters(toc: str = "_toc.yml") -> list[str]:
    """The chapter files (root and ``file:`` entries, at any depth) of a Jupyter Book table of
    contents, as paths relative to the current directory; empty when ``toc`` does not exist."""
    if not os.path.isfile(toc):
        return []
    import yaml  # installed with jupyter-book; only the widgets' timing needs it

    base = os.path.dirname(toc)
    with open(toc, encoding="utf-8") as f:
        entries = _toc_files(yaml.safe_load(f))
    chapters = []
    for entry in entries:
        path = os.path.join(base, entry)
        for ext in ("", ".md", ".ipynb"):
            if os.path.isfile(path + ext) and (path + ext).endswith((".md", ".ipynb")):
                chapters.append(path + ext)
                break
    return chapters


_WIDGET_CALL = re.compile(r"^(?!\s*(?:from|import)\b).*\binteractive_figure\s*\(", re.M)


def widget_redraw_times(
    chapters: Sequence[str], *, repeat: int = 5, png_dir: str | None = None
) -> dict[str, Any]:
    """Live redraw time of every widget (``interactive_figure``) of the given chapters.

    Each chapter (a MyST Markdown or .ipynb notebook, read with jupytext) runs its code cells,
    ``remove-cell`` ones skipped, up to its last widget, in the chapter's directory, with
    ``flashlib.widgets.interactive_figure`` recording every (draw, sliders).  Per widget:
    ``redraw_s``, :func:`flashlib.widgets.redraw_time` at the largest settings (``repeat``
    redraws, the median), and a sweep of a fresh widget through every frame once in grid order
    (first visits, as when a reader moves a slider): ``sweep_median_s`` and ``sweep_max_s``
    over the frames after the first.  ``png_dir``: also write every frame there.  Returns
    ``{"widgets": [...]}``, plus ``"skipped"`` with the reason when nothing could be timed.
    """
    if not chapters:
        return {"widgets": [], "skipped": "no chapters (no _toc.yml here and none given)"}
    try:
        import jupytext
    except ImportError:
        return {"widgets": [], "skipped": "jupytext is not installed"}
    from flashlib import widgets

    found: list[tuple[str, Callable[..., Any], dict[str, Any], dict[str, Any]]] = []
    orig = widgets.interactive_figure
    current = ""

    def recording(draw, sliders, **kw):
        found.append((current, draw, sliders, kw))
        return orig(draw, sliders, **kw)

    static = os.environ.pop(widgets.STATIC_ENV, None)  # time the live redraw
    os.environ.setdefault("MPLBACKEND", "Agg")
    cwd = os.getcwd()
    widgets.interactive_figure = recording
    try:
        for current in chapters:
            nb = jupytext.read(current)
            cells = [c.source for c in nb.cells if c.cell_type == "code"
                     and "remove-cell" not in c.metadata.get("tags", [])]
            last = max((i for i, src in enumerate(cells) if _WIDGET_CALL.search(src)),
                       default=None)
            if last is None:
                continue  # a page without widgets
            namespace: dict[str, Any] = {"__name__": "__main__"}
            os.chdir(os.path.dirname(os.path.abspath(current)))
            try:  # glue() and friends print when there is no kernel: keep stdout clean
                with contextlib.redirect_stdout(io.StringIO()):
                    for src in cells[: last + 1]:
                        exec(compile(src, current, "exec"), namespace)  # noqa: S102
            finally:
                os.chdir(cwd)
    finally:
        widgets.interactive_figure = orig
        if static is not None:
            os.environ[widgets.STATIC_ENV] = static

    timed = []
    for chapter, draw, sliders, kw in found:
        t = widgets.redraw_time(draw, sliders, repeat=repeat)
        fig = orig(draw, sliders, **kw)
        sweep = []
        for values in fig.grid:
            t0 = time.perf_counter()
            png = fig.render(values)
            sweep.append(time.perf_counter() - t0)
            if png_dir:
                os.makedirs(png_dir, exist_ok=True)
                name = "-".join(f"{k}{v}" for k, v in values.items())
                stem = os.path.splitext(os.path.basename(chapter))[0]
                with open(os.path.join(png_dir, f"{stem}-{draw.__name__}-{name}.png"), "wb") as f:
                    f.write(png)
        rest = sweep[1:] or sweep
        timed.append({
            "chapter": chapter, "widget": draw.__name__, "frames": len(fig.grid),
            "redraw_s": t, "sweep_median_s": statistics.median(rest),
            "sweep_max_s": max(rest),
        })
    return {"widgets": timed}


def _format_widgets(redraw: Mapping[str, Any]) -> list[str]:
    if redraw.get("skipped"):
        return [f"widget redraw: skipped ({redraw['skipped']})"]
    lines = [f"\n{'chapter':<28}{'widget':<18}{'frames':>7}{'redraw ms':>11}"
             f"{'sweep median':>14}{'max ms':>8}"]
    for w in redraw.get("widgets", []):
        lines.append(f"{w['chapter']:<28}{w['widget']:<18}{w['frames']:>7}"
                     f"{1000 * w['redraw_s']:>11.1f}{1000 * w['sweep_median_s']:>14.1f}"
                     f"{1000 * w['sweep_max_s']:>8.1f}")
    if len(lines) == 1:
        lines.append("(no widgets found)")
    return lines


def run(
    suite: str = "cpu",
    *,
    ns: Sequence[int] = DEFAULT_NS,
    heads: int = 8,
    d: int = 64,
    repeats: int = 5,
    causal_modes: Sequence[bool] = (False,),
    blocks: Sequence[tuple[int, int]] = DEFAULT_BLOCKS,
    threads: int = 1,
    clock: str = "cpu",
    with_torch: bool = True,
    peak_sgemm: bool = True,
    progress: bool = True,
    redraw: bool = False,
    chapters: Sequence[str] | None = None,
    png_dir: str | None = None,
) -> dict[str, Any]:
    """Run a suite ("cpu", "ladder" or "widgets") and return the JSON-ready results.

    ``clock="cpu"`` with ``threads > 1`` becomes ``"wall"`` (the process CPU time adds up every
    thread's time), noted in ``results["clock_note"]``.  ``redraw`` (off by default for "cpu"
    and "ladder": it executes whole chapters): also time the widgets of ``chapters`` (default:
    those of ``./_toc.yml``, if any) with :func:`widget_redraw_times`, as "widgets" does.
    """
    if suite not in ("cpu", "ladder", "widgets"):
        raise ValueError(f"suite must be 'cpu', 'ladder' or 'widgets', got {suite!r}")
    if clock not in _CLOCKS:
        raise ValueError(f"clock must be one of {sorted(_CLOCKS)}, got {clock!r}")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    clock_note = None
    if threads > 1 and clock == "cpu":
        clock = "wall"
        clock_note = (f"--threads {threads}: the wall clock is used, because the process CPU "
                      "time adds up the time of every thread")
    if suite == "widgets":
        set_threads(threads)
        return {
            "suite": suite,
            "machine": machine_info(threads, "wall"),
            "widget_redraw": widget_redraw_times(
                toc_chapters() if chapters is None else chapters, repeat=repeats,
                png_dir=png_dir),
        }
    with_torch = with_torch and suite == "cpu" and torch_available()
    if with_torch:
        import torch  # noqa: F401  (imported here, lazily, so that set_threads pins it)
    set_threads(threads)
    peak = sgemm_peak(repeats=max(3, repeats), clock=clock) if peak_sgemm else None
    results: dict[str, Any] = {
        "suite": suite,
        "machine": machine_info(threads, clock),
        "sgemm_peak_gflops": peak / 1e9 if peak else None,
        "sgemm_sizes": list(SGEMM_SIZES),
        "defaults": {"block_q": BLOCK_Q, "block_k": BLOCK_K},
        "runs": [],
    }
    if clock_note:
        results["clock_note"] = clock_note
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=0, desc=f"flashlib.bench {suite}", unit="call", file=sys.stderr)
    rng = np.random.default_rng(0)
    for n in ns:
        q, k, v = (rng.standard_normal((heads, n, d), dtype=np.float32) for _ in range(3))
        for causal in causal_modes:
            if suite == "cpu":
                calls = cpu_calls(q, k, v, causal=causal, blocks=blocks, with_torch=with_torch)
            else:
                calls = ladder_calls(q, k, v, causal=causal)
            if "torch_sdpa" in calls:
                results["sdpa_backend"] = calls["torch_sdpa"].backend  # type: ignore[attr-defined]
            if bar is not None:
                bar.total += len(calls) * (repeats + 1)
                bar.set_postfix(n=n, causal=causal)
                bar.refresh()
            # A warm-up call per implementation for small n; at n >= 8192 a call takes
            # seconds and the first one is no slower than the others.
            warmup = n < 8192
            if bar is not None and not warmup:
                bar.total -= len(calls)
            times = time_calls(calls, repeats, clock=clock, warmup=warmup, progress=bar)
            flops = attention_flops(heads, n, n, d, causal)
            results["runs"].append({
                "n": n, "heads": heads, "d": d, "causal": causal, "dtype": "float32",
                "repeats": repeats, "flops": flops, "rows": summarise(times, flops, peak),
            })
    if bar is not None:
        bar.close()
    if redraw:
        results["widget_redraw"] = widget_redraw_times(
            toc_chapters() if chapters is None else chapters, repeat=repeats, png_dir=png_dir)
    return results


def report(results: Mapping[str, Any]) -> str:
    """The printable tables of a :func:`run` result."""
    m = results["machine"]
    blas = ", ".join(f"{b['internal_api']} {b['version']} ({b['architecture']})"
                     for b in m["blas"])
    cpu = m["cpu_model"]
    if m.get("family") is not None:
        cpu += f" (family {m['family']}, model {m.get('model')})"
    flags = m.get("flags") or {}
    if flags:
        cpu += "; " + " ".join(name for name, present in flags.items() if present)
    out = [f"{cpu}; {m['threads']} thread(s); BLAS {blas}; clock {m['clock']}"]
    src = m.get("flashlib", {})
    if src:
        commit = src.get("git_commit", "no git commit")
        out.append(f"flashlib {src.get('version')} ({commit[:12]}"
                   f"{', uncommitted changes' if src.get('git_dirty') else ''})")
    if results.get("clock_note"):
        out.append(results["clock_note"])
    if results.get("sdpa_backend"):
        out.append(f"torch SDPA backend: {results['sdpa_backend']}")
    if results.get("sgemm_peak_gflops"):
        sizes = results.get("sgemm_sizes", SGEMM_SIZES)
        out.append(f"single-thread sgemm peak (best of n = {min(sizes)} ... {max(sizes)}): "
                   f"{results['sgemm_peak_gflops']:.1f} GFLOP/s")
    by_key = {(r["n"], r["causal"]): r for r in results.get("runs", [])}
    for r in results.get("runs", []):
        title = (f"\nn = {r['n']}, heads = {r['heads']}, d = {r['d']}, "
                 f"{'causal' if r['causal'] else 'non-causal'}, medians of {r['repeats']}")
        out.append(_format_table(title, r["rows"]))
        other = by_key.get((r["n"], False))
        if r["causal"] and other is not None:
            full = {row["impl"]: row["median_s"] for row in other["rows"]}
            ratios = ", ".join(f"{row['impl']} {row['median_s'] / full[row['impl']]:.2f}"
                               for row in r["rows"] if row["impl"] in full)
            out.append(f"causal / non-causal time: {ratios}")
    if "widget_redraw" in results:
        out.extend(_format_widgets(results["widget_redraw"]))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashlib.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=["cpu", "ladder", "widgets"], nargs="?", default="cpu")
    parser.add_argument("chapters", nargs="*",
                        help="chapters whose widgets to time (default: those of ./_toc.yml)")
    parser.add_argument("--n", type=int, nargs="+", default=list(DEFAULT_NS),
                        help="sequence lengths n = n_q = n_k (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed calls per implementation (and redraws per widget)")
    parser.add_argument("--causal", action="store_true",
                        help="also time causal attention (and report causal / non-causal)")
    parser.add_argument("--causal-only", action="store_true", help="time causal attention only")
    parser.add_argument("--blocks", default=",".join(f"{r}x{c}" for r, c in DEFAULT_BLOCKS),
                        help="flash_attention tile sizes B_rxB_c, comma-separated (the default "
                        "tile is the row 'flash'; default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS and torch threads; above 1 forces --clock wall")
    parser.add_argument("--clock", choices=sorted(_CLOCKS), default="cpu")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch baselines")
    parser.add_argument("--no-peak", action="store_true",
                        help="skip measuring the sgemm peak (and the fractions of it)")
    parser.add_argument("--out", default=None,
                        help="JSON file (default: bench-results/<suite>.json)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--redraw", action=argparse.BooleanOptionalAction, default=False,
                        help="cpu and ladder: also time the widgets' live redraw (executes "
                        "the chapters; off by default, the widgets suite does only that)")
    parser.add_argument("--png", default=None, metavar="DIR",
                        help="also write every widget frame as a PNG into DIR")
    args = parser.parse_args(argv)

    modes = [True] if args.causal_only else ([False, True] if args.causal else [False])
    results = run(
        args.suite, ns=args.n, heads=args.heads, d=args.d, repeats=args.repeats,
        causal_modes=modes, blocks=_parse_blocks(args.blocks), threads=args.threads,
        clock=args.clock, with_torch=not args.no_torch, peak_sgemm=not args.no_peak,
        progress=not args.no_progress, redraw=args.redraw,
        chapters=args.chapters or None, png_dir=args.png,
    )
    results["command"] = "python -m flashlib.bench " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print(report(results))
    out = args.out or os.path.join("bench-results", f"{args.suite}.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
