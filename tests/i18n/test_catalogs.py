"""The Japanese edition's catalogs (locales/ja) and the table of the code's strings
(flashlib/book/locale/ja), without a built site: every entry translated, none fuzzy, the
markup of each the same as the English's (tools.catalogs), the catalogs up to date with the
chapters, and the font subset holding every character they use."""

from __future__ import annotations

import re
import unicodedata

import pytest
from babel.messages.pofile import read_po

from flashlib.book import i18n
from tools import catalogs, ja_font
from tools.ja_edition import LOCALES, extract
from tools.toc import toc_files


def test_every_page_has_its_catalog() -> None:
    pages = {p.stem for p in toc_files()}
    have = {p.stem for p in (LOCALES / "ja" / "LC_MESSAGES" / "book").glob("*.po")}
    assert pages <= have, f"pages without a catalog (run `make catalogs`): {pages - have}"


@pytest.mark.parametrize("path", catalogs.catalogs(), ids=lambda p: p.name)
def test_catalog_is_translated_and_keeps_the_markup(path) -> None:
    found = catalogs.problems(path)
    assert not found, "\n".join(found[:40])


def test_code_strings_are_translated_with_their_numbers() -> None:
    found = [line for p in sorted(catalogs.CODE_TABLES.glob("*.json"))
             for line in catalogs.code_problems(p)]
    assert not found, "\n".join(found[:40])


def test_catalogs_are_up_to_date_with_the_chapters(tmp_path) -> None:
    """Each page's messages are the English text's now: a changed paragraph needs `make
    catalogs` (it becomes fuzzy, then is translated again)."""
    templates = extract(tmp_path / "gettext")
    stale = []
    for pot in sorted(templates.rglob("*.pot")):
        domain = pot.relative_to(templates).with_suffix("")
        po = LOCALES / "ja" / "LC_MESSAGES" / f"{domain}.po"
        with open(pot, "rb") as f:
            want = {str(m.id) for m in read_po(f) if m.id}
        have = {str(m.id) for m in catalogs.read(po) if m.id} if po.is_file() else set()
        if want - have:
            stale.append(f"{domain}: {len(want - have)} new or changed messages, e.g. "
                         f"{sorted(want - have)[0][:80]!r}")
    assert not stale, "run `make catalogs` and translate:\n" + "\n".join(stale)


def test_font_subset_has_every_character_of_the_translations() -> None:
    for weight in ja_font.SOURCES:
        # the Japanese characters (kana, kanji, CJK punctuation and full-width forms; a
        # symbol like ᵀ or ∘ is drawn by the reader's other fonts, as in the English)
        lacking = sorted(c for c in ja_font.characters() - ja_font.covered(weight)
                         if ord(c) >= 0x3000 and unicodedata.category(c) != "Cn")
        assert not lacking, (f"{ja_font.font_path(weight).name} lacks {''.join(lacking[:60])}"
                             " (run `python -m tools.ja_font`)")


def test_translate_keeps_numbers_and_falls_back_to_english() -> None:
    words = i18n.table("ja")
    key = next(k for k, v in words.items() if "{0}" in k and "{1}" not in k and v != k)
    english = key.replace("{0}", "1,024")
    assert "1,024" in i18n.translate(english, "ja")
    assert i18n.translate(english, "ja") != english
    assert i18n.translate("no such sentence in the table", "ja") == (
        "no such sentence in the table")
    assert i18n.translate(english, "en") == english


def test_parts_are_not_cut_inside_brackets_or_code() -> None:
    assert i18n.parts("n = 4: x[: n // 2] is wrong: see `a: b`") == [
        "n = 4", "x[: n // 2] is wrong", "see `a: b`"]


def test_translate_html_keeps_scripts_and_translates_attributes() -> None:
    words = i18n.table("ja")
    key = next(k for k, v in words.items() if re.fullmatch(r"[A-Za-z ]{12,}", k) and v != k)
    markup = (f'<figure><img alt="{key}" src="x.png"><figcaption>{key}</figcaption>'
              f'<script>var s = "{key}";</script></figure>')
    out = i18n.translate_html(markup, "ja")
    assert out.count(words[key]) == 2, out
    assert f'var s = "{key}";' in out


def test_grader_finds_the_same_exercises_in_the_japanese_student_notebooks() -> None:
    """A class may hand in the Japanese notebooks: "### 練習 N.K" headings, the same cells."""
    import nbformat

    from grading import chapters as grading_chapters
    from tools import notebooks, toc

    for source in toc.chapters():
        en = nbformat.read(notebooks.target(source, student=True), as_version=4)
        ja = nbformat.read(notebooks.target(source, student=True, lang="ja"), as_version=4)
        en_cells = grading_chapters.exercise_cells(en)
        ja_cells = grading_chapters.exercise_cells(ja)
        assert list(en_cells) == list(ja_cells), source.stem
        for number, cells in en_cells.items():
            assert [en.cells[i].source for i in cells] == [
                ja.cells[i].source for i in ja_cells[number]], f"{source.stem} {number}"
