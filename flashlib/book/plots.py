"""Plotting style shared by every chapter: a colour-blind safe palette and figures with alt text.

Nothing numeric lives here: chapters compute with flashlib's numeric modules, then draw.

    from flashlib.book.plots import new_figure, show, use_book_style
    use_book_style()
    fig, ax = new_figure()
    ax.plot(x, y)
    show(fig, alt="Line plot of ...")   # last expression of a cell: the figure, with alt text

Figures are designed for a phone's column as much as a desktop's. A figure's designed size is
its size in inches at :data:`DPI` (96) CSS pixels per inch: the default, 4.8 in wide
(:data:`FIGSIZE`), is shown 461 px wide on a desktop and at least 0.75 of that, 358 px, on a
390 px phone, where 10 pt text keeps about 10 px (text size there = points x 358 / (72 x width
in inches)); no figure should be wider than 4.9 in. Two panels go one above the other
(``new_figure(2, 1, figsize=(4.8, 5.6))``), not side by side. Every PNG is drawn at
:data:`SCALE` (2) times its designed size, so that it stays crisp on a 2x (retina) screen, and
shown at its designed size (``width`` and ``height`` on its image); it is a palette PNG
(:func:`light_png`, about a quarter of the bytes) and carries its smallest text size in CSS
pixels at its designed size (``data-text-px``), which the browser tests check at 390 px.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour-vision
# deficiency. Order: the cycle used for successive lines/bars.
OKABE_ITO: dict[str, str] = {
    "blue": "#0072B2",
    "orange": "#E69F00",
    "bluish_green": "#009E73",
    "vermillion": "#D55E00",
    "sky_blue": "#56B4E9",
    "reddish_purple": "#CC79A7",
    "yellow": "#F0E442",
    "black": "#000000",
}
PALETTE: list[str] = list(OKABE_ITO.values())

#: CSS pixels per inch of a figure's designed size (the web's 96 px per inch).
DPI = 96
#: PNGs are drawn at SCALE x their designed size (crisp on a 2x screen), shown at that size.
SCALE = 2
#: Resolution at which the PNGs are drawn.
RENDER_DPI = DPI * SCALE
#: The book's default figure size in inches (see the module docstring: legible on a phone).
FIGSIZE = (4.8, 3.2)
#: Colours of a palette PNG (:func:`light_png`): enough for anti-aliased text and lines.
PNG_COLORS = 128


def use_book_style() -> None:
    """Set matplotlib's defaults for the book: Okabe-Ito colour cycle, viridis, light axes."""
    import matplotlib as mpl
    from cycler import cycler

    mpl.rcParams.update(
        {
            "axes.prop_cycle": cycler(color=PALETTE),
            "image.cmap": "viridis",  # perceptually uniform, colour-blind safe
            "figure.figsize": FIGSIZE,
            "figure.dpi": RENDER_DPI,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "font.size": 10,
            # Titles at a fixed height above the axes: what the automatic placement picks for
            # every figure of the book (no tick labels on top), without its per-draw search.
            "axes.titley": 1.0,
        }
    )


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None,
               height_ratios: list[float] | None = None):
    """A figure outside pyplot (no global state, never shown by accident) and its axes.

    Returns ``(fig, ax)`` like ``plt.subplots``: ``ax`` is one Axes for 1x1, else an array.
    ``height_ratios``: the relative heights of the rows (panels stacked for a phone).
    The figure keeps one Agg canvas, so redrawing it (a widget updating its artists) reuses
    the renderer and its text-layout caches.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    use_book_style()
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, height_ratios=height_ratios)
    return fig, axes


def freeze_layout(fig: Any) -> None:
    """Keep the layout of the figure's last draw for every later draw (for live redraws).

    Constrained layout costs a whole extra pass over every tick label at each save. A figure
    that is drawn once and then only updated (fixed axes limits and ticks, new data and
    titles) can keep its first layout: this pins the axes positions and the axis labels'
    positions and turns the layout engine off, so :func:`figure_png` takes one draw pass and
    the figure looks the same. Call it after the figure has been drawn (saved) at least once.
    """
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            label = axis.label
            where = label.get_transform().transform(label.get_position())  # pixels
            axis.set_label_coords(*ax.transAxes.inverted().transform(where))
    fig.set_layout_engine("none")  # keeps the axes where the last layout put them


def layout_frozen(fig: Any) -> bool:
    """True when :func:`freeze_layout` turned the figure's layout engine off."""
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    return isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine)


