"""No visible seams on the built site (_build/html, made by `make book`).

A seam is something a build left on a page that no author wrote: an object's repr where a
sentence should be (``<IPython.core.display.Markdown object>``, ``<function f at 0x7f...>``),
a placeholder never filled (``{glue``, ``2^floor``, ``TODO``, ``{{``), a degenerate range
("between 0.00155 and 0.00155", "from 3 to 3"), or the same sentence twice on one page.
Each check reads every chapter's page as a reader sees it: reprs anywhere in the article
(printed outputs included), the others in its prose (code and outputs left out, and the
page's navigation, which repeats titles by design).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from tools.paths import ROOT

SITE = ROOT / "_build" / "html"

#: An object's repr printed where text should be.
REPR = re.compile(r"<[\w.]+ object>|<IPython\.|object at 0x[0-9a-fA-F]+|<function \w+ at 0x")
#: Placeholders never filled in, in prose.
PLACEHOLDER = re.compile(r"\{glue|2\^\s*floor|\\text\{floor\}|\bTODO\b|\{\{|\}\}|\bFIXME\b|"
                         r"\bXXX\b|\?\?\?")
_NUMBER = r"[-−]?\d[\d,]*(?:\.\d+)?(?:[eE][-+−]?\d+)?%?"
#: Math that was never rendered (dollar signs left in the text, e.g. from a glued string).
UNRENDERED_MATH = re.compile(r"\$[^$\s][^$]{0,80}\$")
#: A range whose two ends print the same.
DEGENERATE = re.compile(rf"\b(?:between ({_NUMBER}) and (\1)|from ({_NUMBER}) to (\3))(?![\d.])")
#: A sentence must have at least this many words to count as repeated (short labels such as
#: "Solution" or "Show code cell source" are the theme's, not the author's).
MIN_WORDS = 6

#: What a page's prose is not: code, outputs, math, figures, navigation, the theme's chrome.
NOT_PROSE_TAGS = ["pre", "script", "style", "svg", "nav", "header", "footer", "button",
                  "figure", "mjx-container", "math", "img", "form", "label", "select"]
NOT_PROSE_CLASSES = ["cell_input", "cell_output", "highlight", "math", "headerlink",
                     "bd-sidebar-primary", "bd-sidebar-secondary", "prev-next-area",
                     "toctree-wrapper", "citation", "bd-header-article", "footnote",
                     "flashlib-ifig", "flashlib-diagram", "widget-subarea", "output",
                     "colab-link", "bd-footer", "bd-footer-content", "bd-footer-article",
                     "sd-summary-title", "admonition-title", "caption"]


def chapter_pages() -> list:
    return sorted((SITE / "book").glob("*.html")) + ([SITE / "intro.html"]
                                                     if (SITE / "intro.html").is_file() else [])


def article(html: str):
    """The page's article (its main content), parsed."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    return soup.find("article") or soup.find("main") or soup


def prose(html: str) -> str:
    """The page's prose as text: the article without code, outputs, math and chrome."""
    main = article(html)
    for tag in main.find_all(NOT_PROSE_TAGS):
        tag.decompose()
    for name in NOT_PROSE_CLASSES:
        for tag in main.find_all(class_=name):
            tag.decompose()
    for tag in main.find_all(["p", "li", "dt", "dd", "td", "th", "h1", "h2", "h3", "h4",
                              "summary", "div"]):
        tag.append(" ")  # block boundaries stay word boundaries
    return re.sub(r"\s+", " ", main.get_text(" "))


def sentences(text: str) -> list[str]:
    """The text's sentences of at least MIN_WORDS words, whitespace normalised."""
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z(\"'‘“])", text)
    return [p.strip() for p in parts if len(p.split()) >= MIN_WORDS]


def seams(html: str) -> list[str]:
    """Every seam on one page, in words."""
    problems = []
    main = article(html)
    for tag in main.find_all(class_="cell_input"):
        tag.decompose()  # shown code may name an object; what it prints may not
    everything = re.sub(r"\s+", " ", main.get_text(" "))
    problems += [f"an object's repr: {m.group(0)!r} in ...{_around(everything, m)}..."
                 for m in REPR.finditer(everything)]
    text = prose(html)
    problems += [f"a placeholder: {m.group(0)!r} in ...{_around(text, m)}..."
                 for m in PLACEHOLDER.finditer(text)]
    problems += [f"unrendered math: {m.group(0)!r} in ...{_around(text, m)}..."
                 for m in UNRENDERED_MATH.finditer(text)]
    problems += [f"a degenerate range: {m.group(0)!r} in ...{_around(text, m)}..."
                 for m in DEGENERATE.finditer(text)]
    twice = [s for s, n in Counter(sentences(text)).items() if n > 1]
    problems += [f"the same sentence twice: {s!r}" for s in twice]
    return problems


def _around(text: str, match: re.Match) -> str:
    return text[max(0, match.start() - 60): match.end() + 60]


def test_seams_are_found():
    """The checks find each kind of seam (on made-up pages), and nothing on a clean one."""
    page = ("<html><body><article><p>The error lies between 0.00155 and 0.00155.</p>"
            "<div class='cell_output'><pre>&lt;IPython.core.display.Markdown object&gt;</pre>"
            "</div><p>A term of 2^floor, $2^{-63}$ raw.</p>"
            "<p>It goes from 3 to 3 in all cases.</p>"
            "<p>This sentence is written here twice on purpose. This sentence is written "
            "here twice on purpose.</p><div class='cell_input'><pre>f = lambda: 0  "
            "# &lt;function f at 0x1&gt; TODO {{</pre></div></article></body></html>")
    found = "\n".join(seams(page))
    for kind in ("repr", "2^floor", "unrendered math", "0.00155 and 0.00155", "from 3 to 3",
                 "twice"):
        assert kind in found, (kind, found)
    assert "TODO" not in found and "0x1" not in found  # shown code is not prose
    clean = ("<html><body><article><p>The error lies between 0.00155 and 0.00162, from 3 to "
             "30, between 2 and 2.5. The first sentence of a page is here.</p>"
             "<p>A second sentence that is not the same as the first.</p></article></body>"
             "</html>")
    assert seams(clean) == []


@pytest.mark.site
def test_site_was_built():
    assert (SITE / "book").is_dir(), "no built site: run `make book` first"


@pytest.mark.site
@pytest.mark.parametrize("page", chapter_pages(), ids=lambda p: p.stem)
def test_no_seams_on_the_page(page):
    problems = seams(page.read_text(encoding="utf-8"))
    assert not problems, f"{page.relative_to(SITE)}:\n" + "\n".join(problems)
