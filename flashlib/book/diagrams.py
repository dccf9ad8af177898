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
idea, drawn here): what standard attention and FlashAttention keep where.
"""

from __future__ import annotations

import html
import re
from typing import Any

from flashlib.book.plots import OKABE_ITO, check_alt

__all__ = ["Diagram", "memory_diagram", "WIDTH"]

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
                f'font-family="sans-serif"><title>{alt}</title>{marker}'
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
            dg.chip(245, top + 78, "S_ij", f"{B}×{B}, {_size(tile)}", w=110, h=36,
                    fill="orange")
            for x, name in ((245, "O_i"), (283, "m_i"), (321, "l_i")):
                dg.chip(x, top + 120, name, w=34)
            summary = "read Q_i, K_j, V_j; write O_i and L_i once"
        dg.arrow(192, top + 104, 238, top + 104, "read", label_y=top + 98)
        dg.arrow(238, top + 134, 192, top + 134, "write", label_y=top + 128)
        dg.text(0, top + 170, summary, italic=True)
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