def figure_png(fig: Any) -> bytes:
    """The figure as PNG bytes (deterministic: no timestamp/software metadata)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buf = io.BytesIO()
    if (layout_frozen(fig) and isinstance(fig.canvas, FigureCanvasAgg)
            and fig.dpi == RENDER_DPI):
        # savefig would draw twice (a layout pass first); with the layout frozen one draw
        # suffices, and the figure's own canvas reuses its renderer.
        fig.canvas.print_png(buf, metadata={"Software": None})
    else:
        fig.savefig(buf, format="png", dpi=RENDER_DPI, metadata={"Software": None})
    close(fig)
    return buf.getvalue()


def light_png(png: bytes, colors: int = PNG_COLORS) -> bytes:
    """``png`` as a palette PNG of at most ``colors`` colours, no dithering (a figure's flat
    colours and anti-aliased edges survive; about a quarter of the bytes of matplotlib's RGBA
    PNG). Deterministic. Pillow comes with matplotlib."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        rgb = image.convert("RGB")
    palette = rgb.quantize(colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    palette.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def text_px(fig: Any) -> float | None:
    """Height in CSS pixels of the smallest visible text of a drawn figure at its designed
    size (font size in points x :data:`DPI` / 72); None for a figure without text. Shown as
    ``data-text-px`` on its image, so the browser tests can check how small it gets on a
    phone."""
    from matplotlib.text import Text

    def shown(text: Text) -> bool:
        axes = text.axes
        return (text.get_visible() and bool(text.get_text().strip())
                and (axes is None or axes.get_visible()))

    sizes = [text.get_fontsize() for text in fig.findobj(Text) if shown(text)]
    return round(min(sizes) * DPI / 72, 2) if sizes else None


def text_collisions(fig: Any, tolerance: float = 1.0) -> list[str]:
    """What is wrong with the texts of a drawn figure, one line each: a text cut by the edge of
    the figure (a title "...per heac", a bar label "51.4 m") or two texts overlapping (a legend
    over a label). Boxes as matplotlib lays the texts out, in pixels of the last draw; two
    boxes may share ``tolerance`` pixels. Empty when the figure is clean."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    tick_labels, drawn_ticks = set(), set()  # matplotlib keeps labels of ticks it does not draw
    for ax in fig.axes:
        for axis in ax._axis_map.values():
            ticks = axis.get_major_ticks() + axis.get_minor_ticks()
            tick_labels.update(id(t) for tick in ticks for t in (tick.label1, tick.label2))
            drawn_ticks.update(id(t) for tick in axis._update_ticks()
                               for t in (tick.label1, tick.label2))
    boxes = []
    for text in fig.findobj(Text):
        if id(text) in tick_labels and id(text) not in drawn_ticks:
            continue
        axes = text.axes
        if not (text.get_visible() and text.get_text().strip()) or (
                axes is not None and not axes.get_visible()):
            continue
        box = text.get_window_extent(renderer)
        label = text.get_text().replace("\n", " ")
        if (box.x0 < edge.x0 - tolerance or box.x1 > edge.x1 + tolerance
                or box.y0 < edge.y0 - tolerance or box.y1 > edge.y1 + tolerance):
            boxes.append((label, None))
        boxes.append((label, box))
    found = [f"{label!r} is cut by the edge of the figure" for label, box in boxes
             if box is None]
    shown = [(label, box) for label, box in boxes if box is not None]
    for k, (label, box) in enumerate(shown):
        for other, box2 in shown[k + 1:]:
            if (min(box.x1, box2.x1) - max(box.x0, box2.x0) > tolerance
                    and min(box.y1, box2.y1) - max(box.y0, box2.y0) > tolerance):
                found.append(f"{label!r} overlaps {other!r}")
    return found


#: The family name of flashlib/book/fonts/NotoSansJP-subset-Regular.otf (tools/ja_font.py):
#: matplotlib falls back to it for the Japanese characters of a translated figure.
JA_FONT = "Noto Sans CJK JP"


def _japanese_font() -> None:
    """Register the Japanese font subset with matplotlib (once)."""
    from importlib import resources

    from matplotlib import font_manager

    if any(f.name == JA_FONT for f in font_manager.fontManager.ttflist):
        return
    path = resources.files("flashlib.book").joinpath("fonts", "NotoSansJP-subset-Regular.otf")
    font_manager.fontManager.addfont(str(path))


def _with_japanese(text: Any) -> list[str]:
    """The font families for a text drawn in Japanese: the Japanese font after its own (a
    fallback for the characters its font lacks), or first when the text holds mathtext
    (``$m_k$``), which draws the words around the formula in the first family only."""
    family = [f for f in text.get_fontfamily() if f != JA_FONT]
    return [JA_FONT, *family] if "$" in text.get_text() else [*family, JA_FONT]


def japanese_png(fig: Any) -> bytes | None:
    """The figure drawn again with its texts and tick labels in Japanese
    (:func:`flashlib.book.i18n.translate`, then put back as they were), or None when no text
    has a translation."""
    from matplotlib.text import Text

    from flashlib.book import i18n

    texts = [(t, t.get_text()) for t in fig.findobj(Text)]
    changed = [(t, old) for t, old in texts
               if isinstance(old, str) and old and i18n.translate(old, "ja") != old]
    # tick labels are written by the axis's formatter at every draw: translate its labels
    formatters = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            fmt = axis.get_major_formatter()
            if isinstance(getattr(fmt, "seq", None), list):  # FixedFormatter
                formatters.append((fmt, "seq", fmt.seq))
                fmt.seq = [i18n.translate(str(label), "ja") for label in fmt.seq]
            elif isinstance(getattr(fmt, "_units", None), dict):  # StrCategoryFormatter
                formatters.append((fmt, "_units", fmt._units))
                fmt._units = {i18n.translate(str(k), "ja"): v for k, v in fmt._units.items()}
    translated_ticks = any(getattr(f, a) != old for f, a, old in formatters)
    if not changed and not translated_ticks:
        for fmt, attr, old in formatters:
            setattr(fmt, attr, old)
        return None
    _japanese_font()
    fonts = []
    for ax in fig.axes:  # the tick labels' font, for the Japanese ones
        for label in ax.get_xticklabels() + ax.get_yticklabels():
            if (label, label.get_text()) not in changed:
                fonts.append((label, label.get_fontfamily()))
                label.set_fontfamily(_with_japanese(label))
    try:
        for t, old in changed:
            fonts.append((t, t.get_fontfamily()))
            t.set_text(i18n.translate(old, "ja"))
            t.set_fontfamily(_with_japanese(t))
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=RENDER_DPI, metadata={"Software": None})
        return buf.getvalue()
    finally:
        for t, old in changed:
            t.set_text(old)
        for t, family in fonts:
            t.set_fontfamily(family)
        for fmt, attr, old in formatters:
            setattr(fmt, attr, old)


def close(fig: Any) -> None:
    """Release a figure; closes it in pyplot too if it was made there."""
    import sys

    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close(fig)


def designed_size(png: bytes) -> tuple[int, int]:
    """The CSS size (width, height) at which a PNG drawn at :data:`SCALE` x is shown."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        width, height = image.size
    return round(width / SCALE), round(height / SCALE)


def img_tag(png: bytes, alt: str, text_px: float | None = None, css_class: str = "") -> str:
    """``<img>`` of a PNG drawn at :data:`SCALE` x: inline (a data URL), its designed size as
    ``width`` and ``height`` (scaled down to the column's width, never up), its smallest text
    size as ``data-text-px``."""
    width, height = designed_size(png)
    data = base64.b64encode(png).decode("ascii")
    size = "" if text_px is None else f' data-text-px="{text_px}"'
    cls = f' class="{css_class}"' if css_class else ""
    return (f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}"{cls} '
            f'width="{width}" height="{height}"{size} style="max-width:100%;height:auto">')


