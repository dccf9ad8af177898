"""``python -m flashlib.bench gpu``: attention on a CUDA GPU, every implementation, one table.

    pip install "flashlib[bench,gpu]"                   # + flash-attn, optionally (CUDA only)
    python -m flashlib.bench gpu                        # the full sweep (a few minutes)
    python -m flashlib.bench gpu --n 1024 4096 --d 64 --dtype float16 --impl triton sdpa_flash
    python -m flashlib.bench gpu --plan                 # list the cases, run nothing

Implementations (:mod:`flashlib.gpu.implementations`): the book's Triton kernels, flash-attn's
``flash_attn_func``, each backend of PyTorch's SDPA (``sdpa_kernel``), naive PyTorch; each on
inputs in its own layout, made before timing.  Passes: forward, and forward + backward
(``loss.backward()`` with a fixed upstream gradient).  Sizes follow flash-attn's benchmark: a
fixed number of tokens (batch = tokens / n) and a fixed hidden size (heads = hidden / d).

Timing: ``triton.testing.do_bench`` (warm-up calls first, so compilation and autotuning are not
timed; CUDA events around each call, the L2 cache flushed between calls; the median), TFLOP/s
by :func:`flashlib.gpu.results.tflops` (causal counts half, backward 2.5x).  Peak memory:
``torch.cuda.max_memory_allocated`` during one call, minus what was allocated before it (the
inputs).  A case that cannot run (flash-attn missing, an SDPA backend refusing, out of memory)
gets a row with the reason.  The JSON file (:mod:`flashlib.gpu.results`) records the GPU, the
driver, CUDA, torch, triton and flash-attn versions, the date and flashlib's commit.

Without a CUDA GPU the command says so and exits with status 1 (the kernels still run in
Triton's interpreter: ``pytest tests/gpu/test_parity.py``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

__all__ = ["DEFAULT_NS", "DEFAULT_DS", "DEFAULT_DTYPES", "DEFAULT_IMPLS", "Case", "parse_args",
           "plan", "provenance", "run_cases", "main", "NO_CUDA"]

DEFAULT_NS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_DS = (64, 128)
DEFAULT_DTYPES = ("float16", "bfloat16")
DEFAULT_IMPLS = ("triton", "flash_attn", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn",
                 "sdpa_math", "naive_torch")
PASS_CHOICES = ("fwd", "fwd+bwd")
#: flash-attn's benchmark sizes: batch * n = 16384 tokens, heads * d = 2048.
TOKENS, HIDDEN = 16384, 2048
NO_CUDA = ("python -m flashlib.bench gpu needs a CUDA GPU, and torch sees none on this machine"
           " ({why}). Without one the Triton kernels run only in Triton's interpreter, for "
           "correctness, not speed: pytest tests/gpu/test_parity.py")


class Case(NamedTuple):
    """One timed configuration."""

    impl: str
    passes: str
    dtype: str
    causal: bool
    n: int
    d: int
    batch: int
    heads: int


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _head_dim(text: str) -> int:
    value = _positive(text)
    if not 16 <= value <= 128:
        raise argparse.ArgumentTypeError(f"head dims run from 16 to 128, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m flashlib.bench gpu",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=_positive, nargs="+", default=list(DEFAULT_NS),
                        help="sequence lengths n = n_q = n_k (default: %(default)s)")
    parser.add_argument("--d", type=_head_dim, nargs="+", default=list(DEFAULT_DS),
                        help="head dims, 16 to 128 (default: %(default)s)")
    parser.add_argument("--dtype", nargs="+", default=list(DEFAULT_DTYPES),
                        choices=("float16", "bfloat16", "float32"))
    parser.add_argument("--impl", nargs="+", default=list(DEFAULT_IMPLS),
                        choices=DEFAULT_IMPLS)
    parser.add_argument("--pass", dest="passes", nargs="+", default=list(PASS_CHOICES),
                        choices=PASS_CHOICES)
    causal = parser.add_mutually_exclusive_group()
    causal.add_argument("--causal-only", action="store_true", help="time causal attention only")
    causal.add_argument("--no-causal", action="store_true", help="time non-causal only")
    parser.add_argument("--tokens", type=_positive, default=TOKENS,
                        help="batch * n (batch = max(1, tokens // n); default: %(default)s)")
    parser.add_argument("--hidden", type=_positive, default=HIDDEN,
                        help="heads * d (heads = max(1, hidden // d); default: %(default)s)")
    parser.add_argument("--warmup-ms", type=_positive, default=25)
    parser.add_argument("--rep-ms", type=_positive, default=100)
    parser.add_argument("--out", default=os.path.join("bench-results", "gpu.json"),
                        help="JSON file (default: %(default)s)")
    parser.add_argument("--plan", action="store_true",
                        help="print the cases and exit (needs no GPU)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line (argparse exits with status 2 and a usage line on a bad option)."""
    return _parser().parse_args(list(argv))


