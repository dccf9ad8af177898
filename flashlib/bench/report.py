"""The benchmark's printable report: the machine, then one table per run (``tabulate``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flashlib.bench.machine import SGEMM_SIZES

__all__ = ["report", "format_rows"]

_COLUMNS = ("implementation", "median s", "GFLOP/s", "% own peak", "/naive_inpl", "/sdpa")


def format_rows(rows: list[dict[str, Any]]) -> str:
    """One run's rows (:func:`flashlib.bench.suites.summarise`) as a text table: median time,
    GFLOP/s, percent of its own library's sgemm peak (numpy's BLAS for flashlib and the numpy
    baselines, torch's for torch; "np" or "torch" says which) and the ratios to naive_inplace
    and torch_sdpa (blank where not measured)."""
    from tabulate import tabulate

    table = []
    for r in rows:
        lib = {"numpy": "np", "torch": "torch"}.get(r.get("peak_library", ""), "")
        table.append([
            r["impl"], f"{r['median_s']:.4f}", f"{r['gflops']:.1f}",
            f"{100 * r['peak_fraction']:.1f}% {lib}" if "peak_fraction" in r else "",
            f"{r['vs_naive_inplace']:.2f}" if "vs_naive_inplace" in r else "",
            f"{r['vs_torch_sdpa']:.2f}" if "vs_torch_sdpa" in r else "",
        ])
    return tabulate(table, headers=_COLUMNS, tablefmt="simple", disable_numparse=True,
                    colalign=("left",) + ("right",) * (len(_COLUMNS) - 1))


def report(results: Mapping[str, Any]) -> str:
    """The printable tables of a :func:`flashlib.bench.suites.run` result."""
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
    for note in ("clock_note", "torch_note"):
        if results.get(note):
            out.append(results[note])
    if results.get("sdpa_backend"):
        out.append(f"torch SDPA backend: {results['sdpa_backend']}")
    peaks = results.get("sgemm_peaks_gflops") or (
        {"numpy": results["sgemm_peak_gflops"]} if results.get("sgemm_peak_gflops") else {})
    if peaks:
        sizes = results.get("sgemm_sizes", SGEMM_SIZES)
        out.append(f"{m['threads']}-thread sgemm peak (best of n = {min(sizes)} ... "
                   f"{max(sizes)}, measured in this run): " + ", ".join(
                       f"{lib} {x:.1f} GFLOP/s" for lib, x in peaks.items())
                   + "; '% own peak' is each implementation's attention GFLOP/s against its "
                   "own library's peak (np: numpy's BLAS, torch: torch's)")
    by_key = {(r["n"], r["causal"]): r for r in results.get("runs", [])}
    for r in results.get("runs", []):
        out.append(f"\nn = {r['n']}, heads = {r['heads']}, d = {r['d']}, "
                   f"{'causal' if r['causal'] else 'non-causal'}, medians of {r['repeats']}")
        out.append(format_rows(r["rows"]))
        tr = r.get("threads_rung")
        if tr:
            times = ", ".join(f"{name} {t:.4f} s" for name, t in tr["median_s"].items())
            out.append(f"threads (wall clock): {times}: speed-up {tr['speedup']:.2f}x"
                       + (f" ({tr['note']})" if tr.get("note") else ""))
        other = by_key.get((r["n"], False))
        if r["causal"] and other is not None:
            full = {row["impl"]: row["median_s"] for row in other["rows"]}
            ratios = ", ".join(f"{row['impl']} {row['median_s'] / full[row['impl']]:.2f}"
                               for row in r["rows"] if row["impl"] in full)
            out.append(f"causal / non-causal time: {ratios}")
    return "\n".join(out)
