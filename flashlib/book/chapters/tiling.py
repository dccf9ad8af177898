"""The Tiling chapter's diagram and widget data, both read from the event log of the teaching
functions run on a counting memory (:func:`flashlib.studies.tiling.run_counted`).

:func:`tiling_diagram`      the two loop orders at one tile: what SRAM holds, what is written
:func:`tiling_frames`      the tiling widget (``flashlib/book/js/tiling.js``): one entry per
                            step of a teaching function's run
:func:`tiling_widget_data`  :func:`tiling_frames` for every setting of the sliders
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from flashlib.book.plots import OKABE_ITO
from flashlib.book.svg import Diagram, fmt
from flashlib.core.checks import check_int
from flashlib.core.hbm import Event
from flashlib.studies.tiling import (
    ARRAY_ORDER,
    ORDERS,
    check_order_name,
    random_problem,
    run_counted,
)

__all__ = ["tiling_diagram", "tiling_frames", "tiling_widget_data"]


def _tile_step(order: str, B_r: int, B_c: int, T: int, tile: tuple[int, int]
               ) -> tuple[list[tuple[int, int]], tuple[tuple[str, int | None], ...], list[str]]:
    """Run ``order`` on a T B_r x T B_c problem with a counting memory; return the tiles in
    the order computed (0-based, as the code counts), what SRAM holds during ``tile`` (from
    the log's ``held``) and the blocks written to HBM between ``tile`` and the next one, these
    two with their blocks counted from 1, as the reader sees them."""

    log = run_counted(order, *random_problem(T * B_r, T * B_c, 2), B_r, B_c).mem.log
    tiles = [(e.i, e.j) for e in log if e.op == "tile"]
    at = next(k for k, e in enumerate(log) if e.op == "tile" and (e.i, e.j) == tile)
    # on-chip arrays are logged by their names ("O_i"), blocks by array and 0-based index
    # ("O", 1); the reader sees blocks counted from 1, as in the papers ("O_2")
    held = tuple((name.removesuffix("_i"), None if b is None else b + 1)
                 for name, b in log[at].held)
    writes = []
    for e in log[at + 1:]:
        if e.op == "tile":
            break
        if e.op == "write":
            writes.append(f"{e.name}_{e.i + 1}")
    return tiles, held, writes


def tiling_diagram(B_r: int = 2, B_c: int = 2, T: int = 4, tile: tuple[int, int] = (1, 2)
                   ) -> Diagram:
    """The two loop orders at one tile (i, j) of a T x T grid of B_r x B_c score tiles: the
    tiles already computed, what SRAM holds during the tile and what goes back to HBM after it,
    each read from the event log of the teaching function run on a counting memory
    (:func:`flashlib.studies.tiling.run_counted`): Algorithm 1 ("v1") above, FlashAttention-2
    ("v2") below. ``tile`` counts from 0, as the code does; the diagram, its alt text and its
    caption count blocks from 1, as the papers' boxes do (``tile=(1, 2)`` is tile (2, 3))."""
    if not (0 <= tile[0] < T and 0 <= tile[1] < T):
        raise ValueError(f"tile: expected (i, j) with 0 <= i, j < T = {T}, got {tile}")
    i, j = tile[0] + 1, tile[1] + 1  # as the reader counts
    panels = []
    for order, title, loop in (
            ("v1", "Algorithm 1 (FlashAttention)", "outer loop: K_j, V_j; inner: Q_i"),
            ("v2", "FlashAttention-2", "outer loop: Q_i; inner: K_j, V_j")):
        tiles, held, writes = _tile_step(order, B_r, B_c, T, tile)
        panels.append((order, title, loop, tiles, held, writes))
    v1_writes, v2_writes = panels[0][5], panels[1][5]
    alt = (f"Two panels, a {T} by {T} grid of score tiles at tile ({i}, {j}). Algorithm 1 "
           f"sweeps the grid column by column; during the tile SRAM holds "
           f"{', '.join(f'{a}_{b}' if b is not None else a for a, b in panels[0][4])}, and "
           f"afterwards it writes {', '.join(v1_writes) or 'nothing'} back to HBM. "
           f"FlashAttention-2 sweeps row by row; SRAM holds "
           f"{', '.join(f'{a}_{b}' if b is not None else a for a, b in panels[1][4])}, and it "
           f"writes {', '.join(v2_writes) or 'nothing'} after this tile: O_{i} and L_{i} go "
           f"to HBM once, after the row's last tile.")
    caption = (f"One step, tile ({i}, {j}) (blocks counted from 1, as in the boxes), of each "
               "loop order, read from the event log of the teaching functions: Algorithm 1 "
               "writes O_i, l_i, m_i back after every tile; FlashAttention-2 keeps them on chip "
               "until its row of tiles is done.")
    dg = Diagram(2 * 200 + 8, alt=alt, caption=caption)
    cell = 26
    for p, (_order, title, loop, tiles, held, writes) in enumerate(panels):
        top = 200 * p
        dg.text(0, top + 14, title, bold=True, size=13)
        dg.text(0, top + 30, loop)
        gx, gy = 20, top + 56
        dg.text(gx + T * cell / 2, gy - 8, "key blocks j →", anchor="middle")
        dg.text(gx - 6, gy + T * cell / 2, "i", anchor="end")
        done = set(tiles[: tiles.index(tile)])
        for r in range(T):
            for c in range(T):
                current = (r, c) == tile
                fill = "orange" if current else "sky_blue" if (r, c) in done else None
                dg.element("rect", x=fmt(gx + c * cell), y=fmt(gy + r * cell), width=cell,
                       height=cell, fill=OKABE_ITO[fill] if fill else "none",
                       fill_opacity=0.9 if current else 0.4 if fill else None,
                       stroke="currentColor", stroke_width=0.8)
        dg.box(140, top + 40, 220, 96, "SRAM during this tile", fill="orange")
        names = [f"{a}_{b}" if b is not None else "S_ij" for a, b in held]
        for k, name in enumerate(names):
            dg.chip(148 + 52 * (k % 4), top + 64 + 30 * (k // 4), name,
                    w=46, fill="vermillion" if name == "S_ij" else "sky_blue")
        after = ", ".join(writes) if writes else "nothing"
        dg.box(140, top + 142, 220, 40, "", fill="blue")
        dg.text(148, top + 158, "then written to HBM:", bold=True)
        dg.text(148, top + 175, after if writes else f"nothing (O_{i}, L_{i} after j = {T})")
    dg.text(0, 402, "blue: tiles computed before; orange: the tile now")
    return dg


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
    moved = mem.traffic
    arrays = [a for a in ARRAY_ORDER if a in moved.reads or a in moved.writes]

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
