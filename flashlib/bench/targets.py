"""The performance figures the project tracks (``python -m flashlib.bench targets``).

At n = 4096, 8 heads, d = 64, float32 (by default; ``--causal``: causal attention), each
against its target:

1. one thread, forward: ``flash_attention``'s fraction of numpy's single-thread sgemm peak
   over PyTorch SDPA's fraction of torch's, both peaks measured in the same run (each
   implementation against its own matrix library: OpenBLAS and MKL differ by machine, so a
   plain time ratio would say more about the BLAS than about the attention code)
2. one thread, backward: ``flash_attention_backward``'s fraction of numpy's peak over torch
   autograd through SDPA's (backward only: forward + backward minus forward, in the same run)
   fraction of torch's; backward FLOPs are 2.5 times the forward's (five matmuls to two)
3. logits 30 times larger (q * 30): ``flash_attention``'s time / its time at normal logits
4. one thread: ``flash_attention_backward`` / the naive backward (which stores P), and the
   naive backward's extra memory / flash's (tracemalloc peaks beyond the outputs)

and, reported but not judged: the plain time ratios to torch, and with ``--threads`` above 1
the wall-clock figures on several threads (thread scaling, until a machine shows it).

Every group is timed round-robin (one call of each per repeat, after a warm-up call each) and
reduced to medians.  The report also gives the BLAS library, its kernel and thread count
(threadpoolctl), the torch build, the load average before and after, and whether this process
is in the slow-``exp2`` state (numpy's float32 ``exp2`` is several times slower than ``exp``
in some processes, depending on the address layout: it changes every figure above by tens of
percent), from a quick microbenchmark of ``exp2`` against ``exp``.

Run it on an otherwise idle machine: the figures mean little while other processes hold the
cores, and the load average says whether they did.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.bench.machine import (
    SGEMM_SIZES,
    machine_info,
    set_threads,
    sgemm_peaks,
    torch_available,
)
from flashlib.core.checks import check_int
from flashlib.core.measure import measure_peak, time_calls
from flashlib.fast.backward import flash_attention_backward
from flashlib.fast.forward import flash_attention
from flashlib.fast.naive import naive_attention_backward

__all__ = ["TARGETS", "REPORTED", "LOGIT_SCALE", "SLOW_EXP2_RATIO", "BACKWARD_FLOPS",
           "exp2_state", "run_targets", "format_targets"]

#: The figures and their targets: (key, description, comparison, target).
TARGETS: list[tuple[str, str, str, float]] = [
    ("fwd_peak_ratio", "1 thread, fraction of own peak: flash_attention / SDPA", ">=", 1.0),
    ("bwd_peak_ratio", "1 thread, fraction of own peak: flash backward / torch autograd", ">=",
     1.0),
    ("logits30_vs_normal", "logits x30: flash_attention time / normal logits", "<=", 1.5),
    ("bwd_1t_vs_naive", "1 thread: flash_attention_backward / naive backward", "<=", 1.0),
    ("bwd_memory_ratio", "extra memory: naive backward / flash_attention_backward", ">=", 8.0),
]
#: Figures reported without a target: (key, description).
REPORTED: list[tuple[str, str]] = [
    ("fwd_1t_vs_sdpa", "1 thread: flash_attention time / SDPA time"),
    ("bwd_1t_vs_torch", "1 thread: flash_attention_backward time / torch autograd (bwd only)"),
    ("fwd_mt_vs_sdpa", "{t} threads: flash_attention / SDPA (wall clock)"),
    ("bwd_mt_speedup", "{t} threads: flash_attention_backward speed-up over 1 thread"),
]
#: The large-logit case: q multiplied by this (scores of standard deviation about 30).
LOGIT_SCALE = 30.0
#: exp2 / exp time ratio above which the process is reported as in the slow-exp2 state.
SLOW_EXP2_RATIO = 1.5
#: Backward FLOPs per forward FLOP: five n x n x d matmuls (S, dP, dV, dK, dQ) to two.
BACKWARD_FLOPS = 2.5


def exp2_state(repeats: int = 41) -> dict[str, Any]:
    """Median time of float32 ``np.exp2`` and ``np.exp`` on one (8, 128, 64) tile of ordinary
    arguments (in [-20, 0]), interleaved, their ratio, and whether it says the process is in
    the slow-exp2 state (ratio above :data:`SLOW_EXP2_RATIO`; normally exp2 is the faster)."""
    x = np.random.default_rng(0).uniform(-20, 0, (8, 128, 64)).astype(np.float32)
    out = np.empty_like(x)
    times = time_calls({"exp2": lambda: np.exp2(x, out=out), "exp": lambda: np.exp(x, out=out)},
                       repeats)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    ratio = med["exp2"] / med["exp"]
    return {"exp2_us": 1e6 * med["exp2"], "exp_us": 1e6 * med["exp"], "ratio": ratio,
            "slow": ratio > SLOW_EXP2_RATIO}


def _torch_calls(q, k, v, do, causal: bool = False) -> dict[str, Callable[[], object]]:
    """SDPA forward (no grad) and forward + backward through autograd, pinned to torch's
    FlashAttention backend where it runs (as :func:`flashlib.bench.suites.torch_calls`)."""
    import contextlib

    import torch

    tq, tk, tv = (torch.from_numpy(x)[None].requires_grad_() for x in (q, k, v))
    tdo = torch.from_numpy(do)[None]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    pin: Callable[[], Any] = contextlib.nullcontext
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def pin():
            return sdpa_kernel(SDPBackend.FLASH_ATTENTION)

        with torch.no_grad(), pin():
            sdpa(tq[..., :1, :], tk[..., :1, :], tv[..., :1, :], is_causal=causal)
    except (ImportError, RuntimeError):
        pin = contextlib.nullcontext

    def forward():
        with torch.no_grad(), pin():
            sdpa(tq, tk, tv, is_causal=causal)

    def forward_backward():
        for x in (tq, tk, tv):
            x.grad = None
        with pin():
            out = sdpa(tq, tk, tv, is_causal=causal)
        out.backward(tdo)

    return {"torch_sdpa": forward, "torch_sdpa_fwd_bwd": forward_backward}


def _medians(calls: dict[str, Callable[[], object]], repeats: int, clock: str,
             progress: Any) -> dict[str, float]:
    times = time_calls(calls, repeats, clock=clock, progress=progress)
    return {name: float(statistics.median(ts)) for name, ts in times.items()}


def run_targets(
    *, n: int = 4096, heads: int = 8, d: int = 64, repeats: int = 5,
    threads: int | None = None, with_torch: bool = True, progress: bool = True,
    causal: bool = False,
) -> dict[str, Any]:
    """Measure the figures of :data:`TARGETS` and :data:`REPORTED`; JSON-ready results.
    ``threads``: the multi-thread figures' thread count (default: every core; with one core
    they are skipped).  causal: time causal attention (top-left: SDPA's ``is_causal``)."""
    n, heads, d = (check_int(x, name, minimum=1) for name, x in
                   (("n", n), ("heads", heads), ("d", d)))
    repeats = check_int(repeats, "repeats", minimum=1)
    cores = os.cpu_count() or 1
    threads = cores if threads is None else check_int(threads, "threads", minimum=1)
    with_torch = with_torch and torch_available()
    if with_torch:
        import torch  # noqa: F401  (imported first, so that set_threads pins it too)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=0, desc="flashlib.bench targets", unit="call", file=sys.stderr)

    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((heads, n, d), dtype=np.float32) for _ in range(4))
    q_big = q * np.float32(LOGIT_SCALE)
    o, lse = flash_attention(q, k, v, return_lse=True, causal=causal)
    res: dict[str, Any] = {"suite": "targets", "n": n, "heads": heads, "d": d,
                           "causal": bool(causal), "dtype": "float32", "repeats": repeats,
                           "threads": threads}

    set_threads(1)
    res["machine"] = machine_info(1, "cpu")
    res["exp2_state"] = exp2_state()
    # one peak measurement per run, each library's, round-robin
    peaks = sgemm_peaks(("numpy", "torch") if with_torch else ("numpy",),
                        repeats=max(3, repeats))
    res["sgemm_peaks_gflops"] = {lib: x / 1e9 for lib, x in peaks.items()}
    res["sgemm_sizes"] = list(SGEMM_SIZES)
    fwd = {"flash": lambda: flash_attention(q, k, v, causal=causal),
           f"flash_logits_x{LOGIT_SCALE:g}": lambda: flash_attention(q_big, k, v,
                                                                     causal=causal)}
    bwd = {"flash_backward": lambda: flash_attention_backward(q, k, v, o, lse, do,
                                                              causal=causal),
           "naive_backward": lambda: naive_attention_backward(q, k, v, do, causal=causal)}
    if with_torch:
        tc = _torch_calls(q, k, v, do, causal)
        fwd["torch_sdpa"] = tc["torch_sdpa"]
        bwd["torch_sdpa_fwd_bwd"] = tc["torch_sdpa_fwd_bwd"]
        # the forward again, beside fwd + bwd in the same round-robin: the backward alone is
        # their difference, both medians taken under the same load
        bwd["torch_sdpa_in_bwd_group"] = tc["torch_sdpa"]
    groups = [("one_thread_forward", fwd), ("one_thread_backward", bwd)]
    if bar is not None:
        bar.total += sum(len(c) for _, c in groups) * (repeats + 1)
    one = {}
    for name, calls in groups:
        if bar is not None:
            bar.set_postfix(group=name)
        one.update(_medians(calls, repeats, "cpu", bar))
    res["one_thread_s"] = one

    # context: the forward's two tile matmuls alone, measured on one tile in cache and scaled
    # by the tile count (what no amount of work outside BLAS can go below)
    from flashlib.bench.suites import tile_breakdown

    if not causal:
        res["tile_floor_s"] = tile_breakdown(heads, n, d)

    # extra memory of the backward passes (tracemalloc), outputs not counted
    outputs = 3 * q.nbytes
    _, flash_peak = measure_peak(flash_attention_backward, q, k, v, o, lse, do, causal=causal)
    _, naive_peak = measure_peak(naive_attention_backward, q, k, v, do, causal=causal)
    res["memory_bytes"] = {"flash_backward": flash_peak - outputs,
                           "naive_backward": naive_peak - outputs}

    # fractions of each implementation's own library's peak
    from flashlib.bench.suites import attention_flops

    flops = attention_flops(heads, n, n, d, causal)
    res["flops"] = {"forward": flops, "backward": BACKWARD_FLOPS * flops}
    fractions: dict[str, float] = {
        "flash": flops / one["flash"] / peaks["numpy"],
        "flash_backward": BACKWARD_FLOPS * flops / one["flash_backward"] / peaks["numpy"],
    }
    figures: dict[str, float | None] = dict.fromkeys(
        [key for key, *_ in TARGETS] + [key for key, _ in REPORTED])
    figures["logits30_vs_normal"] = one[f"flash_logits_x{LOGIT_SCALE:g}"] / one["flash"]
    figures["bwd_1t_vs_naive"] = one["flash_backward"] / one["naive_backward"]
    figures["bwd_memory_ratio"] = (res["memory_bytes"]["naive_backward"]
                                   / max(1, res["memory_bytes"]["flash_backward"]))
    if with_torch:
        torch_bwd = one["torch_sdpa_fwd_bwd"] - one["torch_sdpa_in_bwd_group"]
        res["torch_backward_only_s"] = torch_bwd
        fractions["torch_sdpa"] = flops / one["torch_sdpa"] / peaks["torch"]
        figures["fwd_peak_ratio"] = fractions["flash"] / fractions["torch_sdpa"]
        figures["fwd_1t_vs_sdpa"] = one["flash"] / one["torch_sdpa"]
        if torch_bwd > 0:
            fractions["torch_backward"] = BACKWARD_FLOPS * flops / torch_bwd / peaks["torch"]
            figures["bwd_peak_ratio"] = (fractions["flash_backward"]
                                         / fractions["torch_backward"])
            figures["bwd_1t_vs_torch"] = one["flash_backward"] / torch_bwd
        else:  # tiny problems on a loaded machine: the difference is noise, not a time
            res["torch_backward_note"] = (
                "torch's backward alone (fwd+bwd - fwd) came out <= 0 (timing noise: too small "
                "a problem, or too loaded a machine): its figures are skipped")
    res["peak_fractions"] = fractions

    if threads > 1:
        # wall clock, every figure against its one-thread time in the same round-robin; the
        # thread count is switched before each call (microseconds: a cached controller)
        from threadpoolctl import ThreadpoolController

        blas = ThreadpoolController().select(user_api="blas")
        torch = sys.modules.get("torch")

        def pinned(t: int, fn: Callable[[], object]) -> Callable[[], object]:
            def call() -> object:
                blas.limit(limits=t, user_api="blas")
                if torch is not None:
                    torch.set_num_threads(t)
                return fn()
            return call

        calls = {}
        for t in (1, threads):
            calls[f"flash/{t}"] = pinned(t, fwd["flash"])
            calls[f"flash_backward/{t}"] = pinned(t, bwd["flash_backward"])
            if with_torch:
                calls[f"torch_sdpa/{t}"] = pinned(t, fwd["torch_sdpa"])
        if bar is not None:
            bar.total += len(calls) * (repeats + 1)
            bar.set_postfix(group="threads")
        wall = _medians(calls, repeats, "wall", bar)
        set_threads(1)
        res["wall_s"] = wall
        res["threads_speedup"] = {name: wall[f"{name}/1"] / wall[f"{name}/{threads}"]
                                  for name in ("flash", "flash_backward", "torch_sdpa")
                                  if f"{name}/1" in wall}
        figures["bwd_mt_speedup"] = res["threads_speedup"]["flash_backward"]
        if with_torch:
            figures["fwd_mt_vs_sdpa"] = wall[f"flash/{threads}"] / wall[f"torch_sdpa/{threads}"]
    else:
        res["threads_note"] = (f"{cores} core(s): the multi-thread figures need at least 2 "
                               "threads (--threads)")
    if bar is not None:
        bar.close()
    if not with_torch:
        res["torch_note"] = "torch is not installed: the PyTorch figures are skipped"
    res["figures"] = figures
    res["load_average"] = {"before": load_before,
                           "after": os.getloadavg() if hasattr(os, "getloadavg") else None}
    return res