def plan(args: argparse.Namespace) -> list[Case]:
    """Every case of the sweep, in order: by dtype, head dim, causal, n, pass, implementation
    (so that the progress bar passes each size for every implementation at once)."""
    causal_modes = [True] if args.causal_only else [False] if args.no_causal else [False, True]
    return [Case(impl, passes, dtype, causal, n, d, max(1, args.tokens // n),
                 max(1, args.hidden // d))
            for dtype in args.dtype for d in args.d for causal in causal_modes
            for n in args.n for passes in args.passes for impl in args.impl]


def _nvidia_smi(field: str) -> str | None:
    """One field of ``nvidia-smi --query-gpu`` for GPU 0 (None without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def provenance() -> dict[str, Any]:
    """Where the numbers come from: GPU, compute capability, driver, CUDA, torch, triton,
    flash-attn, Python, platform, date (UTC) and flashlib's version and git commit."""
    from flashlib.bench.machine import flashlib_source
    from flashlib.gpu import capabilities

    caps = capabilities()
    cc = caps.compute_capability
    return {
        "gpu": caps.device_name,
        "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
        "driver": _nvidia_smi("driver_version"),
        "gpu_memory": _nvidia_smi("memory.total"),
        "cuda": caps.cuda_version,
        "torch": caps.torch_version,
        "triton": caps.triton_version,
        "flash_attn": caps.flash_attn_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "flashlib": flashlib_source(),
    }


def _inputs(case: Case, layout: str, device: str, seed: int = 0):
    """q, k, v and an upstream gradient do for ``case`` in ``layout``, fixed seed."""
    import torch

    dtype = getattr(torch, case.dtype)
    shape = ((case.batch, case.heads, case.n, case.d) if layout == "bhnd"
             else (case.batch, case.n, case.heads, case.d))
    g = torch.Generator(device=device).manual_seed(seed)
    grad = case.passes != "fwd"
    q, k, v, do = (torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(4))
    return tuple(x.requires_grad_(grad) for x in (q, k, v)) + (do,)


def _step(case: Case, impl, q, k, v, do) -> Callable[[], object]:
    """The call timed for ``case``: forward, or forward then backward."""
    if case.passes == "fwd":
        return lambda: impl.call(q, k, v, causal=case.causal)

    def forward_backward():
        impl.call(q, k, v, causal=case.causal).backward(do)

    return forward_backward


def _cuda_timer(warmup_ms: int, rep_ms: int) -> Callable[..., float]:
    """Median milliseconds of a call by ``triton.testing.do_bench``."""
    from triton.testing import do_bench

    def timer(fn, grads):
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads or None,
                              return_mode="median"))

    return timer


def _cuda_peak(fn) -> int:
    """Bytes allocated at the peak of one call, above what was allocated before it."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - before)


def _reason(err: BaseException) -> str:
    """An exception as one plain line for the results file."""
    import torch

    if isinstance(err, torch.cuda.OutOfMemoryError):
        return "out of GPU memory"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def run_cases(cases: Sequence[Case], *, device: str = "cuda",
              timer: Callable[..., float] | None = None,
              peak: Callable[[Callable[[], object]], int | None] | None = None,
              progress: bool = True,
              on_row: Callable[[list[dict[str, Any]]], None] | None = None,
              ) -> list[dict[str, Any]]:
    """Time every case (``timer(fn, grads) -> ms``, ``peak(fn) -> bytes``; CUDA's by default)
    and return the rows of the results file.  A case that cannot run gets its reason.
    ``on_row(rows)`` is called after each case (the command saves partial results with it)."""
    import torch

    from flashlib.gpu.device import GPUUnavailable
    from flashlib.gpu.implementations import IMPLEMENTATIONS, unavailable_reason
    from flashlib.gpu.results import make_row

    timer = timer or _cuda_timer(25, 100)
    peak = peak or _cuda_peak
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(cases), unit="case", file=sys.stderr)
    rows = []
    for case in cases:
        if bar is not None:
            bar.set_description(f"{case.impl} {case.passes} {case.dtype} d={case.d} "
                                f"n={case.n}{' causal' if case.causal else ''}")
        key = case._asdict()
        key.pop("impl"), key.pop("passes")
        reason = unavailable_reason(case.impl, getattr(torch, case.dtype))
        if reason is None:
            impl = IMPLEMENTATIONS[case.impl]
            try:
                q, k, v, do = _inputs(case, impl.layout, device)
                fn = _step(case, impl, q, k, v, do)
                grads = [q, k, v] if case.passes != "fwd" else []
                ms = timer(fn, grads)
                row = make_row(case.impl, case.passes, **key, ms=ms, peak_bytes=peak(fn))
            except (GPUUnavailable, RuntimeError, ValueError, TypeError) as err:
                reason = str(err) if isinstance(err, GPUUnavailable) else _reason(err)
            finally:
                q = k = v = do = fn = None  # free the inputs before the next case
                if device == "cuda":
                    torch.cuda.empty_cache()
        if reason is not None:
            row = make_row(case.impl, case.passes, **key, error=reason)
        rows.append(row)
        if on_row is not None:
            on_row(rows)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    """TFLOP/s per implementation (columns) and case (rows)."""
    from tabulate import tabulate

    impls = list(dict.fromkeys(r["impl"] for r in rows))
    table: dict[tuple, dict[str, str]] = {}
    for r in rows:
        key = (r["dtype"], r["d"], "causal" if r["causal"] else "", r["n"], r["pass"])
        table.setdefault(key, {})[r["impl"]] = ("-" if r["tflops"] is None
                                                else f"{r['tflops']:.1f}")
    body = [list(key) + [cells.get(i, "") for i in impls] for key, cells in table.items()]
    return ("TFLOP/s (4 batch heads n^2 d per forward, causal half, backward 2.5x; "
            "- = did not run, see the JSON)\n"
            + tabulate(body, headers=["dtype", "d", "mask", "n", "pass", *impls]))


def main(argv: Sequence[str] | None = None) -> int:
    """The command: plain messages and exit statuses, never a traceback for a missing GPU or
    package (1: no CUDA GPU; 2: a package or an option is missing)."""
    args = parse_args(sys.argv[2:] if argv is None else argv)
    cases = plan(args)
    if args.plan:
        for case in cases:
            print(" ".join(f"{k}={v}" for k, v in case._asdict().items()))
        print(f"{len(cases)} cases")
        return 0
    missing = [name for name in ("torch", "triton", "tqdm", "tabulate")
               if importlib.util.find_spec(name) is None]
    if missing:
        print(f"python -m flashlib.bench gpu needs {', '.join(missing)}: "
              'pip install "flashlib[bench,gpu]"', file=sys.stderr)
        return 2
    from flashlib.gpu import capabilities

    caps = capabilities()
    if caps.mode != "cuda":
        why = ("TRITON_INTERPRET is set" if caps.cuda else
               "torch.cuda.is_available() is False" + (
                   f"; torch {caps.torch_version} is a CPU build"
                   if caps.cuda_version is None else ""))
        print(NO_CUDA.format(why=why), file=sys.stderr)
        return 1
    results = {
        "schema": None,  # filled below, from flashlib.gpu.results
        "provenance": provenance(),
        "command": "python -m flashlib.bench gpu " + " ".join(
            sys.argv[2:] if argv is None else argv),
        "settings": {"tokens": args.tokens, "hidden": args.hidden,
                     "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms,
                     "timer": "triton.testing.do_bench, median"},
    }
    from flashlib.gpu.results import SCHEMA, check_results

    results["schema"] = SCHEMA
    print("\n".join(f"{k}: {v}" for k, v in results["provenance"].items()))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)

    def save(rows: list[dict[str, Any]], every: int = 10) -> None:
        """Write the file every ``every`` cases, so an interrupted sweep keeps what it did."""
        if len(rows) % every == 0 or len(rows) == len(cases):
            _write(args.out, {**results, "rows": rows})

    results["rows"] = run_cases(cases, timer=_cuda_timer(args.warmup_ms, args.rep_ms),
                                progress=not args.no_progress, on_row=save)
    problems = check_results(results)
    if problems:  # a bug here, not a measurement: say so, but keep the data
        print("warning: the results do not follow the schema: " + "; ".join(problems[:3]),
              file=sys.stderr)
    print(_table(results["rows"]))
    _write(args.out, results)
    print(f"\nwrote {args.out}")
    return 0


def _write(path: str, results: dict[str, Any]) -> None:
    """Write the results file atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)
