"""Interactive figures that work in a live kernel (Jupyter, Colab) and on the static website.

Two kinds, the same controls, caption and accessibility:

**interactive_figure** (matplotlib, at most :data:`MAX_FRAMES` frames)::

    from flashlib.book.widgets import interactive_figure
    interactive_figure(
        draw, sliders={"n": [256, 512, 1024], "B": [16, 64]},
        labels={"n": "sequence length n", "B": "block size B"},   # what a screen reader says
        defaults={"n": 512},
        caption="What to notice: ...",                           # one line under the figure
        alt=lambda n, B: f"... at n = {n} ...",                  # or one str for every frame
        fixed={"head dimension d": 64})                          # what no slider sets

``draw(**values)`` returns a matplotlib Figure (it only draws what numeric functions computed).
The returned :class:`InteractiveFigure`, as a cell's last expression, shows

- in a live kernel: one ipywidgets ``SelectionSlider`` per parameter (described by its label),
  an ``Output`` in which the figure is redrawn whenever a slider moves, and the caption;
- when the book is built (:func:`flashlib.book.site.static_site`): a self-contained ``<figure>``
  with every frame of the slider grid precomputed as a palette PNG
  (:func:`flashlib.book.plots.light_png`, drawn at twice its designed size and shown at it, as
  every figure of the book: crisp on a 2x screen), a range input per slider, the caption as its
  ``<figcaption>`` and a few lines of JavaScript (js/frames.js) that switch frames and alt
  texts. With JavaScript off the default frame is shown, the controls stay hidden and a note
  says that the sliders need JavaScript. No kernel, no request.

**svg_figure** (drawn by the page; for many frames, e.g. a step slider over a schedule)::

    from flashlib.book.widgets import svg_figure
    svg_figure("tiling", data=tiling_widget_data([48, 100], [16, 32]),
               sliders={"n": [48, 100], ..., "step": list(range(400))},
               labels={"n": "sequence length n", ..., "step": "step of the schedule"},
               caption="What to notice: ...", alt="Description of the default frame",
               fixed={"head dimension d": 4})

The page draws each frame as SVG from ``data`` (a compact JSON table computed by flashlib)
with the renderer ``flashlib/book/js/<kind>.js``: a function ``draw(data, values, h) ->
{svg, alt, limits}`` (see js/drawn.js for the helpers ``h`` and ``limits``). The same HTML and
JavaScript run on the static site and as a Jupyter/Colab output: no kernel, no ipywidgets.
``alt`` describes the default frame for readers without JavaScript; the renderer's ``alt``
follows every frame.

Fast live redraws (interactive_figure): a ``draw`` may build a new figure on every call, but a
slider move then pays for creating the axes, their ticks and a constrained layout (``python
tools/widget_redraw.py`` times every widget of the book on your machine). Instead build the
figure once, outside ``draw``, with fixed axes limits and ticks, and let ``draw`` only update
its artists (``bar.set_height``, ``line.set_data``, ``text.set_text``, ``ax.set_title``) and
return that same figure. When ``draw`` returns the figure it returned before, the figure's
first layout is kept (:func:`flashlib.book.plots.freeze_layout`): each redraw is then one draw
pass on a reused renderer. Measure with :func:`redraw_time`; keep it under 0.2 s.
"""

from __future__ import annotations

import base64
import hashlib
import html
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

from flashlib.book import i18n
from flashlib.book.plots import (
    check_alt,
    check_figure,
    designed_size,
    figure_png,
    freeze_layout,
    img_tag,
    japanese_png,
    layout_frozen,
    light_png,
    text_collisions,
    text_px,
)
from flashlib.book.site import STATIC_ENV, static_site
from flashlib.core.measure import median_times

__all__ = [
    "interactive_figure",
    "svg_figure",
    "InteractiveFigure",
    "SvgFigure",
    "redraw_time",
    "renderer_source",
    "MAX_FRAMES",
    "STATIC_ENV",
    "categorical",
    "static_mode",
]

#: Largest slider grid (number of precomputed frames) of an interactive_figure.
MAX_FRAMES = 64
#: The MIME type of a live widget's view in a notebook (ipywidgets 7 and 8 alike).
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: Placeholders in the JavaScript files (flashlib/book/js/).
_ID, _RENDERER = "__FLASHLIB_ID__", "/*__FLASHLIB_RENDERER__*/"

