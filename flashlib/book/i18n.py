"""The words the book's code draws and prints, in the reader's language (English or Japanese).

The chapters' prose is translated through gettext catalogs (locales/, tools/ja_edition.py);
this module translates what the *code* produces: figure and diagram labels, widget labels and
captions, alt texts, tables, glued sentences, checker verdicts and hints. The code always
writes English; a string is translated where it leaves for the reader:

- on the website, one execution serves both editions: the Japanese build translates the
  executed outputs as it writes its pages (tools/i18n_extension.py: HTML outputs and glued
  values through :func:`translate_html` / :func:`translate`; the page's figures drawn in the
  browser through the same table, js/i18n.js), so both editions show the very same numbers;
- in a notebook the language is chosen at run time: the Japanese notebooks' set-up cell calls
  ``set_language("ja")`` (or ``FLASHLIB_LANG=ja``), and the checkers' verdicts, the figures'
  HTML and the matplotlib labels pass through :func:`translate` before they are shown.

Why translate finished strings rather than give every function a ``lang`` argument: the
strings are built in hundreds of places (f-strings with measured numbers), and one table keyed
by the English, with every number replaced by a placeholder (:func:`template`), covers them all
without touching the numerics or the checkers' logic, and cannot drift from the English: a
string without a translation stays English (tests/i18n lists and refuses those the book shows).

The table is flashlib/book/locale/ja/*.json: ``{"English, {0} for each number": "日本語 {0}"}``
(site.json: what the pages show; checkers.json: the checkers' verdicts and hints).
A number is a run of digits with its decimal point, thousands commas and exponent
(``1,024``, ``0.5``, ``3.2e-05``) not glued to a letter or an underscore before it (``fp16``,
``B_1`` and ``H100`` are words).
"""

from __future__ import annotations

import html
import json
import os
import re
from functools import cache
from html.parser import HTMLParser
from importlib import resources

__all__ = ["language", "set_language", "translate", "translate_html", "template", "table",
           "LANGUAGES"]

LANGUAGES = ("en", "ja")
ENV = "FLASHLIB_LANG"
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?")
_PLACEHOLDER = re.compile(r"\{(\d+)\}")
#: What a text needs to be worth translating: two Latin letters in a row (not "K_2 V_2", "m, l").
_WORD = re.compile(r"[A-Za-z]{2}")
_JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
_language: str | None = None
#: Strings asked for and not found (to list what is left to translate): see :func:`missing`.
_MISSING: set[str] = set()


def language() -> str:
    """The language code strings are translated to: ``set_language``'s, else ``FLASHLIB_LANG``'s
    ("en" when unset)."""
    lang = _language or os.environ.get(ENV, "en") or "en"
    return lang if lang in LANGUAGES else "en"


def set_language(lang: str) -> None:
    """Translate what the code shows into ``lang`` ("en" or "ja") from now on."""
    global _language
    if lang not in LANGUAGES:
        raise ValueError(f"lang: expected one of {LANGUAGES}, got {lang!r}")
    _language = lang


@cache
def table(lang: str) -> dict[str, str]:
    """The translations into ``lang``: {English template: template in ``lang``}, from every
    flashlib/book/locale/<lang>/*.json (an empty translation counts as none)."""
    if lang == "en":
        return {}
    words: dict[str, str] = {}
    folder = resources.files("flashlib.book").joinpath("locale", lang)
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            words.update((k, v) for k, v in json.loads(entry.read_text("utf-8")).items() if v)
    return words


def template(text: str) -> tuple[str, list[str]]:
    """``text`` with each number replaced by ``{0}``, ``{1}``, ... and the numbers:
    ``template("step 3 of 12") == ("step {0} of {1}", ["3", "12"])``."""
    numbers: list[str] = []

    def hole(match: re.Match[str]) -> str:
        numbers.append(match.group(0))
        return f"{{{len(numbers) - 1}}}"

    return NUMBER.sub(hole, text), numbers


#: A set of names as Python prints it (``{'acc', 'l'}``, ``set()``): a checker's message
#: about a learner's set is one entry whatever the set, with ``{s0}``, ``{s1}`` ... for the sets.
NAMES = re.compile(r"\{'[^'{}]*'(?:, '[^'{}]*')*\}|\bset\(\)")
_NAMES_HOLE = re.compile(r"\{s(\d+)\}")


