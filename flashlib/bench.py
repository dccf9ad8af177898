"""CPU benchmark: naive attention, FlashAttention (v1 and v2 loop orders), PyTorch SDPA.

    python -m flashlib.bench cpu                        # n = 1024 4096, 8 heads, d = 64
    python -m flashlib.bench cpu --n 4096 16384 --causal --repeats 5
    python -m flashlib.bench cpu --n 64 --heads 1 --repeats 1 --blocks 16x16   # tiny (CI)
    python -m flashlib.bench ladder --n 4096            # the rungs of flashlib.ladder

Every implementation runs on the same inputs, one thread (BLAS via threadpoolctl, torch via
``torch.set_num_threads``), round-robin (one call of each per repeat, so drift hits all alike);
the table shows medians and ratios from one run.  The default clock is the process CPU time,
which on a shared machine leaves out the time other processes hold the core; ``--clock wall``
uses ``time.perf_counter``.  A JSON file records the machine (CPU model, BLAS and its kernel,
threads, library versions), the single-thread sgemm peak, every time and the ratios.

torch is imported only here and only when asked for: flashlib's numerics never need it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from flashlib.flash import BLOCK_K, BLOCK_Q, flash_attention
from flashlib.flash_v1 import flash_attention_v1
from flashlib.ladder import RUNGS, naive_inplace
from flashlib.naive import naive_attention

__all__ = [
    "attention_flops",
    "sgemm_peak",
    "set_threads",
    "time_calls",
    "machine_info",
    "cpu_calls",
    "ladder_calls",
    "torch_calls",
    "tile_breakdown",
    "summarise",
    "run",
    "main",
]

#: The naive baselines run on all heads at once while the (heads, n, n) float32 matrix stays
#: below this many bytes, head by head beyond it (n = 16384 would need 8 GiB for 8 heads).
NAIVE_BATCH_BYTES = 1 << 30

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
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


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


def sgemm_peak(
    sizes: Sequence[int] = (256, 512, 1024, 2048), repeats: int = 5, *, clock: str = "cpu"
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
        times = time_calls({"sgemm": lambda a=a, b=b, c=c: np.matmul(a, b, out=c)}, reps,
                           clock=clock)
        best = max(best, 2.0 * n**3 / statistics.median(times["sgemm"]))
    return best


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int, clock: str) -> dict[str, Any]:
    """CPU model, core count, BLAS (threadpoolctl: library, version, kernel), versions."""
    from threadpoolctl import threadpool_info

    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
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
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
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


def torch_calls(q, k, v, causal: bool = False) -> dict[str, Callable[[], object]]:
    """PyTorch's fused SDPA and a naive torch attention on q, k, v: (heads, n, d) float32.

    Imports torch (lazily, only here) and pins it to the threads set by :func:`set_threads`.
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

    def torch_sdpa():
        with torch.no_grad():
            sdpa(tq, tk, tv, is_causal=causal)

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

    times = time_calls({
        "matmuls": lambda: (np.matmul(q_aug, k_aug, out=s), np.matmul(s, v, out=pv)),
        "exp2 + row sum": elementwise,
    }, repeats, clock=clock)
    tiles = -(-n // b_r) * -(-n // b_c)
    return {name: statistics.median(ts) * tiles for name, ts in times.items()}


def summarise(
    times: Mapping[str, Sequence[float]], flops: float, peak: float | None
) -> list[dict[str, Any]]:
    """One row per implementation: median and min seconds, GFLOP/s, fraction of the sgemm
    peak, and ratios to naive_inplace and torch_sdpa (when they were timed)."""
    med = {name: statistics.median(ts) for name, ts in times.items()}
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


def _redraw_times() -> dict[str, float]:
    """Redraw time of a representative widget (a bar chart of a timing table), when
    flashlib.widgets provides ``redraw_time``; empty otherwise."""
    try:
        from flashlib import widgets
        from flashlib.plots import new_figure
    except ImportError:
        return {}
    if not hasattr(widgets, "redraw_time"):
        return {}

    def draw(n: int = 1024, heads: int = 8):
        fig, ax = new_figure()
        names = [label for label, _ in RUNGS]
        ax.barh(names, np.linspace(1.0, 0.5, len(names)) * n * heads / 8192)
        ax.set_xlabel("seconds")
        return fig

    return {"bar_chart": widgets.redraw_time(draw, {"n": [1024, 2048], "heads": [4, 8]})}


def run(
    suite: str = "cpu",
    *,
    ns: Sequence[int] = (1024, 4096),
    heads: int = 8,
    d: int = 64,
    repeats: int = 5,
    causal_modes: Sequence[bool] = (False,),
    blocks: Sequence[tuple[int, int]] = ((64, 64), (128, 256), (256, 256)),
    threads: int = 1,
    clock: str = "cpu",
    with_torch: bool = True,
    peak_sgemm: bool = True,
    progress: bool = True,
    redraw: bool = True,
) -> dict[str, Any]:
    """Run a suite ("cpu" or "ladder") and return the JSON-ready results."""
    if suite not in ("cpu", "ladder"):
        raise ValueError(f"suite must be 'cpu' or 'ladder', got {suite!r}")
    if with_torch and suite == "cpu":
        import torch  # noqa: F401  (imported here, lazily, so that set_threads pins it)
    set_threads(threads)
    peak = sgemm_peak(repeats=max(3, repeats), clock=clock) if peak_sgemm else None
    results: dict[str, Any] = {
        "suite": suite,
        "machine": machine_info(threads, clock),
        "sgemm_peak_gflops": peak / 1e9 if peak else None,
        "defaults": {"block_q": BLOCK_Q, "block_k": BLOCK_K},
        "runs": [],
    }
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
        results["widget_redraw_s"] = _redraw_times()
    return results


def report(results: Mapping[str, Any]) -> str:
    """The printable tables of a :func:`run` result."""
    m = results["machine"]
    blas = ", ".join(f"{b['internal_api']} {b['version']} ({b['architecture']})"
                     for b in m["blas"])
    out = [f"{m['cpu_model']}; {m['threads']} thread(s); BLAS {blas}; clock {m['clock']}"]
    if results.get("sgemm_peak_gflops"):
        out.append(f"single-thread sgemm peak (best of n = 256 ... 2048): "
                   f"{results['sgemm_peak_gflops']:.1f} GFLOP/s")
    by_key = {(r["n"], r["causal"]): r for r in results["runs"]}
    for r in results["runs"]:
        title = (f"\nn = {r['n']}, heads = {r['heads']}, d = {r['d']}, "
                 f"{'causal' if r['causal'] else 'non-causal'}, medians of {r['repeats']}")
        out.append(_format_table(title, r["rows"]))
        other = by_key.get((r["n"], False))
        if r["causal"] and other is not None:
            full = {row["impl"]: row["median_s"] for row in other["rows"]}
            ratios = ", ".join(f"{row['impl']} {row['median_s'] / full[row['impl']]:.2f}"
                               for row in r["rows"] if row["impl"] in full)
            out.append(f"causal / non-causal time: {ratios}")
    for name, t in results.get("widget_redraw_s", {}).items():
        out.append(f"widget redraw ({name}): {1000 * t:.0f} ms")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashlib.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=["cpu", "ladder"], nargs="?", default="cpu")
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096],
                        help="sequence lengths n = n_q = n_k (default: 1024 4096)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per implementation")
    parser.add_argument("--causal", action="store_true",
                        help="also time causal attention (and report causal / non-causal)")
    parser.add_argument("--causal-only", action="store_true", help="time causal attention only")
    parser.add_argument("--blocks", default="64x64,128x256,256x256",
                        help="extra flash_attention tile sizes B_rxB_c, comma-separated")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=sorted(_CLOCKS), default="cpu")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch baselines")
    parser.add_argument("--no-peak", action="store_true",
                        help="skip measuring the sgemm peak (and the fractions of it)")
    parser.add_argument("--out", default=None,
                        help="JSON file (default: bench-results/<suite>.json)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-redraw", action="store_true",
                        help="skip timing the widget redraw (flashlib.widgets.redraw_time)")
    args = parser.parse_args(argv)

    modes = [True] if args.causal_only else ([False, True] if args.causal else [False])
    results = run(
        args.suite, ns=args.n, heads=args.heads, d=args.d, repeats=args.repeats,
        causal_modes=modes, blocks=_parse_blocks(args.blocks), threads=args.threads,
        clock=args.clock, with_torch=not args.no_torch, peak_sgemm=not args.no_peak,
        progress=not args.no_progress, redraw=not args.no_redraw,
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
