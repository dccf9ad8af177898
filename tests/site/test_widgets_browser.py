"""flashlib.book.widgets in a real browser: both kinds of interactive figure, as the website
and a Jupyter/Colab output show them, with and without JavaScript (headless Chromium through
Playwright, tests/browser.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from flashlib.book import plots, widgets  # noqa: E402
from flashlib.book.widget_data import tiling_widget_data  # noqa: E402
from tests.browser import chromium, serve  # noqa: E402

pytestmark = [pytest.mark.browser]

N_VALUES, BLOCKS = [20, 36], [8, 16]


def bars(n: int, kind: str):
    fig, ax = plots.new_figure(figsize=(3, 2))
    ax.bar([0, 1], [n, 3 if kind == "a" else 5])
    ax.set_title(f"n = {n}, {kind}")
    return fig


@pytest.fixture(scope="module")
def page_dir(tmp_path_factory, monkeypatch_module):
    """A page holding one figure of each kind, as the book build renders them."""
    monkeypatch_module.setenv(widgets.STATIC_ENV, "1")
    png = widgets.interactive_figure(
        bars, {"n": [1, 2, 3], "kind": ["a", "b"]},
        labels={"n": "sequence length n", "kind": "kind of bar"},
        caption="What to notice: the bars move.",
        alt=lambda n, kind: f"Two bars for n = {n}, kind {kind}")
    data = tiling_widget_data(N_VALUES, BLOCKS)
    steps = max(len(run["steps"]) for run in data["configs"].values())
    svg = widgets.svg_figure(
        "tiling", data=data,
        sliders={"n": N_VALUES, "B_r": BLOCKS, "B_c": BLOCKS, "order": ["v1", "v2"],
                 "step": list(range(steps))},
        labels={"n": "sequence length n", "B_r": "query block B_r", "B_c": "key block B_c",
                "order": "loop order", "step": "step of the schedule"},
        defaults={"n": 36, "step": 5}, caption="What to notice: the schedule.",
        alt="Step 5 of Algorithm 1's schedule.")
    folder = tmp_path_factory.mktemp("widgets")
    (folder / "index.html").write_text(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>widgets</title>"
        "<link rel='icon' href='data:,'>"
        f"</head><body><main>{png.to_html()}{svg._repr_html_()}</main></body></html>",
        encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


STATE = """fig => {
  const img = fig.querySelector('img');
  if (img) return img.getAttribute('src') + '|' + img.getAttribute('alt');
  const d = fig.querySelector('.flashlib-ifig-drawing');
  return d.innerHTML + '|' + d.getAttribute('aria-label');
}"""


def test_both_kinds_redraw_from_every_slider(page_dir):
    errors: list[str] = []
    with serve(page_dir) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/index.html")
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
        # the png kind's alt text follows the frame
        img = page.locator("figure.flashlib-ifig-png img")
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
        page.close()
    assert not errors, errors


def test_without_javascript_the_default_frame_and_a_note(page_dir):
    with serve(page_dir) as url, chromium() as browser:
        context = browser.new_context(java_script_enabled=False)
        page = context.new_page()
        page.goto(f"{url}/index.html")
        for fig in (page.locator("figure.flashlib-ifig-png"),
                    page.locator("figure.flashlib-ifig-svg")):
            assert not fig.locator(".flashlib-ifig-controls").is_visible()
            assert fig.locator(".flashlib-ifig-nojs").is_visible()
        img = page.locator("figure.flashlib-ifig-png img")
        assert img.is_visible() and img.get_attribute("alt") == "Two bars for n = 1, kind a"
        note = page.locator("figure.flashlib-ifig-svg .flashlib-ifig-nojs").inner_text()
        assert note.startswith("Step 5 of Algorithm 1's schedule.")
        context.close()