def _lookup(text: str, words: dict[str, str]) -> str | None:
    """The translation of ``text`` (stripped): exact, else by its template, else with its
    sets of names as holes too (:data:`NAMES`); None if none."""
    found = words.get(text)
    if found is not None:
        return found
    key, numbers = template(text)
    found = words.get(key)
    if found is None:
        sets: list[str] = []

        def hole(match: re.Match[str]) -> str:
            sets.append(match.group(0))
            return f"{{s{len(sets) - 1}}}"

        holed = NAMES.sub(hole, text)
        if not sets:
            return _lookup_got(text, words)
        found = _lookup(holed, words)
        if found is None:
            return None
        return _NAMES_HOLE.sub(
            lambda m: sets[int(m.group(1))] if int(m.group(1)) < len(sets) else m.group(0),
            found)
    return _PLACEHOLDER.sub(
        lambda m: numbers[int(m.group(1))] if int(m.group(1)) < len(numbers) else m.group(0),
        found)


#: What a learner's function returned, shown as Python shows it, at the end of a message
#: ("expected a number, got 'eleven'"): one entry whatever it was, with ``{r0}`` for it.
_GOT = re.compile(r"(?P<head>(?:.*[,;] )?got )(?P<got>.+)", re.DOTALL)


def _lookup_got(text: str, words: dict[str, str]) -> str | None:
    """The translation of ``text`` by its entry with ``{r0}`` for what follows its last
    "got " (:data:`_GOT`); None if it has none."""
    match = _GOT.fullmatch(text)
    if match is None or "{r0}" in text:
        return None
    found = _lookup(match["head"] + "{r0}", words)
    return None if found is None else found.replace("{r0}", match["got"])


#: Between the parts of a message translated part by part ("label: problem: hint").
SEPARATOR = {"ja": "：", "en": ": "}
_OPENING, _CLOSING = "([{", ")]}"


def parts(text: str) -> list[str]:
    """``text`` cut at each ": " outside brackets and backticks (a slice ``x[: n]`` or a
    parenthesis that runs on is not cut): "label: finding: hint" -> its three parts."""
    out, depth, code, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == "`":
            code = not code
        elif code:
            continue
        elif ch in _OPENING:
            depth += 1
        elif ch in _CLOSING:
            depth = max(0, depth - 1)
        elif ch == ":" and depth == 0 and text[i + 1: i + 2] == " ":
            out.append(text[start:i])
            start = i + 2
    out.append(text[start:])
    return out


def translate(text: str, lang: str | None = None) -> str:
    """``text`` in ``lang`` (default :func:`language`): its translation with its own numbers put
    back, or ``text`` unchanged when the table has none. Surrounding blanks are kept.

    A message the table lacks as a whole ("N = 64 in 2 splits: you averaged the splits'
    outputs: ...", a checker's case label, its finding and a hint) is translated part by part,
    the parts being what lies between ": " outside brackets (:func:`parts`; each part found
    as a whole or by its template)."""
    lang = lang or language()
    if lang == "en" or not isinstance(text, str) or not text.strip():
        return text
    stripped = text.strip()
    if not _WORD.search(stripped) or _JAPANESE.search(stripped):
        return text  # nothing to translate, or translated already (the alt of a ja figure)
    words = table(lang)
    found = _lookup(stripped, words)
    pieces = parts(stripped) if found is None else []
    if len(pieces) > 1:
        done = [_lookup(part, words) if _WORD.search(part) else part
                for part in pieces]
        if any(d is not None for d in done):
            for part, d in zip(pieces, done, strict=True):
                if d is None:
                    _miss(template(part)[0])
            found = SEPARATOR.get(lang, ": ").join(
                d if d is not None else part for part, d in zip(pieces, done, strict=True))
    if found is None:
        _miss(template(stripped)[0])
        return text
    start = text[: len(text) - len(text.lstrip())]
    end = text[len(text.rstrip()):]
    return f"{start}{found}{end}"


def _miss(key: str) -> None:
    """Note a template without a translation (and append it to FLASHLIB_I18N_RECORD's file)."""
    if key in _MISSING:
        return
    _MISSING.add(key)
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(key, ensure_ascii=False) + "\n")


