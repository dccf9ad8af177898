"""The Japanese edition as built (_build/html/ja, `make book`): every page of the English site
is there, in Japanese, with the same numbers; the switcher links the two editions both ways;
what the code wrote is translated; and the font subset covers every character shown.

The browser tests (tests/site/test_site.py) open the Japanese pages too: they are pages of
the same site, under ja/.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tools import ja_font
from tools.i18n_extension import MISSING_FILE
from tools.ja_edition import JA_HTML, JA_OUT
from tools.paths import BUILD_HTML
from tools.toc import chapters, toc_files

pytestmark = pytest.mark.site

JAPANESE = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uff01-\uff5e]")
PAGES = [p.relative_to(p.parents[1]).with_suffix(".html").as_posix() for p in toc_files()]


def _read(path: Path) -> str:
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make book`")
    return path.read_text(encoding="utf-8")


class _Text(HTMLParser):
    """The main column's text: its paragraphs (outside code, math and the cells' outputs),
    the glued values and every text node."""

    SKIP = ("pre", "code", "script", "style", "math", "mjx-container")

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, set[str]]] = []
        self.paragraphs: list[str] = []
        self.pasted: list[str] = []
        self.text: list[str] = []
        self._para: list[str] | None = None
        self._pasted: list[str] | None = None

    def _inside(self, cls: str) -> bool:
        return any(cls in classes for _, classes in self.stack)

    def handle_starttag(self, tag, attrs):
        if tag in ("br", "img", "input", "meta", "link", "hr", "wbr"):
            return
        classes = set((dict(attrs).get("class") or "").split())
        self.stack.append((tag, classes))
        if tag == "p" and not self._inside("cell_output") and self._para is None:
            self._para = []
        if "pasted-text" in classes or "pasted-inline" in classes:
            self._pasted = []

    def handle_endtag(self, tag):
        while self.stack:
            top, classes = self.stack.pop()
            if "pasted-text" in classes or "pasted-inline" in classes:
                self.pasted.append("".join(self._pasted or []).strip())
                self._pasted = None
            if top == "p" and self._para is not None and not any(t == "p" for t, _ in self.stack):
                self.paragraphs.append("".join(self._para).strip())
                self._para = None
            if top == tag:
                break

    def handle_data(self, data):
        skip = any(t in self.SKIP for t, _ in self.stack)
        if not skip:
            self.text.append(data)
        if self._pasted is not None:
            self._pasted.append(data)
        if self._para is not None and not skip and not self._inside("math"):
            self._para.append(data)


def _main(html: str) -> _Text:
    start = html.find('<article class="bd-article"')
    end = html.find("</article>", start)
    parser = _Text()
    parser.feed(html[start:end] if start >= 0 else html)
    return parser


@pytest.mark.parametrize("page", PAGES)
def test_page_is_japanese_with_the_english_numbers(page: str) -> None:
    en, ja = _read(BUILD_HTML / page), _read(JA_HTML / page)
    assert re.search(r'<html[^>]*\blang="ja"', ja), f"ja/{page}: not lang=ja"
    en_text, ja_text = _main(en), _main(ja)
    numbers = re.compile(r"[^A-Za-z\u3040-\u9fff]*")  # glued words are translated
    en_text.pasted = [v for v in en_text.pasted if numbers.fullmatch(v)]
    ja_text.pasted = [v for v in ja_text.pasted if numbers.fullmatch(v)]
    assert Counter(en_text.pasted) == Counter(ja_text.pasted), (
        f"ja/{page}: glued values differ from the English page's: "
        f"{sorted((Counter(en_text.pasted) - Counter(ja_text.pasted)).elements())[:10]}")
    english = [] if page.endswith("references.html") else [p for p in ja_text.paragraphs
               if re.search(r"[A-Za-z]{4,}(?:\s+[A-Za-z]{2,}){3,}", p) and not JAPANESE.search(p)]
    assert not english, f"ja/{page}: paragraphs left in English: {english[:5]}"
    assert "**" not in "".join(ja_text.text), f"ja/{page}: literal ** in the text"


@pytest.mark.parametrize("page", PAGES)
def test_switcher_links_the_same_page_both_ways(page: str) -> None:
    en, ja = _read(BUILD_HTML / page), _read(JA_HTML / page)
    to_ja = re.search(r'<nav class="flashlib-edition"[^>]*>\s*<a href="([^"]+)" hreflang="ja"', en)
    to_en = re.search(r'<nav class="flashlib-edition"[^>]*>\s*<a href="([^"]+)" hreflang="en"', ja)
    assert to_ja and to_en, f"{page}: no edition switcher"
    assert ((BUILD_HTML / page).parent / to_ja.group(1)).resolve() == (JA_HTML / page).resolve()
    assert ((JA_HTML / page).parent / to_en.group(1)).resolve() == (BUILD_HTML / page).resolve()


def test_the_code_strings_the_pages_show_are_translated() -> None:
    missing = [line for line in _read(JA_OUT / MISSING_FILE).splitlines() if line.strip()]
    assert not missing, (f"{len(missing)} strings the Japanese pages show have no translation "
                         "in flashlib/book/locale/ja/site.json:\n" + "\n".join(missing[:40]))


def test_the_figures_the_kernels_drew_in_japanese_are_translated() -> None:
    """While `make book` executes the chapters, each kernel draws the Japanese frames of its
    figures and widgets and lists in _build/i18n-kernel-misses.jsonl (FLASHLIB_I18N_RECORD)
    every text it drew without a translation: a label a measurement chose on this machine,
    say. A listed text translated since counts as done. The file is made by the recipe (empty:
    nothing missed), so a book built without it fails here rather than passing unchecked."""
    from flashlib.book import i18n
    from tools.paths import ROOT

    recipe = (ROOT / "Makefile").read_text(encoding="utf-8").split("\nbook:", 1)[1]
    recipe = recipe.split("\n\n", 1)[0]
    assert "FLASHLIB_I18N_RECORD=$(CURDIR)/$(KERNEL_MISSES) $(BIN)/jupyter-book build" in recipe
    path = BUILD_HTML.parent / "i18n-kernel-misses.jsonl"
    listed = _read(path).splitlines()
    words = i18n.table("ja")
    missing = sorted({key for key in map(json.loads, filter(None, listed)) if key not in words})
    assert not missing, (f"{len(missing)} texts the figures drew untranslated (add them to "
                         "flashlib/book/locale/ja/figures.json):\n" + "\n".join(missing[:40]))


def test_the_font_subset_covers_every_japanese_character_shown() -> None:
    shown: set[str] = set()
    for page in PAGES:  # the whole page: the theme's words (目次, 検索) too
        html = re.sub(r"<(script|style)\b.*?</\1>", "", _read(JA_HTML / page), flags=re.S)
        shown.update(c for c in re.sub(r"<[^>]+>", "", html) if ord(c) >= 0x3000)
    lacking = sorted(shown - ja_font.covered())
    assert not lacking, f"the font subset lacks {''.join(lacking)}: run python -m tools.ja_font"


@pytest.mark.parametrize("page", PAGES)
def test_no_line_starts_with_punctuation_after_a_formula(page: str) -> None:
    """Each inline formula with 、 。 ） after it, or （ before it, is wrapped in a span that
    does not break (tools/i18n_extension.py): MathJax draws a formula as a box, and a browser
    breaks a line beside a box even where Japanese line breaking forbids it."""
    math = r'<span class="math notranslate nohighlight">[^<]*</span>'
    opening, closing = "[（「『［]", "[、。，．）」』］！？：；・]"
    html = re.sub(rf'<span class="flashlib-nobr">{opening}?{math}{closing}*</span>', "",
                  _read(JA_HTML / page))
    loose = re.findall(rf"{opening}{math}|{math}{closing}", html)
    assert not loose, f"ja/{page}: formulas whose punctuation may start a line: {loose[:5]}"


def test_japanese_notebooks_exist_for_every_chapter() -> None:
    from tools.notebooks import target

    for source in chapters():
        for student in (False, True):
            path = target(source, student=student, lang="ja")
            assert path.is_file(), f"{path}: missing (make notebooks)"
            text = path.read_text(encoding="utf-8")
            assert JAPANESE.search(text), f"{path}: no Japanese"
            if "Exercise" in _read(target(source, student=student)):
                assert "### 練習 " in text, f"{path}: no exercise heading 練習 N.K"


@pytest.mark.browser
def test_switcher_works_offline_on_file_urls_both_ways() -> None:
    """From a page opened as a file (no server, no network), the switcher reaches the same
    page of the other edition, and back; the Japanese page draws its text in Japanese fonts
    (the shipped subset where the machine has none: no tofu) and its figures' labels come
    from the table (none left untranslated by the page's scripts)."""
    from tests.browser import chromium

    page_path = "book/tiling.html"
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:"))
                   else r.abort())
        page.goto((BUILD_HTML / page_path).as_uri(), wait_until="load")
        page.click('nav.flashlib-edition a[hreflang="ja"]')
        page.wait_for_load_state("load")
        assert page.url == (JA_HTML / page_path).as_uri(), page.url
        assert page.evaluate("document.documentElement.lang") == "ja"
        page.evaluate("document.fonts.ready.then(() => true)")
        family = page.evaluate("getComputedStyle(document.querySelector('main p')).fontFamily")
        missing = page.evaluate("Object.keys(window.flashlibMissing || {})")
        page.click('nav.flashlib-edition a[hreflang="en"]')
        page.wait_for_load_state("load")
        assert page.url == (BUILD_HTML / page_path).as_uri(), page.url
        context.close()
    # the shipped subset is in the text's fonts, after the reader's own Japanese fonts (a
    # machine with none, like CI's Chromium with fonts-dejavu only, draws the text with it)
    assert "Noto Sans JP subset" in family, family
    assert not missing, f"figure strings without a translation: {missing[:20]}"


