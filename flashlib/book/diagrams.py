"""Diagrams drawn by the book as inline SVG: crisp at any width, a few kilobytes, no JavaScript.

A diagram is a small picture of an idea (which arrays live in fast memory, which go to slow
memory), not a plot of data. It is built in Python from the numbers flashlib computes, shown
by a hidden cell as the cell's last expression (an ``<svg>`` inside a ``<figure>`` with a
caption), and renders the same on the website, in JupyterLab and on Colab.

Style (every diagram of the book):

- a ``viewBox`` :data:`WIDTH` (360) units wide, text at 12 units and up: on a 390 px phone the
  diagram is shown about 358 px wide, so text stays about 12 px; on a desktop at most 30rem;
- text and strokes in ``currentColor`` (readable in the theme's light and dark modes), fills
  from the Okabe-Ito palette (:data:`flashlib.book.plots.OKABE_ITO`) at partial opacity;
- panels stacked vertically, never side by side;
- ``role="img"`` with the alt text as ``aria-label`` and ``<title>``; a caption under it.

    from flashlib.book.diagrams import Diagram
    dg = Diagram(height=120, alt="...", caption="...")
    dg.box(0, 0, 150, 100, "HBM (slow)")
    dg.chip(10, 30, "S", "n x n", fill="vermillion")
    dg.arrow(160, 50, 200, 50, "write")
    dg                                  # last expression of a cell

:func:`memory_diagram` is the Introduction's picture (the FlashAttention paper's Figure 1
idea, drawn here): what standard attention and FlashAttention keep where;
:func:`precision_diagram` is the Precision chapter's: in which format each number is kept;
:func:`launch_grid_diagram` is the GPU chapter's: the Triton kernel's programs and the key
tiles each one visits (:func:`flashlib.gpu.grid.tile_map`); :func:`fa3_schedule_diagram` is
Beyond's: FlashAttention-3's schedules as timelines (:func:`flashlib.studies.beyond.fa3_timeline`).
"""

from __future__ import annotations

import html
import re
from typing import Any

import numpy as np

from flashlib.book.plots import OKABE_ITO, check_alt
from flashlib.studies.beyond import fa3_timeline

__all__ = ["Diagram", "memory_diagram", "softmax_passes_diagram", "merge_diagram",
           "tiling_diagram", "ladder_diagram", "backward_diagram", "BACKWARD_MATMULS",
           "precision_diagram", "launch_grid_diagram", "hierarchy_diagram", "split_kv_diagram",
           "fa3_schedule_diagram", "WIDTH"]

#: Width of every diagram's viewBox, in SVG units (about pixels on a phone).
WIDTH = 360


def _fmt(value: float) -> str:
    return f"{value:g}"


