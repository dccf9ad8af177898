"""The GPU benchmark's data file and its arithmetic (pure Python: the book reads it anywhere).

TFLOP/s follow the accounting of the Triton tutorial and flash-attn's benchmarks: a forward
pass costs ``4 * batch * heads * n_q * n_k * d`` FLOPs (Q K^T and P V, two per multiply-add),
half of that with a causal mask (half the scores are computed), and a backward pass 2.5 times
the forward (five matmuls instead of two), so forward + backward counts 3.5 forwards.

A results file is JSON::

    {"schema": "flashlib-gpu-bench/1",
     "provenance": {"gpu": ..., "compute_capability": ..., "driver": ..., "cuda": ...,
                    "torch": ..., "triton": ..., "flash_attn": ..., "date": ...,
                    "flashlib": {"version": ..., "git_commit": ...}, ...},
     "command": "python -m flashlib.bench gpu ...",
     "settings": {"tokens": ..., "hidden": ..., "warmup_ms": ..., "rep_ms": ...},
     "rows": [{"impl", "pass", "dtype", "causal", "n", "d", "batch", "heads",
               "ms", "tflops", "peak_bytes", "error"}, ...]}

``ms``/``tflops``/``peak_bytes`` are null and ``error`` says why when a case did not run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flashlib.core.checks import check_int

__all__ = ["SCHEMA", "PASSES", "PASS_FACTOR", "PROVENANCE_KEYS", "ROW_KEYS", "attention_flops",
           "tflops", "make_row", "check_results", "load_results", "tflops_by_impl"]

SCHEMA = "flashlib-gpu-bench/1"
#: The passes timed, and how many forward passes' FLOPs each counts.
PASS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
PASSES = tuple(PASS_FACTOR)
#: What a results file must say about where it was measured.
PROVENANCE_KEYS = ("gpu", "compute_capability", "driver", "cuda", "torch", "triton",
                   "flash_attn", "date", "flashlib")
ROW_KEYS = ("impl", "pass", "dtype", "causal", "n", "d", "batch", "heads", "ms", "tflops",
            "peak_bytes", "error")


def attention_flops(batch: int, heads: int, n_q: int, n_k: int, d: int, *,
                    causal: bool = False, passes: str = "fwd") -> float:
    """FLOPs of ``passes`` ("fwd", "bwd", "fwd+bwd") of attention: 4 batch heads n_q n_k d per
    forward, halved for causal, backward 2.5x."""
    for name, value in (("batch", batch), ("heads", heads), ("n_q", n_q), ("n_k", n_k),
                        ("d", d)):
        check_int(value, name, minimum=1)
    if passes not in PASS_FACTOR:
        raise ValueError(f"passes must be one of {PASSES}, got {passes!r}")
    flops = 4.0 * batch * heads * n_q * n_k * d * PASS_FACTOR[passes]
    return flops / 2 if causal else flops


def tflops(ms: float, batch: int, heads: int, n: int, d: int, *, causal: bool = False,
           passes: str = "fwd") -> float:
    """TFLOP/s of a call that took ``ms`` milliseconds (n_q = n_k = n)."""
    if not isinstance(ms, (int, float)) or isinstance(ms, bool) or not ms > 0:
        raise ValueError(f"ms must be a positive time in milliseconds, got {ms!r}")
    flops = attention_flops(batch, heads, n, n, d, causal=causal, passes=passes)
    return flops / (ms * 1e-3) / 1e12


def make_row(impl: str, passes: str, dtype: str, causal: bool, n: int, d: int, batch: int,
             heads: int, *, ms: float | None = None, peak_bytes: int | None = None,
             error: str | None = None) -> dict[str, Any]:
    """One row of a results file; ``tflops`` computed from ``ms`` (None when it did not run)."""
    if (ms is None) == (error is None):
        raise ValueError("a row has either a time (ms) or an error, not both or neither")
    return {"impl": impl, "pass": passes, "dtype": dtype, "causal": bool(causal), "n": n,
            "d": d, "batch": batch, "heads": heads, "ms": ms,
            "tflops": None if ms is None else tflops(ms, batch, heads, n, d, causal=causal,
                                                    passes=passes),
            "peak_bytes": peak_bytes, "error": error}


def check_results(data: Any) -> list[str]:
    """The problems of a results file's contents (empty when it follows the schema)."""
    if not isinstance(data, Mapping):
        return [f"a results file holds a JSON object, got {type(data).__name__}"]
    problems = []
    if data.get("schema") != SCHEMA:
        problems.append(f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    prov = data.get("provenance")
    if not isinstance(prov, Mapping):
        problems.append("provenance is missing")
    else:
        problems += [f"provenance lacks {key!r}" for key in PROVENANCE_KEYS if key not in prov]
    rows = data.get("rows")
    if not isinstance(rows, list):
        return problems + ["rows is missing"]
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            problems.append(f"row {i} is not an object")
            continue
        missing = [key for key in ROW_KEYS if key not in row]
        if missing:
            problems.append(f"row {i} lacks {missing}")
            continue
        if row["pass"] not in PASS_FACTOR:
            problems.append(f"row {i}: pass {row['pass']!r} is not one of {PASSES}")
        if (row["ms"] is None) == (row["error"] is None):
            problems.append(f"row {i}: needs either ms or error")
        elif row["ms"] is not None:
            try:
                want = tflops(row["ms"], row["batch"], row["heads"], row["n"], row["d"],
                              causal=row["causal"], passes=row["pass"])
            except (TypeError, ValueError) as err:
                problems.append(f"row {i}: {err}")
                continue
            if not isinstance(row["tflops"], (int, float)) or abs(row["tflops"] - want) > (
                    1e-6 * want):
                problems.append(f"row {i}: tflops {row['tflops']!r} does not follow from ms "
                                f"(expected {want:.6g})")
    return problems


def load_results(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Read results files (a directory's ``*.json`` when a path is a directory), sorted by
    path; a file that does not follow the schema raises ValueError naming it and the problem."""
    files: list[Path] = []
    for path in map(Path, paths):
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    out = []
    for file in sorted(files):
        data = json.loads(file.read_text(encoding="utf-8"))
        problems = check_results(data)
        if problems:
            raise ValueError(f"{file}: {'; '.join(problems[:5])}")
        out.append(data)
    return out


def tflops_by_impl(data: Mapping[str, Any], *, n: int, d: int, causal: bool, dtype: str,
                   passes: str = "fwd") -> dict[str, float | None]:
    """One case of a results file: TFLOP/s per implementation (None where it did not run, with
    its reason in the file), in the file's order; empty when the case was not measured."""
    return {row["impl"]: row["tflops"] for row in data["rows"]
            if (row["n"], row["d"], row["causal"], row["dtype"], row["pass"])
            == (n, d, bool(causal), dtype, passes)}