class StaticFigure:
    """A rendered figure with alt text; shows as ``<img alt=...>`` in notebooks and the book.

    ``png`` is drawn at :data:`SCALE` x its designed size and shown at that size;
    ``text_px``: the smallest text height in CSS pixels (:func:`text_px`), as
    ``data-text-px``. ``png_ja``: the same figure with Japanese texts (the book build draws
    both; each edition of the site keeps its own, tools/book_extension.py)."""

    def __init__(self, png: bytes, alt: str, text_px: float | None = None,
                 png_ja: bytes | None = None):
        self.png = png
        self.alt = alt
        self.text_px = text_px
        self.png_ja = png_ja

    def _repr_mimebundle_(self, include=None, exclude=None) -> tuple[dict[str, str], dict]:
        from flashlib.book import i18n

        data = base64.b64encode(self.png).decode("ascii")
        width, height = designed_size(self.png)
        if self.png_ja is None:
            img = img_tag(self.png, i18n.translate(self.alt), self.text_px, "flashlib-figure")
        else:
            img = (img_tag(self.png, self.alt, self.text_px, "flashlib-figure flashlib-lang-en")
                   + img_tag(self.png_ja, i18n.translate(self.alt, "ja"), self.text_px,
                             "flashlib-figure flashlib-lang-ja").replace("<img ", "<img hidden ",
                                                                         1))
        bundle = {"text/html": img, "image/png": data, "text/plain": f"<figure: {self.alt}>"}
        return bundle, {"image/png": {"width": width, "height": height}}


def check_alt(alt: Any) -> None:
    """ValueError unless ``alt`` is a non-empty text describing a figure."""
    if not isinstance(alt, str) or not alt.strip():
        raise ValueError("alt: expected a non-empty text describing the figure")


def check_figure(fig: Any, name: str = "fig") -> None:
    """TypeError unless ``fig`` (the argument or result called ``name``) is a matplotlib Figure."""
    if not hasattr(fig, "savefig"):
        raise TypeError(f"{name}: expected a matplotlib Figure, got {type(fig).__name__}")


def show(fig: Any, *, alt: str) -> StaticFigure:
    """Render ``fig`` with alt text (a required, non-empty description); closes the figure."""
    from flashlib.book import i18n
    from flashlib.book.site import static_site

    check_alt(alt)
    check_figure(fig)
    png = figure_png(fig)  # draws the figure: its texts have their final sizes
    smallest = text_px(fig)
    if static_site():  # the book: both editions' figures
        ja = japanese_png(fig)
        return StaticFigure(light_png(png), alt, smallest,
                            light_png(ja) if ja is not None else None)
    if i18n.language() != "en":  # a Japanese notebook: the figure as the Japanese site has it
        png = japanese_png(fig) or png
    return StaticFigure(light_png(png), alt, smallest)
