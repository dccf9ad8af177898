"""Browser tests of the built site (_build/html, made by `make book`).

Serves the site on 127.0.0.1 and opens every page in headless Chromium driven by Playwright
(tests/browser.py), three times:

- **at 1280 px** (a desktop): no failed request, no request leaving 127.0.0.1, no console
  error; nothing sideways-scrolls (shown code, printed output, displayed math, tables,
  figures: an element wider than its box fails, named), also inside every dropdown and
  collapsed cell, opened; no code block wraps (:data:`WRAPPED_CODE`: its rendered lines
  outnumber its source lines); no formula is clipped (:data:`MATH`); zero axe-core critical or
  serious violations; no visible ``glue(`` in shown code; every image has alt text; every
  chapter links to its notebook on Colab; every slider of every interactive figure changes its
  figure, from the keyboard too, and back; every figure is crisp on a 2x screen
  (:data:`FIGURES`: SVG, or a raster of twice its shown size); the page's weight (every byte
  the browser loads) is at most 3.5 MB, and is printed at the end of the run;
- **at 390 px** (a phone): the page does not scroll sideways (only a code block, a table or
  one display equation per page may scroll inside its own box); no code block wraps, every
  dropdown opened; no formula is clipped; every figure is crisp and shown at least 0.75 of its
  designed size; zero axe-core critical or serious violations; text in figures and diagrams is
  at least 9 px tall as shown;
- **with JavaScript off**: no control that looks usable but does nothing (no visible slider
  or button), and every interactive figure shows its default frame or its description.

Full-page screenshots at both widths go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.browser import (
    MAX_PAGE_BYTES,
    PAGE_WEIGHTS,
    axe_violations,
    chromium,
    find_chromium,
    page_weight,
    serve,
)
from tools import convert, toc
from tools.colab import colab_url, release_ref
from tools.paths import ROOT
from tools.project import repository

pytestmark = [pytest.mark.site, pytest.mark.browser]

SITE = ROOT / "_build" / "html"
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
NOT_PAGES = {"genindex.html", "search.html", "index.html"}  # index.html: redirect to the root
DESKTOP, PHONE = 1280, 390
#: Smallest text height, in CSS pixels, in a figure or diagram as a 390 px phone shows it.
MIN_TEXT_PX = 9.0

#: Elements whose content must fit their box (at 1280 px; at 390 px all but the last two).
FITTING = ("main pre, main div.highlight, main div.cell_output, main div.output, "
           "main .flashlib-ifig, main figure, main img, main svg, main table, "
           "main mjx-container[display='true'], main div.math")
#: Elements that may scroll inside their own box on a phone (never at 1280 px): a display
#: equation (at most MAX_SCROLLING_EQUATIONS per page), a table, a code block.
OWN_SCROLL = ("mjx-container[display='true'], div.math, .pst-scrollable-table-container, "
              "table, .flashlib-table, pre")
#: Display equations per page that may scroll inside their own box on a phone; the others are
#: split into aligned lines, one step per line.
MAX_SCROLLING_EQUATIONS = 1
#: Smallest share of its designed size (its width attribute, or its viewBox) at which a figure
#: is shown on a 390 px phone.
MIN_FIGURE_SCALE = 0.75

#: Open every dropdown, collapsed code cell and toggled block (solutions) of the page.
OPEN_ALL = """() => {
  for (const d of document.querySelectorAll('main details')) d.open = true;
  for (const e of document.querySelectorAll('main .toggle-hidden'))
    e.classList.remove('toggle-hidden');
}"""

#: Code blocks whose rendered lines outnumber their source lines: wrapped code.
WRAPPED_CODE = r"""() => {
  const bad = [];
  for (const pre of document.querySelectorAll('main pre')) {
    if (!pre.checkVisibility({visibilityProperty: true})) continue;
    const text = pre.textContent.replace(/\n$/, '');
    const lines = text.split('\n').length;
    // the same text in the same box that cannot wrap: as tall as the lines of the source
    const probe = pre.cloneNode(false);
    probe.style.whiteSpace = 'pre';
    pre.parentNode.appendChild(probe);
    probe.textContent = 'x';
    const one = probe.getBoundingClientRect().height;
    probe.textContent = 'x\nx';
    const lineHeight = probe.getBoundingClientRect().height - one;
    probe.textContent = text;
    const unwrapped = probe.clientHeight;
    probe.remove();
    if (lineHeight <= 0) continue;
    const rendered = lines + Math.round((pre.clientHeight - unwrapped) / lineHeight);
    if (rendered > lines) {
      const longest = text.split('\n').reduce((a, b) => (b.length > a.length ? b : a), '');
      bad.push(`${lines} lines shown as ${rendered} (longest, ${longest.length} columns: ` +
               `${longest.trim().slice(0, 60)})`);
    }
  }
  return bad;
}"""

#: Formulas hidden in part (an inline formula clipped by its box) and display equations that
#: scroll inside their own box: {clipped: [...], scrolling: [...]}.
MATH = """() => {
  const clipped = [], scrolling = [];
  const tex = el => (el.querySelector('mjx-assistive-mml') || el).textContent.trim()
    .slice(0, 50);
  for (const span of document.querySelectorAll('main span.math')) {
    const m = span.querySelector('mjx-container');  // the theme's span.math hides overflow
    if (!m || !span.checkVisibility({visibilityProperty: true})) continue;
    const [inner, outer] = [m, span].map(el => el.getBoundingClientRect().width);
    if (inner > outer + 2)  // (glyphs overhang their box by a pixel or two: no matter)
      clipped.push(`inline ${tex(span)} (${Math.round(inner)} px in ${Math.round(outer)} px)`);
  }
  for (const m of document.querySelectorAll("main mjx-container[display='true']")) {
    if (!m.checkVisibility({visibilityProperty: true})) continue;
    const box = m.closest('div.math') || m;
    if (box !== m && box.scrollWidth > box.clientWidth + 1)
      clipped.push(`display ${tex(m)} (${box.scrollWidth} px in ${box.clientWidth} px)`);
    if (m.scrollWidth > m.clientWidth + 1)
      scrolling.push(`${tex(m)} (${m.scrollWidth} px in ${m.clientWidth} px)`);
  }
  return {clipped, scrolling};
}"""

#: Figures (images, and the SVG of diagrams and drawn widgets): not crisp on a 2x screen (a
#: raster of less than twice its shown width), or shown at less than ``minScale`` of their
#: designed size (the image's width attribute, the SVG's width or viewBox).
FIGURES = r"""(minScale) => {
  const bad = [];
  const svgs = 'main .flashlib-diagram svg, main .flashlib-ifig svg, main figure svg';
  for (const img of document.querySelectorAll('main img')) {
    if (!img.checkVisibility({visibilityProperty: true})) continue;
    const name = `image "${(img.alt || img.src).slice(0, 50)}"`;
    const shown = img.getBoundingClientRect().width;
    const svg = /\.svg$|^data:image\/svg/.test(img.getAttribute('src') || '');
    if (!svg && img.naturalWidth < 2 * shown - 2)
      bad.push(`${name}: ${img.naturalWidth} px drawn for ${Math.round(shown)} px shown ` +
               '(not crisp on a 2x screen: draw it at twice its size, or as SVG)');
    const designed = Number(img.getAttribute('width'));
    if (!svg && !designed) bad.push(`${name}: no width attribute (its designed size)`);
    if (designed && shown < minScale * designed - 1)
      bad.push(`${name}: shown at ${Math.round(shown)} px, less than ${minScale} of its ` +
               `designed ${designed} px`);
  }
  for (const svg of document.querySelectorAll(svgs)) {
    if (!svg.checkVisibility({visibilityProperty: true}) || !svg.viewBox.baseVal) continue;
    const designed = Number(svg.getAttribute('width')) || svg.viewBox.baseVal.width;
    const shown = svg.getBoundingClientRect().width;
    if (designed && shown < minScale * designed - 1)
      bad.push(`svg "${(svg.getAttribute('aria-label') || '').slice(0, 50)}": shown at ` +
               `${Math.round(shown)} px, less than ${minScale} of its designed ${designed} px`);
  }
  return bad;
}"""

SIDEWAYS = """([selector, ownScroll]) => {
  const bad = [];
  for (const el of document.querySelectorAll(selector)) {
    if (getComputedStyle(el).display.startsWith('inline') && el.tagName !== 'IMG') continue;
    if (!el.checkVisibility({visibilityProperty: true})) continue;  // e.g. a closed <details>
    if (ownScroll && el.closest(ownScroll)) continue;
    const name = el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
      (el.className && typeof el.className === 'string' ?
       '.' + el.className.trim().split(/\\s+/).slice(0, 2).join('.') : '');
    const text = (el.textContent || el.getAttribute('alt') || '').trim().slice(0, 60);
    if (el.scrollWidth > el.clientWidth + 1)
      bad.push(`${name} (${el.scrollWidth} px of content in ${el.clientWidth} px): ${text}`);
    const right = el.getBoundingClientRect().right;
    const main = document.querySelector('main').getBoundingClientRect().right;
    if (right > main + 1) bad.push(`${name} (ends at ${Math.round(right)} px, past the ` +
                                   `content's ${Math.round(main)} px): ${text}`);
  }
  return bad;
}"""

VISIBLE_GLUE = """() => [...document.querySelectorAll('main pre')]
  .filter(pre => pre.checkVisibility({visibilityProperty: true})
                 && pre.textContent.includes('glue('))
  .map(pre => pre.textContent.trim().slice(0, 80))"""

SMALL_TEXT = """(minimum) => {
  const bad = [];
  for (const img of document.querySelectorAll('main img')) {
    if (!img.checkVisibility({visibilityProperty: true})) continue;
    const designed = Number(img.getAttribute('width')) || img.naturalWidth;
    if (!img.hasAttribute('data-text-px')) {
      bad.push(`image "${img.alt.slice(0, 60)}": no data-text-px (flashlib.book.plots.show)`);
      continue;
    }
    const px = Number(img.dataset.textPx) * img.clientWidth / designed;
    if (px < minimum) bad.push(`image "${img.alt.slice(0, 60)}": text ${px.toFixed(1)} px`);
  }
  for (const svg of document.querySelectorAll('main svg[viewBox]')) {
    if (!svg.checkVisibility({visibilityProperty: true})) continue;
    const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
    for (const t of svg.querySelectorAll('text')) {
      const px = parseFloat(getComputedStyle(t).fontSize) * scale;
      if (px < minimum) {
        bad.push(`svg "${(svg.getAttribute('aria-label') || '').slice(0, 50)}": ` +
                 `"${t.textContent.slice(0, 30)}" ${px.toFixed(1)} px`);
        break;
      }
    }
  }
  return bad;
}"""

#: What a figure shows: the image (and its alt) or the drawing (and its label).
FIGURE_STATE = """fig => {
  const img = fig.querySelector('img');
  if (img) return img.getAttribute('src') + '|' + img.getAttribute('alt');
  const drawing = fig.querySelector('.flashlib-ifig-drawing');
  return drawing.innerHTML + '|' + drawing.getAttribute('aria-label');
}"""

#: With JavaScript off: visible controls that need it.
DEAD_CONTROLS = """() => [...document.querySelectorAll(
    'input, button, select, textarea, [role=button], [role=slider], [role=switch]')]
  .filter(el => el.checkVisibility({visibilityProperty: true}))
  .map(el => el.outerHTML.slice(0, 120))"""


def site_pages() -> list[str]:
    """Every content page of the built site, relative to _build/html."""
    if not (SITE / "index.html").is_file():
        return []
    return sorted(
        str(p.relative_to(SITE))
        for p in SITE.rglob("*.html")
        if p.name not in NOT_PAGES
        and not any(part.startswith("_") for part in p.relative_to(SITE).parts)
    )


PAGES = site_pages() or ["<missing _build/html: run make book>"]


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


def _open(browser, server: str, page_path: str, width: int, *, javascript: bool = True):
    """A fresh context (no cache: the page weight counts everything) showing the page;
    returns (context, page, problems) with problems a dict of lists."""
    if page_path.startswith("<"):
        pytest.fail(f"{SITE} is missing: run `make book` first (make test does it)")
    context = browser.new_context(viewport={"width": width, "height": 900},
                                  java_script_enabled=javascript, service_workers="block")
    page = context.new_page()
    problems: dict[str, list[str]] = {"outside": [], "failed": [], "errors": []}
    def route(route) -> None:
        host = urlparse(route.request.url).hostname
        if route.request.url.startswith("data:") or host == "127.0.0.1":
            route.continue_()
        else:
            problems["outside"].append(route.request.url)
            route.abort()

    def on_response(response) -> None:
        if response.status >= 400:
            problems["failed"].append(f"{response.url} (HTTP {response.status})")

    page.route("**/*", route)
    page.on("requestfailed", lambda r: problems["failed"].append(f"{r.url} ({r.failure})"))
    page.on("response", on_response)
    page.on("console", lambda m: problems["errors"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems["errors"].append(str(e)))
    page.goto(f"{server}/{page_path}", wait_until="load")
    page.wait_for_load_state("networkidle")
    if javascript:  # wait for MathJax (vendored) to typeset, and for the fonts it then loads
        page.wait_for_function("() => !window.MathJax || !!(MathJax.startup || {}).promise")
        page.evaluate("() => window.MathJax && MathJax.startup.promise.then(() => true)")
        page.wait_for_load_state("networkidle")
    return context, page, problems


def _screenshot(page, page_path: str, width: int, suffix: str = "") -> None:
    page.evaluate("window.scrollTo(0, 0)")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    name = page_path.replace("/", "__").removesuffix(".html")
    page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}{suffix}.png"), full_page=True)


def _check_sliders(page, page_path: str) -> None:
    """Each slider of each interactive figure changes its figure (mouse-free: the keyboard),
    updates what it announces, and going back restores the frame."""
    figures = page.locator(".flashlib-ifig")
    for i in range(figures.count()):
        fig = figures.nth(i)
        fig.scroll_into_view_if_needed()
        where = f"{page_path}: figure {i}"
        assert fig.is_visible(), f"{where} not visible"
        assert fig.locator(".flashlib-ifig-controls").is_visible(), f"{where}: no controls"
        assert fig.locator("figcaption").inner_text().strip(), f"{where}: no caption"
        held = fig.locator(".flashlib-ifig-fixed")  # what no slider sets, stated (issue 33)
        assert held.count() == 1 and held.is_visible(), f"{where}: its fixed parameters unsaid"
        start = "固定：" if page_path.startswith("ja/") else "Held fixed: "
        assert held.inner_text().startswith(start), f"{where}: {held.inner_text()!r}"
        img = fig.locator("img")
        if img.count():
            assert img.evaluate("i => i.complete && i.naturalWidth > 0"), f"{where}: no image"
        sliders = fig.locator("input[type=range]")
        assert sliders.count() >= 1, f"{where} has no slider"
        for k in range(sliders.count()):
            slider = sliders.nth(k)
            name = slider.get_attribute("aria-label") or ""
            # a name that says what it sets: two words (Japanese has no spaces: 3 characters)
            meaningful = (len(name.strip()) >= 3 if page_path.startswith("ja/")
                          else len(name.split()) >= 2)
            assert meaningful, f"{where}: slider {k} is named {name!r}"
            before = fig.evaluate(FIGURE_STATE)
            said = slider.get_attribute("aria-valuetext")
            at_top = int(slider.input_value()) == int(slider.get_attribute("max"))
            slider.focus()
            page.keyboard.press("ArrowLeft" if at_top else "ArrowRight")
            after = fig.evaluate(FIGURE_STATE)
            assert after != before, f"{where}: slider '{name}' changed nothing"
            assert slider.get_attribute("aria-valuetext") != said, (
                f"{where}: slider '{name}' does not announce its new value")
            page.keyboard.press("ArrowRight" if at_top else "ArrowLeft")
            assert fig.evaluate(FIGURE_STATE) == before, f"{where}: '{name}' not reversible"


@pytest.mark.parametrize("page_path", PAGES)
def test_page_desktop(server, browser, page_path: str) -> None:
    context, page, problems = _open(browser, server, page_path, DESKTOP)
    try:
        missing_alt = page.eval_on_selector_all(
            "main img",
            """imgs => imgs.filter(img => {
                 const alt = (img.getAttribute('alt') || '').trim();
                 const meaningful = alt && !/\\.(png|svg|jpe?g)$/i.test(alt);
                 const fig = img.closest('figure');
                 return !meaningful && !(fig && fig.querySelector('figcaption'));
               }).map(img => img.src.slice(0, 80))""",
        )
        assert not missing_alt, f"{page_path}: images without alt text or caption: {missing_alt}"

        colab = page.locator("p.colab-link a")
        # the Japanese edition's pages (ja/...) open the Japanese notebooks (notebooks/ja/)
        folder = "notebooks/ja" if page_path.startswith("ja/") else "notebooks"
        if (ROOT / folder / f"{Path(page_path).stem}.ipynb").is_file():
            assert colab.count() == 1, f"{page_path}: no 'Open in Colab' link"
        if colab.count():
            href = colab.first.get_attribute("href")
            name = Path(page_path).stem
            assert href == colab_url(repository()[0], release_ref(), name, folder), href
            assert (ROOT / folder / f"{name}.ipynb").is_file(), href

        sideways = page.evaluate(SIDEWAYS, [FITTING, None])
        assert not sideways, f"{page_path} at {DESKTOP} px, scrolling sideways:\n" + (
            "\n".join(sideways))
        glue_shown = page.evaluate(VISIBLE_GLUE)
        assert not glue_shown, f"{page_path}: glue( in shown code (hide the cell): {glue_shown}"
        _check_sliders(page, page_path)
        weight = page_weight(page)  # before axe-core, which the tests add
        violations = axe_violations(page)
        figures = page.evaluate(FIGURES, 0)
        _screenshot(page, page_path, DESKTOP)
        page.evaluate(OPEN_ALL)  # what a reader sees in every dropdown and collapsed cell
        opened = page.evaluate(SIDEWAYS, [FITTING, None])
        wrapped = page.evaluate(WRAPPED_CODE)
        math = page.evaluate(MATH)
    finally:
        context.close()
    PAGE_WEIGHTS[page_path] = weight
    assert not opened, f"{page_path} at {DESKTOP} px, dropdowns opened, scrolling sideways:\n" + (
        "\n".join(opened))
    assert not wrapped, f"{page_path} at {DESKTOP} px, code that wraps:\n" + "\n".join(wrapped)
    assert not math["clipped"] and not math["scrolling"], (
        f"{page_path} at {DESKTOP} px, formulas that do not fit:\n" + "\n".join(
            math["clipped"] + math["scrolling"]))
    assert not figures, f"{page_path} at {DESKTOP} px, figures:\n" + "\n".join(figures)
    assert not violations, f"{page_path} at {DESKTOP} px, axe-core:\n" + "\n".join(violations)
    assert not problems["outside"], f"{page_path}: requests leaving 127.0.0.1: {problems}"
    assert not problems["failed"], f"{page_path}: failed requests: {problems['failed']}"
    assert not problems["errors"], f"{page_path}: console errors: {problems['errors']}"
    assert weight <= MAX_PAGE_BYTES, (
        f"{page_path} weighs {weight / 1e6:.2f} MB, more than "
        f"{MAX_PAGE_BYTES / 1e6:.1f} MB (lighter widget frames, fewer frames, svg_figure)")


@pytest.mark.parametrize("page_path", PAGES)
def test_page_phone(server, browser, page_path: str) -> None:
    context, page, problems = _open(browser, server, page_path, PHONE)
    try:
        width = page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
        sideways = page.evaluate(SIDEWAYS, [FITTING, OWN_SCROLL])
        small = page.evaluate(SMALL_TEXT, MIN_TEXT_PX)
        figures = page.evaluate(FIGURES, MIN_FIGURE_SCALE)
        violations = axe_violations(page)
        _screenshot(page, page_path, PHONE)
        page.evaluate(OPEN_ALL)
        opened = page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
        wrapped = page.evaluate(WRAPPED_CODE)
        math = page.evaluate(MATH)
    finally:
        context.close()
    assert width[0] <= width[1], f"{page_path} at {PHONE} px scrolls sideways: {width}"
    assert opened[0] <= opened[1], (
        f"{page_path} at {PHONE} px, dropdowns opened, scrolls sideways: {opened}")
    assert not sideways, f"{page_path} at {PHONE} px, wider than their box:\n" + (
        "\n".join(sideways))
    assert not wrapped, f"{page_path} at {PHONE} px, code that wraps:\n" + "\n".join(wrapped)
    assert not math["clipped"], f"{page_path} at {PHONE} px, formulas cut off:\n" + (
        "\n".join(math["clipped"]))
    assert len(math["scrolling"]) <= MAX_SCROLLING_EQUATIONS, (
        f"{page_path} at {PHONE} px: {len(math['scrolling'])} display equations scroll inside "
        f"their box, at most {MAX_SCROLLING_EQUATIONS} may (split the others into aligned "
        "lines, one step per line):\n" + "\n".join(math["scrolling"]))
    assert not figures, f"{page_path} at {PHONE} px, figures:\n" + "\n".join(figures)
    assert not small, f"{page_path} at {PHONE} px, text below {MIN_TEXT_PX} px:\n" + (
        "\n".join(small))
    assert not violations, f"{page_path} at {PHONE} px, axe-core:\n" + "\n".join(violations)
    assert not problems["errors"], f"{page_path}: console errors: {problems['errors']}"


def test_diffs_show_removed_lines_red_and_added_lines_green(server, browser) -> None:
    """The ladder's diffs (flashlib.book.diffs) as its text says: removed lines red, added
    lines green, in the light and the dark theme."""
    page_path = "book/optimisation-ladder.html"
    for theme in ("light", "dark"):
        context, page, _ = _open(browser, server, page_path, DESKTOP)
        try:
            page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
            colours = page.evaluate("""() => Object.fromEntries(['gd', 'gi'].map(c => {
                const el = document.querySelector(`main .highlight-diff .${c}`);
                const rgb = getComputedStyle(el).color.match(/\\d+/g).map(Number);
                return [c, rgb];
            }))""")
        finally:
            context.close()
        (r, g, b), (r2, g2, b2) = colours["gd"][:3], colours["gi"][:3]
        assert r > g + 40 and r > b + 40, f"{theme}: removed lines are not red: {colours}"
        assert g2 > r2 + 40 and g2 > b2 + 20, f"{theme}: added lines are not green: {colours}"


@pytest.mark.parametrize("page_path", PAGES)
def test_page_without_javascript(server, browser, page_path: str) -> None:
    context, page, _ = _open(browser, server, page_path, DESKTOP, javascript=False)
    try:
        dead = page.evaluate(DEAD_CONTROLS)
        figures = page.locator(".flashlib-ifig")
        shown = []
        for i in range(figures.count()):
            fig = figures.nth(i)
            note = fig.locator(".flashlib-ifig-nojs")
            img = fig.locator("img")
            shown.append(note.count() == 1 and note.is_visible()
                         and (img.count() == 0 or img.is_visible()))
    finally:
        context.close()
    assert not dead, f"{page_path} without JavaScript shows controls that need it: {dead}"
    assert all(shown), f"{page_path} without JavaScript: figures without their note: {shown}"


def test_site_was_built() -> None:
    assert (SITE / "index.html").is_file(), f"{SITE} is missing: run `make book` first"
    pages = site_pages()
    assert "book/intro.html" in pages, f"no book/intro.html among {pages}"
    assert "book/glossary.html" in pages, f"no book/glossary.html among {pages}"


def test_no_page_repeats_a_script() -> None:
    """tools/book_extension.py dedupe_scripts: sphinx-thebe's config script, repeated, is a
    console error (the browser test would catch it only on pages it opens)."""
    assert site_pages(), f"{SITE} is missing: run `make book` first"
    for page_path in site_pages():
        text = (SITE / page_path).read_text(encoding="utf-8")
        scripts = re.findall(r"<script\b[^>]*>.*?</script>", text, re.S)
        repeated = {s[:100] for s in scripts if scripts.count(s) > 1}
        assert not repeated, f"{page_path}: repeated <script> elements: {repeated}"


def test_exercises_are_numbered_per_chapter() -> None:
    """"Exercise C.K" on the site, C the chapter's number: the notebooks' numbers too."""
    for source in toc.chapters():
        page = SITE / source.relative_to(ROOT).with_suffix(".html")
        if not page.is_file():
            continue
        html = page.read_text(encoding="utf-8")
        on_site = re.findall(r'<span class="caption-number">Exercise (\d+(?:\.\d+)*)', html)
        in_notebook = re.findall(r"^### Exercise (\S+)", "\n".join(
            c.source for c in convert.clean_notebook(source).cells
            if c.cell_type == "markdown"), re.M)
        chapter = toc.chapter_number(source)
        want = [f"{chapter}.{k}" for k in range(1, len(in_notebook) + 1)]
        assert [n.rstrip(".") for n in on_site] == want == [n.rstrip(":") for n in in_notebook], (
            source.name, on_site, in_notebook)


def test_theme_templates_match_the_pinned_theme() -> None:
    """book/_templates holds copies of pydata-sphinx-theme 0.17.1's templates: a new theme
    version needs fresh copies (the changes are marked in each file)."""
    import pydata_sphinx_theme

    assert pydata_sphinx_theme.__version__ == "0.17.1", (
        "pydata-sphinx-theme changed: copy its static/webpack-macros.html, "
        "search-button-field.html and theme-switcher.html (its components/) into "
        "book/_templates again and reapply the changes marked there")


def test_find_chromium(monkeypatch, tmp_path) -> None:
    browser = tmp_path / "my-chrome"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    monkeypatch.setenv("CHROMIUM", str(browser))
    assert find_chromium() == str(browser)
    monkeypatch.setenv("CHROMIUM", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="CHROMIUM"):
        find_chromium()
    monkeypatch.delenv("CHROMIUM")
    snap = tmp_path / "chromium-browser"
    snap.write_text("#!/bin/sh\nexec /snap/bin/chromium \"$@\"\n")
    snap.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_chromium() is None  # the snap wrapper is skipped: Playwright's own browser
    (tmp_path / "google-chrome").write_text("#!/bin/sh\n")
    (tmp_path / "google-chrome").chmod(0o755)
    assert find_chromium() == str(tmp_path / "google-chrome")


def write_weights() -> None:
    """test-artifacts/page-weights.json: the weights this run measured (tests/conftest.py)."""
    if PAGE_WEIGHTS:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "page-weights.json").write_text(
            json.dumps(dict(sorted(PAGE_WEIGHTS.items())), indent=1) + "\n", encoding="utf-8")
