"""The Backward chapter's diagram and widget data.

:func:`backward_diagram`     one tile of the backward: what stays in SRAM, what streams, the five
                             matmuls (:data:`BACKWARD_MATMULS`), and the two-pass schedule
:func:`backward_widget_frame`, :func:`backward_widget_data`  saved bytes, FLOPs and which program
                             writes which block
:func:`write_matrix`         which program writes which block of dQ, dK, dV, and which blocks
                             several programs write at once
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from flashlib.book.svg import Diagram, size_text
from flashlib.core.checks import check_float_dtype, check_int
from flashlib.studies.backward import SAVE_METHODS, backward_flops, saved_bytes
from flashlib.studies.io_model import BACKWARD_ORDERS, sram_footprint, traffic
from flashlib.studies.tiling import program_accesses

__all__ = ["BACKWARD_MATMULS", "backward_diagram", "backward_widget_frame",
           "backward_widget_data", "write_matrix"]


#: The five matrix products of one tile (i, j) of the backward, in the order of
#: :func:`flashlib.algorithms.flash2_backward` (the two-pass schedule's passes use some of them).
BACKWARD_MATMULS = ("S_ij = τ Q_i K_jᵀ", "dV_j += P_ijᵀ dO_i", "dP_ij = dO_i V_jᵀ",
                    "dQ_i += τ dS_ij K_j", "dK_j += τ dS_ijᵀ Q_i")


def backward_diagram(B_r: int, B_c: int, d: int, itemsize: int) -> Diagram:
    """One tile (i, j) of the backward, for blocks B_r x B_c, head dimension d (= d_v) and
    ``itemsize`` bytes per element: what FlashAttention-2's program for key block j keeps in
    SRAM (K_j, V_j, dK_j, dV_j for the whole loop; Q_i, dO_i, L_i, D_i, dQ_i streaming in; two
    B_r x B_c tiles), its five matmuls, and dQ_i read and written back to HBM every tile; then
    the two-pass schedule's programs.  Sizes from
    :func:`flashlib.studies.io_model.sram_footprint`."""

    held = sram_footprint("backward", B_r, B_c, d)
    total = sum(held.values()) * itemsize
    tile = B_r * B_c * itemsize
    alt = (f"Two panels. FlashAttention-2's backward, one tile: HBM holds Q, K, V, dO, L, D "
           f"and the gradients dQ, dK, dV. The program of key block j keeps K_j, V_j, dK_j "
           f"and dV_j in SRAM for its whole loop, loads Q_i, dO_i, L_i, D_i and dQ_i for each "
           f"query block, computes two {B_r} by {B_c} tiles (P_ij, then dP_ij turned into "
           f"dS_ij) with five matrix products, and writes dQ_i back to HBM after every tile. "
           f"{size_text(total)} in SRAM in all. The two-pass schedule: pass 1, one program per "
           f"key block, four products, writes dK_j and dV_j; pass 2, one program per query "
           f"block, three products, writes dQ_i once.")
    caption = (f"One tile of the backward at B_r = {B_r}, B_c = {B_c}, d = {d}, {itemsize} "
               f"bytes per number: {size_text(total)} on chip, five matmuls, and in "
               "FlashAttention-2 dQ_i goes back to HBM after every tile.")
    dg = Diagram(560, alt=alt, caption=caption)
    dg.text(0, 14, "FlashAttention-2: the program of key block j", bold=True, size=13)
    dg.box(0, 22, 360, 72, "HBM", fill="blue")
    for k, name in enumerate(("Q", "K", "V", "dO", "L", "D")):
        dg.chip(8 + 40 * k, 46, name, w=36)
    dg.chip(252, 46, "dQ", w=32, fill="vermillion")
    dg.chip(288, 46, "dK", w=32, fill="bluish_green")
    dg.chip(324, 46, "dV", w=32, fill="bluish_green")
    dg.arrow(60, 96, 60, 130)
    dg.text(68, 118, "load blocks")
    dg.arrow(268, 130, 268, 96)
    dg.text(260, 118, "dQ_i += …", anchor="end")
    dg.box(0, 132, 360, 196, f"on chip (SRAM, registers): {size_text(total)}", fill="orange")
    dg.text(8, 168, "stay:")
    for k, name in enumerate(("K_j", "V_j", "dK_j", "dV_j")):
        dg.chip(62 + 50 * k, 152, name, w=46, fill="bluish_green")
    dg.text(8, 204, "stream:")
    for k, name in enumerate(("Q_i", "dO_i", "L_i", "D_i", "dQ_i")):
        dg.chip(62 + 50 * k, 188, name, w=46, fill="vermillion" if k == 4 else "sky_blue")
    dg.chip(8, 226, "P_ij", f"{B_r}×{B_c}, {size_text(tile)}", w=168, h=36, fill="yellow")
    dg.chip(184, 226, "dP_ij → dS_ij", f"{B_r}×{B_c}, {size_text(tile)}", w=168, h=36,
            fill="yellow")
    dg.text(8, 282, "P_ij = exp(S_ij − L_i)")
    dg.text(8, 300, "dS_ij = P_ij ∘ (dP_ij − D_i)")
    dg.text(8, 318, "(elementwise, no matmul)", italic=True)
    dg.text(0, 348, "Its five matmuls per tile:", bold=True)
    for k, line in enumerate(BACKWARD_MATMULS):
        dg.text(8 + 176 * (k % 2), 368 + 18 * (k // 2), f"{k + 1}. {line}")
    top = 430
    dg.text(0, top, "Two passes (the Triton tutorial)", bold=True, size=13)
    dg.box(0, top + 8, 176, 100, "pass 1: block j", fill="bluish_green")
    for k, line in enumerate(("stay: K_j, V_j, dK_j, dV_j", "matmuls 1, 2, 3, 5",
                              "writes dK_j, dV_j")):
        dg.text(8, top + 46 + 18 * k, line)
    dg.box(184, top + 8, 176, 100, "pass 2: block i", fill="sky_blue")
    for k, line in enumerate(("stay: Q_i, dO_i, dQ_i", "matmuls 1, 3, 4",
                              "writes dQ_i once")):
        dg.text(192, top + 46 + 18 * k, line)
    return dg


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
