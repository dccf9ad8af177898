"""The benchmark's suites: what is timed, on which inputs, and the summary of the times.

cpu     naive attention (numpy, in place), FlashAttention v1 and v2 loop orders, v2 at several
        tile sizes, and (when torch is installed) PyTorch's SDPA and a naive torch attention
ladder  the in-place naive baseline and every rung of :mod:`flashlib.studies.ladder`; then rung 10
        (threads) against rung 9 on the wall clock
(``targets``, the tracked figures against their targets, is :mod:`flashlib.bench.targets`)

Every implementation runs on the same inputs, round-robin
(:func:`flashlib.core.measure.time_calls`). torch is imported only here and only when asked for:
flashlib's numerics never need it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from flashlib.bench.machine import (
    SGEMM_SIZES,
    machine_info,
    own_library,
    set_threads,
    sgemm_peaks,
    thread_count,
    torch_available,
)
from flashlib.core.checks import check_int
from flashlib.core.constants import BLOCK_K, BLOCK_Q
from flashlib.core.masks import causal_tiles
from flashlib.core.measure import CLOCKS, median_times, time_calls
from flashlib.fast.flash_v1 import flash_attention_v1
from flashlib.fast.forward import flash_attention
from flashlib.fast.naive import naive_attention
from flashlib.studies.ladder import RUNGS, THREADS_RUNG, naive_inplace

__all__ = [
    "DEFAULT_NS",
    "DEFAULT_BLOCKS",
    "SUITES",
    "attention_flops",
    "cpu_calls",
    "ladder_calls",
    "torch_calls",
    "tile_breakdown",
    "threads_rung_times",
    "summarise",
    "run",
]

#: The naive baselines run on all heads at once while the (heads, n, n) float32 matrix stays
#: below this many bytes, head by head beyond it (n = 16384 would need 8 GiB for 8 heads).
NAIVE_BATCH_BYTES = 1 << 30
#: Sequence lengths timed by ``python -m flashlib.bench cpu`` when ``--n`` is not given.
DEFAULT_NS = (1024, 4096)
#: Tile sizes (B_r, B_c) of flash_attention timed by ``python -m flashlib.bench cpu`` when
#: ``--blocks`` is not given: the sweep cited where flashlib.core.constants chooses
#: BLOCK_Q x BLOCK_K.  The default tile among them is the row "flash", not timed twice.
DEFAULT_BLOCKS = ((64, 64), (128, 64), (64, 128), (128, 128), (256, 128), (128, 256))
#: The suites of ``python -m flashlib.bench``: :func:`run` runs the first two, the third is
#: :func:`flashlib.bench.targets.run_targets`.
SUITES = ("cpu", "ladder", "targets", "accuracy")


def attention_flops(heads: int, n_q: int, n_k: int, d: int, causal: bool = False) -> float:
    """Matmul FLOPs of one attention forward: 4 heads n_q n_k d (Q K^T and P V, 2 each per
    multiply-add), halved for causal, the accounting of the Triton tutorial and flash-attn."""
    flops = 4.0 * heads * n_q * n_k * d
    return flops / 2 if causal else flops


def _per_head(fn: Callable[..., np.ndarray], q, k, v, **kw) -> np.ndarray:
    """Run ``fn`` on all heads at once, or head by head when the n x n matrices would not fit
    NAIVE_BATCH_BYTES."""
    heads, n_q, n_k = q.shape[0], q.shape[-2], k.shape[-2]
    if heads * n_q * n_k * 4 <= NAIVE_BATCH_BYTES:
        return fn(q, k, v, **kw)
    return np.stack([fn(q[h], k[h], v[h], **kw) for h in range(heads)])


def torch_calls(q, k, v, causal: bool = False) -> dict[str, Callable[[], object]]:
    """PyTorch's fused SDPA and a naive torch attention on q, k, v: (heads, n, d) float32.

    Imports torch (lazily, only here) and pins it to the threads set by
    :func:`flashlib.bench.machine.set_threads`.  SDPA runs inside
    ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` when that backend accepts these inputs here
    (tried once), else with torch's own choice; ``calls["torch_sdpa"].backend`` says which,
    with the reason for a fallback.
    """
    import torch

    if thread_count() is not None:
        torch.set_num_threads(thread_count())

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
    """naive_inplace and every rung of :mod:`flashlib.studies.ladder` at its default blocks."""
    calls: dict[str, Callable[[], object]] = {
        "naive_inplace": lambda: naive_inplace(q, k, v, causal=causal)
    }
    for label, fn in RUNGS:
        calls[label] = lambda fn=fn: fn(q, k, v, causal=causal)
    return calls


def threads_rung_times(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False, repeats: int = 5,
    workers: int | None = None,
) -> dict[str, Any]:
    """Rung 9 (the library forward on one thread) against rung 10 (on ``workers`` threads,
    default every core), wall clock, round-robin: medians and the speed-up.  On one core
    rung 10 is rung 9, and the result says so."""
    workers = workers or (os.cpu_count() or 1)
    label, fn = THREADS_RUNG
    calls = {"9 one thread": lambda: fn(q, k, v, causal=causal, workers=1),
             f"{label} ({workers})": lambda: fn(q, k, v, causal=causal, workers=workers)}
    med = median_times(calls, repeats, clock="wall")
    one, many = med.values()
    return {"workers": workers, "median_s": med, "speedup": one / many,
            "note": None if workers > 1 else "one core: no second thread to run on"}


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
    times: Mapping[str, Sequence[float]], flops: float,
    peak: float | Mapping[str, float] | None,
) -> list[dict[str, Any]]:
    """One row per implementation: median and min seconds, GFLOP/s, the fraction of its own
    matrix library's sgemm peak (``peak``: {library: FLOP/s} as :func:`flashlib.bench.machine.
    sgemm_peaks` measures it, each implementation against its :func:`flashlib.bench.machine.
    own_library`'s; a single number is every implementation's), and ratios to naive_inplace and
    torch_sdpa (when they were timed)."""
    med = {name: float(np.median(ts)) for name, ts in times.items()}
    rows = []
    for name, ts in times.items():
        row: dict[str, Any] = {
            "impl": name,
            "median_s": med[name],
            "min_s": min(ts),
            "times_s": list(ts),
            "gflops": flops / med[name] / 1e9,
        }
        library = own_library(name)
        own = peak.get(library) if isinstance(peak, Mapping) else peak
        if own:
            row["peak_fraction"] = flops / med[name] / own
            row["peak_library"] = library
        for base in ("naive_inplace", "torch_sdpa"):
            if base in med:
                row[f"vs_{base}"] = med[name] / med[base]
        rows.append(row)
    return rows


def _torch_status(suite: str, with_torch: bool) -> tuple[bool, str | None]:
    """Whether to time the torch baselines, and why not (None when they are timed or were not
    asked for).  torch is imported here, so that set_threads pins it too."""
    if not with_torch or suite != "cpu":
        return False, None
    if not torch_available():
        return False, ("torch is not installed: the PyTorch baselines are skipped "
                       "(pip install torch to time them)")
    try:
        import torch  # noqa: F401
    except Exception as exc:  # a broken torch install: report it, time the rest
        return False, (f"torch failed to import ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0][:200]}): the PyTorch baselines are skipped")
    return True, None


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
) -> dict[str, Any]:
    """Run a suite ("cpu" or "ladder") and return the JSON-ready results.

    ``clock="cpu"`` with ``threads > 1`` becomes ``"wall"`` (the process CPU time adds up every
    thread's time), noted in ``results["clock_note"]``.  When torch was asked for but is
    missing (or does not import), ``results["torch_note"]`` says so and the rest is timed.
    """
    if suite not in SUITES[:2]:
        raise ValueError(f"suite must be one of {SUITES[:2]} (targets: run_targets), "
                         f"got {suite!r}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    threads = check_int(threads, "threads", minimum=1)
    repeats = check_int(repeats, "repeats", minimum=1)
    notes: dict[str, str] = {}
    if threads > 1 and clock == "cpu":
        clock = "wall"
        notes["clock_note"] = (f"--threads {threads}: the wall clock is used, because the "
                               "process CPU time adds up the time of every thread")
    with_torch, torch_note = _torch_status(suite, with_torch)
    if torch_note:
        notes["torch_note"] = torch_note
    set_threads(threads)
    # one peak measurement per run: numpy's BLAS (flashlib's library) and, with the torch
    # baselines, torch's, round-robin
    libraries = ("numpy", "torch") if with_torch else ("numpy",)
    peaks = (sgemm_peaks(libraries, repeats=max(3, repeats), clock=clock) if peak_sgemm
             else None)
    results: dict[str, Any] = {
        "suite": suite,
        "machine": machine_info(threads, clock),
        "sgemm_peak_gflops": peaks["numpy"] / 1e9 if peaks else None,
        "sgemm_peaks_gflops": {lib: x / 1e9 for lib, x in peaks.items()} if peaks else None,
        "sgemm_sizes": list(SGEMM_SIZES),
        "defaults": {"block_q": BLOCK_Q, "block_k": BLOCK_K},
        **notes,
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
            if "torch_sdpa" in calls:
                results["sdpa_backend"] = calls["torch_sdpa"].backend  # type: ignore[attr-defined]
            # A warm-up call per implementation for small n; at n >= 8192 a call takes
            # seconds and the first one is no slower than the others.
            warmup = n < 8192
            if bar is not None:
                bar.total += len(calls) * (repeats + warmup)
                bar.set_postfix(n=n, causal=causal)
                bar.refresh()
            times = time_calls(calls, repeats, clock=clock, warmup=warmup, progress=bar)
            flops = attention_flops(heads, n, n, d, causal)
            results["runs"].append({
                "n": n, "heads": heads, "d": d, "causal": causal, "dtype": "float32",
                "repeats": repeats, "flops": flops, "rows": summarise(times, flops, peaks),
            })
            if suite == "ladder":
                results["runs"][-1]["threads_rung"] = threads_rung_times(
                    q, k, v, causal=causal, repeats=repeats)
    if bar is not None:
        bar.close()
    return results