class Diagram:
    """An inline SVG diagram (see the module docstring); display it as a cell's last value."""

    def __init__(self, height: float, *, alt: str, caption: str, width: float = WIDTH):
        check_alt(alt)
        if not isinstance(caption, str) or not caption.strip():
            raise ValueError("caption: expected one line under the diagram")
        self.width, self.height = width, height
        self.alt, self.caption = alt, caption
        self.parts: list[str] = []

    @staticmethod
    def _tag(tag: str, content: str = "", **attrs: Any) -> str:
        text = " ".join(f'{k.rstrip("_").replace("_", "-")}="{html.escape(str(v))}"'
                        for k, v in attrs.items() if v is not None)
        return f"<{tag} {text}>{content}</{tag}>"

    def _el(self, tag: str, content: str = "", **attrs: Any) -> None:
        self.parts.append(self._tag(tag, content, **attrs))

    def text(self, x: float, y: float, text: str, *, size: float = 12, bold: bool = False,
             anchor: str = "start", italic: bool = False) -> None:
        """Text whose baseline starts (``anchor``: start, middle, end) at (x, y); ``A_ij``
        is written A with the subscript ij (at 0.8 of the size)."""
        if size < 12:
            raise ValueError(f"size: text below 12 units is illegible on a phone, got {size}")
        content = re.sub(
            r"([A-Za-z])_([a-z0-9]+)",
            lambda m: (f'{m[1]}<tspan baseline-shift="sub" font-size="{_fmt(0.8 * size)}">'
                       f"{m[2]}</tspan>"),
            html.escape(text))
        self.parts.append(self._tag(
            "text", content, x=_fmt(x), y=_fmt(y), font_size=_fmt(size),
            font_weight="bold" if bold else None, text_anchor=anchor,
            font_style="italic" if italic else None))

    def box(self, x: float, y: float, w: float, h: float, title: str = "", *,
            fill: str | None = None, dashed: bool = False) -> None:
        """A rounded frame (a memory), its title inside at the top left."""
        self._el("rect", x=_fmt(x), y=_fmt(y), width=_fmt(w), height=_fmt(h), rx=6,
                 fill=OKABE_ITO[fill] if fill else "none", fill_opacity=0.12 if fill else None,
                 stroke="currentColor", stroke_width=1.2,
                 stroke_dasharray="4 3" if dashed else None)
        if title:
            self.text(x + 8, y + 17, title, bold=True)

    def chip(self, x: float, y: float, name: str, note: str = "", *, w: float = 40,
             h: float = 24, fill: str = "sky_blue") -> None:
        """An array: a filled rectangle with its name (and a note below the name)."""
        self._el("rect", x=_fmt(x), y=_fmt(y), width=_fmt(w), height=_fmt(h), rx=3,
                 fill=OKABE_ITO[fill], fill_opacity=0.35, stroke=OKABE_ITO[fill],
                 stroke_width=1.2)
        mid = x + w / 2
        if note:
            self.text(mid, y + h / 2 - 2, name, anchor="middle", bold=True)
            self.text(mid, y + h / 2 + 13, note, anchor="middle")
        else:
            self.text(mid, y + h / 2 + 4, name, anchor="middle", bold=True)

    def arrow(self, x1: float, y1: float, x2: float, y2: float, label: str = "", *,
              label_y: float | None = None) -> None:
        """An arrow from (x1, y1) to (x2, y2), its label above its middle."""
        self._el("line", x1=_fmt(x1), y1=_fmt(y1), x2=_fmt(x2), y2=_fmt(y2),
                 stroke="currentColor", stroke_width=1.5, marker_end="url(#flashlib-arrow)")
        if label:
            ly = (y1 + y2) / 2 - 6 if label_y is None else label_y
            self.text((x1 + x2) / 2, ly, label, anchor="middle", italic=True)

    def svg(self) -> str:
        marker = ('<defs><marker id="flashlib-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
                  'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                  '<path d="M0,0 L10,5 L0,10 z" fill="currentColor"/></marker></defs>')
        alt = html.escape(self.alt)
        return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_fmt(self.width)} '
                f'{_fmt(self.height)}" role="img" aria-label="{alt}" fill="currentColor" '
                f'font-family="sans-serif" style="max-width:30rem;height:auto">'
                f'<title>{alt}</title>{marker}'
                f'{"".join(self.parts)}</svg>')

    def _repr_html_(self) -> str:
        return (f'<figure class="flashlib-diagram">{self.svg()}'
                f'<figcaption class="flashlib-caption">{html.escape(self.caption)}'
                "</figcaption></figure>")

    def __repr__(self) -> str:
        return f"<diagram: {self.alt}>"


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def memory_diagram(n: int, d: int, B: int, itemsize: int) -> Diagram:
    """What lives where, for n rows of head dimension d, blocks B_r = B_c = B and ``itemsize``
    bytes per element: standard attention (Algorithm 0) writes the n x n matrices S and P to
    HBM; FlashAttention keeps one step's blocks (Q_i, K_j, V_j, the tile S_ij, O_i, m_i, l_i)
    in SRAM and writes only O and L to HBM."""
    matrix, tile, block = n * n * itemsize, B * B * itemsize, B * d * itemsize
    alt = (f"Two panels. Standard attention: HBM holds Q, K, V, O and the n by n matrices S "
           f"and P ({_size(matrix)} each at n = {n}), which go back and forth to the chip. "
           f"FlashAttention: HBM holds only Q, K, V, O and L; SRAM holds the blocks Q_i, K_j, "
           f"V_j, O_i ({_size(block)} each at B = {B}) and one {B} by {B} tile S_ij "
           f"({_size(tile)}), which never leaves the chip.")
    caption = (f"What lives where, at n = {n}, d = {d}, blocks of {B} rows and {itemsize} bytes "
               "per number: FlashAttention never writes an n × n matrix to HBM.")
    dg = Diagram(352, alt=alt, caption=caption)
    for top, title, flash in ((0, "Standard attention (Algorithm 0)", False),
                              (180, "FlashAttention", True)):
        dg.text(0, top + 14, title, bold=True, size=13)
        dg.box(0, top + 22, 190, 130, "HBM (large, slow)", fill="blue")
        dg.box(240, top + 22, 120, 130, "SRAM (fast)", fill="orange")
        for k, name in enumerate(("Q", "K", "V", "O")):
            dg.chip(8 + 45 * k, top + 30 + 18, name, w=39)
        if not flash:
            dg.chip(8, top + 80, "S", f"n×n, {_size(matrix)}", w=84, h=36, fill="vermillion")
            dg.chip(98, top + 80, "P", f"n×n, {_size(matrix)}", w=84, h=36, fill="vermillion")
            dg.text(8, top + 138, "written, then read back")
            for k, line in enumerate(("one block at a", "time passes", "through; nothing",
                                      "stays")):
                dg.text(248, top + 62 + 16 * k, line)
            summary = "read Q, K, S, P, V; write S, P, O"
        else:
            dg.chip(8, top + 80, "L", w=39)
            dg.text(56, top + 97, "no S, no P")
            for k, name in enumerate(("Q_i", "K_j", "V_j")):
                dg.chip(245 + 38 * k, top + 48, name, w=34)
            # the tile's name and its size on lines of their own: S_ij's subscript would
            # otherwise run into the size below it
            dg.chip(245, top + 76, "", w=110, h=40, fill="orange")
            dg.text(300, top + 91, "S_ij", anchor="middle", bold=True)
            dg.text(300, top + 110, f"{B}×{B}, {_size(tile)}", anchor="middle")
            for x, name in ((245, "O_i"), (283, "m_i"), (321, "l_i")):
                dg.chip(x, top + 120, name, w=34)
            summary = "read Q_i, K_j, V_j; write O_i and L_i once"
        dg.arrow(192, top + 104, 238, top + 104, "read", label_y=top + 98)
        dg.arrow(238, top + 134, 192, top + 134, "write", label_y=top + 128)
        dg.text(0, top + 170, summary, italic=True)
    return dg


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
    from flashlib.studies.io_model import sram_footprint

    held = sram_footprint("backward", B_r, B_c, d)
    total = sum(held.values()) * itemsize
    tile = B_r * B_c * itemsize
    alt = (f"Two panels. FlashAttention-2's backward, one tile: HBM holds Q, K, V, dO, L, D "
           f"and the gradients dQ, dK, dV. The program of key block j keeps K_j, V_j, dK_j "
           f"and dV_j in SRAM for its whole loop, loads Q_i, dO_i, L_i, D_i and dQ_i for each "
           f"query block, computes two {B_r} by {B_c} tiles (P_ij, then dP_ij turned into "
           f"dS_ij) with five matrix products, and writes dQ_i back to HBM after every tile. "
           f"{_size(total)} in SRAM in all. The two-pass schedule: pass 1, one program per "
           f"key block, four products, writes dK_j and dV_j; pass 2, one program per query "
           f"block, three products, writes dQ_i once.")
    caption = (f"One tile of the backward at B_r = {B_r}, B_c = {B_c}, d = {d}, {itemsize} "
               f"bytes per number: {_size(total)} on chip, five matmuls, and in FlashAttention-2 "
               "dQ_i goes back to HBM after every tile.")
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
    dg.box(0, 132, 360, 196, f"SRAM: {_size(total)}", fill="orange")
    dg.text(8, 168, "stay:")
    for k, name in enumerate(("K_j", "V_j", "dK_j", "dV_j")):
        dg.chip(62 + 50 * k, 152, name, w=46, fill="bluish_green")
    dg.text(8, 204, "stream:")
    for k, name in enumerate(("Q_i", "dO_i", "L_i", "D_i", "dQ_i")):
        dg.chip(62 + 50 * k, 188, name, w=46, fill="vermillion" if k == 4 else "sky_blue")
    dg.chip(8, 226, "P_ij", f"{B_r}×{B_c}, {_size(tile)}", w=168, h=36, fill="yellow")
    dg.chip(184, 226, "dP_ij → dS_ij", f"{B_r}×{B_c}, {_size(tile)}", w=168, h=36,
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


_SHORT = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
          "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def precision_diagram(kept: dict[str, str]) -> Diagram:
    """In which format a FlashAttention-2 kernel keeps each number: ``kept`` maps the cast
    points of :class:`flashlib.studies.precision.Casts` (inputs, S, P, acc, m, l, O, compute) to
    dtype names, e.g. ``dataclasses.asdict(Casts.flash("bfloat16"))``.  HBM holds Q, K, V and O in
    their formats; on chip, the tile S_ij, m_i, l_i and the accumulator O_i stay in theirs, and
    the unnormalised P_ij is rounded to ``kept["P"]`` just before the P V matmul."""
    missing = {"inputs", "S", "P", "acc", "m", "l", "O"} - set(kept)
    if missing:
        raise ValueError(f"kept: missing cast points {sorted(missing)}")
    short = {k: _SHORT.get(v, v) for k, v in kept.items()}
    alt = (f"Two stacked boxes. HBM holds Q, K and V in {kept['inputs']} and the output O in "
           f"{kept['O']}. On chip, the tile of scores S_ij is kept in {kept['S']}, the running "
           f"maximum m_i in {kept['m']}, the running sum l_i in {kept['l']} and the output "
           f"accumulator O_i in {kept['acc']}; the unnormalised probabilities P_ij are rounded to "
           f"{kept['P']} just before the P V matrix product.")
    caption = ("Where the rounding happens: loading Q, K, V, rounding P before P V, and "
               "writing O; the sums that outgrow their terms, l and the accumulator, never "
               "leave a wide format.")
    dg = Diagram(312, alt=alt, caption=caption)

    def labelled(x: float, y: float, name: str, note: str, w: float, fill: str) -> None:
        dg.chip(x, y, "", w=w, h=44, fill=fill)  # name and note spaced for subscripts
        dg.text(x + w / 2, y + 17, name, anchor="middle", bold=True)
        dg.text(x + w / 2, y + 37, note, anchor="middle")

    dg.box(0, 0, 360, 78, "HBM (stored)", fill="blue")
    for k, name in enumerate(("Q", "K", "V")):
        labelled(8 + 52 * k, 26, name, short["inputs"], 46, "sky_blue")
    labelled(300, 26, "O", short["O"], 52, "sky_blue")
    dg.arrow(80, 80, 80, 118)
    dg.text(88, 104, "load", italic=True)
    dg.arrow(326, 118, 326, 80)
    dg.text(318, 104, "write O_i / l_i", anchor="end", italic=True)
    dg.box(0, 120, 360, 192, "On chip (registers and SRAM)", fill="orange")
    labelled(8, 146, "S_ij", f"{short['S']} (QK^T in {short.get('compute', 'fp32')})", 166,
             "orange")
    labelled(186, 146, "P_ij", f"rounded to {short['P']}", 166, "vermillion")
    for k, (name, point) in enumerate((("m_i", "m"), ("l_i", "l"), ("O_i", "acc"))):
        labelled(8 + 118 * k, 202, name, short[point], 110, "bluish_green")
    dg.text(8, 270, "O_i += P_ij V_j: products exact,", italic=True)
    dg.text(8, 290, f"sums kept in {short['acc']}; l_i likewise ({short['l']})", italic=True)
    return dg


def launch_grid_diagram(n: int, B_r: int, B_c: int, causal: bool, program: int) -> Diagram:
    """The forward kernel's launch grid for one batch x head at sequence length n: one row per
    program (query block of B_r rows), one column per key tile of B_c keys, each cell skipped,
    full or masked (:func:`flashlib.gpu.grid.tile_map`), and what program ``program`` keeps
    where.  ``program`` counts from 0, as the code does; the diagram numbers the programs from
    1, as the reader counts blocks (``program=5`` is program 6).  Needs no torch or triton."""
    from flashlib.gpu.grid import FULL, MASKED, SKIPPED, tile_counts, tile_map

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
            dg._el("rect", x=_fmt(x0 + j * cell + 1), y=_fmt(y0 + i * cell + 1),
                   width=_fmt(cell - 2), height=_fmt(cell - 2), rx=2,
                   fill=fills.get(code, "none"), fill_opacity=0.55 if code != SKIPPED else None,
                   stroke="currentColor" if code == SKIPPED else fills[code],
                   stroke_width=0.6, stroke_opacity=0.45 if code == SKIPPED else None)
    dg._el("rect", x=_fmt(x0 - 2), y=_fmt(y0 + program * cell - 1), width=_fmt(cols * cell + 4),
           height=_fmt(cell + 2), rx=3, fill="none", stroke="currentColor", stroke_width=2.2)
    top = y0 + grid_h + 22
    for k, (label, fill) in enumerate((("full", "blue"), ("masked", "orange"))):
        x = 84 * k
        dg._el("rect", x=_fmt(x), y=_fmt(top - 11), width=12, height=12, rx=2,
               fill=OKABE_ITO[fill], fill_opacity=0.55, stroke=OKABE_ITO[fill])
        dg.text(x + 17, top, label)
    dg._el("rect", x="184", y=_fmt(top - 11), width=12, height=12, rx=2, fill="none",
           stroke="currentColor", stroke_width=0.6, stroke_opacity=0.45)
    dg.text(201, top, "skipped")
    lines = (f"Program {program + 1} (framed): Q_i loaded once;",
             f"{visits} K_j, V_j tiles streamed through;",
             "m_i, l_i, acc kept in registers;",
             "O_i and L_i written once, at the end.")
    for k, line in enumerate(lines):
        dg.text(0, top + 24 + 18 * k, line, italic=k > 0)
    return dg


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
           f"each with {sram_per_sm // 1024} KB of SRAM, {_size(total_sram)} in all, at about "
           f"{sram_bandwidth / 1e12:g} TB/s. HBM is about {ratio:,.0f} times larger; SRAM "
           f"about {speed[0]:.0f} to {speed[1]:.0f} times faster.")
    caption = (f"The A100's memories as the FlashAttention paper gives them: HBM is "
               f"{ratio:,.0f}× larger than all the SRAM together, SRAM {speed[0]:.0f}-"
               f"{speed[1]:.0f}× faster.")
    dg = Diagram(250, alt=alt, caption=caption)
    dg.box(0, 0, 360, 70, "HBM (off chip): large, slow", fill="blue")
    dg.text(8, 40, f"{gb[0]}-{gb[1]} GB: Q, K, V, O (and S, P")
    dg.text(8, 58, "for standard attention)")
    dg.arrow(110, 74, 110, 122)
    dg.arrow(130, 122, 130, 74)
    dg.text(142, 103, f"read, write: {tbs[0]}-{tbs[1]} TB/s", italic=True)
    dg.box(0, 126, 360, 124, f"GPU chip: {sms} SMs", fill="orange")
    for k, name in enumerate(("SM 1", "SM 2", "SM 3")):
        dg.chip(8 + 66 * k, 150, name, f"{sram_per_sm // 1024} KB", w=60, h=36,
                fill="orange")
    dg.text(208, 173, "...")
    dg.chip(230, 150, f"SM {sms}", f"{sram_per_sm // 1024} KB", w=60, h=36, fill="orange")
    dg.text(8, 212, f"SRAM: {_size(total_sram)} in all, about "
                    f"{sram_bandwidth / 1e12:g} TB/s")
    dg.text(8, 234, "the blocks Q_i, K_j, V_j and the tile S_ij")
    return dg


