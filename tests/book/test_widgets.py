"""flashlib.book.widgets.interactive_figure: static (website) and live (ipywidgets) renderings."""

from __future__ import annotations

import base64
import io
import json
import re

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("ipywidgets")

from flashlib.book import plots, widgets  # noqa: E402

SLIDERS = {"n": [256, 512, 1024], "dtype": ["float16", "float32"]}
LABELS = {"n": "sequence length n", "dtype": "data type of the inputs"}
CAPTION = "What to notice: the bar grows with n."
KW = {"labels": LABELS, "caption": CAPTION, "fixed": {"head dimension d": 64}}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def draw(n: int, dtype: str):
    fig, ax = plots.new_figure(figsize=(2, 1.5))
    ax.bar([0, 1], [n, 2 if dtype == "float16" else 4])
    ax.set_title(f"{n} {dtype}")
    return fig


def constant_in_dtype(n: int, dtype: str):
    fig, ax = plots.new_figure(figsize=(2, 1.5))
    ax.plot([0, n])
    return fig


@pytest.fixture
def static(monkeypatch):
    monkeypatch.setenv(widgets.STATIC_ENV, "1")


@pytest.fixture
def live(monkeypatch):
    monkeypatch.delenv(widgets.STATIC_ENV, raising=False)


def payload(html: str) -> dict:
    match = re.search(r'<script type="application/json" class="flashlib-ifig-data">(.*?)</script>',
                      html, re.S)
    assert match, "no frame data in the HTML"
    return json.loads(match.group(1))


def test_static_bundle_is_self_contained_html(static):
    fig = widgets.interactive_figure(draw, SLIDERS, defaults={"n": 512}, alt="Bars of n", **KW)
    bundle = fig._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain"}
    html = bundle["text/html"]
    # a slider over numbers, a dropdown over names (dtype): a slider would suggest an order
    assert html.count('type="range"') == 1 and html.count("<select ") == 1
    assert html.count("<option ") == 2 and '<option value="0" selected>float16' in html
    assert 'data-name="n"' in html and 'data-name="dtype"' in html
    assert 'alt="Bars of n"' in html
    assert "addEventListener(" in html  # the frame-switching script
    assert "http" not in html  # no request anywhere
    data = payload(html)
    assert data["labels"] == [["256", "512", "1024"], ["float16", "float32"]]
    assert len(data["index"]) == 6 and len(data["frames"]) == 6
    # the initial image is the frame of the defaults (n=512 -> index 1, dtype first -> 0)
    first = data["frames"][data["index"][1 * 2 + 0]]
    assert f'src="{first}"' in html and first.startswith("data:image/png;base64,")
    assert 'value="1"' in html
    # both sliders off their first value: the last frame (n=1024 -> 2, float32 -> 1)
    last = widgets.interactive_figure(draw, SLIDERS, defaults={"n": 1024, "dtype": "float32"},
                                      alt="Bars", **KW).to_html()
    data = payload(last)
    assert f'src="{data["frames"][data["index"][2 * 2 + 1]]}"' in last
    assert 'value="2"' in last and 'value="1"' in last


def test_static_frames_are_deduplicated_and_deterministic(static):
    fig = widgets.interactive_figure(constant_in_dtype, SLIDERS, alt="Line", **KW)
    html = fig.to_html()
    data = payload(html)
    assert len(data["index"]) == 6
    assert len(data["frames"]) == 3  # dtype changes nothing
    assert data["index"] == [0, 0, 1, 1, 2, 2]
    assert fig.to_html() == html


