"""The tiling chapter's widget, built as book/tiling.md builds it, in a real browser: five named
sliders, the step slider moves the tile, the traffic and the chosen row's running m and l, the
drawing fits a 390 px phone, and the table stays light (headless Chromium, tests/browser.py)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")

from flashlib.book import widgets  # noqa: E402
from flashlib.book.widget_data import tiling_widget_data  # noqa: E402
from tests.browser import chromium, serve  # noqa: E402
from tools.paths import ROOT

pytestmark = [pytest.mark.browser]

CSS = ROOT / "book" / "_static" / "flashlib.css"
#: The page's grid (book/tiling.md, "Try it: stepping through the schedule").
WIDGET_NS, WIDGET_BLOCKS = [48, 100], [16, 32, 64]


@pytest.fixture(scope="module")
def table():
    return tiling_widget_data(WIDGET_NS, WIDGET_BLOCKS)


@pytest.fixture(scope="module")
def page_dir(tmp_path_factory, table):
    steps = max(len(run["steps"]) for run in table["configs"].values())
    fig = widgets.svg_figure(
        "tiling", data=table,
        sliders={"n": WIDGET_NS, "B_r": WIDGET_BLOCKS, "B_c": WIDGET_BLOCKS,
                 "order": ["v1", "v2"], "step": list(range(steps))},
        labels={"n": "sequence length n", "B_r": "query block size B_r",
                "B_c": "key block size B_c", "order": "loop order",
                "step": "step of the schedule"},
        defaults={"n": 100, "B_r": 32, "B_c": 16, "step": 6},
        caption="What to notice: the schedule.", alt="Step 6 of Algorithm 1's schedule.")
    folder = tmp_path_factory.mktemp("tiling")
    (folder / "index.html").write_text(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>tiling</title>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<link rel='icon' href='data:,'><style>{CSS.read_text(encoding='utf-8')}</style>"
        f"</head><body><main>{fig._repr_html_()}</main></body></html>", encoding="utf-8")
    return folder


def test_table_is_light(table):
    assert len(table["configs"]) == 2 * 3 * 3 * 2
    assert len(json.dumps(table, separators=(",", ":"))) < 250_000


def test_step_moves_the_tile_the_traffic_and_the_rows_m_and_l(page_dir):
    errors: list[str] = []
    with serve(page_dir) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": 390, "height": 900})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/index.html")
        fig = page.locator("figure.flashlib-ifig-svg")
        sliders = fig.locator("input[type=range]")
        assert sliders.count() == 5
        assert all(len((sliders.nth(k).get_attribute("aria-label") or "").split()) >= 2
                   for k in range(5))
        drawing = fig.locator(".flashlib-ifig-drawing")
        label = drawing.get_attribute("aria-label")
        # one slider away and back is the same frame: the default step exists in every
        # configuration one slider away (n = 48 with these blocks has 6 tiles)
        for k in range(4):
            sliders.nth(k).focus()
            page.keyboard.press("ArrowLeft" if k == 0 else "ArrowRight")
            page.keyboard.press("ArrowRight" if k == 0 else "ArrowLeft")
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
        page.close()
    assert not errors, errors
