"""The tiling chapter's diagram: read from the teaching functions' event log, legible SVG."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from flashlib.book.chapters.tiling import _tile_step, tiling_diagram
from tools.paths import ROOT


def test_the_step_is_the_logs():
    tiles, held, writes = _tile_step("v1", 2, 2, 4, (1, 2))
    assert tiles[:5] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]  # column by column
    assert [name for name, _ in held] == ["K", "V", "Q", "O", "l", "m", "S"]
    assert writes == ["O_2", "l_2", "m_2"]  # blocks counted from 1, as the reader counts
    assert held[0] == ("K", 3) and held[2] == ("Q", 2)
    tiles, held, writes = _tile_step("v2", 2, 2, 4, (1, 2))
    assert tiles[:5] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]  # row by row
    assert [name for name, _ in held] == ["Q", "O", "l", "m", "K", "V", "S"]
    assert writes == []
    assert _tile_step("v2", 2, 2, 4, (1, 3))[2] == ["O_2", "L_2"]


def test_diagram_is_legible_svg():
    dg = tiling_diagram()
    root = ET.fromstring(dg.svg())
    assert root.get("viewBox").startswith("0 0 360 ")
    sizes = [float(t.get("font-size")) for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert sizes and min(sizes) >= 12
    assert "O_2, l_2, m_2" in dg.alt and "writes nothing after this tile" in dg.alt
    assert "tile (2, 3)" in dg.alt and "tile (2, 3)" in dg.caption  # tile=(1, 2) in code
    assert "after j = 4" in dg.svg() and "K_3" in dg.svg()
    assert "<figcaption" in dg._repr_html_()


def test_bad_tile():
    with pytest.raises(ValueError, match="tile"):
        tiling_diagram(T=4, tile=(4, 0))


def test_the_page_offers_the_checkers_choices():
    """Exercise 4.5 lists the choices of check_cap_reason verbatim (book/tiling.md)."""

    from flashlib.book.exercises.tiling import CAP_CHOICES

    page = (ROOT / "book" / "tiling.md").read_text()
    for letter, text in CAP_CHOICES.items():
        assert f"- ({letter}) {text}\n" in page, letter
