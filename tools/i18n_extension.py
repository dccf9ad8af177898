"""Sphinx extension of the translated editions (loaded by the configs tools/ja_edition.py
writes): glued numbers kept in translated paragraphs, and what the code wrote translated.

**What the code wrote.** The Japanese site reuses the English execution (the same cache, the
same numbers). As it reads a page, it translates the executed outputs through
:mod:`flashlib.book.i18n`'s table: every HTML output (figures' captions, controls, alt texts,
"Held fixed" lines, diagrams' SVG text, tables) with :func:`~flashlib.book.i18n.translate_html`,
and every glued value (Markdown sentences, HTML) as it is pasted into the text. Printed output
(``print``, tracebacks) is the program's own output and stays as it is. Figures drawn in the
browser translate their labels with the same table: each page loads ``flashlib-words.js``
(the table and flashlib/book/js/i18n.js).

**Glued numbers in translated paragraphs.**
Sphinx replaces a paragraph by its translation by parsing the translated text as a document
of its own (``sphinx.transforms.i18n``); myst-nb's glue roles look their values up in the
document's notebook renderer, which that small document lacks, so every ``{glue:text}`` of a
translated paragraph would be lost ("No key ... found in glue data"). Here the renderer of the
page being read is remembered, and the glue look-up falls back to it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.config import Config

from flashlib.book import i18n
from tools.book_extension import FIGURE_DATA

_RENDERERS: dict[str, Any] = {}


def _patch() -> None:
    import myst_nb.ext.glue.directives as directives
    import myst_nb.ext.glue.roles as roles
    import myst_nb.ext.glue.utils as utils
    import myst_nb.sphinx_ as sphinx_

    if getattr(utils.retrieve_glue_data, "_flashlib", False):
        return
    original = utils.retrieve_glue_data
    parse = sphinx_.Parser.parse

    class Attributes(dict):
        """A document's attributes that remember the notebook renderer myst-nb pops from
        them at the end of its parse (myst_nb/sphinx_.py: "we temporarily store nb_renderer
        on the document")."""

        docname = ""

        def pop(self, key: str, *default: Any) -> Any:
            if key == "nb_renderer" and key in self:
                _RENDERERS[self.docname] = self[key]
            return super().pop(key, *default)

    def remembering_parse(self: Any, inputstring: str, document: Any) -> None:
        env = getattr(document.settings, "env", None)
        attributes = Attributes(document.attributes)
        attributes.docname = getattr(env, "docname", "")
        document.attributes = attributes
        try:
            parse(self, inputstring, document)
        finally:
            document.attributes = dict(attributes)  # pickled with the doctree

    def retrieve_glue_data(document: Any, key: str) -> Any:
        if "nb_renderer" in document:
            return original(document, key)
        env = getattr(document.settings, "env", None)
        renderer = _RENDERERS.get(getattr(env, "docname", None))
        if renderer is None:
            return original(document, key)
        # lent for the look-up only: the translated nodes keep a reference to their small
        # document, which is pickled with the page (a renderer cannot be)
        document.attributes["nb_renderer"] = renderer
        try:
            return original(document, key)
        finally:
            del document.attributes["nb_renderer"]

    def translated_glue_data(document: Any, key: str) -> Any:
        result = retrieve_glue_data(document, key)
        lang = _LANGUAGE[0]
        if lang != "en":
            data = dict(result.data)
            if isinstance(data.get("text/markdown"), str):
                data["text/markdown"] = i18n.translate(data["text/markdown"], lang)
            if isinstance(data.get("text/html"), str):
                data["text/html"] = i18n.translate_html(data["text/html"], lang)
            plain = data.get("text/plain")
            if (isinstance(plain, str) and len(plain) > 1 and plain[0] == plain[-1]
                    and plain[0] in "'\"" and re.search(r"[A-Za-z]", plain)):
                # a glued str ({glue:text} of words, not a number): its repr, quotes kept
                data["text/plain"] = plain[0] + i18n.translate(plain[1:-1], lang) + plain[0]
            result.data = data
        return result

    translated_glue_data._flashlib = True  # type: ignore[attr-defined]
    sphinx_.Parser.parse = remembering_parse
    for module in (utils, roles, directives):
        if hasattr(module, "retrieve_glue_data"):
            module.retrieve_glue_data = translated_glue_data


#: The edition's language, set when the config is read (the glue look-up has no app).
_LANGUAGE = ["en"]


def configure(app: Sphinx, config: Config) -> None:
    """Remember the language; give the pages the table of the code's words (flashlib-words.js)."""
    lang = config.language or "en"
    _LANGUAGE[0] = lang if lang in i18n.LANGUAGES else "en"
    if _LANGUAGE[0] == "en":
        return
    # the theme's search field (sphinx-book-theme's own text, which its catalog lacks)
    config.html_theme_options = {**(config.html_theme_options or {}),
                                 "search_bar_text": "この本を検索..."}
    folder = Path(app.outdir).parent / "i18n_static"
    folder.mkdir(parents=True, exist_ok=True)
    script = i18n.words_script(_LANGUAGE[0], "site")
    (folder / WORDS_FILE).write_text(script, encoding="utf-8")
    config.html_static_path = [*config.html_static_path, str(folder)]


#: The table of what figures draw, for the pages that draw figures in the browser.
WORDS_FILE = "flashlib-words.js"


def add_words(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Load flashlib-words.js (168 KB) on the pages whose figures draw their text in the
    browser (svg_figure; the PNG figures' frames and alt texts are translated here, below),
    not on every page: it counts against the 3.5 MB a page may weigh."""
    body = context.get("body") or ""
    if _LANGUAGE[0] == "en" or "flashlib-ifig-svg" not in body:
        return
    src = context["pathto"](f"_static/{WORDS_FILE}", 1)
    # before the figures' own scripts, which run as the page is read
    context["body"] = f'<script src="{src}"></script>\n' + body


def translate_frames(app: Sphinx, pagename: str, templatename: str, context: dict,
                     doctree) -> None:
    """The PNG figures' slider labels and alt texts (their JSON data) in the edition's
    language, so that their pages need no table in the browser."""
    body = context.get("body") or ""
    if _LANGUAGE[0] == "en" or "flashlib-ifig-png" not in body:
        return

    def translated(match: re.Match[str]) -> str:
        data = json.loads(match["data"])
        lang = _LANGUAGE[0]
        data["labels"] = [[i18n.translate(str(v), lang) for v in values]
                          for values in data.get("labels", [])]
        data["alts"] = [i18n.translate(str(a), lang) for a in data.get("alts", [])]
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return match.group(1) + text.replace("<", "\\u003c") + match.group(3)

    context["body"] = FIGURE_DATA.sub(translated, body)


#: An inline formula with the punctuation that must not start (、 。 ） ...) or end (（ 「) a
#: line next to it. MathJax draws a formula as one box, and a browser may break a line on
#: either side of a box even where Japanese line breaking (kinsoku) forbids it.
_MATH_WITH_PUNCTUATION = re.compile(
    r'(?P<open>[（「『［]?)(?P<math><span class="math notranslate nohighlight">[^<]*</span>)'
    r'(?P<close>[、。，．）」』］！？：；・]*)')


def keep_math_with_punctuation(app: Sphinx, pagename: str, templatename: str, context: dict,
                               doctree) -> None:
    """Wrap each inline formula of a Japanese page with the punctuation beside it in a span
    that does not break (class ``flashlib-nobr``), so that no line starts with 、 or ） right
    after a formula, or ends with （ right before one."""
    body = context.get("body") or ""
    if _LANGUAGE[0] != "ja" or "math notranslate" not in body:
        return

    def wrapped(match: re.Match[str]) -> str:
        if not match["open"] and not match["close"]:
            return match[0]
        return f'<span class="flashlib-nobr">{match[0]}</span>'

    context["body"] = _MATH_WITH_PUNCTUATION.sub(wrapped, body)


def translate_captions(app: Sphinx, doctree: nodes.document) -> None:
    """The table of contents' part captions ("Building FlashAttention"): _toc.yml puts them
    into the root page's toctrees after the page's messages were translated."""
    if _LANGUAGE[0] == "en":
        return
    from sphinx import addnodes

    from tools.ja_edition import _catalog

    words = _catalog(Path(app.env.docname).name)
    for toctree in doctree.findall(addnodes.toctree):
        caption = toctree.get("caption")
        if caption and caption in words:
            toctree["caption"] = words[caption]


#: The first line of what an exercise's checker cell shows on the site (a neutral line, never
#: a verdict: flashlib.book.exercises.feedback.ON_THE_SITE), which speaks to the reader.
_ON_THE_SITE = "Run this cell in Jupyter or Colab"


def _translated_lines(text: str, lang: str) -> str:
    out = []
    for line in text.split("\n"):
        if line.rstrip().endswith(":"):  # the checker's title, "FLOPs of attention:"
            out.append(i18n.translate(line.rstrip()[:-1], lang) + i18n.SEPARATOR.get(lang, ": "))
        else:
            out.append(i18n.translate(line, lang))
    return "\n".join(out)


def translate_outputs(app: Sphinx, doctree: nodes.document) -> None:
    """Translate the HTML the chapter's code cells showed (see the module docstring), and the
    checkers' neutral line (:data:`_ON_THE_SITE`)."""
    lang = _LANGUAGE[0]
    if lang == "en":
        return
    for block in doctree.findall(nodes.literal_block):
        text = block.astext()
        if _ON_THE_SITE in text:
            new = _translated_lines(text, lang)
            block.children = [nodes.Text(new)]
            block.rawsource = new
    for node in doctree.findall(nodes.raw):
        if node.get("format") == "html":
            text = node.astext()
            new = i18n.translate_html(text, lang)
            if new != text:
                node.children = [nodes.Text(new)]
                node.rawsource = new


#: What the Japanese build found without a translation (tests/i18n refuses any).
MISSING_FILE = "missing-code-strings.txt"


def list_missing(app: Sphinx, exception: Exception | None) -> None:
    """Write the code's strings the pages show that the table lacks, one per line."""
    if _LANGUAGE[0] == "en" or exception is not None:
        return
    path = Path(app.outdir).parent.parent / MISSING_FILE
    path.write_text("".join(f"{key}\n" for key in i18n.missing()), encoding="utf-8")


def setup(app: Sphinx) -> dict:
    _patch()
    app.connect("build-finished", list_missing)
    app.connect("config-inited", configure)
    app.connect("doctree-read", translate_outputs)
    app.connect("doctree-read", translate_captions)
    app.connect("html-page-context", translate_frames, priority=880)
    app.connect("html-page-context", add_words, priority=880)
    app.connect("html-page-context", keep_math_with_punctuation, priority=880)
    return {"parallel_read_safe": False, "parallel_write_safe": True}
