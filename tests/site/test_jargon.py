"""Jargon before its definition: on every page of the built site (_build/html), the first use
of a glossary term is a link to its entry in the glossary ({term}`...`), or comes after one,
or is its definition in place (the term alone in emphasis, *warp*, then what it means).

Uses are found in the page's text, not in code blocks, printed outputs, formulas, figures or
headings; a term is matched as a whole word, with a plural "s". The glossary itself must not
define a term twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from tools.paths import ROOT

pytestmark = [pytest.mark.site]

SITE = ROOT / "_build" / "html"
GLOSSARY = SITE / "book" / "glossary.html"
#: Glossary entries that are symbols of the algorithm (a letter in a formula), not words:
#: their uses are in math, which this test does not read.
SYMBOLS = {"B_c", "B_r", "D", "L", "l", "m"}
#: Entries that are ordinary words too, used in their plain sense long before the glossary's
#: (a "program" of instructions, a "tile" of a floor): linked at first use where the sense
#: matters, not checked here.
ORDINARY = {"program", "tile", "FLOP", "bfloat16", "accumulator"}
#: What a term's text is never part of: code, outputs, formulas, figures, headings, links to
#: other pages (a chapter's title), the bibliography, the page's own navigation.
SKIPPED = {"pre", "code", "script", "style", "svg", "img", "figure", "h1", "h2", "h3", "h4", "h5",
           "h6", "nav", "button", "summary", "mjx-container"}
SKIPPED_CLASSES = {"math", "cell_output", "headerlink", "colab-link", "toctree-wrapper",
                   "prev-next-area", "citation"}


@dataclass
class Event:
    position: int
    kind: str  # "use", "link" or "definition"
    term: str
    context: str


def glossary_terms() -> dict[str, str]:
    """{anchor id: term} of the glossary's entries, from the built glossary page."""
    html = GLOSSARY.read_text(encoding="utf-8")
    return dict(re.findall(r'<dt id="(term-[^"]+)">(.*?)<a class="headerlink"', html))


def term_pattern(term: str) -> re.Pattern[str]:
    """A whole-word match of ``term`` (and its plural); acronyms match their case only."""
    words = r"[\s-]+".join(re.escape(w) for w in re.split(r"[\s-]+", term))
    flags = 0 if term.upper() == term or re.search(r"[A-Z]", term[1:]) else re.IGNORECASE
    return re.compile(rf"(?<![\w/-]){words}(?:s|es)?(?![\w-])", flags)


def page_events(html: str, terms: dict[str, str]) -> list[Event]:
    """Uses, glossary links and in-place definitions of the terms, in document order."""
    from bs4 import BeautifulSoup, NavigableString, Tag

    soup = BeautifulSoup(html, "html.parser")
    article = soup.select_one("article.bd-article") or soup
    patterns = {term: term_pattern(term) for term in terms.values()}
    events: list[Event] = []
    position = 0

    def skipped(tag: Tag) -> bool:
        return tag.name in SKIPPED or bool(SKIPPED_CLASSES & set(tag.get("class") or []))

    def walk(node, link: str | None, emphasis: str | None) -> None:
        nonlocal position
        for child in node.children:
            if isinstance(child, NavigableString):
                text = str(child)
                for term, pattern in patterns.items():
                    for match in pattern.finditer(text):
                        kind = ("link" if link == term else
                                "definition" if emphasis is not None and pattern.fullmatch(
                                    emphasis.strip()) else "use")
                        events.append(Event(position + match.start(), kind, term,
                                            text[max(0, match.start() - 40):match.end() + 40]))
                position += len(text)
            elif isinstance(child, Tag) and not skipped(child):
                href = child.get("href", "") if child.name == "a" else ""
                anchor = href.split("#", 1)[1] if "glossary.html#" in href else None
                if child.name == "a" and anchor is None:
                    continue  # a link elsewhere: its text is a title, not a use
                if anchor in terms:
                    events.append(Event(position, "link", terms[anchor], child.get_text()))
                inner_link = terms.get(anchor, link)
                inner_emphasis = (child.get_text() if child.name in ("em", "strong", "dfn")
                                  else emphasis)
                walk(child, inner_link, inner_emphasis)

    walk(article, None, None)
    return sorted(events, key=lambda e: (e.position, e.kind != "link"))


def undefined_first_uses(html: str, terms: dict[str, str]) -> list[str]:
    """The checked terms whose first use on the page comes before any link to their glossary
    entry and is not their definition in place: one line each, with the text around it."""
    checked = {a: t for a, t in terms.items() if t not in SYMBOLS | ORDINARY}
    first: dict[str, Event] = {}
    for event in page_events(html, checked):
        first.setdefault(event.term, event)
    return [f"{term!r} used before its glossary link: ...{' '.join(e.context.split())}..."
            for term, e in first.items() if e.kind == "use"]


def site_pages() -> list[str]:
    if not GLOSSARY.is_file():
        return ["<missing _build/html: run make book>"]
    return sorted(str(p.relative_to(SITE)) for p in (SITE / "book").rglob("*.html")
                  if p.name not in ("glossary.html", "references.html"))


@pytest.mark.parametrize("page_path", site_pages())
def test_no_jargon_before_its_definition(page_path: str) -> None:
    if page_path.startswith("<"):
        pytest.fail(f"{SITE} is missing: run `make book` first (make test does it)")
    html = (SITE / page_path).read_text(encoding="utf-8")
    problems = undefined_first_uses(html, glossary_terms())
    assert not problems, (f"{page_path}: link the glossary at a term's first use "
                          "({term}`warp`) or define it there (*warp*, then what it is):\n"
                          + "\n".join(problems))


def test_the_glossary_defines_each_term_once() -> None:
    """One definition per entry: a second paragraph of an entry may add to it, not restate it
    (the build merges a term written twice into one entry with two definitions)."""
    source = (ROOT / "book" / "glossary.md").read_text(encoding="utf-8")
    body = source.split("```{glossary}", 1)[1].split("\n```", 1)[0]
    entries = re.findall(r"^(\S.*)\n((?:(?:  .*)?\n)+)", body + "\n", re.M)
    assert entries, "no entries found in book/glossary.md"
    names = [name for name, _ in entries]
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    for name, text in entries:
        paragraphs = [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
        assert len(paragraphs) == 1, f"{name!r} has {len(paragraphs)} definitions"


def test_the_check_finds_jargon_before_its_link() -> None:
    terms = {"term-warp": "warp", "term-split-K": "split-K", "term-SM": "SM"}
    link = '<a class="reference internal" href="glossary.html#term-warp">warps</a>'
    page = (f'<article class="bd-article"><p>Four warps split-KV the SMs.</p><p>{link}</p>'
            "<pre>warp</pre><p>split-K and <em>split-K</em></p></article>")
    problems = undefined_first_uses(page, terms)
    assert len(problems) == 3 and "'warp'" in problems[0] and "'SM'" in problems[1]
    assert "'split-K'" in problems[2]  # "split-KV" is another word; the plain use comes first
    ok = (f'<article class="bd-article"><p>{link} and then warps; <em>split-K</em> is a '
          "split, split-K again; the <strong>SM</strong>s</p></article>")
    assert undefined_first_uses(ok, terms) == []
