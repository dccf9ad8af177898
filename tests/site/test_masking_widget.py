"""The masking widget's renderer (flashlib/book/js/masking.js) in a real browser: every slider
changes the drawing, and the tile counts and rows without keys it reports equal
flashlib.core.masks' classification of the same mask (the predicate is written twice, in Python and
in JavaScript: this test keeps them equal)."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from flashlib.book import widgets  # noqa: E402
from flashlib.core.masks import classify_tiles, dense_mask, padded, sliding_window
from tests.browser import chromium, serve  # noqa: E402

pytestmark = [pytest.mark.browser]

SLIDERS = {"n_q": [4, 9, 24], "n_k": [5, 16, 32], "B_r": [2, 3, 8], "B_c": [2, 5, 8],
           "left": ["none", 0, 3], "right": ["none", 0, 2], "padding": [0, 3, 40],
           "align": ["top_left", "bottom_right"]}


def expected(v):
    bound = {"none": None}
    visible = padded(sliding_window(bound.get(v["left"], v["left"]),
                                    bound.get(v["right"], v["right"]), align=v["align"]),
                     max(v["n_k"] - v["padding"], 0))
    counts = np.bincount(classify_tiles(visible, v["n_q"], v["n_k"], v["B_r"], v["B_c"]).ravel(),
                         minlength=3)
    blind = int((~dense_mask(visible, v["n_q"], v["n_k"]).any(axis=1)).sum())
    return int(counts[2]), int(counts[1]), int(counts[0]), blind


@pytest.fixture(scope="module")
def page_dir(tmp_path_factory):
    svg = widgets.svg_figure(
        "masking", data={}, sliders=SLIDERS,
        labels={name: f"slider {name}" for name in SLIDERS},
        caption="What to notice: the tiles.", alt="A mask.")
    folder = tmp_path_factory.mktemp("masking")
    (folder / "index.html").write_text(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>masking</title>"
        "<link rel='icon' href='data:,'>"
        f"</head><body><main>{svg._repr_html_()}</main></body></html>", encoding="utf-8")
    return folder


def test_masking_widget_counts_match_flashlib(page_dir):
    errors: list[str] = []
    rng = np.random.default_rng(0)
    with serve(page_dir) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/index.html")
        fig = page.locator("figure.flashlib-ifig-svg")
        drawing = fig.locator(".flashlib-ifig-drawing")
        # every slider changes the drawing
        for name in SLIDERS:
            slider = fig.locator(f"input[data-name={name}]")
            before = drawing.inner_html()
            slider.focus()
            page.keyboard.press("ArrowRight")
            assert drawing.inner_html() != before, name
            page.keyboard.press("Home")
        # random settings: the renderer's counts equal flashlib's
        for _ in range(12):
            values = {}
            for name, options in SLIDERS.items():
                index = int(rng.integers(len(options)))
                fig.locator(f"input[data-name={name}]").focus()
                page.keyboard.press("Home")
                for _ in range(index):
                    page.keyboard.press("ArrowRight")
                values[name] = options[index]
            alt = drawing.get_attribute("aria-label")
            found = re.search(r"(\d+) full, (\d+) partial, (\d+) empty; .*; (\d+) rows see no",
                              alt)
            assert found, alt
            assert tuple(int(x) for x in found.groups()) == expected(values), (values, alt)
        page.close()
    assert not errors, errors