def test_live_bundle_is_an_ipywidget(live):
    import ipywidgets

    calls = []

    def recording(n, dtype):
        calls.append((n, dtype))
        return draw(n, dtype)

    fig = widgets.interactive_figure(recording, SLIDERS, defaults={"dtype": "float32"}, alt="x",
                                     **KW)
    bundle = fig._repr_mimebundle_()
    box = fig.widget()
    # What Jupyter and Colab render as the live widget, under ipywidgets 8 (this suite) and 7.7.1
    # (tools/colab_check.py runs this file in its Colab-like venv): protocol 2.0, the box's id.
    assert bundle == {
        "text/plain": repr(fig),
        WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": box.model_id},
    }, ipywidgets.__version__
    assert widgets.WIDGET_VIEW == WIDGET_VIEW
    sliders = [w for w in box.children
               if isinstance(w, ipywidgets.SelectionSlider | ipywidgets.Dropdown)]
    # numbers on a slider, names (dtype) in a dropdown, in ipywidgets 7 and 8 alike
    assert [type(s).__name__ for s in sliders] == ["SelectionSlider", "Dropdown"]
    outputs = [w for w in box.children if isinstance(w, ipywidgets.Output)]
    assert [s.description for s in sliders] == list(LABELS.values())
    assert [s.value for s in sliders] == [256, "float32"]
    assert len(outputs) == 1
    assert calls == [(256, "float32")]
    sliders[0].value = 1024
    assert calls[-1] == (1024, "float32")
    sliders[0].value = 256  # cached: no new draw
    assert calls == [(256, "float32"), (1024, "float32")]
    assert fig.widget() is box


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"alt": ""}, ValueError, "alt"),
        ({"alt": "x", "sliders": {}}, ValueError, "sliders"),
        ({"alt": "x", "sliders": {"n": []}}, ValueError, "sliders"),
        ({"alt": "x", "sliders": {"n": "abc"}}, ValueError, "sliders"),
        ({"alt": "x", "sliders": {"n": [1, 1]}}, ValueError, "distinct"),
        ({"alt": "x", "sliders": {"n": list(range(65))}}, ValueError, "at most"),
        ({"alt": "x", "defaults": {"m": 1}}, ValueError, "defaults"),
        ({"alt": "x", "defaults": {"n": 3}}, ValueError, "defaults"),
        ({"alt": "x", "draw": 3}, TypeError, "draw"),
        ({"alt": 3}, TypeError, "alt"),
        ({"alt": "x", "caption": " "}, ValueError, "caption"),
        ({"alt": "x", "labels": {"n": "sequence length n"}}, ValueError, "labels"),
        ({"alt": "x", "labels": {"n": "n", "dtype": "data type"}}, ValueError, "screen reader"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    args = {"draw": draw, "sliders": SLIDERS} | KW | kwargs
    draw_fn, sliders = args.pop("draw"), args.pop("sliders")
    with pytest.raises(error, match=match):
        widgets.interactive_figure(draw_fn, sliders, **args)


def test_draw_must_return_a_figure(static):
    fig = widgets.interactive_figure(lambda n: n, {"n": [1, 2]}, alt="x",
                                     labels={"n": "sequence length n"}, caption=CAPTION,
                                     fixed={"head dimension d": 64})
    message = r"draw\(\*\*values\): expected a matplotlib Figure, got int"
    with pytest.raises(TypeError, match=message):
        fig.to_html()


def test_widgets_and_plots_check_alt_text_the_same_way():
    message = "alt: expected a non-empty text describing the figure"
    with pytest.raises(ValueError, match=message):
        widgets.interactive_figure(draw, SLIDERS, alt="  ", **KW)
    fig, _ = plots.new_figure()
    with pytest.raises(ValueError, match=message):
        plots.show(fig, alt="")
    with pytest.raises(TypeError, match="fig: expected a matplotlib Figure, got str"):
        plots.show("not a figure", alt="x")


def test_redraw_time_is_a_positive_median():
    seconds = widgets.redraw_time(draw, SLIDERS, repeat=3)
    assert 0 < seconds < 10


def test_plots_palette_and_alt_text():
    assert len(set(plots.PALETTE)) == len(plots.PALETTE) == 8
    fig, ax = plots.new_figure()
    ax.plot([0, 1])
    shown = plots.show(fig, alt="A rising line")
    bundle, metadata = shown._repr_mimebundle_()
    assert 'alt="A rising line"' in bundle["text/html"]
    assert bundle["image/png"]
    # drawn at 2x for a retina screen, shown at the designed size: the default 4.8 x 3.2 in
    width, height = plots.designed_size(shown.png)
    assert abs(width - 96 * plots.FIGSIZE[0]) <= 1 and abs(height - 96 * plots.FIGSIZE[1]) <= 1
    assert metadata == {"image/png": {"width": width, "height": height}}
    assert f'width="{width}" height="{height}"' in bundle["text/html"]
    with pytest.raises(ValueError, match="alt"):
        plots.show(fig, alt=" ")
    with pytest.raises(TypeError, match="fig"):
        plots.show("not a figure", alt="x")


def updating_draw():
    """The fast pattern: one figure built once, draw() only updates it."""
    fig, ax = plots.new_figure(figsize=(3, 2))
    bars = ax.bar([0, 1], [1, 1])
    ax.set_ylim(0, 1100)
    ax.set_xticks([0, 1], ["n", "bytes"])
    ax.set_ylabel("value")

    def draw(n: int, dtype: str):
        for bar, value in zip(bars, [n, 2 if dtype == "float16" else 4], strict=True):
            bar.set_height(value)
        ax.set_title(f"{n} {dtype}")
        return fig

    return draw, fig


def rebuilding_draw(n: int, dtype: str):
    """The same picture as updating_draw, rebuilt (and laid out) on every call."""
    fig, ax = plots.new_figure(figsize=(3, 2))
    ax.bar([0, 1], [n, 2 if dtype == "float16" else 4])
    ax.set_ylim(0, 1100)
    ax.set_xticks([0, 1], ["n", "bytes"])
    ax.set_ylabel("value")
    ax.set_title(f"{n} {dtype}")
    return fig


def count_draws(monkeypatch) -> list[int]:
    from matplotlib.figure import Figure

    calls: list[int] = []
    draw = Figure.draw

    def counting(self, renderer):
        calls.append(1)
        return draw(self, renderer)

    monkeypatch.setattr(Figure, "draw", counting)
    return calls


def test_reused_figure_keeps_its_first_layout_and_looks_the_same(static, monkeypatch):
    draw, fig = updating_draw()
    reused = widgets.interactive_figure(draw, SLIDERS, alt="Bars", **KW)
    rebuilt = widgets.interactive_figure(rebuilding_draw, SLIDERS, alt="Bars", **KW)
    calls = count_draws(monkeypatch)
    grid = reused.grid
    first = reused.render(grid[0])
    assert not plots.layout_frozen(fig)  # the first frame is laid out as usual
    assert len(calls) == 2  # savefig: layout pass + draw
    position = fig.axes[0].get_position().bounds
    frames = [first]
    for values in grid[1:]:
        calls.clear()
        frames.append(reused.render(values))
        assert len(calls) == 1, "a frozen figure must render in one draw pass"
    assert plots.layout_frozen(fig)
    assert fig.axes[0].get_position().bounds == position
    # pixel for pixel what rebuilding the figure (with a fresh layout) gives
    assert frames == [rebuilt.render(values) for values in grid]
    assert payload(reused.to_html())["frames"] == payload(rebuilt.to_html())["frames"]


def test_live_widget_redraws_a_reused_figure(live):
    import ipywidgets

    draw, fig = updating_draw()
    shown = widgets.interactive_figure(draw, SLIDERS, defaults={"n": 512}, alt="Bars", **KW)
    box = shown.widget()
    sliders = [w for w in box.children
               if isinstance(w, ipywidgets.SelectionSlider | ipywidgets.Dropdown)]
    sliders[0].value = 1024
    sliders[1].value = "float32"
    assert plots.layout_frozen(fig)
    assert shown.render({"n": 1024, "dtype": "float32"}) == plots.figure_png(
        rebuilding_draw(1024, "float32")
    )


def test_redraw_time_moves_from_the_first_to_the_largest_values():
    calls = []

    def recording(n, dtype):
        calls.append((n, dtype))
        return draw(n, dtype)

    widgets.redraw_time(recording, SLIDERS, repeat=2)
    largest, first = (1024, "float32"), (256, "float16")
    # round-robin (flashlib.core.measure): a warm-up of each, then every timed redraw at the
    # largest values follows one at the first values
    assert calls == [first, largest] * 3


def test_static_figure_is_accessible_without_javascript(static):
    """Spoken slider names, the caption as figcaption, controls hidden until the script runs
    (no dead slider with JavaScript off), a note saying what the default frame shows, alt text
    that follows the frame, palette PNG frames, the smallest text size on the image."""
    fig = widgets.interactive_figure(
        draw, SLIDERS, defaults={"n": 512}, alt=lambda n, dtype: f"Bars for n = {n}, {dtype}",
        **KW)
    html = fig.to_html()
    assert html.startswith('<figure class="flashlib-ifig flashlib-ifig-png"')
    assert 'aria-label="sequence length n"' in html
    assert "<span>data type of the inputs</span>" in html
    assert f"<figcaption>{CAPTION}</figcaption>" in html
    assert '<div class="flashlib-ifig-controls" hidden>' in html
    assert "<noscript>" in html and "sequence length n = 512" in html
    assert 'alt="Bars for n = 512, float16"' in html
    data = payload(html)
    assert len(data["alts"]) == 6 and data["alts"][data["altIndex"][1 * 2 + 0]] == (
        "Bars for n = 512, float16")
    png = base64.b64decode(data["frames"][0].removeprefix("data:image/png;base64,"))
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        assert image.mode == "P"  # a palette PNG
        # drawn at twice its designed size (crisp on a 2x screen), shown at that size
        assert image.size == (2 * 96 * 2, 1.5 * 96 * 2)
    assert 'width="192" height="144"' in html  # draw's figsize (2, 1.5) at 96 px per inch
    assert re.search(r'data-text-px="1[0-9.]+"', html)  # 10 pt at 96 dpi: 13.33 px


def test_alt_function_must_return_text(static):
    fig = widgets.interactive_figure(draw, SLIDERS, alt=lambda n, dtype: "", **KW)
    with pytest.raises(ValueError, match="alt"):
        fig.to_html()


def test_svg_figure_inlines_its_renderer_and_data():
    from flashlib.book.chapters.tiling import tiling_widget_data

    data = tiling_widget_data([20], [8], orders=["v2"])
    steps = len(data["configs"]["20-8-8-v2"]["steps"])
    fig = widgets.svg_figure(
        "tiling", data=data,
        sliders={"n": [20], "B_r": [8], "B_c": [8], "order": ["v2"],
                 "step": list(range(steps))},
        labels={"n": "sequence length n", "B_r": "query block B_r", "B_c": "key block B_c",
                "order": "loop order", "step": "step of the schedule"},
        defaults={"step": 3}, caption="What to notice: K and V are re-read.",
        alt="The third tile of FlashAttention-2's schedule.", fixed={"head dimension d": 4})
    html = fig._repr_html_()
    assert html.startswith('<figure class="flashlib-ifig flashlib-ifig-svg"')
    assert "function draw(data, values, h)" in html  # js/tiling.js, inlined
    assert "__FLASHLIB" not in html  # every placeholder filled
    assert 'role="img" aria-label="The third tile' in html
    assert "which is off" in html  # the no-JavaScript note
    assert 'value="3"' in html and "http://" not in html.replace(
        "http://www.w3.org/2000/svg", "")
    spec = payload(html)
    assert spec["data"] == data and spec["sliders"][4]["values"] == list(range(steps))
    assert widgets._inline(widgets.renderer_source("tiling")) in html


@pytest.mark.parametrize(
    ("kind", "kwargs", "error", "match"),
    [
        ("nope", {}, ValueError, "no renderer"),
        ("../x", {}, ValueError, "kind"),
        ("drawn", {}, ValueError, "kind"),
        ("tiling", {"data": {"x": float("nan")}}, TypeError, "JSON"),
        ("tiling", {"data": {"x": object()}}, TypeError, "JSON"),
        ("tiling", {"labels": {"step": "s"}}, ValueError, "screen reader"),
    ],
)
def test_svg_figure_bad_arguments(kind, kwargs, error, match):
    args = {"data": {}, "sliders": {"step": [0, 1]}, "labels": {"step": "step of the run"},
            "caption": CAPTION, "alt": "x", "fixed": {"head dimension d": 4}} | kwargs
    with pytest.raises(error, match=match):
        widgets.svg_figure(kind, **args)