Alt = str | Callable[..., str]


def static_mode() -> bool:
    """True when figures should render as static HTML (the book build), not live widgets."""
    return static_site()


def _inline(source: str) -> str:
    """JavaScript as inlined into a page: without its whole-line ``//`` comments and
    indentation (every figure carries its own copy)."""
    lines = (line.strip() for line in source.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("//"))


def _js(name: str) -> str:
    """The text of flashlib/book/js/<name>.js, as inlined."""
    return _inline(
        resources.files("flashlib.book").joinpath("js", f"{name}.js").read_text("utf-8"))


def renderer_source(kind: str) -> str:
    """The renderer of an svg_figure kind: flashlib/book/js/<kind>.js, which must define
    ``function draw(data, values, h)``. ValueError naming the kinds there otherwise."""
    if not isinstance(kind, str) or not kind.replace("_", "").isalnum() or kind in (
            "frames", "drawn"):
        raise ValueError(f"kind: expected the name of a renderer in flashlib/book/js/, got "
                         f"{kind!r}")
    folder = resources.files("flashlib.book").joinpath("js")
    try:
        source = folder.joinpath(f"{kind}.js").read_text("utf-8")
    except FileNotFoundError:
        kinds = sorted(p.name[:-3] for p in folder.iterdir()
                       if p.name.endswith(".js") and p.name not in ("frames.js", "drawn.js"))
        raise ValueError(f"kind: no renderer flashlib/book/js/{kind}.js (kinds: {kinds})"
                         ) from None
    if "function draw(" not in source:
        raise ValueError(f"flashlib/book/js/{kind}.js: no `function draw(data, values, h)`")
    return source


def _json_script(payload: Any) -> str:
    """JSON for a ``<script type="application/json">``: only "<" could close it early."""
    return json.dumps(payload, separators=(",", ":")).replace("<", "\\u003c")


def _uid(*parts: str) -> str:
    digest = hashlib.sha1("\x00".join(parts).encode()).hexdigest()
    return f"flashlib-ifig-{digest[:12]}"


def _value_text(values: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    return ", ".join(f"{labels[name]} = {value}" for name, value in values.items())


def fixed_text(fixed: Mapping[str, Any]) -> str:
    """The line under a figure's controls saying what it holds fixed: "Held fixed: head
    dimension d = 64; mask: none" (a number after "=", words after a colon)."""
    parts = [f"{name} = {value}" if isinstance(value, int | float) else f"{name}: {value}"
             for name, value in fixed.items()]
    return "Held fixed: " + "; ".join(parts) + "."


def _check_fixed(fixed: Any) -> dict[str, Any]:
    if not isinstance(fixed, Mapping) or not fixed:
        raise ValueError("fixed: expected what the figure holds fixed while its sliders move, "
                         "{spoken name: value}, e.g. {'head dimension d': 64}; got "
                         f"{fixed!r}")
    for name, value in fixed.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"fixed: names must be words a reader can read, got {name!r}")
        if isinstance(value, bool) or not isinstance(value, str | int | float) or (
                isinstance(value, str) and not value.strip()):
            raise TypeError(f"fixed[{name!r}]: expected a number or words, got {value!r}")
    return dict(fixed)


def categorical(values: Sequence[Any]) -> bool:
    """Whether a slider's values are names (all strings: a loop order, a float format), shown
    as a dropdown rather than a slider: a slider suggests an order between them."""
    return all(isinstance(v, str) for v in values)