def missing() -> list[str]:
    """The templates asked for in this process that have no translation, sorted."""
    return sorted(_MISSING)


#: ``FLASHLIB_I18N_RECORD=file``: every template asked for without a Japanese translation
#: (:func:`translate`, :func:`record`) is appended to ``file`` as a JSON line: what is left to
#: translate (e.g. ``FLASHLIB_I18N_RECORD=left.jsonl make book``, or the checkers' test).
RECORD_ENV = "FLASHLIB_I18N_RECORD"


def record(text: str) -> None:
    """Note ``text`` (a checker's message, a hint) as shown to readers: with
    ``FLASHLIB_I18N_RECORD`` set, its template is listed if Japanese lacks it."""
    if not os.environ.get(RECORD_ENV) or not isinstance(text, str):
        return
    words = table("ja")
    if _lookup(text.strip(), words) is not None:
        return
    for part in parts(text.strip()):
        if _WORD.search(part) and _lookup(part, words) is None:
            _miss(template(part)[0])


#: Attributes whose value a reader sees or hears.
_ATTRIBUTES = ("alt", "aria-label", "aria-valuetext", "title", "placeholder")
#: Elements whose text is not for reading (kept as they are).
_RAW = ("script", "style", "code", "pre", "math")


class _Translator(HTMLParser):
    def __init__(self, lang: str) -> None:
        super().__init__(convert_charrefs=True)  # "A100&#x27;s" is one text, A100's
        self.lang = lang
        self.out: list[str] = []
        self.raw: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.out.append(self._tag(tag, attrs, ">"))
        if tag in _RAW:
            self.raw.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.out.append(self._tag(tag, attrs, " />"))

    def _tag(self, tag: str, attrs: list[tuple[str, str | None]], close: str) -> str:
        """The start tag as written, or rebuilt with its readable attributes translated."""
        text = self.get_starttag_text() or ""
        if self.raw or not any(name in _ATTRIBUTES for name, _ in attrs):
            return text
        parts = [f"<{tag}"]
        for name, value in attrs:
            if value is None:
                parts.append(f" {name}")
                continue
            if name in _ATTRIBUTES:
                value = translate(value, self.lang)
            parts.append(f' {name}="{html.escape(value, quote=True)}"')
        return "".join(parts) + close

    def handle_endtag(self, tag: str) -> None:
        if self.raw and self.raw[-1] == tag:
            self.raw.pop()
        self.out.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if self.raw:  # a script's or style's text comes as it was written
            self.out.append(data if self.raw[-1] in ("script", "style")
                            else html.escape(data, quote=False))
            return
        self.out.append(html.escape(translate(data, self.lang), quote=False))

    def handle_comment(self, data: str) -> None:
        self.out.append(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.out.append(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self.out.append(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self.out.append(f"<![{data}]>")


def translate_html(markup: str, lang: str | None = None) -> str:
    """``markup`` with every text node and every attribute a reader sees (alt, aria-label,
    aria-valuetext, title) translated by :func:`translate`; scripts, styles and code kept."""
    lang = lang or language()
    if lang == "en" or not isinstance(markup, str):
        return markup
    parser = _Translator(lang)
    parser.feed(markup)
    parser.close()
    return "".join(parser.out)


def words_script(lang: str, only: str | None = None) -> str:
    """JavaScript that gives a page the table into ``lang`` and ``window.flashlibTranslate``
    (flashlib/book/js/i18n.js), for the figures the page draws itself; ``only``: one of the
    table's files (``"site"``: what figures show, without the checkers' messages)."""
    words = table(lang)
    if only is not None:
        path = resources.files("flashlib.book").joinpath("locale", lang, f"{only}.json")
        # captions and "Held fixed" lines are HTML, translated before the page is shown
        words = {k: v for k, v in json.loads(path.read_text("utf-8")).items()
                 if v and not k.startswith(("What to notice", "Held fixed"))}
    words = json.dumps(words, ensure_ascii=False, separators=(",", ":"))
    source = resources.files("flashlib.book").joinpath("js", "i18n.js").read_text("utf-8")
    words = words.replace("<", "\\u003c")  # a "</script>" in a string closes no script
    return f"window.flashlibWords = {words};\n{source}"
