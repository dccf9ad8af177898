"""flashlib.book: glue without myst-nb, html_table rendered by tabulate, the diagrams and the
source diffs. (The MyST -> Jupyter rewriting of the notebooks is tested in
tests/tools/test_convert.py.)"""

from __future__ import annotations

import builtins
import re

import pytest

from flashlib import book

# flashlib.book ---------------------------------------------------------------------------------


@pytest.fixture


def no_myst_nb(monkeypatch):
    """Make ``import myst_nb`` fail, as on Colab."""
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "myst_nb" or name.startswith("myst_nb."):
            raise ImportError("No module named 'myst_nb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_glue_without_myst_nb_records_and_shows_only_when_asked(no_myst_nb, monkeypatch):
    shown = []
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda value: shown.append(value))
    book.glue("test_hidden", 1.5, display=False)
    assert shown == []
    book.glue("test_shown", 42)
    assert shown == [42]
    assert book.glued()["test_hidden"] == 1.5 and book.glued()["test_shown"] == 42
    book.glued()["test_hidden"] = 0  # a copy
    assert book.glued()["test_hidden"] == 1.5


def test_glue_with_myst_nb_delegates(monkeypatch):
    myst_nb = pytest.importorskip("myst_nb")
    calls = []
    monkeypatch.setattr(myst_nb, "glue", lambda *args: calls.append(args))
    book.glue("test_delegated", 3, display=False)
    assert calls == [("test_delegated", 3, False)]
    assert book.glued()["test_delegated"] == 3


def test_glue_rejects_bad_name():
    with pytest.raises(TypeError, match="name"):
        book.glue("", 1)


def _cells(html: str, tag: str) -> list[str]:
    return [c.strip() for c in re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", html)]


def test_html_table_escapes_keeps_cells_and_checks_row_length():
    table = book.html_table(["x", "a<b"], [[1, "<i>"], [2.5, "&"], ["1.50", "0012"]])
    html = table.data
    assert html.startswith('<div class="flashlib-table" tabindex="0"><table class="table">')
    assert html.rstrip().endswith("</table></div>")
    assert _cells(html, "th") == ["x", "a&lt;b"]
    # escaped, and shown as given: no re-formatting of numbers ("1.50" stays "1.50")
    assert _cells(html, "td") == ["1", "&lt;i&gt;", "2.5", "&amp;", "1.50", "0012"]
    empty = book.html_table(["a"], []).data
    assert _cells(empty, "th") == ["a"] and _cells(empty, "td") == []
    with pytest.raises(ValueError, match=r"rows\[1\] has 1 cells, header has 2"):
        book.html_table(["a", "b"], [[1, 2], [3]])


# diagrams and diffs ---------------------------------------------------------------------------


def test_backward_diagram_draws_the_five_matmuls_and_the_footprint():
    from flashlib.book.chapters.backward import BACKWARD_MATMULS, backward_diagram
    from flashlib.studies.io_model import sram_footprint

    assert len(BACKWARD_MATMULS) == 5  # one tile's products: S, dV, dP, dQ, dK
    dg = backward_diagram(B_r=64, B_c=32, d=16, itemsize=4)
    svg = dg.svg()
    kib = sum(sram_footprint("backward", 64, 32, 16).values()) * 4 / 2**10
    assert f"{kib:.0f} KiB" in dg.caption and "five matmuls" in dg.caption
    assert svg.count("<text") >= 30 and 'viewBox="0 0 360 ' in svg
    for name in ("dQ", "dK", "dV", "pass 1", "pass 2"):
        assert name in svg


def test_hierarchy_diagram_states_the_cited_a100_figures():
    from flashlib.book.chapters.io_model import hierarchy_diagram
    from flashlib.studies import io_model as io

    gpu = io.GPUS["A100 (1.5 TB/s)"]
    dg = hierarchy_diagram(io.A100_HBM_BYTES, (1.5e12, 2.0e12), gpu.sram_per_sm, gpu.sms,
                           io.A100_SRAM_BANDWIDTH)
    for text in ("40 to 80 GB", "1.5 to 2 TB/s", "108 streaming", "164 KiB", "19 TB/s"):
        assert text in dg.alt
    assert "<svg" in dg.svg() and dg.caption


def test_source_diff_shows_only_changed_lines_without_docstrings():
    from flashlib.book.diffs import source_diff
    from flashlib.studies.ladder import rung6_stale_max, rung7_kt_tiles

    diff = source_diff(rung6_stale_max, rung7_kt_tiles)
    text = diff.text()
    assert text.startswith("--- rung6_stale_max\n+++ rung7_kt_tiles")
    assert "transposed_tiles" in text and '"""' not in text
    assert diff.added and diff.removed
    assert diff._repr_markdown_().startswith("```diff\n")
    with pytest.raises(TypeError, match="old, new"):
        source_diff(1, rung7_kt_tiles)
    with pytest.raises(ValueError, match="context"):
        source_diff(rung6_stale_max, rung7_kt_tiles, context=-1)


def test_chapter_diagrams_render_with_alt_and_caption():
    from flashlib.book.chapters.ladder import ladder_diagram
    from flashlib.book.chapters.online_softmax import merge_diagram
    from flashlib.book.chapters.overflow import softmax_passes_diagram

    for dg in (softmax_passes_diagram(4096, 4), merge_diagram(256, 64), merge_diagram(100, 64),
               ladder_diagram(64, 128, 64, 64)):
        html = dg._repr_html_()
        assert html.startswith('<figure class="flashlib-diagram"><svg') and "aria-label" in html
        assert "<figcaption" in html


def _before(x, y):
    z = x + y  # the sum
    # a note
    return z * 2


def _after(x, y):
    z = x + y  # the sum, now explained at length
    w = "a # inside a string"
    return z * 3 + len(w)


def test_source_diff_ignores_changes_of_comments_alone():
    """A line whose comment alone changed is context (in its new version), a comment line
    removed on its own is no change; a code change, and a # inside a string, still count."""
    from flashlib.book.diffs import source_diff

    lines = source_diff(_before, _after, context=5).lines
    assert "     z = x + y  # the sum, now explained at length" in lines
    assert not any("the sum" in line for line in lines if line[:1] in "+-")
    assert '+    w = "a # inside a string"' in lines
    assert "-    return z * 2" in lines and "+    return z * 3 + len(w)" in lines
    assert "-    # a note" in lines  # removed together with code: part of the change
    only_comments = source_diff(_before, _before_commented, context=0)  # and the name
    assert only_comments.added == only_comments.removed == 1
    assert only_comments.lines[2:] == [
        "@@ -1 +1 @@", "-def _before(x, y):", "+def _before_commented(x, y):"]


def _before_commented(x, y):
    z = x + y  # the total
    # a note
    # and a second note
    return z * 2


def test_text_collisions_finds_cut_and_overlapping_text():
    pytest.importorskip("matplotlib")
    from flashlib.book import plots

    fig, ax = plots.new_figure(figsize=(3, 2))
    ax.set_title("a title")
    ax.plot([0, 1], [0, 1])
    plots.figure_png(fig)
    assert plots.text_collisions(fig) == []
    # a label past the right edge (a bar label "51.4 m"), two texts on top of each other
    ax.text(1.3, 0.5, "51.4 ms", transform=ax.transAxes)
    ax.text(0.2, 0.5, "one label")
    ax.text(0.2, 0.5, "another")
    plots.freeze_layout(fig)
    plots.figure_png(fig)
    found = plots.text_collisions(fig)
    assert "'51.4 ms' is cut by the edge of the figure" in found
    assert "'one label' overlaps 'another'" in found
    assert len(found) == 2, found