class _Figure:
    """What both kinds share: sliders with spoken labels, a caption, alt text, the HTML."""

    kind = ""

    def __init__(self, sliders: dict[str, list[Any]], defaults: dict[str, Any],
                 labels: dict[str, str], caption: str, alt: Alt,
                 fixed: Mapping[str, Any] | None = None):
        self.fixed = dict(fixed or {})
        self.sliders = sliders
        self.defaults = defaults
        self.labels = labels
        self.caption = caption
        self.alt = alt

    def alt_for(self, values: Mapping[str, Any]) -> str:
        """The alt text of the frame at ``values`` (``alt`` itself when it is a str)."""
        text = self.alt(**values) if callable(self.alt) else self.alt
        check_alt(text)
        return text

    def _controls(self) -> str:
        """Hidden until the figure's script runs: with JavaScript off, no dead control. A
        slider over names (:func:`categorical`: a loop order, a float format) is a dropdown,
        its options' values the indices, as a range input's."""
        rows = []
        for name, values in self.sliders.items():
            i = values.index(self.defaults[name])
            label, value = html.escape(self.labels[name]), html.escape(str(values[i]))
            if categorical(values):
                options = "".join(
                    f'<option value="{k}"{" selected" if k == i else ""}>'
                    f"{html.escape(str(v))}</option>" for k, v in enumerate(values))
                rows.append(f'<label><span>{label}</span> <select data-name='
                            f'"{html.escape(name)}">{options}</select></label>')
                continue
            rows.append(
                f'<label><span>{label}</span> <input type="range" min="0" '
                f'max="{len(values) - 1}" step="1" value="{i}" aria-label="{label}" '
                f'aria-valuetext="{value}" data-name="{html.escape(name)}">'
                f'<output aria-hidden="true">{value}</output></label>')
        return f'<div class="flashlib-ifig-controls" hidden>{"".join(rows)}</div>'

    def _fixed_html(self) -> str:
        """What the figure holds fixed, shown with JavaScript on or off."""
        if not self.fixed:
            return ""
        return f'<p class="flashlib-ifig-fixed">{html.escape(fixed_text(self.fixed))}</p>'

    def _nojs(self, note: str) -> str:
        return f'<noscript><p class="flashlib-ifig-nojs">{html.escape(note)}</p></noscript>'

    def _figure(self, uid: str, body: str, payload: str, script: str) -> str:
        return (
            f'<figure class="flashlib-ifig flashlib-ifig-{self.kind}" id="{uid}">'
            f"{self._controls()}{self._fixed_html()}{body}"
            f"<figcaption>{html.escape(self.caption)}</figcaption>"
            f'<script type="application/json" class="flashlib-ifig-data">{payload}</script>'
            f"<script>{script.replace(_ID, uid)}</script></figure>"
        )

    @property
    def grid(self) -> list[dict[str, Any]]:
        """Every combination of slider values, in frame order (last slider fastest)."""
        names = list(self.sliders)
        combos = itertools.product(*self.sliders.values())
        return [dict(zip(names, combo, strict=True)) for combo in combos]


