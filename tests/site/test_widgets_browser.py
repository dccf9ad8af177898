"""flashlib.book.widgets in a real browser (headless Chromium through Playwright,
tests/browser.py), on small pages made of widget outputs, as the website and a Jupyter/Colab
output show them:

- both kinds of interactive figure (``interactive_figure``'s PNG frames, ``svg_figure``'s
  JavaScript renderers): every slider redraws, with and without JavaScript;
- the tiling chapter's widget, built as book/tiling.md builds it (flashlib/book/js/tiling.js):
  five named sliders, the step slider moves the tile, the traffic and the chosen row's running
  m and l, the drawing fits a 390 px phone, and its table stays light;
- the masking widget's renderer (flashlib/book/js/masking.js): every slider changes the
  drawing, and the tile counts and rows without keys it reports equal flashlib.core.masks'
  classification of the same mask (the predicate is written twice, in Python and in
  JavaScript: this test keeps them equal);
- the dropout widget's renderer (flashlib/book/js/dropout.js): every slider changes the
  drawing, the kept bits it draws equal flashlib.core.philox.dropout_keep (the threshold is
  written twice), a smaller n shows the corner of a larger one, and it fits a 390 px phone.

The pages of the built site are tested in tests/site/test_site.py.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from flashlib.book import plots, widgets  # noqa: E402
from flashlib.book.chapters.masking import DROPOUT_WIDGET, dropout_widget_data  # noqa: E402
from flashlib.book.chapters.tiling import tiling_widget_data  # noqa: E402
from flashlib.core.masks import (  # noqa: E402
    classify_tiles,
    dense_mask,
    padded,
    sliding_window,
)
from flashlib.core.philox import dropout_keep  # noqa: E402
from tests.browser import chromium, serve  # noqa: E402
from tools.paths import ROOT  # noqa: E402

pytestmark = [pytest.mark.browser]

CSS = ROOT / "book" / "_static" / "flashlib.css"


def write_page(folder: Path, title: str, body: str, head: str = "") -> Path:
    """``folder``/index.html: a minimal accessible page holding ``body`` in its main."""
    (folder / "index.html").write_text(
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
        f"{head}<link rel='icon' href='data:,'>"
        f"</head><body><main>{body}</main></body></html>", encoding="utf-8")
    return folder


@contextlib.contextmanager
def opened(folder: Path, width: int) -> Iterator[object]:
    """The page of ``folder`` in Chromium, ``width`` CSS px wide; fails the test on any
    console error or uncaught exception it logged."""
    errors: list[str] = []
    with serve(folder) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/index.html")
        yield page
        page.close()
    assert not errors, errors


def choose(page, fig, name: str, index: int) -> None:
    """Sets the control ``name`` of ``fig`` to its value number ``index``: a dropdown (a
    slider over names) by choosing the option, a slider from the keyboard."""
    control = fig.locator(f"[data-name={name}]")
    if control.evaluate("c => c.tagName") == "SELECT":
        control.select_option(value=str(index))
        return
    control.focus()
    page.keyboard.press("Home")
    for _ in range(index):
        page.keyboard.press("ArrowRight")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


# both kinds of interactive figure ----------------------------------------------------------------

N_VALUES, BLOCKS = [20, 36], [8, 16]


def bars(n: int, kind: str):
    fig, ax = plots.new_figure(figsize=(3, 2))
    ax.bar([0, 1], [n, 3 if kind == "a" else 5])
    ax.set_title(f"n = {n}, {kind}")
    return fig


@pytest.fixture(scope="module")
def figures_page(tmp_path_factory, monkeypatch_module):
    """A page holding one figure of each kind, as the book build renders them."""
    monkeypatch_module.setenv(widgets.STATIC_ENV, "1")
    png = widgets.interactive_figure(
        bars, {"n": [1, 2, 3], "kind": ["a", "b"]},
        labels={"n": "sequence length n", "kind": "kind of bar"},
        caption="What to notice: the bars move.",
        alt=lambda n, kind: f"Two bars for n = {n}, kind {kind}", fixed={"bar width": 0.5})
    data = tiling_widget_data(N_VALUES, BLOCKS)
    steps = max(len(run["steps"]) for run in data["configs"].values())
    svg = widgets.svg_figure(
        "tiling", data=data,
        sliders={"n": N_VALUES, "B_r": BLOCKS, "B_c": BLOCKS, "order": ["v1", "v2"],
                 "step": list(range(steps))},
        labels={"n": "sequence length n", "B_r": "query block B_r", "B_c": "key block B_c",
                "order": "loop order", "step": "step of the schedule"},
        defaults={"n": 36, "step": 5}, caption="What to notice: the schedule.",
        alt="Step 5 of Algorithm 1's schedule.", fixed={"head dimension d": 4})
    return write_page(tmp_path_factory.mktemp("widgets"), "widgets",
                      png.to_html() + svg._repr_html_())


STATE = """fig => {
  const img = fig.querySelector('img');
  if (img) return img.getAttribute('src') + '|' + img.getAttribute('alt');
  const d = fig.querySelector('.flashlib-ifig-drawing');
  return d.innerHTML + '|' + d.getAttribute('aria-label');
}"""


def test_both_kinds_redraw_from_every_slider(figures_page):
    with opened(figures_page, 1280) as page:
        figures = page.locator("figure.flashlib-ifig")
        assert figures.count() == 2
        svg_fig = page.locator("figure.flashlib-ifig-svg")
        assert svg_fig.locator(".flashlib-ifig-drawing svg text").count() > 5
        assert "step 5" in svg_fig.locator(".flashlib-ifig-drawing").get_attribute("aria-label")
        for i in range(2):
            fig = figures.nth(i)
            assert fig.locator(".flashlib-ifig-controls").is_visible()
            assert fig.locator("figcaption").inner_text().startswith("What to notice")
            sliders = fig.locator("input[type=range]")
            for k in range(sliders.count()):
                slider = sliders.nth(k)
                before, said = fig.evaluate(STATE), slider.get_attribute("aria-valuetext")
                top = int(slider.input_value()) == int(slider.get_attribute("max"))
                slider.focus()
                page.keyboard.press("ArrowLeft" if top else "ArrowRight")
                assert fig.evaluate(STATE) != before, slider.get_attribute("aria-label")
                assert slider.get_attribute("aria-valuetext") != said
                page.keyboard.press("ArrowRight" if top else "ArrowLeft")
                assert fig.evaluate(STATE) == before, slider.get_attribute("aria-label")
            # a slider over names (kind, loop order) is a dropdown: it redraws too
            dropdowns = fig.locator("select")
            assert dropdowns.count() == 1
            menu = dropdowns.first
            before, chosen = fig.evaluate(STATE), menu.input_value()
            menu.select_option(value="1" if chosen == "0" else "0")
            assert fig.evaluate(STATE) != before, menu.get_attribute("data-name")
            menu.select_option(value=chosen)
            assert fig.evaluate(STATE) == before, menu.get_attribute("data-name")
        # the png kind's alt text follows the frame
        img = page.locator("figure.flashlib-ifig-png img:not([hidden])")
        page.locator("figure.flashlib-ifig-png input").first.focus()
        page.keyboard.press("End")
        assert img.get_attribute("alt") == "Two bars for n = 3, kind a"
        # the renderer limits the step slider to the schedule's length: a short schedule
        # (n = 20, blocks of 16: 2 x 2 tiles) pulls a late step back to its last one
        step = svg_fig.locator("input[data-name=step]")
        step.focus()
        page.keyboard.press("End")
        svg_fig.locator("input[data-name=n]").focus()
        page.keyboard.press("Home")
        for name in ("B_r", "B_c"):
            svg_fig.locator(f"input[data-name={name}]").focus()
            page.keyboard.press("End")
        last = int(step.get_attribute("max"))
        assert last == 4 and int(step.input_value()) == last  # 4 tiles after step 0
        label = svg_fig.locator(".flashlib-ifig-drawing").get_attribute("aria-label")
        assert f"step {last} of {last}" in label
        # and says so: its label and spoken value follow the clamp (the reader's stale "20")
        assert step.locator("xpath=following-sibling::output").inner_text() == str(last)
        assert step.get_attribute("aria-valuetext") == str(last)


def test_without_javascript_the_default_frame_and_a_note(figures_page):
    with serve(figures_page) as url, chromium() as browser:
        context = browser.new_context(java_script_enabled=False)
        page = context.new_page()
        page.goto(f"{url}/index.html")
        for fig in (page.locator("figure.flashlib-ifig-png"),
                    page.locator("figure.flashlib-ifig-svg")):
            assert not fig.locator(".flashlib-ifig-controls").is_visible()
            assert fig.locator(".flashlib-ifig-nojs").is_visible()
        img = page.locator("figure.flashlib-ifig-png img:not([hidden])")
        assert img.is_visible() and img.get_attribute("alt") == "Two bars for n = 1, kind a"
        note = page.locator("figure.flashlib-ifig-svg .flashlib-ifig-nojs").inner_text()
        assert note.startswith("Step 5 of Algorithm 1's schedule.")
        context.close()


# the tiling chapter's widget ---------------------------------------------------------------------

#: The page's grid (book/tiling.md, "Try it: stepping through the schedule").
WIDGET_NS, WIDGET_BLOCKS = [48, 100], [16, 32, 64]


@pytest.fixture(scope="module")
def tiling_table():
    return tiling_widget_data(WIDGET_NS, WIDGET_BLOCKS)


@pytest.fixture(scope="module")
def tiling_page(tmp_path_factory, tiling_table):
    steps = max(len(run["steps"]) for run in tiling_table["configs"].values())
    fig = widgets.svg_figure(
        "tiling", data=tiling_table,
        sliders={"n": WIDGET_NS, "B_r": WIDGET_BLOCKS, "B_c": WIDGET_BLOCKS,
                 "order": ["v1", "v2"], "step": list(range(steps))},
        labels={"n": "sequence length n", "B_r": "query block size B_r",
                "B_c": "key block size B_c", "order": "loop order",
                "step": "step of the schedule"},
        defaults={"n": 100, "B_r": 32, "B_c": 16, "step": 6},
        caption="What to notice: the schedule.", alt="Step 6 of Algorithm 1's schedule.",
        fixed={"head dimension d": 4})
    head = ("<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<style>{CSS.read_text(encoding='utf-8')}</style>")
    return write_page(tmp_path_factory.mktemp("tiling"), "tiling", fig._repr_html_(), head)


def test_tiling_table_is_light(tiling_table):
    assert len(tiling_table["configs"]) == 2 * 3 * 3 * 2
    assert len(json.dumps(tiling_table, separators=(",", ":"))) < 250_000


def test_step_moves_the_tile_the_traffic_and_the_rows_m_and_l(tiling_page):
    with opened(tiling_page, 390) as page:
        fig = page.locator("figure.flashlib-ifig-svg")
        sliders = fig.locator("input[type=range]")
        assert sliders.count() == 4  # n, B_r, B_c, step; the loop order is a dropdown
        assert all(len((sliders.nth(k).get_attribute("aria-label") or "").split()) >= 2
                   for k in range(4))
        order = fig.locator("select[data-name=order]")
        assert order.locator("option").all_inner_texts() == ["v1", "v2"]
        assert "loop order" in fig.locator("label:has(select)").inner_text()
        drawing = fig.locator(".flashlib-ifig-drawing")
        label = drawing.get_attribute("aria-label")
        # one slider away and back is the same frame: the default step exists in every
        # configuration one slider away (n = 48 with these blocks has 6 tiles)
        for k in range(3):
            sliders.nth(k).focus()
            page.keyboard.press("ArrowLeft" if k == 0 else "ArrowRight")
            page.keyboard.press("ArrowRight" if k == 0 else "ArrowLeft")
            assert drawing.get_attribute("aria-label") == label
        order.select_option("1")
        assert "FlashAttention-2" in drawing.inner_html()
        order.select_option("0")
        assert drawing.get_attribute("aria-label") == label
        assert "step 6" in label and "running maximum m" in label
        # blocks counted from 1, as in the algorithm boxes: step 6 of Algorithm 1 on 4 x 7
        # tiles is the second tile of the second key block (0-based (1, 1) in the log)
        assert "tile (2, 2) is computed, SRAM holds K_2, V_2, Q_2, O_2, l_2, m_2" in label
        step = fig.locator("input[data-name=step]")
        step.focus()
        for _ in range(11):  # v1, n = 100, 4 x 7 tiles: step 17 is a tile of row block 1
            page.keyboard.press("ArrowRight")
        later = drawing.get_attribute("aria-label")
        assert "step 17" in later and later != label
        assert later.split("row 51 has seen")[1] != label.split("row 51 has seen")[1]
        assert "m = " in drawing.inner_html() and "l = " in drawing.inner_html()
        wide = fig.evaluate("f => f.scrollWidth > f.clientWidth + 1")
        assert not wide, "the widget scrolls sideways at 390 px"


# the masking widget ------------------------------------------------------------------------------

MASK_SLIDERS = {"n_q": [4, 9, 24], "n_k": [5, 16, 32], "B_r": [2, 3, 8], "B_c": [2, 5, 8],
                "left": ["none", 0, 3], "right": ["none", 0, 2], "padding": [0, 3, 40],
                "align": ["top_left", "bottom_right"]}


def expected_mask_counts(v):
    """flashlib's (full, partial, empty tiles, rows without keys) for the sliders' values."""
    bound = {"none": None}
    visible = padded(sliding_window(bound.get(v["left"], v["left"]),
                                    bound.get(v["right"], v["right"]), align=v["align"]),
                     max(v["n_k"] - v["padding"], 0))  # a bottom-right diagonal: last real key
    counts = np.bincount(classify_tiles(visible, v["n_q"], v["n_k"], v["B_r"], v["B_c"]).ravel(),
                         minlength=3)
    blind = int((~dense_mask(visible, v["n_q"], v["n_k"]).any(axis=1)).sum())
    return int(counts[2]), int(counts[1]), int(counts[0]), blind


@pytest.fixture(scope="module")
def masking_page(tmp_path_factory):
    svg = widgets.svg_figure(
        "masking", data={}, sliders=MASK_SLIDERS,
        labels={name: f"slider {name}" for name in MASK_SLIDERS},
        caption="What to notice: the tiles.", alt="A mask.", fixed={"values": "none"})
    return write_page(tmp_path_factory.mktemp("masking"), "masking", svg._repr_html_())


def test_masking_widget_counts_match_flashlib(masking_page):
    rng = np.random.default_rng(0)
    with opened(masking_page, 1280) as page:
        fig = page.locator("figure.flashlib-ifig-svg")
        drawing = fig.locator(".flashlib-ifig-drawing")
        # every slider changes the drawing
        for name in MASK_SLIDERS:
            before = drawing.inner_html()
            choose(page, fig, name, 1)
            assert drawing.inner_html() != before, name
            choose(page, fig, name, 0)
        # random settings: the renderer's counts equal flashlib's
        for _ in range(12):
            values = {}
            for name, options in MASK_SLIDERS.items():
                index = int(rng.integers(len(options)))
                choose(page, fig, name, index)
                values[name] = options[index]
            alt = drawing.get_attribute("aria-label")
            found = re.search(r"(\d+) full, (\d+) partial, (\d+) empty; .*; (\d+) rows see no",
                              alt)
            assert found, alt
            assert tuple(int(x) for x in found.groups()) == expected_mask_counts(values), (
                values, alt)


# the dropout widget ------------------------------------------------------------------------------

DROPOUT_SLIDERS = {"n": [8, 16, 24, 32], "B": [4, 8, 16], "p": [0.1, 0.2, 0.5]}


@pytest.fixture(scope="module")
def dropout_page(tmp_path_factory):
    svg = widgets.svg_figure(
        "dropout", data=dropout_widget_data(32), sliders=DROPOUT_SLIDERS,
        labels={"n": "sequence length n", "B": "block size B", "p": "dropout probability p"},
        caption="What to notice: the bits.", alt="A dropout mask.", fixed={"seed": 2024})
    return write_page(tmp_path_factory.mktemp("dropout"), "dropout", svg._repr_html_())


def _drawn_bits(drawing) -> list[bool]:
    """The entries the renderer drew, in row order: True where filled (kept)."""
    return drawing.evaluate(
        "d => Array.from(d.querySelectorAll('svg > rect[fill=\"#0072B2\"],"
        " svg > rect[stroke=\"#888888\"]')).map(r => r.getAttribute('fill') !== 'none')")


def test_dropout_widget_bits_match_flashlib(dropout_page):
    rng = np.random.default_rng(1)
    with opened(dropout_page, 1280) as page:
        fig = page.locator("figure.flashlib-ifig-svg")
        drawing = fig.locator(".flashlib-ifig-drawing")
        for name in DROPOUT_SLIDERS:  # every slider changes the drawing
            before = drawing.inner_html()
            choose(page, fig, name, 1)
            assert drawing.inner_html() != before, name
            choose(page, fig, name, 0)
        for _ in range(8):  # random settings: the bits drawn are flashlib's
            values = {}
            for name, options in DROPOUT_SLIDERS.items():
                index = int(rng.integers(len(options)))
                choose(page, fig, name, index)
                values[name] = options[index]
            n, p = values["n"], values["p"]
            want = dropout_keep(DROPOUT_WIDGET["seed"], DROPOUT_WIDGET["head"],
                                np.arange(n)[:, None], np.arange(n), p)
            drawn = np.array(_drawn_bits(drawing)[: n * n]).reshape(n, n)
            np.testing.assert_array_equal(drawn, want)
            alt = drawing.get_attribute("aria-label")
            assert f"{int(want.sum())} of {n * n} entries kept" in alt, (values, alt)
    with opened(dropout_page, 390) as page:
        fig = page.locator("figure.flashlib-ifig-svg")
        choose(page, fig, "n", 3)
        wide = fig.evaluate("f => f.scrollWidth > f.clientWidth + 1")
        assert not wide, "the dropout widget scrolls sideways at 390 px"

