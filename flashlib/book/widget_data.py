"""The data the chapters' figures and widgets draw: JSON-able tables computed from the numerics.

Each function shapes what one widget or figure shows, next to the code that draws it
(:mod:`flashlib.book.widgets`, ``flashlib/book/js/*.js``, :mod:`flashlib.book.diagrams`):

:func:`tiling_frames`, :func:`tiling_widget_data`  the tiling widget: one entry per step of a
    teaching function run on a counting memory (:mod:`flashlib.studies.tiling`)
:func:`io_widget_data`        the IO-model widget's table: modelled and counted traffic
:func:`backward_widget_frame`, :func:`backward_widget_data`  the backward chapter's data: saved
    bytes, FLOPs and which program writes which block
:func:`write_matrix`          the backward widget: which program writes which block of dQ, dK,
    dV, and which blocks several programs write at once
:func:`precision_table`       the precision widget's table
:func:`launch_grid_widget_data`  the GPU chapter's launch-grid widget: where each program's
    loop over keys stops (:func:`flashlib.gpu.grid.key_block_end`)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from flashlib.core.checks import check_float_dtype, check_int
from flashlib.core.hbm import Event
from flashlib.studies.backward import SAVE_METHODS, backward_flops, saved_bytes
from flashlib.studies.io_model import BACKWARD_ORDERS, block_sizes, traffic
from flashlib.studies.precision import (
    Casts,
    ErrorStats,
    as_dtype,
    attention_with_casts,
    error_stats,
    random_inputs,
    round_to,
    spacing,
)
from flashlib.studies.tiling import (
    ARRAY_ORDER,
    ORDERS,
    check_order_name,
    count_io,
    program_accesses,
    random_problem,
    run_counted,
)

__all__ = [
    "launch_grid_widget_data",
    "tiling_frames",
    "tiling_widget_data",
    "io_widget_data",
    "backward_widget_frame",
    "backward_widget_data",
    "write_matrix",
    "TableRow",
    "precision_table",
]


def _steps(log: Sequence[Event]) -> list[list[Event]]:
    """Group a log into steps: step 0 holds what happens before the first tile; step k the
    loads of tile k, the tile, and the writes after it.  A read goes with the next tile, or
    with the next write when that comes first (D's pre-pass in the backward)."""
    steps: list[list[Event]] = [[]]
    pending: list[Event] = []
    for e in log:
        if e.op == "read":
            pending.append(e)
        elif e.op == "tile":
            steps.append(pending + [e])
            pending = []
        else:
            steps[-1] += pending + [e]
            pending = []
    steps[-1] += pending
    return steps


def _sig(x: float, digits: int = 4) -> float | None:
    """``x`` to ``digits`` significant digits, for JSON (None for non-finite)."""
    if not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def tiling_frames(n: int, B_r: int, B_c: int, order: str, *, n_k: int | None = None,
                  d: int = 4, row: int | None = None, seed: int = 0) -> dict[str, Any]:
    """The tiling widget's data for one (n, B_r, B_c, order): a JSON-able dict.

    The teaching function of ``order`` runs on random inputs (n query rows, n_k = n key rows
    by default, head dimension d) against a counting memory; its log, grouped into steps (step
    0: before the first tile; step k: tile k with its loads and writes), gives per step:

    tile           [i, j], the tile computed (None at step 0)
    events         the HBM transfers of the step: [op, array, block] (block None: whole array)
    sram           what SRAM holds during the tile: [array, block] pairs ("S": the tile)
    sram_elements  its size in elements
    reads, writes  elements read / written so far, per array (in the order of ``arrays``)
    done           the query blocks whose rows of O are final
    keys_seen, m, l  for the chosen ``row`` (default n // 2): how many keys its running
                   maximum m and sum l cover, and their values (4 significant digits)

    and, for the whole run: n, n_k, d, B_r, B_c, order, T_r, T_c, row, arrays.
    """
    order = check_order_name(order, ORDERS)
    n = check_int(n, "n", minimum=1)
    n_k = n if n_k is None else check_int(n_k, "n_k", minimum=1)
    B_r, B_c = check_int(B_r, "B_r", minimum=1), check_int(B_c, "B_c", minimum=1)
    d = check_int(d, "d", minimum=1)
    row = n // 2 if row is None else check_int(row, "row", minimum=0)
    if row >= n:
        raise ValueError(f"row must be below n = {n}, got {row}")
    Q, K, V = random_problem(n, n_k, d, seed)
    mem = run_counted(order, Q, K, V, B_r, B_c).mem
    steps = _steps(mem.log)
    arrays = [a for a in ARRAY_ORDER if a in mem.reads or a in mem.writes]

    last_store: dict[int, int] = {}  # query block -> step of its last write of O
    for k, step in enumerate(steps):
        for e in step:
            if e.op == "write" and e.name == "O" and e.i is not None:
                last_store[e.i] = k
    s_row = (Q[row] @ K.T) / math.sqrt(d)  # the chosen row's scores, for its running m and l
    keys_seen = 0
    reads = dict.fromkeys(arrays, 0)
    writes = dict.fromkeys(arrays, 0)
    frames = []
    for k, step in enumerate(steps):
        tile = next((e for e in step if e.op == "tile"), None)
        for e in step:
            if e.op == "read":
                reads[e.name] += e.elements
            elif e.op == "write":
                writes[e.name] += e.elements
        if tile is not None and tile.i == row // B_r:
            keys_seen = max(keys_seen, min(n_k, (tile.j + 1) * B_c))
        m = float(s_row[:keys_seen].max()) if keys_seen else None
        frames.append({
            "tile": None if tile is None else [tile.i, tile.j],
            "events": [[e.op, e.name, e.i] for e in step if e.op != "tile"],
            "sram": [] if tile is None else [[name, b] for name, b in tile.held],
            "sram_elements": 0 if tile is None else tile.sram,
            "reads": [reads[a] for a in arrays],
            "writes": [writes[a] for a in arrays],
            "done": sorted(i for i, last in last_store.items() if last <= k),
            "keys_seen": keys_seen,
            "m": None if m is None else _sig(m),
            "l": None if m is None else _sig(float(np.exp(s_row[:keys_seen] - m).sum())),
        })
    return {"n": n, "n_k": n_k, "d": d, "B_r": B_r, "B_c": B_c, "order": order,
            "T_r": -(-n // B_r), "T_c": -(-n_k // B_c), "row": row, "arrays": arrays,
            "steps": frames}


def tiling_widget_data(n_values: Iterable[int], block_values: Iterable[int], *,
                       orders: Sequence[str] = ORDERS, d: int = 4) -> dict[str, Any]:
    """:func:`tiling_frames` for every n in ``n_values``, B_r and B_c in ``block_values`` and
    order in ``orders``, keyed "n-B_r-B_c-order" (e.g. "100-32-16-v1"): the tiling widget's
    whole table, JSON-able."""
    n_values, block_values = list(n_values), list(block_values)
    configs = {f"{n}-{b_r}-{b_c}-{order}": tiling_frames(n, b_r, b_c, order, d=d)
               for n in n_values for b_r in block_values for b_c in block_values
               for order in orders}
    return {"n_values": n_values, "block_values": block_values, "orders": list(orders),
            "configs": configs}


def io_widget_data(N_values: Iterable[int], d_values: Iterable[int], M_values: Iterable[int],
                   *, count_N: int = 512, count_tiles: int = 1024) -> dict[str, Any]:
    """The IO-model widget's table, JSON-able: for each (N, d, M), keyed "N-d-M", and each of
    "standard", "v1", "v2": ``[B_r, B_c, modelled, counted]`` in elements, with the blocks of
    :func:`flashlib.studies.io_model.block_sizes` (``rule="fit"``: a step fits in M).  ``counted``
    is a run on a :class:`CountingMemory` whose SRAM holds exactly M elements (:func:`count_io`),
    for N <= ``count_N`` and at most ``count_tiles`` tiles (None otherwise, or when M cannot
    hold one step, then every entry but the order's name is None).  ``floor``: 4 N d per
    "N-d" (:func:`flashlib.studies.io_model.minimum_traffic`).

    ``passes``: the mechanism, per key and order, ``[once, per_pass, passes]`` with
    ``once + per_pass * passes == modelled``: what is moved once, and what is moved again on
    every pass of the outer loop ("v1": Q, O, l, m for each of T_c key blocks; "v2": K, V for
    each of T_r query blocks; "standard": S and P, 4 N^2, one "pass").  ``sram``: per key,
    ``{array: elements}`` one step of "v2" holds (:func:`sram_footprint`), or None."""
    from flashlib.studies.io_model import minimum_traffic, sram_footprint, traffic

    N_values, d_values, M_values = list(N_values), list(d_values), list(M_values)
    rows: dict[str, dict[str, list[int | None]]] = {}
    passes: dict[str, dict[str, list[int] | None]] = {}
    sram: dict[str, dict[str, int] | None] = {}
    floor: dict[str, int] = {}
    for N in N_values:
        for d in d_values:
            floor[f"{N}-{d}"] = minimum_traffic(N, N, d)
            standard = traffic("standard", N, N, d).total
            counted_standard = count_io(N, d, None, "standard") if N <= count_N else None
            for M in M_values:
                key = f"{N}-{d}-{M}"
                row: dict[str, list[int | None]] = {
                    "standard": [None, None, standard, counted_standard]}
                passes[key] = {"standard": [standard - 4 * N * N, 4 * N * N, 1]}
                sram[key] = None
                for order in ORDERS:
                    try:
                        B_r, B_c = block_sizes(M, d, order, rule="fit")
                    except ValueError:
                        row[order] = [None, None, None, None]
                        passes[key][order] = None
                        continue
                    if order == "v1":  # Q, O, l, m again for each key block
                        passes[key][order] = [2 * N * d + N * (d + 2), N * (3 * d + 4),
                                              -(-N // B_c)]
                    else:  # K and V again for each query block
                        passes[key][order] = [2 * N * d + N, 2 * N * d, -(-N // B_r)]
                        sram[key] = sram_footprint(order, B_r, B_c, d, n_q=N, n_k=N)
                    modelled = traffic(order, N, N, d, B_r=B_r, B_c=B_c).total
                    tiles = -(-N // B_r) * -(-N // B_c)
                    counted = (count_io(N, d, M, order, rule="fit")
                               if N <= count_N and tiles <= count_tiles else None)
                    row[order] = [B_r, B_c, modelled, counted]
                rows[key] = row
    return {"N_values": N_values, "d_values": d_values, "M_values": M_values,
            "rows": rows, "floor": floor, "passes": passes, "sram": sram}


@functools.lru_cache(maxsize=64)
def _accesses(order: str, n: int, B: int) -> dict[str, Any]:
    """:func:`flashlib.studies.tiling.program_accesses` for self-attention over n rows with B x B
    blocks.  When B divides n, the run is made on n / B rows of blocks of one row: the same
    schedule (block for block: which blocks each program reads and writes does not depend on
    how many rows a block has), at a fraction of the cost."""
    if n % B == 0:
        run = program_accesses(order, n // B, n // B, 1, 1)
        run.update(n_q=n, n_k=n, B_r=B, B_c=B)
        return run
    return program_accesses(order, n, n, B, B)


def backward_widget_frame(n: int, B: int, order: str, *, d: int = 64,
                          dtype: Any = np.float16) -> dict[str, Any]:
    """One frame of the backward widget: self-attention over n rows, B x B blocks (B = min(B,
    n)), head dimension d, inputs in ``dtype``, schedule ``order`` ("backward" or
    "two_pass_backward").  JSON-able:

    ``saved``      bytes kept for backward per head: {"standard": {...}, "flash": {...}}
    ``flops``      :func:`backward_flops` of the schedule (and of "standard" under
                   ``flops_standard``)
    ``traffic``    HBM elements read and written per array
    (:func:`flashlib.studies.io_model.traffic`) ``programs``   from the event log of the schedule's
                   teaching function (:func:`flashlib.studies.tiling.program_accesses`): per stage,
                   the programs launched and the arrays they write; per program, the blocks it
                   reads and writes; ``writers`` and ``shared`` (arrays written by several
                   programs)
    """
    n, B, d = check_int(n, "n", minimum=1), check_int(B, "B", minimum=1), \
        check_int(d, "d", minimum=1)
    if order not in BACKWARD_ORDERS:
        raise ValueError(f"order must be one of {BACKWARD_ORDERS}, got {order!r}")
    B = min(B, n)
    t = traffic(order, n, n, d, B_r=B, B_c=B)
    return {
        "n": n, "B": B, "d": d, "dtype": check_float_dtype(dtype, "dtype").name,
        "order": order,
        "saved": {m: saved_bytes(n, n, d, m, dtype=dtype) for m in SAVE_METHODS},
        "flops": backward_flops(n, n, d, order=order),
        "flops_standard": backward_flops(n, n, d, order="standard"),
        "traffic": {"reads": t.reads, "writes": t.writes, "total": t.total},
        "programs": _accesses(order, n, B),
    }


def backward_widget_data(n_values: Iterable[int] = (256, 512, 1024, 2048),
                         block_values: Iterable[int] = (64, 128, 256),
                         orders: Sequence[str] = BACKWARD_ORDERS, *, d: int = 64,
                         dtype: Any = np.float16) -> dict[str, Any]:
    """:func:`backward_widget_frame` for every (n, B, order), keyed "n-B-order" (e.g.
    "1024-128-backward"): the widget's whole table, JSON-able."""
    n_values, block_values = list(n_values), list(block_values)
    frames = {f"{n}-{B}-{o}": backward_widget_frame(n, B, o, d=d, dtype=dtype)
              for n in n_values for B in block_values for o in orders}
    return {"n_values": n_values, "block_values": block_values, "orders": list(orders),
            "d": d, "frames": frames}


#: The gradients the backward widget draws, in its order (rows: every block of each).
GRADIENTS = ("dQ", "dK", "dV")


def write_matrix(programs: dict[str, Any]) -> dict[str, Any]:
    """Which program writes which block of dQ, dK and dV, from a run's programs
    (:func:`flashlib.studies.tiling.program_accesses`, the ``programs`` of
    :func:`backward_widget_frame`).  JSON-able:

    ``columns``  one per program that writes a gradient, in launch order: ``{"stage", "side",
                 "block"}`` (side "kv": a key block's program, "q": a query block's; block
                 counted from 1)
    ``rows``     one per block of each gradient: ``{"array", "block"}`` (block from 1), dQ's
                 T_r blocks, then dK's and dV's T_c each
    ``written``  rows x columns of 0/1: whether the program writes the block
    ``writers``  per row, how many programs write it (more than 1: they collide, and on a GPU,
                 where they run at the same time, need atomic adds)
    ``passes``   per stage among the columns, its side and how many programs it launches
    """
    counts = {"dQ": programs["T_r"], "dK": programs["T_c"], "dV": programs["T_c"]}
    rows = [{"array": a, "block": b + 1} for a in GRADIENTS for b in range(counts[a])]
    index = {(r["array"], r["block"] - 1): k for k, r in enumerate(rows)}
    columns, cells = [], []
    for p in programs["programs"]:
        if p["stage"] < 0:  # the whole-array initialisation (dQ = 0) before any loop
            continue
        touched = [index[a, b] for a, runs in p["writes"].items() if a in counts
                   for start, stop in runs for b in range(start, stop)]
        if not touched:
            continue
        columns.append({"stage": p["stage"], "side": p["side"], "block": p["block"] + 1})
        cells.append(touched)
    written = [[0] * len(columns) for _ in rows]
    for c, touched in enumerate(cells):
        for r in touched:
            written[r][c] = 1
    passes = []
    for col in columns:
        if not passes or passes[-1]["stage"] != col["stage"]:
            passes.append({"stage": col["stage"], "side": col["side"], "programs": 0})
        passes[-1]["programs"] += 1
    return {"columns": columns, "rows": rows, "written": written,
            "writers": [sum(row) for row in written], "passes": passes}


class TableRow(NamedTuple):
    """One setting of the chapter's widget and what it shows (errors against float64 of the
    inputs rounded to ``inputs``): standard and tiled attention with the chosen casts, plain
    attention in the input dtype (the 2x line is twice its error) and the spacing of the
    input dtype near max|O| (rounding the output alone errs by up to half of it)."""

    n: int
    block: int
    scale: float
    outlier: float
    inputs: str
    P: str
    acc: str
    standard: ErrorStats
    tiled: ErrorStats
    plain: ErrorStats
    spacing: float


def precision_table(
    *,
    ns: Sequence[int] = (128, 512),
    blocks: Sequence[int] = (16, 128),
    scales: Sequence[float] = (1.0, 4.0),
    outliers: Sequence[float] = (0.0,),
    inputs: Sequence[str] = ("float16", "bfloat16"),
    P: Sequence[str | None] = (None, "float32"),
    acc: Sequence[str] = ("float32", "bfloat16"),
    d: int = 32,
    seed: int = 0,
) -> list[TableRow]:
    """The widget's table: one :class:`TableRow` per combination of the arguments.

    For each setting the kernel keeps what FlashAttention-2 keeps (:meth:`Casts.flash` of the
    input dtype) except for the chosen P and accumulator dtypes (``None`` for P: the input
    dtype); ``l`` follows the accumulator (both are sums kept across key blocks).  Inputs:
    :func:`random_inputs` (n x d, ``np.random.default_rng(seed)``), rounded to the input dtype.
    Standard and plain attention are computed once per setting, whatever the block.
    """
    rows = []
    for n in ns:
        n = check_int(n, "ns", minimum=1)
        for scale in scales:
            for outlier in outliers:
                Q, K, V = random_inputs(n, d, np.random.default_rng(seed), scale=scale,
                                        outlier=outlier)
                for dt_in in inputs:
                    dt_in = as_dtype(dt_in, "inputs").name
                    Qr, Kr, Vr = (round_to(X, dt_in) for X in (Q, K, V))
                    ref = attention_with_casts(Qr, Kr, Vr, Casts.exact(), None)
                    plain = error_stats(
                        attention_with_casts(Qr, Kr, Vr, Casts.plain(dt_in), None), ref)
                    gap = float(spacing(np.max(np.abs(ref)), dt_in))
                    for dt_p in P:
                        dt_p = dt_in if dt_p is None else as_dtype(dt_p, "P").name
                        for dt_acc in acc:
                            dt_acc = as_dtype(dt_acc, "acc").name
                            casts = Casts.flash(dt_in).replace(P=dt_p, acc=dt_acc, l=dt_acc)
                            standard = error_stats(
                                attention_with_casts(Qr, Kr, Vr, casts, None), ref)
                            for b in blocks:
                                b = check_int(b, "blocks", minimum=1)
                                tiled = error_stats(
                                    attention_with_casts(Qr, Kr, Vr, casts, b), ref)
                                rows.append(TableRow(n, b, float(scale), float(outlier),
                                                     dt_in, dt_p, dt_acc, standard, tiled,
                                                     plain, gap))
    return rows


def launch_grid_widget_data(n_values: Iterable[int], B_r_values: Iterable[int],
                            B_c_values: Iterable[int], *, d: int = 64) -> dict[str, Any]:
    """The launch-grid widget's table (flashlib/book/js/launch_grid.js), JSON-able: for each
    n (= n_q = n_k), B_r, B_c and mask, keyed "n-B_r-B_c-causal" (causal "on"/"off"), the key
    where each program's loop stops (:func:`flashlib.gpu.grid.key_block_end`); program p
    reads rows p B_r .. min(n, (p + 1) B_r) - 1 of Q, keys 0 .. stop - 1 of K and V in tiles
    of B_c, and writes its rows of O and L.  ``d``: the head dim the bytes are counted for."""
    from flashlib.gpu.grid import cdiv, key_block_end

    n_values, B_r_values, B_c_values = list(n_values), list(B_r_values), list(B_c_values)
    configs = {}
    for n in n_values:
        for B_r in B_r_values:
            for B_c in B_c_values:
                for mask in ("off", "on"):
                    configs[f"{n}-{B_r}-{B_c}-{mask}"] = [
                        key_block_end(p, B_r, n, mask == "on") for p in range(cdiv(n, B_r))]
    return {"d": check_int(d, "d", minimum=1), "configs": configs}