class InteractiveFigure(_Figure):
    """A matplotlib figure with sliders (see the module docstring); made by
    :func:`interactive_figure`."""

    kind = "png"

    def __init__(self, draw: Callable[..., Any], sliders: dict[str, list[Any]],
                 defaults: dict[str, Any], alt: Alt, *, labels: dict[str, str] | None = None,
                 caption: str = "", fixed: Mapping[str, Any] | None = None):
        super().__init__(sliders, defaults, labels or {name: name for name in sliders},
                         caption, alt, fixed)
        self.draw = draw
        self._widget = None
        self._last_figure: Any = None  # the figure of the previous render
        self._text_px: float | None = None

    def __repr__(self) -> str:
        return f"<interactive figure ({', '.join(self.labels.values())}): {self.caption}>"

    def render(self, values: Mapping[str, Any]) -> bytes:
        """PNG of ``draw(**values)`` (matplotlib's RGBA PNG).

        A ``draw`` that updates and returns the same figure every time keeps the layout of its
        first frame (see the module docstring); a new figure per call is laid out every time.
        """
        fig = self.draw(**values)
        check_figure(fig, "draw(**values)")
        if fig is self._last_figure and not layout_frozen(fig):
            freeze_layout(fig)  # drawn before: keep that layout, skip the layout pass
        self._last_figure = fig
        png = figure_png(fig)
        if values == self.defaults:
            self._text_px = text_px(fig)
        return png

    def frames(self) -> tuple[list[bytes], list[int]]:
        """Unique palette-PNG frames and, for each grid point, the index of its frame. When
        the book is built, the Japanese frames too (:attr:`frames_ja`, drawn by
        :func:`flashlib.book.plots.japanese_png`; each edition keeps its own)."""
        seen: dict[bytes, int] = {}  # frame -> its index; dicts keep insertion order
        index = []
        seen_ja: dict[bytes, int] = {}
        index_ja = []
        problems: dict[str, list[str]] = {}  # text cut or overlapping -> the frames showing it
        for values in self.grid:
            png = light_png(self.render(values))
            index.append(seen.setdefault(png, len(seen)))
            for problem in text_collisions(self._last_figure):
                problems.setdefault(problem, []).append(_value_text(values, self.labels))
            if static_mode():  # the Japanese frame in the English frame's layout
                if not layout_frozen(self._last_figure):
                    freeze_layout(self._last_figure)
                ja = japanese_png(self._last_figure)
                ja = png if ja is None else light_png(ja)
                index_ja.append(seen_ja.setdefault(ja, len(seen_ja)))
        if problems:
            raise ValueError("draw: texts of the figure are cut or overlap (give the layout "
                             "room for every frame's text):\n" + "\n".join(
                                 f"{p} (at {frames[0]}; {len(frames)} frames)"
                                 for p, frames in problems.items()))
        self.frames_ja = (list(seen_ja), index_ja) if seen_ja else None
        return list(seen), index

    def to_html(self) -> str:
        """The static, kernel-free version: range inputs + precomputed frames + a little JS.
        The frames are data URLs (the book's Sphinx extension moves them into files of the
        site, loaded when a slider reaches them)."""
        frames, index = self.frames()
        alts: dict[str, int] = {}
        alt_index = [alts.setdefault(self.alt_for(values), len(alts)) for values in self.grid]
        labels = [[str(v) for v in values] for values in self.sliders.values()]
        def url(png: bytes) -> str:
            return "data:image/png;base64," + base64.b64encode(png).decode("ascii")

        data = {"labels": labels, "frames": [url(png) for png in frames], "index": index,
                "alts": list(alts), "altIndex": alt_index}
        first = self.grid.index(self.defaults)
        alt = self.alt_for(self.defaults)
        if self.frames_ja is None:
            img = img_tag(frames[index[first]], alt, self._text_px)
        else:  # both editions' frames: tools/book_extension.py keeps each page's own
            frames_ja, index_ja = self.frames_ja
            data |= {"framesJa": [url(png) for png in frames_ja], "indexJa": index_ja}
            # the Japanese one hidden (the site's Japanese pages keep it alone, shown)
            img = (img_tag(frames[index[first]], alt, self._text_px, "flashlib-lang-en")
                   + img_tag(frames_ja[index_ja[first]], i18n.translate(alt, "ja"),
                             self._text_px, "flashlib-lang-ja").replace("<img ", "<img hidden ",
                                                                         1))
        payload = _json_script(data)
        uid = _uid(payload, self.caption)
        note = ("The sliders of this figure need JavaScript; it shows "
                f"{_value_text(self.defaults, self.labels)}.")
        return self._figure(uid, img + self._nojs(note), payload, _js("frames"))

    def widget(self):
        """The live ipywidgets UI (created once): a SelectionSlider per parameter, an Output,
        the caption."""
        if self._widget is not None:
            return self._widget
        import ipywidgets as widgets
        from IPython.display import Image, display

        out = widgets.Output()
        # a Dropdown for names (a loop order, a float format), as on the website; both are
        # in ipywidgets 7 (Colab's 7.7.1) and 8 with these arguments
        controls = {
            name: (widgets.Dropdown if categorical(values) else widgets.SelectionSlider)(
                options=[(str(v), v) for v in values],
                value=self.defaults[name],
                description=i18n.translate(self.labels[name]),
                style={"description_width": "initial"},
                layout=widgets.Layout(width="auto", max_width="36em"),
                **({} if categorical(values) else {"continuous_update": False}),
            )
            for name, values in self.sliders.items()
        }

        cache: dict[tuple[str, ...], bytes] = {}  # a revisited setting redraws instantly

        def redraw(_change=None) -> None:
            values = {name: c.value for name, c in controls.items()}
            key = tuple(str(v) for v in values.values())
            png = cache.get(key)
            if png is None:
                png = self.render(values)
                if i18n.language() != "en":  # a Japanese notebook
                    png = japanese_png(self._last_figure) or png
                cache[key] = png
            width, height = designed_size(png)  # drawn at 2x: shown at its designed size
            with out:
                out.clear_output(wait=True)
                display(Image(data=png, format="png", width=width, height=height))

        for control in controls.values():
            control.observe(redraw, names="value")
        redraw()
        caption = widgets.HTML(f"<em>{html.escape(i18n.translate(self.caption))}</em>")
        held = [widgets.HTML(i18n.translate_html(self._fixed_html()))] if self.fixed else []
        self._widget = widgets.VBox([*controls.values(), *held, out, caption])
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


