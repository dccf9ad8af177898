"""Interactive figures that work in a live kernel (Jupyter, Colab) and on the static website.

One mechanism for every chapter::

    from flashlib.book.widgets import interactive_figure
    interactive_figure(draw, sliders={"n": [256, 512, 1024], "dtype": ["float16", "float32"]},
                       defaults={"n": 512}, alt="Alt text describing the figure")

``draw(**values)`` returns a matplotlib Figure (it only draws what numeric functions computed).
The returned :class:`InteractiveFigure`, as a cell's last expression, shows

- in a live kernel: one ipywidgets ``SelectionSlider`` per parameter and an ``Output`` in which
  the figure is redrawn whenever a slider moves;
- when the book is built (the Sphinx extension scripts/colab_link.py sets the environment
  variable ``FLASHLIB_STATIC_WIDGETS=1`` for the executing kernels): a self-contained ``text/html``
  block with every frame of the slider grid precomputed as a PNG and a few lines of JavaScript
  that switch frames when an ``<input type="range">`` moves. No kernel, no request.

Fast live redraws: a ``draw`` may build a new figure on every call, but a slider move then pays
for creating the axes, their ticks and a constrained layout (``python scripts/widget_redraw.py``
times every widget of the book on your machine). Instead build the figure once, outside
``draw``, with fixed axes limits and ticks, and let ``draw`` only update its artists
(``bar.set_height``, ``line.set_data``, ``text.set_text``, ``ax.set_title``) and return that
same figure. When ``draw`` returns the figure it returned before, the figure's first layout is
kept (:func:`flashlib.book.plots.freeze_layout`): each redraw is then one draw pass on a reused
renderer. Measure with :func:`redraw_time`.
"""

from __future__ import annotations

import base64
import hashlib
import html
import itertools
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flashlib.book.plots import (
    check_alt,
    check_figure,
    figure_png,
    freeze_layout,
    layout_frozen,
)
from flashlib.measure import median_times

#: Environment variable that selects the static (website) rendering.
STATIC_ENV = "FLASHLIB_STATIC_WIDGETS"
#: Largest slider grid (number of precomputed frames) accepted.
MAX_FRAMES = 64
#: The MIME type of a live widget's view in a notebook (ipywidgets 7 and 8 alike).
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

_SCRIPT = """(function () {
  var root = document.getElementById(%(id)s);
  var data = JSON.parse(root.querySelector("script.flashlib-ifig-data").textContent);
  var img = root.querySelector("img");
  var inputs = root.querySelectorAll("input[type=range]");
  function update() {
    var frame = 0;
    inputs.forEach(function (input, k) {
      var i = Number(input.value);
      frame = frame * data.labels[k].length + i;
      input.setAttribute("aria-valuetext", data.labels[k][i]);
      input.nextElementSibling.textContent = data.labels[k][i];
    });
    img.src = "data:image/png;base64," + data.frames[data.index[frame]];
  }
  inputs.forEach(function (input) { input.addEventListener("input", update); });
})();"""


def static_mode() -> bool:
    """True when figures should render as static HTML (the book build), not live widgets."""
    return os.environ.get(STATIC_ENV, "") not in ("", "0")


