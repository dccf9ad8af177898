"""``python -m flashlib.bench``: the command line of the CPU benchmark (see flashlib.bench)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence

#: What the benchmark needs beyond numpy: the ``bench`` extra.
REQUIRED = ("threadpoolctl", "tqdm", "tabulate")


def missing_dependencies() -> list[str]:
    """The packages of the ``bench`` extra that are not installed."""
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def _parse_blocks(text: str) -> list[tuple[int, int]]:
    """``"64x64,128x64"`` -> [(64, 64), (128, 64)]; ``"32"`` is 32 x 32."""
    blocks = []
    for item in text.split(","):
        if item.strip():
            b_r, _, b_c = item.strip().partition("x")
            try:
                blocks.append((int(b_r), int(b_c or b_r)))
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected tile sizes like 128x64,64x64, got {text!r}") from None
    return blocks


def _positive(option: str) -> Callable[[str], int]:
    """An argparse type: a positive integer, or an error naming ``option``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{option} must be a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{option} must be a positive integer, got {value}")
        return value

    parse.__name__ = option  # argparse names the type in some messages
    return parse


def bench_bytes(n: int, heads: int, d: int) -> int:
    """Bytes a benchmark run of sequence length n holds at its peak, about: the naive baselines'
    score matrices (three n x n float32 arrays per head, all heads at once when they fit
    flashlib.bench.suites.NAIVE_BATCH_BYTES, else one head at a time) and some twenty
    (heads, n, d) float32 arrays of inputs, outputs and gradients."""
    from flashlib.bench.suites import NAIVE_BATCH_BYTES

    per_head = 4 * n * n
    naive = 3 * per_head * (heads if heads * per_head <= NAIVE_BATCH_BYTES else 1)
    return naive + 20 * 4 * heads * n * d


def _check_out(out: str) -> str | None:
    """Why the results file ``out`` cannot be written (None when it can), tried before the run
    (the folder is created; a file that did not exist is removed again)."""
    if os.path.isdir(out):
        return "it is a folder; name a file"
    existed = os.path.exists(out)
    try:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    if not existed:
        os.remove(out)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["gpu"]:  # the GPU suite has its own options: flashlib.bench.gpu
        from flashlib.bench.gpu import main as gpu_main

        return gpu_main(args_list[1:])
    from flashlib import bench

    missing = missing_dependencies()
    if missing:
        print(f"python -m flashlib.bench needs {', '.join(missing)}, which "
              f"{'is' if len(missing) == 1 else 'are'} not installed: "
              'pip install "flashlib[bench]"', file=sys.stderr)
        return 2
    from flashlib.bench.report import report
    from flashlib.bench.suites import DEFAULT_BLOCKS, DEFAULT_NS, SUITES, run
    from flashlib.core.measure import CLOCKS

    parser = argparse.ArgumentParser(prog="python -m flashlib.bench", description=bench.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=SUITES, nargs="?", default="cpu")
    parser.add_argument("--n", type=_positive("--n"), nargs="+", default=None,
                        help="sequence lengths n = n_q = n_k (default: "
                        f"{' '.join(map(str, DEFAULT_NS))}; targets: the first only, default "
                        "4096)")
    parser.add_argument("--heads", type=_positive("--heads"), default=8)
    parser.add_argument("--d", type=_positive("--d"), default=64)
    parser.add_argument("--repeats", type=_positive("--repeats"), default=5,
                        help="timed calls per implementation")
    parser.add_argument("--causal", action="store_true",
                        help="also time causal attention (and report causal / non-causal); "
                        "targets: time causal attention")
    parser.add_argument("--causal-only", action="store_true", help="time causal attention only")
    parser.add_argument("--blocks", type=_parse_blocks,
                        default=",".join(f"{r}x{c}" for r, c in DEFAULT_BLOCKS),
                        help="flash_attention tile sizes B_rxB_c, comma-separated (the default "
                        "tile is the row 'flash'; default: %(default)s)")
    parser.add_argument("--threads", type=_positive("--threads"), default=None,
                        help="BLAS and torch threads (default 1); above 1 forces --clock wall. "
                        "targets: the thread count of the multi-thread figures (default: "
                        "every core)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch baselines")
    parser.add_argument("--no-peak", action="store_true",
                        help="skip measuring the sgemm peak (and the fractions of it)")
    parser.add_argument("--out", default=None,
                        help="JSON file (default: bench-results/<suite>.json)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    out = args.out or os.path.join("bench-results", f"{args.suite}.json")
    why = _check_out(out)
    if why is not None:  # said now, not after the whole run
        parser.error(f"--out {out}: cannot write the results there ({why})")
    if args.suite == "accuracy":
        from flashlib.bench.accuracy import format_accuracy, run_accuracy

        results = run_accuracy()
        print(format_accuracy(results))
        results = {"rows": results["rows"], "cases": results["cases"],
                   "failures": [[str(c), name, err, plain]
                                for c, name, err, plain in results["failures"]]}
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
        print(f"\nwrote {out}")
        return 0 if not results["failures"] else 1
    from flashlib.core.sysmem import available_memory

    ns = (args.n[:1] or [4096]) if args.suite == "targets" else (args.n or list(DEFAULT_NS))
    limit = available_memory()
    need = max(bench_bytes(n, args.heads, args.d) for n in ns)
    if limit is not None and need > limit:
        parser.error(f"--n {max(ns)} with --heads {args.heads} and --d {args.d} needs about "
                     f"{need / 2**30:,.1f} GiB of memory, more than the {limit / 2**30:,.1f} GiB "
                     "available; choose a smaller --n")

    modes = [True] if args.causal_only else ([False, True] if args.causal else [False])
    try:
        if args.suite == "targets":
            from flashlib.bench.targets import format_targets, run_targets

            results = run_targets(
                n=args.n[0] if args.n else 4096, heads=args.heads, d=args.d,
                repeats=args.repeats, threads=args.threads, with_torch=not args.no_torch,
                progress=not args.no_progress, causal=args.causal or args.causal_only)
        else:
            results = run(
                args.suite, ns=args.n or list(DEFAULT_NS), heads=args.heads, d=args.d,
                repeats=args.repeats, causal_modes=modes, blocks=args.blocks,
                threads=1 if args.threads is None else args.threads, clock=args.clock,
                with_torch=not args.no_torch, peak_sgemm=not args.no_peak,
                progress=not args.no_progress,
            )
    except (TypeError, ValueError) as err:  # a bad option value: say which, no traceback
        parser.error(str(err))
    results["command"] = "python -m flashlib.bench " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print(format_targets(results) if args.suite == "targets" else report(results))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
