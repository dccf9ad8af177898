"""Every SVG diagram of the book in a real browser (headless Chromium, tests/browser.py), at a
390 px phone and a 1280 px desktop: no text box overlaps another text box (a subscript running
into the line under it, an arrow label on a heading), and none is clipped by the diagram's
viewBox.  The diagrams are drawn with the arguments their chapters use (book/*.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.browser import chromium, serve

pytestmark = [pytest.mark.browser]

#: Pixels two text boxes may share (anti-aliasing, rounding of glyph boxes).
TOLERANCE = 0.5


def diagrams() -> dict[str, str]:
    """name -> the SVG of each diagram, drawn as its chapter draws it."""
    from flashlib.book.chapters.backward import backward_diagram
    from flashlib.book.chapters.beyond import fa3_schedule_diagram, split_kv_diagram
    from flashlib.book.chapters.gpu import launch_grid_diagram
    from flashlib.book.chapters.intro import memory_diagram
    from flashlib.book.chapters.io_model import hierarchy_diagram
    from flashlib.book.chapters.ladder import ladder_diagram
    from flashlib.book.chapters.online_softmax import merge_diagram
    from flashlib.book.chapters.overflow import softmax_passes_diagram
    from flashlib.book.chapters.precision import precision_diagram
    from flashlib.book.chapters.tiling import tiling_diagram
    from flashlib.core.constants import BLOCK_K, BLOCK_Q
    from flashlib.studies.io_model import A100_HBM_BYTES, A100_SRAM_BANDWIDTH, GPUS
    from flashlib.studies.precision import Casts

    low, high = GPUS["A100 (1.5 TB/s)"], GPUS["A100 (2.0 TB/s)"]
    made = {
        "backward": backward_diagram(B_r=64, B_c=64, d=64, itemsize=4),
        "split_kv": split_kv_diagram(N=8192, d=128, n_splits=4, itemsize=2),
        "fa3_schedule": fa3_schedule_diagram(0.5),
        "launch_grid": launch_grid_diagram(n=1024, B_r=128, B_c=64, causal=True, program=5),
        "memory": memory_diagram(n=4096, d=64, B=128, itemsize=2),
        "hierarchy": hierarchy_diagram(A100_HBM_BYTES, (low.bandwidth, high.bandwidth),
                                       low.sram_per_sm, low.sms, A100_SRAM_BANDWIDTH),
        "merge": merge_diagram(n_k=256, block=64),
        "ladder": ladder_diagram(d=64, B_r=BLOCK_Q, B_c=BLOCK_K, d_v=64),
        "softmax_passes": softmax_passes_diagram(n=4096, itemsize=4),
        "precision": precision_diagram(dataclasses.asdict(Casts.flash("bfloat16"))),
        "tiling": tiling_diagram(B_r=2, B_c=2, T=4, tile=(1, 2)),
    }
    return {name: dg.svg() for name, dg in made.items()}


#: Collects, per svg[data-name], the text boxes that overlap and those outside the svg.
MEASURE = """(tolerance) => {
  const inter = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > tolerance
      && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > tolerance;
  const found = [];
  for (const svg of document.querySelectorAll('svg[data-name]')) {
    const box = svg.getBoundingClientRect();
    const texts = [...svg.querySelectorAll('text')].map(t => [t.textContent,
                                                              t.getBoundingClientRect()]);
    texts.forEach(([s, r], i) => {
      if (r.left < box.left - tolerance || r.right > box.right + tolerance
          || r.top < box.top - tolerance || r.bottom > box.bottom + tolerance)
        found.push(`${svg.dataset.name}: "${s}" clipped by the viewBox`);
      texts.slice(i + 1).forEach(([s2, r2]) => {
        if (inter(r, r2)) found.push(`${svg.dataset.name}: "${s}" overlaps "${s2}"`);
      });
    });
  }
  return found;
}"""


@pytest.fixture(scope="module")
def page_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("diagrams")
    body = "".join(f'<figure>{svg.replace("<svg ", f"<svg data-name={name!r} ", 1)}</figure>'
                   for name, svg in diagrams().items())
    (folder / "index.html").write_text(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>diagrams</title>"
        "<meta name='viewport' content='width=device-width'><link rel='icon' href='data:,'>"
        "<style>svg{width:100%}</style></head>"
        f"<body><main>{body}</main></body></html>", encoding="utf-8")
    return folder


@pytest.mark.parametrize("width", [390, 1280])
def test_diagram_text_neither_overlaps_nor_is_clipped(page_folder, width):
    with serve(page_folder) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(f"{url}/index.html")
        found = page.evaluate(MEASURE, TOLERANCE)
        page.close()
    assert not found, "\n".join(found)
