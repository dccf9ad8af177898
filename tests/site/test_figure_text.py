"""The text of every SVG figure of the built site (_build/html, made by `make book`): the
diagrams (``figure.flashlib-diagram``) and the drawings of the widgets the page draws itself
(``svg_figure``: tiling, masking, IO model, launch grid), at a 390 px phone and a 1280 px
desktop.  No text box overlaps another, none is clipped by its SVG's viewport, and at 1280 px a
widget's text is at least :data:`MIN_WIDGET_TEXT_PX` tall (a widget scaled to the column, not
shrunk into a corner of it).  Every slider of a drawn widget is moved to its last value too:
the longest labels are often there.

The matplotlib widgets (``interactive_figure``) are PNG frames; their texts are checked when
the book is built, on every frame (:func:`flashlib.book.plots.text_collisions`).
"""

from __future__ import annotations

import pytest

from tests.browser import chromium, serve
from tests.site.test_site import PAGES, SITE

pytestmark = [pytest.mark.site, pytest.mark.browser]

#: Pixels two text boxes may share (anti-aliasing, rounding of glyph boxes).
TOLERANCE = 0.5
#: Pixels a text box may reach past its SVG's edge: the box of a glyph such as "w" starts
#: about a pixel left of its origin, x = 0, with its ink inside.
CLIP_TOLERANCE = 1.5
#: Smallest font size, in CSS px, of a drawn widget's text on a 1280 px desktop.
MIN_WIDGET_TEXT_PX = 12.0

#: Per SVG (diagram or drawn widget): texts that overlap, that the viewport clips, and, for a
#: widget, texts smaller than min_px (when min_px is given).
MEASURE = """([tolerance, clip, minPx]) => {
  const inter = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > tolerance
      && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > tolerance;
  const found = [];
  const svgs = document.querySelectorAll(
    'main figure.flashlib-diagram > svg, main .flashlib-ifig-drawing > svg');
  svgs.forEach((svg, n) => {
    const fig = svg.closest('figure');
    const name = (fig.querySelector('figcaption') || fig).textContent.slice(0, 50);
    const widget = !!svg.closest('.flashlib-ifig-drawing');
    const box = svg.getBoundingClientRect();
    const texts = [...svg.querySelectorAll('text')]
      .filter(t => t.textContent.trim() && t.checkVisibility())
      .map(t => [t.textContent.trim(), t.getBoundingClientRect(), t]);
    texts.forEach(([s, r, t], i) => {
      if (r.left < box.left - clip || r.right > box.right + clip
          || r.top < box.top - clip || r.bottom > box.bottom + clip)
        found.push(`figure ${n} "${name}": "${s}" clipped by the viewport`);
      if (widget && minPx) {
        const px = parseFloat(getComputedStyle(t).fontSize) * svg.getScreenCTM().a;
        if (px < minPx - 0.01)
          found.push(`figure ${n} "${name}": "${s}" is ${px.toFixed(1)} px`);
      }
      texts.slice(i + 1).forEach(([s2, r2]) => {
        if (inter(r, r2)) found.push(`figure ${n} "${name}": "${s}" overlaps "${s2}"`);
      });
    });
  });
  return found;
}"""

#: Moves every slider of every drawn widget to its last value.
LAST_VALUES = """() => {
  for (const input of document.querySelectorAll(
      'main .flashlib-ifig-svg input[type=range]')) {
    input.value = input.max;
    input.dispatchEvent(new Event('input'));
  }
}"""


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").is_file():
        pytest.fail(f"{SITE} is missing: run `make book` first (make test does it)")
    with serve(SITE) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.mark.parametrize("width", [390, 1280])
@pytest.mark.parametrize("page_path", PAGES)
def test_figure_text_fits(server, browser, page_path, width):
    if page_path.startswith("<"):
        pytest.fail(f"{SITE} is missing: run `make book` first (make test does it)")
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(f"{server}/{page_path}")
    min_px = MIN_WIDGET_TEXT_PX if width == 1280 else 0
    found = page.evaluate(MEASURE, [TOLERANCE, CLIP_TOLERANCE, min_px])
    page.evaluate(LAST_VALUES)
    last = page.evaluate(MEASURE, [TOLERANCE, CLIP_TOLERANCE, min_px])
    found += [f"{f} (sliders at their last values)" for f in last if f not in found]
    page.close()
    assert not found, "\n".join(found)
