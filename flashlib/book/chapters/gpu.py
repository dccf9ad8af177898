"""The GPU chapter's launch grid, as a diagram and as the widget's table
(``flashlib/book/js/launch_grid.js``), both from :mod:`flashlib.gpu.grid` (no torch or triton
needed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from flashlib.book.plots import OKABE_ITO
from flashlib.book.svg import Diagram, fmt
from flashlib.core.checks import check_int
from flashlib.gpu.grid import FULL, MASKED, SKIPPED, cdiv, key_block_end, tile_counts, tile_map

__all__ = ["launch_grid_diagram", "launch_grid_widget_data"]


def launch_grid_diagram(n: int, B_r: int, B_c: int, causal: bool, program: int) -> Diagram:
    """The forward kernel's launch grid for one batch x head at sequence length n: one row per
    program (query block of B_r rows), one column per key tile of B_c keys, each cell skipped,
    full or masked (:func:`flashlib.gpu.grid.tile_map`), and what program ``program`` keeps
    where.  ``program`` counts from 0, as the code does; the diagram numbers the programs from
    1, as the reader counts blocks (``program=5`` is program 6).  Needs no torch or triton."""

    tiles = tile_map(n, n, B_r, B_c, causal)
    rows, cols = tiles.shape
    if not 0 <= program < rows:
        raise ValueError(f"program: expected 0 <= program < {rows}, got {program}")
    counts = tile_counts(n, n, B_r, B_c, causal)
    cell = min(16.0, 256 / cols, 160 / rows)
    x0, y0 = 78.0, 44.0
    grid_h = rows * cell
    visits = int(np.count_nonzero(tiles[program]))
    alt = (f"A grid of {rows} rows, the programs, by {cols} columns, the key tiles, for n = {n}"
           f" and tiles of {B_r} by {B_c}{', causal' if causal else ''}: "
           f"{counts['visited']} of {counts['all']} tiles are visited, {counts['masked']} of "
           f"them masked, {counts['skipped']} skipped above the diagonal. Program "
           f"{program + 1} is "
           f"highlighted: it loads its Q_i once, streams {visits} K_j, V_j tiles, keeps m_i, l_i "
           "and acc in registers and writes O_i and L_i once.")
    caption = (f"The launch grid at n = {n}, B_r × B_c = {B_r} × {B_c}"
               f"{', causal' if causal else ''}: the GPU runs all the rows at once; each row is "
               "the inner loop of flash2_forward.")
    dg = Diagram(y0 + grid_h + 122, alt=alt, caption=caption)
    dg.text(x0, 14, "key tiles K_j, V_j (j →)", bold=True)
    dg.text(0, 14, "programs", bold=True)
    dg.text(0, 30, "(i ↓)")
    fills = {FULL: OKABE_ITO["blue"], MASKED: OKABE_ITO["orange"]}
    for i in range(rows):
        dg.text(x0 - 8, y0 + (i + 0.5) * cell + 4, str(i + 1), anchor="end")  # from 1
        for j in range(cols):
            code = int(tiles[i, j])
            dg.element("rect", x=fmt(x0 + j * cell + 1), y=fmt(y0 + i * cell + 1),
                   width=fmt(cell - 2), height=fmt(cell - 2), rx=2,
                   fill=fills.get(code, "none"), fill_opacity=0.55 if code != SKIPPED else None,
                   stroke="currentColor" if code == SKIPPED else fills[code],
                   stroke_width=0.6, stroke_opacity=0.45 if code == SKIPPED else None)
    dg.element("rect", x=fmt(x0 - 2), y=fmt(y0 + program * cell - 1), width=fmt(cols * cell + 4),
           height=fmt(cell + 2), rx=3, fill="none", stroke="currentColor", stroke_width=2.2)
    top = y0 + grid_h + 22
    for k, (label, fill) in enumerate((("full", "blue"), ("masked", "orange"))):
        x = 84 * k
        dg.element("rect", x=fmt(x), y=fmt(top - 11), width=12, height=12, rx=2,
               fill=OKABE_ITO[fill], fill_opacity=0.55, stroke=OKABE_ITO[fill])
        dg.text(x + 17, top, label)
    dg.element("rect", x="184", y=fmt(top - 11), width=12, height=12, rx=2, fill="none",
           stroke="currentColor", stroke_width=0.6, stroke_opacity=0.45)
    dg.text(201, top, "skipped")
    lines = (f"Program {program + 1} (framed): Q_i loaded once;",
             f"{visits} K_j, V_j tiles streamed through;",
             "m_i, l_i, acc kept in registers;",
             "O_i and L_i written once, at the end.")
    for k, line in enumerate(lines):
        dg.text(0, top + 24 + 18 * k, line, italic=k > 0)
    return dg


def launch_grid_widget_data(n_values: Iterable[int], B_r_values: Iterable[int],
                            B_c_values: Iterable[int], *, d: int = 64) -> dict[str, Any]:
    """The launch-grid widget's table (flashlib/book/js/launch_grid.js), JSON-able: for each
    n (= n_q = n_k), B_r, B_c and mask, keyed "n-B_r-B_c-causal" (causal "on"/"off"), the key
    where each program's loop stops (:func:`flashlib.gpu.grid.key_block_end`); program p
    reads rows p B_r .. min(n, (p + 1) B_r) - 1 of Q, keys 0 .. stop - 1 of K and V in tiles
    of B_c, and writes its rows of O and L.  ``d``: the head dim the bytes are counted for."""

    n_values, B_r_values, B_c_values = list(n_values), list(B_r_values), list(B_c_values)
    configs = {}
    for n in n_values:
        for B_r in B_r_values:
            for B_c in B_c_values:
                for mask in ("off", "on"):
                    configs[f"{n}-{B_r}-{B_c}-{mask}"] = [
                        key_block_end(p, B_r, n, mask == "on") for p in range(cdiv(n, B_r))]
    return {"d": check_int(d, "d", minimum=1), "configs": configs}