class SvgFigure(_Figure):
    """A figure the page draws from a JSON table (see the module docstring); made by
    :func:`svg_figure`. The same HTML in the book and in Jupyter/Colab."""

    kind = "svg"

    def __init__(self, renderer: str, data: Any, sliders: dict[str, list[Any]],
                 defaults: dict[str, Any], labels: dict[str, str], caption: str, alt: Alt,
                 name: str, fixed: Mapping[str, Any] | None = None):
        super().__init__(sliders, defaults, labels, caption, alt, fixed)
        self.renderer = renderer
        self.data = data
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name} figure ({', '.join(self.labels.values())}): {self.caption}>"

    def to_html(self) -> str:
        sliders = [{"name": name, "values": values, "labels": [str(v) for v in values]}
                   for name, values in self.sliders.items()]
        payload = _json_script({"sliders": sliders, "data": self.data})
        uid = _uid(payload, self.caption, self.name)
        alt = self.alt_for(self.defaults)
        drawing = (f'<div class="flashlib-ifig-drawing" role="img" '
                   f'aria-label="{html.escape(alt)}"></div>')
        note = f"{alt} (This figure is drawn by JavaScript, which is off.)"
        script = _js("drawn").replace(_RENDERER, _inline(self.renderer))
        return self._figure(uid, drawing + self._nojs(note), payload, script)

    def _repr_html_(self) -> str:
        """The figure's HTML; in a Japanese notebook translated, with the table the page's
        script translates its drawing with (js/i18n.js)."""
        markup = self.to_html()
        if i18n.language() == "en" or static_mode():
            return markup
        return (f"<script>{i18n.words_script(i18n.language(), 'site')}</script>"
                + i18n.translate_html(markup))


def _check_sliders(sliders: Any, labels: Any, defaults: Any, caption: Any, alt: Any,
                   max_frames: int | None) -> tuple[dict[str, list[Any]], dict[str, Any],
                                                    dict[str, str]]:
    if not (isinstance(alt, str) or callable(alt)):
        raise TypeError(f"alt: expected a str or a function of the slider values, got "
                        f"{type(alt).__name__}")
    if isinstance(alt, str):
        check_alt(alt)
    if not isinstance(caption, str) or not caption.strip():
        raise ValueError("caption: expected one line saying what to notice in the figure")
    if not isinstance(sliders, Mapping) or not sliders:
        raise ValueError("sliders: expected a non-empty dict {name: [values, ...]}")
    grid: dict[str, list[Any]] = {}
    for name, values in sliders.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"sliders: names must be Python identifiers, got {name!r}")
        if isinstance(values, str | bytes) or not isinstance(values, Sequence | range) or (
                not values):
            raise ValueError(f"sliders[{name!r}]: expected a non-empty list of values")
        if len({str(v) for v in values}) != len(values):
            raise ValueError(f"sliders[{name!r}]: values must be distinct, got {list(values)}")
        grid[name] = list(values)
    if max_frames is not None:
        n_frames = math.prod(len(v) for v in grid.values())
        if n_frames > max_frames:
            raise ValueError(f"sliders: {n_frames} combinations, at most {max_frames} allowed "
                             "(svg_figure draws many frames from a table)")
    if not isinstance(labels, Mapping) or set(labels) != set(grid):
        raise ValueError(f"labels: expected a spoken name for each slider {list(grid)}, "
                         f"e.g. {{'n': 'sequence length n'}}; got {labels!r}")
    for name, label in labels.items():
        if not isinstance(label, str) or len(label.split()) < 2:
            raise ValueError(f"labels[{name!r}]: expected words a screen reader can say, such "
                             f"as 'sequence length n', got {label!r}")
    defaults = dict(defaults or {})
    for name, value in defaults.items():
        if name not in grid:
            raise ValueError(f"defaults: {name!r} is not a slider (sliders: {list(grid)})")
        if value not in grid[name]:
            raise ValueError(f"defaults[{name!r}]: {value!r} is not one of {grid[name]}")
    start = {name: defaults.get(name, values[0]) for name, values in grid.items()}
    return grid, start, dict(labels)


