"""tools/book_extension.py's build-time fixes, on doctrees and page bodies made here (no
Sphinx build): wide code blocks marked, over-long lines warned about, figures moved to files."""

from __future__ import annotations

import base64
import logging
from types import SimpleNamespace

from docutils import nodes

from tools import book_extension as ext


def _cell(text: str, box: str = "cell_input") -> tuple[nodes.container, nodes.literal_block]:
    block = nodes.literal_block(text, text)
    return nodes.container("", block, classes=[box]), block


def test_a_block_over_76_columns_is_widened_on_its_cell_box():
    doc = nodes.document(None, None)
    narrow_box, narrow = _cell("x = 1\n" + "y" * ext.CODE_COLUMNS)
    wide_box, wide = _cell("z = 2\n" + "w" * (ext.CODE_COLUMNS + 1), "cell_output")
    plain = nodes.literal_block("q" * 90, "q" * 90)  # a literalinclude: no cell around it
    doc += [narrow_box, wide_box, plain]
    ext.mark_wide_code(None, doc, "book/x")
    assert not set(ext.WIDE_CLASSES) & set(narrow_box["classes"] + narrow["classes"])
    assert set(ext.WIDE_CLASSES) <= set(wide_box["classes"]) and not wide["classes"]
    assert set(ext.WIDE_CLASSES) <= set(plain["classes"])
    ext.mark_wide_code(None, doc, "book/x")  # twice: the classes are not repeated
    assert wide_box["classes"].count("flashlib-wide") == 1


def test_a_line_too_long_even_for_the_wide_column_is_a_warning(caplog):
    doc = nodes.document(None, None)
    doc += nodes.literal_block("ok\n" + "v" * (ext.MAX_CODE_COLUMNS + 1),
                               "ok\n" + "v" * (ext.MAX_CODE_COLUMNS + 1))
    with caplog.at_level(logging.WARNING):
        ext.mark_wide_code(None, doc, "book/x")
    assert f"a code line of {ext.MAX_CODE_COLUMNS + 1} columns" in caplog.text
    assert ext.code_columns("a\tb\n" + "c" * 9) == 9 and ext.code_columns("") == 0


def test_figures_become_files_of_the_site(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    body = (f'<img src="{url}" alt="a"><script type="application/json">'
            f'{{"frames":["{url}","{url}"]}}</script>')
    app = SimpleNamespace(outdir=str(tmp_path), builder=SimpleNamespace(
        get_target_uri=lambda name: f"{name}.html"))
    context = {"body": body}
    ext.images_to_files(app, "book/tiling", "page.html", context, None)
    files = list((tmp_path / "_images" / "flashlib").iterdir())
    assert len(files) == 1 and files[0].read_bytes() == png  # one file per distinct image
    src = f"../_images/flashlib/{files[0].name}"
    assert context["body"].count(src) == 3 and "data:image" not in context["body"]
    untouched = {"body": "<p>no figure</p>"}
    ext.images_to_files(app, "book/tiling", "page.html", untouched, None)
    assert untouched["body"] == "<p>no figure</p>"


def test_a_block_in_an_exercise_or_a_dropdown_has_fewer_columns():
    doc = nodes.document(None, None)
    inside = nodes.literal_block("a" * 72, "a" * 72)  # fits the text column, not a solution
    top = nodes.literal_block("b" * 72, "b" * 72)
    solution = nodes.admonition("", nodes.container("", inside, classes=["sd-card-body"]))
    doc += [solution, top]
    assert ext.available_columns(top) == ext.CODE_COLUMNS
    assert ext.available_columns(inside) == (
        ext.CODE_COLUMNS - ext.ADMONITION_COLUMNS - ext.DROPDOWN_COLUMNS)
    ext.mark_wide_code(None, doc, "book/x")
    assert "flashlib-wide" in inside["classes"] and "flashlib-wide" not in top["classes"]
