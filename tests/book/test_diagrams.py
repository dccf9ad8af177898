"""The chapters' inline SVG diagrams (flashlib.book.chapters, drawn with flashlib.book.svg) say
what flashlib computed."""

from __future__ import annotations

import dataclasses
import re

import pytest

pytest.importorskip("ml_dtypes")

from flashlib.book.chapters.intro import memory_diagram  # noqa: E402
from flashlib.book.chapters.precision import precision_diagram  # noqa: E402
from flashlib.book.svg import WIDTH  # noqa: E402
from flashlib.studies.precision import Casts  # noqa: E402


def font_sizes(svg: str) -> list[float]:
    return [float(s) for s in re.findall(r'font-size="([0-9.]+)"', svg)]


@pytest.mark.parametrize("dtype, short", [("bfloat16", "bf16"), ("float16", "fp16")])
def test_precision_diagram_shows_the_casts(dtype, short):
    dg = precision_diagram(dataclasses.asdict(Casts.flash(dtype)))
    svg = dg.svg()
    assert f'viewBox="0 0 {WIDTH} ' in svg
    assert f">{short}<" in svg and f"rounded to {short}" in svg  # inputs, O and P
    assert "fp32" in svg  # S, m, l and the accumulator
    assert f"in {dtype}" in dg.alt and "float32" in dg.alt
    assert min(font_sizes(svg)) >= 9.6  # subscripts at 0.8 of 12 units


def test_precision_diagram_follows_a_narrow_accumulator():
    kept = dataclasses.asdict(Casts.flash("bfloat16").replace(acc="bfloat16"))
    assert "accumulator O_i in bfloat16" in precision_diagram(kept).alt


def test_precision_diagram_needs_every_cast_point():
    with pytest.raises(ValueError, match="missing cast points"):
        precision_diagram({"inputs": "bfloat16"})


def test_memory_diagram_still_draws():
    assert "S_ij" in memory_diagram(n=256, d=64, B=64, itemsize=4).alt


def test_memory_diagram_tile_label_clears_its_size():
    """Issue 24: the tile's name S_ij (its subscript below the baseline) ran into the size
    under it ("64×64"): the two lines are now a full line of 12-unit text apart."""
    svg = memory_diagram(n=4096, d=64, B=128, itemsize=2).svg()
    name_y = float(re.search(r'<text x="[0-9.]+" y="([0-9.]+)"[^>]*>S<tspan', svg)[1])
    size_y = float(re.search(r'<text x="[0-9.]+" y="([0-9.]+)"[^>]*>128×128', svg)[1])
    assert size_y - name_y >= 18, (name_y, size_y)


def test_fa3_schedule_diagram_says_what_the_model_computed():
    from flashlib.book.chapters.beyond import fa3_schedule_diagram

    dg = fa3_schedule_diagram(0.5)
    svg = dg.svg()
    assert f'viewBox="0 0 {WIDTH} ' in svg
    assert min(float(s) for s in re.findall(r'<text [^>]*font-size="([0-9.]+)"', svg)) >= 12
    for text in ("ping-pong", "pipelined", "tensor cores busy 100%", "tensor cores busy 67%"):
        assert text in svg
    # every tile of every row is drawn and labelled (QK_1 written with a subscript)
    assert svg.count(">QK<") == 2 + 4 + 2
    assert "4 tiles in 8.0 units" in dg.alt and "softmax takes 1 units" in dg.alt
    rects = [float(x) + float(w) for x, w in re.findall(
        r'<rect x="([0-9.]+)" y="[0-9.]+" width="([0-9.]+)"', svg)]
    assert max(rects) <= WIDTH