def interactive_figure(
    draw: Callable[..., Any],
    sliders: Mapping[str, Sequence[Any]],
    *,
    labels: Mapping[str, str],
    caption: str,
    alt: Alt,
    fixed: Mapping[str, Any],
    defaults: Mapping[str, Any] | None = None,
) -> InteractiveFigure:
    """A matplotlib figure redrawn from slider values, live in Jupyter/Colab and static (every
    frame precomputed) on the website.

    Args:
        draw: ``draw(**values) -> matplotlib.figure.Figure``, one keyword per slider.
        sliders: ``{name: [value, ...]}``; the grid (product of lengths) is at most MAX_FRAMES.
        labels: ``{name: "sequence length n"}``: the words a screen reader says for a slider
            (at least two words), also shown beside it.
        caption: one line under the figure saying what to notice.
        alt: alt text (required): a str, or ``alt(**values) -> str`` describing each frame.
        fixed: what the figure holds fixed while the sliders move, ``{"head dimension d":
            64, "mask": "none"}`` (required, shown under the controls: a reader must not have
            to guess the parameters no slider sets).
        defaults: starting value per slider (others start at their first value).
    """
    fixed = _check_fixed(fixed)
    if not callable(draw):
        raise TypeError(f"draw: expected a callable draw(**values) -> Figure, got {type(draw)}")
    grid, start, spoken = _check_sliders(sliders, labels, defaults, caption, alt, MAX_FRAMES)
    return InteractiveFigure(draw, grid, start, alt, labels=spoken, caption=caption,
                             fixed=fixed)


def svg_figure(
    kind: str,
    *,
    data: Any,
    sliders: Mapping[str, Sequence[Any]],
    labels: Mapping[str, str],
    caption: str,
    alt: Alt,
    fixed: Mapping[str, Any],
    defaults: Mapping[str, Any] | None = None,
) -> SvgFigure:
    """A figure the page draws itself, as SVG, from the JSON table ``data`` with the renderer
    ``flashlib/book/js/<kind>.js``; the same HTML on the website and in Jupyter/Colab.

    Args:
        kind: the renderer's name (its file in flashlib/book/js/).
        data: a JSON-able table computed by flashlib (keep it compact: it is in the page).
        sliders: ``{name: [value, ...]}`` (JSON-able values); any number of combinations.
        labels: ``{name: "spoken name"}`` per slider, as for :func:`interactive_figure`.
        caption: one line under the figure saying what to notice.
        alt: describes the default frame (for readers without JavaScript); a str or
            ``alt(**values) -> str``. The renderer returns the alt text of every frame.
        fixed: what the figure holds fixed, as for :func:`interactive_figure` (required).
        defaults: starting value per slider (others start at their first value).
    """
    fixed = _check_fixed(fixed)
    renderer = renderer_source(kind)
    grid, start, spoken = _check_sliders(sliders, labels, defaults, caption, alt, None)
    try:
        json.dumps({"data": data, "sliders": grid}, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TypeError(f"data, sliders: expected JSON-able values (no NaN): {err}") from None
    return SvgFigure(renderer, data, grid, start, spoken, caption, alt, kind, fixed)


def redraw_time(
    draw: Callable[..., Any], sliders: Mapping[str, Sequence[Any]], *, repeat: int = 5
) -> float:
    """Median seconds to redraw (draw + PNG) at the largest settings (last value of each slider).

    What a live slider move costs in the kernel (wall clock), excluding the round trip to the
    browser: each timed redraw at the largest settings follows one at the first values, so the
    figure really changes (as when a slider moves) rather than repeating the same frame.
    """
    labels = {name: f"slider {name}" for name in sliders}
    grid, _, _ = _check_sliders(sliders, labels, None, "benchmark", "benchmark", MAX_FRAMES)
    figure = InteractiveFigure(draw, grid, {}, "benchmark")
    largest = {name: values[-1] for name, values in grid.items()}
    first = {name: values[0] for name, values in grid.items()}
    # Round-robin: every timed redraw at the largest settings follows one at the first values;
    # the warm-up call of each pays for imports, the font cache and the first layout.
    med = median_times({"first": lambda: figure.render(first),
                        "largest": lambda: figure.render(largest)}, repeat, clock="wall")
    return med["largest"]