class InteractiveFigure:
    """A figure with sliders (see the module docstring); made by :func:`interactive_figure`."""

    def __init__(
        self,
        draw: Callable[..., Any],
        sliders: dict[str, list[Any]],
        defaults: dict[str, Any],
        alt: str,
    ):
        self.draw = draw
        self.sliders = sliders
        self.defaults = defaults
        self.alt = alt
        self._widget = None
        self._last_figure: Any = None  # the figure of the previous render

    def __repr__(self) -> str:
        return f"<interactive figure ({', '.join(self.sliders)}): {self.alt}>"

    @property
    def grid(self) -> list[dict[str, Any]]:
        """Every combination of slider values, in frame order (last slider fastest)."""
        names = list(self.sliders)
        combos = itertools.product(*self.sliders.values())
        return [dict(zip(names, combo, strict=True)) for combo in combos]

    def render(self, values: Mapping[str, Any]) -> bytes:
        """PNG of ``draw(**values)``.

        A ``draw`` that updates and returns the same figure every time keeps the layout of its
        first frame (see the module docstring); a new figure per call is laid out every time.
        """
        fig = self.draw(**values)
        check_figure(fig, "draw(**values)")
        if fig is self._last_figure and not layout_frozen(fig):
            freeze_layout(fig)  # drawn before: keep that layout, skip the layout pass
        self._last_figure = fig
        return figure_png(fig)

    def frames(self) -> tuple[list[str], list[int]]:
        """Unique base64 PNG frames and, for each grid point, the index of its frame."""
        seen: dict[str, int] = {}  # frame -> its index; dicts keep insertion order
        index = []
        for values in self.grid:
            png = base64.b64encode(self.render(values)).decode("ascii")
            index.append(seen.setdefault(png, len(seen)))
        return list(seen), index

    def to_html(self) -> str:
        """The static, kernel-free version: range inputs + precomputed frames + a little JS."""
        frames, index = self.frames()
        labels = [[str(v) for v in values] for values in self.sliders.values()]
        payload = json.dumps({"labels": labels, "frames": frames, "index": index})
        # Only labels can contain "<"; escaped, the JSON cannot close its <script> early.
        payload = payload.replace("<", "\\u003c")
        digest = hashlib.sha1(payload.encode() + self.alt.encode()).hexdigest()
        uid = f"flashlib-ifig-{digest[:12]}"
        start = [values.index(self.defaults[name]) for name, values in self.sliders.items()]
        first = self.grid.index(self.defaults)
        controls = "".join(
            f'<label>{html.escape(name)} <input type="range" min="0" max="{len(values) - 1}" '
            f'step="1" value="{i}" aria-label="{html.escape(name)}" '
            f'aria-valuetext="{html.escape(labels[k][i])}" data-name="{html.escape(name)}">'
            f"<output>{html.escape(labels[k][i])}</output></label>"
            for k, ((name, values), i) in enumerate(zip(self.sliders.items(), start, strict=True))
        )
        script = _SCRIPT % {"id": json.dumps(uid)}
        return (
            f'<div class="flashlib-ifig" id="{uid}">'
            f'<div class="flashlib-ifig-controls">{controls}</div>'
            f'<img src="data:image/png;base64,{frames[index[first]]}" '
            f'alt="{html.escape(self.alt)}">'
            f'<script type="application/json" class="flashlib-ifig-data">{payload}</script>'
            f"<script>{script}</script></div>"
        )

    def widget(self):
        """The live ipywidgets UI (created once): a SelectionSlider per parameter + an Output."""
        if self._widget is not None:
            return self._widget
        import ipywidgets as widgets
        from IPython.display import Image, display

        out = widgets.Output()
        controls = {
            name: widgets.SelectionSlider(
                options=[(str(v), v) for v in values],
                value=self.defaults[name],
                description=name,
                continuous_update=False,
                style={"description_width": "initial"},
            )
            for name, values in self.sliders.items()
        }

        cache: dict[tuple[str, ...], bytes] = {}  # a revisited setting redraws instantly

        def redraw(_change=None) -> None:
            values = {name: c.value for name, c in controls.items()}
            key = tuple(str(v) for v in values.values())
            png = cache[key] = cache.get(key) or self.render(values)
            with out:
                out.clear_output(wait=True)
                display(Image(data=png, format="png"))

        for control in controls.values():
            control.observe(redraw, names="value")
        redraw()
        self._widget = widgets.VBox([*controls.values(), out])
        return self._widget

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, Any]:
        """The static HTML (book build) or the live widget's view, built here rather than
        asked of the widget: ipywidgets 8 displays a widget through ``_repr_mimebundle_``,
        ipywidgets 7 (Colab's 7.7.1) through ``_ipython_display_`` and has no such method.
        The ``widget-view+json`` bundle (protocol version 2.0) is the same in both."""
        if static_mode():
            return {"text/html": self.to_html(), "text/plain": repr(self)}
        box = self.widget()
        bundle = {"text/plain": repr(self), WIDGET_VIEW: {
            "version_major": 2, "version_minor": 0, "model_id": box.model_id}}
        handle_displayed = getattr(box, "_handle_displayed", None)  # ipywidgets 7 callbacks
        if handle_displayed is not None:
            handle_displayed()
        return bundle


def _check(
    draw: Any, sliders: Any, defaults: Any, alt: Any
) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    if not callable(draw):
        raise TypeError(f"draw: expected a callable draw(**values) -> Figure, got {type(draw)}")
    check_alt(alt)
    if not isinstance(sliders, Mapping) or not sliders:
        raise ValueError("sliders: expected a non-empty dict {name: [values, ...]}")
    grid: dict[str, list[Any]] = {}
    for name, values in sliders.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"sliders: names must be Python identifiers, got {name!r}")
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"sliders[{name!r}]: expected a non-empty list of values")
        if len({str(v) for v in values}) != len(values):
            raise ValueError(f"sliders[{name!r}]: values must be distinct, got {list(values)}")
        grid[name] = list(values)
    n_frames = math.prod(len(v) for v in grid.values())
    if n_frames > MAX_FRAMES:
        raise ValueError(f"sliders: {n_frames} combinations, at most {MAX_FRAMES} allowed")
    defaults = dict(defaults or {})
    for name, value in defaults.items():
        if name not in grid:
            raise ValueError(f"defaults: {name!r} is not a slider (sliders: {list(grid)})")
        if value not in grid[name]:
            raise ValueError(f"defaults[{name!r}]: {value!r} is not one of {grid[name]}")
    return grid, {name: defaults.get(name, values[0]) for name, values in grid.items()}


def interactive_figure(
    draw: Callable[..., Any],
    sliders: Mapping[str, Sequence[Any]],
    *,
    defaults: Mapping[str, Any] | None = None,
    alt: str,
) -> InteractiveFigure:
    """A figure redrawn from slider values, live in Jupyter/Colab and static on the website.

    Args:
        draw: ``draw(**values) -> matplotlib.figure.Figure``, one keyword per slider.
        sliders: ``{name: [value, ...]}``; the grid (product of lengths) is at most MAX_FRAMES.
        defaults: starting value per slider (others start at their first value).
        alt: alt text describing the figure (required).
    """
    grid, start = _check(draw, sliders, defaults, alt)
    return InteractiveFigure(draw, grid, start, alt)


def redraw_time(
    draw: Callable[..., Any], sliders: Mapping[str, Sequence[Any]], *, repeat: int = 5
) -> float:
    """Median seconds to redraw (draw + PNG) at the largest settings (last value of each slider).

    What a live slider move costs in the kernel (wall clock), excluding the round trip to the
    browser: each timed redraw at the largest settings follows one at the first values, so the
    figure really changes (as when a slider moves) rather than repeating the same frame.
    """
    grid, _ = _check(draw, sliders, None, "benchmark")
    figure = InteractiveFigure(draw, grid, {}, "benchmark")
    largest = {name: values[-1] for name, values in grid.items()}
    first = {name: values[0] for name, values in grid.items()}
    # Round-robin: every timed redraw at the largest settings follows one at the first values;
    # the warm-up call of each pays for imports, the font cache and the first layout.
    med = median_times({"first": lambda: figure.render(first),
                        "largest": lambda: figure.render(largest)}, repeat, clock="wall")
    return med["largest"]
