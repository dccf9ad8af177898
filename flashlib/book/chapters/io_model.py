"""The IO-model chapter's diagram and widget table.

:func:`hierarchy_diagram`  the memory hierarchy (the FlashAttention paper's Section 2.1)
:func:`io_widget_data`     the widget's table (``flashlib/book/js/io_model.js``): modelled and
                           counted traffic per (N, d, M)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flashlib.book.svg import Diagram, size_text
from flashlib.studies.io_model import (
    block_sizes,
    minimum_traffic,
    sram_footprint,
    traffic,
)
from flashlib.studies.tiling import ORDERS, count_io

__all__ = ["hierarchy_diagram", "io_widget_data"]


def hierarchy_diagram(hbm_bytes: tuple[float, float], hbm_bandwidth: tuple[float, float],
                      sram_per_sm: int, sms: int, sram_bandwidth: float) -> Diagram:
    """The memory hierarchy of the IO-model chapter (the FlashAttention paper's Section 2.1):
    HBM of ``hbm_bytes`` (low, high) at ``hbm_bandwidth`` (low, high) bytes/s above ``sms``
    SMs with ``sram_per_sm`` bytes of SRAM each, at ``sram_bandwidth`` bytes/s in all."""
    total_sram = sram_per_sm * sms
    gb = [f"{b / 1e9:g}" for b in hbm_bytes]
    tbs = [f"{b / 1e12:g}" for b in hbm_bandwidth]
    ratio = hbm_bytes[0] / total_sram
    speed = [sram_bandwidth / b for b in hbm_bandwidth[::-1]]
    alt = (f"Two memories stacked. Top: HBM, {gb[0]} to {gb[1]} GB, read and written at "
           f"{tbs[0]} to {tbs[1]} TB/s. Bottom: the chip, {sms} streaming multiprocessors "
           f"each with {sram_per_sm // 1024} KiB of shared memory, "
           f"{size_text(total_sram)} in all, at about {sram_bandwidth / 1e12:g} TB/s. HBM is "
           f"about {ratio:,.0f} times larger; shared memory about {speed[0]:.0f} to "
           f"{speed[1]:.0f} times faster.")
    caption = (f"The A100's memories: HBM as the FlashAttention paper gives it, "
               f"{sram_per_sm // 1024} KiB of shared memory per SM as NVIDIA's Ampere tuning "
               f"guide gives it (the paper's 192 KB include the L1 cache). HBM is "
               f"{ratio:,.0f}× larger than all the shared memory together, which is "
               f"{speed[0]:.0f}-{speed[1]:.0f}× faster.")
    dg = Diagram(250, alt=alt, caption=caption)
    dg.box(0, 0, 360, 70, "HBM (off chip): large, slow", fill="blue")
    dg.text(8, 40, f"{gb[0]}-{gb[1]} GB: Q, K, V, O (and S, P")
    dg.text(8, 58, "for standard attention)")
    dg.arrow(110, 74, 110, 122)
    dg.arrow(130, 122, 130, 74)
    dg.text(142, 103, f"read, write: {tbs[0]}-{tbs[1]} TB/s", italic=True)
    dg.box(0, 126, 360, 124, f"GPU chip: {sms} SMs", fill="orange")
    for k, name in enumerate(("SM 1", "SM 2", "SM 3")):
        dg.chip(8 + 66 * k, 150, name, f"{sram_per_sm // 1024} KiB", w=60, h=36,
                fill="orange")
    dg.text(208, 173, "...")
    dg.chip(230, 150, f"SM {sms}", f"{sram_per_sm // 1024} KiB", w=60, h=36, fill="orange")
    dg.text(8, 212, f"shared memory: {size_text(total_sram)} in all, about "
                    f"{sram_bandwidth / 1e12:g} TB/s")
    dg.text(8, 234, "the tiles Q_i, K_j, V_j (S_ij: registers)")
    return dg


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
