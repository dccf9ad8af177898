"""The drawing primitives of the book's diagrams: inline SVG, crisp at any width, a few kilobytes,
no JavaScript.  Each chapter's own diagrams are in :mod:`flashlib.book.chapters` (one module per
chapter); this module is what they share.

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

    from flashlib.book.svg import Diagram
    dg = Diagram(height=120, alt="...", caption="...")
    dg.box(0, 0, 150, 100, "HBM (slow)")
    dg.chip(10, 30, "S", "n x n", fill="vermillion")
    dg.arrow(160, 50, 200, 50, "write")
    dg                                  # last expression of a cell
"""

from __future__ import annotations

import html
import re
from typing import Any

from flashlib.book.plots import OKABE_ITO, check_alt

__all__ = ["Diagram", "WIDTH", "fmt", "size_text"]


#: Width of every diagram's viewBox, in SVG units (about pixels on a phone).
WIDTH = 360


def fmt(value: float) -> str:
    """A number for an SVG attribute: no trailing zeros."""
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

    def element(self, tag: str, content: str = "", **attrs: Any) -> None:
        """Any SVG element (``rect``, ``line``, ...); ``stroke_width=`` is written stroke-width."""
        self.parts.append(self._tag(tag, content, **attrs))

    def text(self, x: float, y: float, text: str, *, size: float = 12, bold: bool = False,
             anchor: str = "start", italic: bool = False) -> None:
        """Text whose baseline starts (``anchor``: start, middle, end) at (x, y); ``A_ij``
        is written A with the subscript ij (at 0.8 of the size), ``K^T`` as Kᵀ."""
        if size < 12:
            raise ValueError(f"size: text below 12 units is illegible on a phone, got {size}")
        content = re.sub(
            r"([A-Za-z])_([a-z0-9]+)",
            # lowered a quarter of the size (Chromium's "sub" lowers it almost half, into the
            # line below)
            lambda m: (f'{m[1]}<tspan baseline-shift="{fmt(-0.25 * size)}" '
                       f'font-size="{fmt(0.8 * size)}">{m[2]}</tspan>'),
            html.escape(text.replace("^T", "ᵀ")))
        self.parts.append(self._tag(
            "text", content, x=fmt(x), y=fmt(y), font_size=fmt(size),
            font_weight="bold" if bold else None, text_anchor=anchor,
            font_style="italic" if italic else None))

    def box(self, x: float, y: float, w: float, h: float, title: str = "", *,
            fill: str | None = None, dashed: bool = False) -> None:
        """A rounded frame (a memory), its title inside at the top left."""
        self.element("rect", x=fmt(x), y=fmt(y), width=fmt(w), height=fmt(h), rx=6,
                 fill=OKABE_ITO[fill] if fill else "none", fill_opacity=0.12 if fill else None,
                 stroke="currentColor", stroke_width=1.2,
                 stroke_dasharray="4 3" if dashed else None)
        if title:
            self.text(x + 8, y + 17, title, bold=True)

    def chip(self, x: float, y: float, name: str, note: str = "", *, w: float = 40,
             h: float = 24, fill: str = "sky_blue") -> None:
        """An array: a filled rectangle with its name (and a note below the name)."""
        self.element("rect", x=fmt(x), y=fmt(y), width=fmt(w), height=fmt(h), rx=3,
                 fill=OKABE_ITO[fill], fill_opacity=0.35, stroke=OKABE_ITO[fill],
                 stroke_width=1.2)
        mid = x + w / 2
        if note:  # 17 units apart: a subscript of the name stays clear of the note
            self.text(mid, y + h / 2 - 3, name, anchor="middle", bold=True)
            self.text(mid, y + h / 2 + 14, note, anchor="middle")
        else:
            self.text(mid, y + h / 2 + 4, name, anchor="middle", bold=True)

    def arrow(self, x1: float, y1: float, x2: float, y2: float, label: str = "", *,
              label_y: float | None = None) -> None:
        """An arrow from (x1, y1) to (x2, y2), its label above its middle."""
        self.element("line", x1=fmt(x1), y1=fmt(y1), x2=fmt(x2), y2=fmt(y2),
                 stroke="currentColor", stroke_width=1.5, marker_end="url(#flashlib-arrow)")
        if label:
            ly = (y1 + y2) / 2 - 6 if label_y is None else label_y
            self.text((x1 + x2) / 2, ly, label, anchor="middle", italic=True)

    def svg(self) -> str:
        marker = ('<defs><marker id="flashlib-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
                  'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                  '<path d="M0,0 L10,5 L0,10 z" fill="currentColor"/></marker></defs>')
        alt = html.escape(self.alt)
        return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {fmt(self.width)} '
                f'{fmt(self.height)}" role="img" aria-label="{alt}" fill="currentColor" '
                f'font-family="sans-serif" style="max-width:30rem;height:auto">'
                f'<title>{alt}</title>{marker}'
                f'{"".join(self.parts)}</svg>')

    def _repr_html_(self) -> str:
        """The diagram as a figure; in a Japanese notebook its text translated
        (flashlib.book.i18n; the Japanese site translates the English when it is built)."""
        from flashlib.book import i18n

        return i18n.translate_html(
            f'<figure class="flashlib-diagram">{self.svg()}'
            f'<figcaption class="flashlib-caption">{html.escape(self.caption)}'
            "</figcaption></figure>")

    def __repr__(self) -> str:
        return f"<diagram: {self.alt}>"


def size_text(nbytes: int) -> str:
    """Bytes in words, as the diagrams label arrays: "16 KiB", "1.5 MiB", "96 B"."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{nbytes} B"