def format_targets(res: dict[str, Any]) -> str:
    """The printable report of :func:`run_targets`: machine line, state lines, the peaks and
    each implementation's fraction of its own library's peak, the figures against their
    targets, the reported figures, and the raw medians."""
    from tabulate import tabulate

    m = res["machine"]
    blas = ", ".join(f"{b['internal_api']} {b['version']} (kernel {b['architecture']}, "
                     f"{b['num_threads']} thread(s) while timing one thread)"
                     for b in m["blas"] if b.get("internal_api") != "openmp") or "not found"
    mode = "causal" if res.get("causal") else "non-causal"
    lines = [f"flashlib targets: n = {res['n']}, {res['heads']} heads, d = {res['d']}, {mode}, "
             f"{res['dtype']}; medians of {res['repeats']} round-robin runs",
             f"CPU {m.get('cpu_model')} ({m.get('cpu_count')} cores); BLAS {blas}; "
             f"numpy {m.get('numpy')}; torch {m.get('torch', 'not installed')}"]
    forced = {key: value for key, value in m.get("env", {}).items()
              if key in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    if forced:
        lines.append(f"WARNING: {forced} is set: OpenBLAS may run a slower kernel than this CPU "
                     "allows (make bench unsets both)")
    e = res["exp2_state"]
    lines.append(
        f"float32 exp2 / exp on one tile: {e['ratio']:.2f} ({e['exp2_us']:.0f} us / "
        f"{e['exp_us']:.0f} us): " + (
            "this process is in the SLOW-EXP2 STATE (exp2 should be the faster); every flash "
            "figure is worse by tens of percent: rerun" if e["slow"] else "normal"))
    load = res.get("load_average") or {}
    if load.get("before") is not None:
        lines.append("load average (1, 5, 15 min) before: "
                     + ", ".join(f"{x:.2f}" for x in load["before"]) + "; after: "
                     + ", ".join(f"{x:.2f}" for x in load["after"])
                     + " (above ~0.5 other processes share the cores: figures are noisy)")
    for note in ("threads_note", "torch_note", "torch_backward_note"):
        if res.get(note):
            lines.append(res[note])
    peaks = res.get("sgemm_peaks_gflops") or {}
    fr = res.get("peak_fractions") or {}
    if peaks:
        sizes = res.get("sgemm_sizes", SGEMM_SIZES)
        lines.append("")
        lines.append(f"single-thread sgemm peak (best of n = {min(sizes)} ... {max(sizes)}, "
                     "measured in this run): " + ", ".join(f"{lib} {x:.1f} GFLOP/s"
                                                          for lib, x in peaks.items()))
        table = []
        for label, mine, theirs in (("forward", "flash", "torch_sdpa"),
                                    ("backward", "flash_backward", "torch_backward")):
            a, b = fr.get(mine), fr.get(theirs)
            table.append([label, f"{a:.2f}" if a is not None else "",
                          f"{b:.2f}" if b is not None else "",
                          f"{a / b:.2f}" if a is not None and b else ""])
        lines.append("fraction of its own library's peak (attention FLOPs / time / peak; "
                     f"backward FLOPs = {BACKWARD_FLOPS:g} x forward):")
        lines.append(tabulate(table, headers=("", "flashlib (numpy)", "torch (torch)",
                                              "flashlib / torch"),
                              tablefmt="simple", disable_numparse=True))
    rows = []
    for key, text, op, target in TARGETS:
        value = res["figures"].get(key)
        if value is None:
            rows.append([text.format(t=res["threads"]), "skipped", f"{op} {target:g}", ""])
            continue
        met = value <= target if op == "<=" else value >= target
        rows.append([text.format(t=res["threads"]), f"{value:.2f}", f"{op} {target:g}",
                     "met" if met else "MISSED"])
    for key, text in REPORTED:
        value = res["figures"].get(key)
        if value is not None:
            rows.append([text.format(t=res["threads"]), f"{value:.2f}", "reported", ""])
    lines.append("")
    lines.append(tabulate(rows, headers=("figure", "value", "target", ""),
                          tablefmt="simple", disable_numparse=True))
    lines.append("")
    raw = [[name, f"{t:.4f}"] for name, t in res["one_thread_s"].items()]
    if "torch_backward_only_s" in res:
        raw.append(["torch autograd backward only (fwd+bwd - fwd)",
                    f"{res['torch_backward_only_s']:.4f}"])
    lines.append("one thread, process CPU time (median s):")
    lines.append(tabulate(raw, tablefmt="plain", disable_numparse=True))
    if "wall_s" in res:
        lines.append(f"\nwall clock (median s), 1 vs {res['threads']} threads:")
        lines.append(tabulate([[name, f"{t:.4f}"] for name, t in res["wall_s"].items()],
                              tablefmt="plain", disable_numparse=True))
        lines.append("speed-up over one thread: " + ", ".join(
            f"{name} {x:.2f}x" for name, x in res["threads_speedup"].items()))
    floor = res.get("tile_floor_s")
    if floor:
        text = (f"\nfloor: flash_attention's tile matmuls alone (one tile in cache, times the "
                f"tile count) take {floor['matmuls']:.4f} s, exp2 and the row sums "
                f"{floor['exp2 + row sum']:.4f} s")
        sdpa = res["one_thread_s"].get("torch_sdpa")
        if sdpa:
            text += f"; the matmuls alone are {floor['matmuls'] / sdpa:.2f} x SDPA's time"
        lines.append(text)
    mem = res["memory_bytes"]
    lines.append(f"\nextra memory (tracemalloc peak beyond the outputs): flash backward "
                 f"{mem['flash_backward'] / 2**20:.1f} MiB, naive backward "
                 f"{mem['naive_backward'] / 2**20:.1f} MiB")
    return "\n".join(lines)
