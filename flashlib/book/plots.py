"""Plotting style shared by every chapter: a colour-blind safe palette and figures with alt text.

Nothing numeric lives here: chapters compute with flashlib's numeric modules, then draw.

    from flashlib.book.plots import new_figure, show, use_book_style
    use_book_style()
    fig, ax = new_figure()
    ax.plot(x, y)
    show(fig, alt="Line plot of ...")   # last expression of a cell: the figure, with alt text
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

#: Resolution of the PNGs shown in the book and in widgets.
DPI = 96


def use_book_style() -> None:
    """Set matplotlib's defaults for the book: Okabe-Ito colour cycle, viridis, light axes."""
    import matplotlib as mpl
    from cycler import cycler

    mpl.rcParams.update(
        {
            "axes.prop_cycle": cycler(color=PALETTE),
            "image.cmap": "viridis",  # perceptually uniform, colour-blind safe
            "figure.figsize": (6.4, 3.6),
            "figure.dpi": DPI,
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


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None):
    """A figure outside pyplot (no global state, never shown by accident) and its axes.

    Returns ``(fig, ax)`` like ``plt.subplots``: ``ax`` is one Axes for 1x1, else an array.
    The figure keeps one Agg canvas, so redrawing it (a widget updating its artists) reuses
    the renderer and its text-layout caches.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    use_book_style()
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols)
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
    if layout_frozen(fig) and isinstance(fig.canvas, FigureCanvasAgg) and fig.dpi == DPI:
        # savefig would draw twice (a layout pass first); with the layout frozen one draw
        # suffices, and the figure's own canvas reuses its renderer.
        fig.canvas.print_png(buf, metadata={"Software": None})
    else:
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    close(fig)
    return buf.getvalue()


def close(fig: Any) -> None:
    """Release a figure; closes it in pyplot too if it was made there."""
    import sys

    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close(fig)


class StaticFigure:
    """A rendered figure with alt text; shows as ``<img alt=...>`` in notebooks and the book."""

    def __init__(self, png: bytes, alt: str):
        self.png = png
        self.alt = alt

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        data = base64.b64encode(self.png).decode("ascii")
        img = (
            f'<img src="data:image/png;base64,{data}" alt="{html.escape(self.alt)}" '
            'class="flashlib-figure" style="max-width:100%;height:auto">'
        )
        return {"text/html": img, "image/png": data, "text/plain": f"<figure: {self.alt}>"}


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
    check_alt(alt)
    check_figure(fig)
    return StaticFigure(figure_png(fig), alt)