def softmax_passes_diagram(n: int, itemsize: int) -> Diagram:
    """The safe softmax of one row of ``n`` scores of ``itemsize`` bytes: three passes over the
    row in memory (the maximum m, the sum l, then the probabilities p), and the two numbers the
    chip keeps between them."""
    row = _size(n * itemsize)
    alt = (f"A row x of n = {n} scores ({row}) lives in memory. Pass 1 reads all of it to find "
           "the maximum m; pass 2 reads all of it again to sum exp(x - m) into l; pass 3 reads "
           "it a third time and writes the probabilities p = exp(x - m) / l. Only m and l stay "
           "on the chip between the passes.")
    caption = (f"The safe softmax reads a row of n = {n} scores ({row}) three times; the chip "
               "keeps only m and l between the passes.")
    dg = Diagram(196, alt=alt, caption=caption)
    dg.box(0, 0, 170, 170, "memory (large, slow)", fill="blue")
    dg.box(250, 0, 110, 170, "chip (fast)", fill="orange")
    dg.chip(10, 30, "x", f"n scores, {row}", w=150, h=36, fill="vermillion")
    dg.chip(10, 120, "p", f"n probabilities, {row}", w=150, h=36, fill="vermillion")
    dg.chip(270, 36, "m", "max", w=70, h=36)
    dg.chip(270, 84, "l", "sum", w=70, h=36)
    dg.arrow(162, 54, 268, 54, "1: max of x", label_y=48)
    dg.arrow(162, 98, 268, 98, "2: sum e^(x-m)", label_y=92)
    dg.arrow(268, 142, 162, 142, "3: e^(x-m) / l", label_y=136)
    dg.text(0, 190, "three reads of x, one write of p", italic=True)
    return dg