#: Where Debian (fonts-dejavu-core, which CI installs with Chromium) keeps its Latin fonts.
LATIN_FONTS = ("/usr/share/fonts/truetype/dejavu",)


@pytest.mark.browser
def test_pages_stay_within_the_budget_on_a_machine_without_japanese_fonts(tmp_path) -> None:
    """A reader whose machine has no Japanese font downloads the shipped subset: on every page
    of the ja edition the browser loads it, and the page's weight with it stays within the
    budget. This Chromium sees Latin fonts only (a fontconfig of its own), whatever fonts the
    machine running the test has (the site tests' weights are those of this machine)."""
    from tests.browser import MAX_PAGE_BYTES, chromium, page_weight, serve

    dirs = "".join(f"<dir>{d}</dir>" for d in LATIN_FONTS if Path(d).is_dir())
    (tmp_path / "fonts.conf").write_text(
        '<?xml version="1.0"?><fontconfig>'
        f"{dirs}<cachedir>{tmp_path / 'cache'}</cachedir></fontconfig>", encoding="utf-8")
    env = {**os.environ, "FONTCONFIG_FILE": str(tmp_path / "fonts.conf")}
    weights, without = {}, []
    with serve(BUILD_HTML) as server, chromium(env) as browser:
        for page_path in PAGES:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.goto(f"{server}/ja/{page_path}", wait_until="load")
            page.wait_for_load_state("networkidle")
            page.evaluate("() => window.MathJax && MathJax.startup.promise.then(() => true)")
            page.evaluate("() => document.fonts.ready.then(() => true)")
            page.wait_for_load_state("networkidle")
            if not page.evaluate("""() => [...document.fonts].some(
                    f => f.family.includes('Noto Sans JP subset') && f.status === 'loaded')"""):
                without.append(page_path)
            weights[page_path] = page_weight(page)
            context.close()
    print("\nja pages without Japanese fonts on the machine (the subset downloaded):")
    for page_path, weight in sorted(weights.items()):
        print(f"  {weight / 1e6:.2f} MB  ja/{page_path}")
    assert not without, f"pages that did not load the Japanese subset: {without}"
    heavy = {p: round(w / 1e6, 2) for p, w in weights.items() if w > MAX_PAGE_BYTES}
    assert not heavy, f"pages over {MAX_PAGE_BYTES / 1e6} MB with the font: {heavy}"