def merge_diagram(n_k: int, block: int) -> Diagram:
    """One query row's ``n_k`` keys cut into blocks of ``block``: each block's state (m, l, acc)
    is computed alone, and states merge pairwise, in any order or tree, into the state of all
    the keys, from which o = acc / l."""
    count = -(-n_k // block)
    shown = min(count, 4)
    alt = (f"A row of {n_k} scores and values cut into {count} blocks of {block} keys. Each "
           "block gives its own state: its maximum m, its sum l of exp(s - m) and its "
           "unnormalised output acc. Two states merge into the state of both blocks by "
           "rescaling each to the larger maximum; merging all of them, in any order, gives the "
           "state of the whole row, and the output o = acc / l.")
    caption = (f"{n_k} keys in {count} blocks of {block}: each block's state (m, l, acc) is "
               "computed alone; merges combine them, in any order, into the whole row's.")
    dg = Diagram(236, alt=alt, caption=caption)
    dg.text(0, 14, "one query row: scores s and values v, by blocks", bold=True)
    width = 360 / shown
    for b in range(shown):
        x = b * width
        name = f"block {b + 1}" if b < shown - 1 or count == shown else f"... {count}"
        dg.chip(x + 4, 24, name, f"{block} keys", w=width - 8, h=36, fill="sky_blue")
        dg.arrow(x + width / 2, 62, x + width / 2, 86)
        dg.chip(x + 4, 88, "m, l, acc", w=width - 8, h=28, fill="yellow")
    for pair in range(shown // 2):
        x = pair * 2 * width
        dg.arrow(x + width / 2, 118, x + width - 4, 146)
        dg.arrow(x + 1.5 * width, 118, x + width + 4, 146)
        dg.chip(x + width / 2, 148, "merge", w=width, h=26, fill="orange")
        dg.arrow(x + width, 176, 180 + (pair - 0.5) * 40, 194)
    dg.chip(100, 196, "m, l, acc: all keys", w=160, h=26, fill="bluish_green")
    dg.text(268, 214, "o = acc / l")
    return dg


def ladder_diagram(d: int, B_r: int, B_c: int, d_v: int) -> Diagram:
    """Where the optimisation ladder puts the work of one tile: the stale maximum rides in the
    first matmul ([Q_i, -m_i] [K_j^T; 1] = S_ij - m_i), one exp2 stays outside, and the row sum
    rides in the second (P_ij [V_j | 1] = [P_ij V_j | l])."""
    alt = (f"One tile of the fast rungs. First matmul: the query block with an extra column "
           f"holding minus the running maximum ({B_r} by {d + 1}) times the key block, "
           f"transposed, with an extra row of ones ({d + 1} by {B_c}), gives the scores minus "
           f"the maximum ({B_r} by {B_c}). Then exp2, the only work outside the matmuls. Second "
           f"matmul: the probabilities times the value block with an extra column of ones "
           f"({B_c} by {d_v + 1}) gives P V and the row sums l together.")
    caption = (f"One tile at d = {d}, B_r = {B_r}, B_c = {B_c}: both matmuls carry an extra "
               "row or column, so only exp2 is left outside them.")
    dg = Diagram(214, alt=alt, caption=caption)
    dg.text(0, 14, "1. scores, maximum subtracted, in one matmul", bold=True)
    dg.chip(0, 24, "[Q_i, -m_i]", f"{B_r}×{d + 1}", w=100, h=36, fill="sky_blue")
    dg.text(108, 46, "×")
    dg.chip(122, 24, "[K_j^T; 1]", f"{d + 1}×{B_c}", w=100, h=36, fill="blue")
    dg.text(230, 46, "=")
    dg.chip(246, 24, "S_ij - m_i", f"{B_r}×{B_c}", w=114, h=36, fill="orange")
    dg.text(0, 88, "2. the one pass left outside the matmuls", bold=True)
    dg.chip(246, 96, "exp2 in place", w=114, h=28, fill="vermillion")
    dg.arrow(303, 62, 303, 94)
    dg.text(0, 150, "3. P V and the row sums l in one matmul", bold=True)
    dg.chip(0, 160, "P_ij", f"{B_r}×{B_c}", w=80, h=36, fill="orange")
    dg.text(88, 182, "×")
    dg.chip(102, 160, "[V_j | 1]", f"{B_c}×{d_v + 1}", w=100, h=36, fill="bluish_green")
    dg.text(210, 182, "=")
    dg.chip(226, 160, "[P_ij V_j | l]", f"{B_r}×{d_v + 1}", w=134, h=36, fill="yellow")
    dg.arrow(303, 126, 40, 158)
    return dg


def _tile_step(order: str, B_r: int, B_c: int, T: int, tile: tuple[int, int]
               ) -> tuple[list[tuple[int, int]], tuple[tuple[str, int | None], ...], list[str]]:
    """Run ``order`` on a T B_r x T B_c problem with a counting memory; return the tiles in
    the order computed (0-based, as the code counts), what SRAM holds during ``tile`` (from
    the log's ``held``) and the blocks written to HBM between ``tile`` and the next one, these
    two with their blocks counted from 1, as the reader sees them."""
    from flashlib.studies.tiling import random_problem, run_counted  # lazy: numerics

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
                dg._el("rect", x=_fmt(gx + c * cell), y=_fmt(gy + r * cell), width=cell,
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


def split_kv_diagram(N: int, d: int, n_splits: int, itemsize: int) -> Diagram:
    """Split-KV decoding of one query row against a cache of N keys and values (head dimension
    d, ``itemsize`` bytes per number): ``n_splits`` programs (one per SM) each read q and their
    share of K and V from HBM, write a partial result (O_s, L_s), and a merge combines them."""
    share = -(-N // n_splits)
    kv = 2 * share * d * itemsize
    alt = (f"Top: HBM holds the KV cache of {N} keys and values, cut into {n_splits} shares of "
           f"{share} rows ({_size(kv)} of K and V each). Middle: {n_splits} programs, one per "
           "SM, each read the query row q and one share, and write their output O_s and "
           "logsumexp L_s back to HBM. Bottom: a merge reads the partial results and writes "
           "the output O, weighting each O_s by exp(L_s - L).")
    caption = (f"Split-KV decoding at N = {N}, d = {d}, {n_splits} splits, {itemsize} bytes per "
               "number: the splits run at once on different SMs; only n_splits small partial "
               "results are merged.")
    dg = Diagram(290, alt=alt, caption=caption)
    col = 360 / n_splits
    dg.box(0, 0, 360, 76, "HBM: the KV cache (and q)", fill="blue")
    dg.text(352, 17, f"{N} rows", anchor="end")
    for s in range(n_splits):
        x = s * col
        dg.chip(x + 6, 25, f"K_{s + 1}, V_{s + 1}", _size(kv), w=col - 12, h=44)
        dg.arrow(x + col / 2, 70, x + col / 2, 108)
        dg.box(x + 4, 110, col - 8, 74, f"SM {s + 1}: q", fill="orange")
        dg.chip(x + 10, 144, f"O_{s + 1}, L_{s + 1}", w=col - 20, h=30, fill="yellow")
        dg.arrow(x + col / 2, 186, 180, 222)
    dg.box(60, 224, 240, 60, "merge", fill="bluish_green")
    dg.text(180, 270, "O = Σ exp(L_s - L) O_s", anchor="middle")
    return dg


def fa3_schedule_diagram(exp_share: float, tiles: int = 2) -> Diagram:
    """Three timelines of one SM on a shared time axis, from
    :func:`flashlib.studies.beyond.fa3_timeline`: one warpgroup doing each step after the last,
    two warpgroups in ping-pong, and one warpgroup pipelining its softmax under its next
    matmuls. ``exp_share``: exponential time over matmul time (the softmax of a tile takes
    ``2 * exp_share`` matmul units); ``tiles``: key tiles per warpgroup."""
    panels = [
        ("serial", "one after the other: one warpgroup", ["warpgroup 1"], ["WG 1"]),
        ("ping-pong", "ping-pong: two warpgroups take turns", ["warpgroup 1", "warpgroup 2"],
         ["WG 1", "WG 2"]),
        ("pipelined", "pipelined inside one warpgroup", ["tensor cores", "softmax"],
         ["matmul", "exp"]),
    ]
    timelines = {name: fa3_timeline(name, exp_share, tiles) for name, *_ in panels}
    span = max(stop for ops in timelines.values() for _, _, stop, _, _ in ops)
    x0, row_h = 58.0, 24.0
    scale = (WIDTH - x0 - 4) / span
    summaries = {}
    for name, ops in timelines.items():
        busy = sum(b - a for _, a, b, kind, _ in ops if kind == "matmul")
        end = max(b for _, _, b, _, _ in ops)
        steps = tiles * (2 if name == "ping-pong" else 1)
        summaries[name] = (f"{steps} tiles in {end:.1f} units, tensor cores busy "
                           f"{busy / end:.0%}")
    alt = (f"Three timelines of one GPU multiprocessor, time running to the right, in units of "
           f"one tile's matmul; a tile's softmax takes {2 * exp_share:.2g} units. One after "
           f"the other: a warpgroup computes Q K transposed, then its softmax, then P V, and "
           f"the tensor cores wait during each softmax ({summaries['serial']}). Ping-pong: two "
           f"warpgroups with their own query rows alternate, one doing its softmax while the "
           f"other does its matmuls ({summaries['ping-pong']}). Pipelined: one warpgroup "
           f"issues the next tile's Q K transposed and the previous tile's P V while it "
           f"computes the softmax of the current tile ({summaries['pipelined']}).")
    caption = (f"FlashAttention-3's overlaps as a schematic timeline (our model, not a measured "
               f"trace): matmuls (blue) on the tensor cores, softmax (orange) on the exp units; "
               f"a softmax takes {2 * exp_share:.2g} matmul units, as computed above.")
    height = 26 + sum(18 + row_h * len(rows) + 20 for *_, rows, _ in panels) + 20
    dg = Diagram(height, alt=alt, caption=caption)
    for k, (kind, text) in enumerate((("matmul", "matmul (tensor cores)"),
                                      ("softmax", "softmax (exp)"))):
        x = 0 if k == 0 else 200
        dg._el("rect", x=_fmt(x), y="4", width="14", height="14", rx=2,
               fill=OKABE_ITO["blue" if kind == "matmul" else "vermillion"], fill_opacity=0.4)
        dg.text(x + 19, 16, text)
    y = 26.0
    for name, title, rows, short in panels:
        dg.text(0, y + 13, title, bold=True)
        y += 18
        for row, label in zip(rows, short, strict=True):
            dg.text(0, y + row_h / 2 + 4, label)
            for r, a, b, kind, name_ in timelines[name]:
                if r != row:
                    continue
                fill = OKABE_ITO["blue" if kind == "matmul" else "vermillion"]
                dg._el("rect", x=_fmt(x0 + a * scale + 1), y=_fmt(y + 2),
                       width=_fmt((b - a) * scale - 2), height=_fmt(row_h - 4), rx=2,
                       fill=fill, fill_opacity=0.35, stroke=fill, stroke_width=1)
                if (b - a) * scale >= 30:
                    dg.text(x0 + (a + b) / 2 * scale, y + row_h / 2 + 4, name_,
                            anchor="middle")
            y += row_h
        dg.text(x0, y + 14, summaries[name], italic=True)
        y += 20
    dg._el("line", x1=_fmt(x0), y1=_fmt(y + 2), x2=_fmt(WIDTH - 4), y2=_fmt(y + 2),
           stroke="currentColor", stroke_width=1, marker_end="url(#flashlib-arrow)")
    dg.text(WIDTH - 4, y + 16, f"time ({span:g} matmul units)", anchor="end")
    return dg
