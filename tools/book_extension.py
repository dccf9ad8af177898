"""The book's Sphinx extension: what the site adds to Jupyter Book, fixed once at build time.

Registered in _config.yml (``sphinx: local_extensions: tools.book_extension: ./``); the root is
on ``sys.path`` because Jupyter Book adds the ``local_extensions`` folders to it.

- **"Open in Colab"** under the title of every notebook chapter, pointing at its generated
  notebook on GitHub (``make notebooks``) at the release tag, the one the notebook's set-up
  cell installs flashlib from (``tools.colab.release_ref()``)::

      https://colab.research.google.com/github/<org>/<repo>/blob/v<version>/notebooks/<name>.ipynb

  ``<org>/<repo>`` comes from ``repository:`` in _config.yml (the only place the URL is
  configured), read by ``tools.project.repository()``, the version from pyproject.toml; the
  URL built by ``tools.colab.colab_url``. A chapter without its notebook
  is a build warning (so ``-W`` fails).
- **Exercise numbers per chapter**: "Exercise 2.3" is the third exercise of the second chapter
  (:func:`number_exercises`), the numbers tools/convert.py prints in the notebooks
  (both use ``tools.toc.chapter_number``).
- **Accessible HTML** (:func:`accessible_body`): the bibliography's entries are list items of
  its list (docutils writes ``role="doc-biblioentry"``, which axe-core reports as
  aria-required-children, critical), and myst-nb's "Show code cell source" summaries are named
  by their visible text, not "Toggle hidden content" (label-content-name-mismatch). The theme's
  own buttons are fixed in its templates (``book/_templates``, a copy per pinned theme file);
  those that need JavaScript are hidden when it is off (:data:`NOSCRIPT_STYLE`).
- **Static widgets and quiet checkers while the book executes**: ``FLASHLIB_STATIC_WIDGETS=1``
  for the kernels that run the chapters, so that :mod:`flashlib.book.widgets` renders its
  no-kernel HTML and the exercise checkers show a neutral line instead of a verdict
  (:func:`flashlib.book.site.static_site`).
- **Code that never wraps** (:func:`mark_wide_code`): shown code and printed outputs keep their
  lines (book/_static/flashlib.css: ``white-space: pre``; a block too wide for a phone scrolls
  inside itself). The text column at 1280 px holds :data:`CODE_COLUMNS` columns (fewer in an
  exercise, a note or a dropdown); a block with a longer line is marked ``flashlib-wide``
  (and the theme's ``full-width``, so that its "On this page" sidebar folds while the block
  is in view) and widens into that sidebar's space on screens of 1200 px and more, where up
  to :data:`MAX_CODE_COLUMNS` fit. A longer line is a build warning, naming the page and the
  line.
- **Figures as files** (:func:`images_to_files`): every PNG that a page carries as a data URL
  (the book's figures, and every frame of its interactive figures) is written once to
  ``_images/flashlib/<hash>.png`` and referenced from there, so that a page loads the frames
  its reader looks at, not all of them (their weight counts against the 3.5 MB per page).
- **No repeated scripts** (:func:`dedupe_scripts`) and **encrypted kernel connections**
  (:func:`encrypt_kernel_transport`): two build-log and console-error fixes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.osutil import relative_uri

from tools.colab import colab_url, release_ref
from tools.project import repository
from tools.toc import chapter_number, is_notebook

logger = logging.getLogger(__name__)

#: Environment variable read by flashlib.book.site.static_site() in the executing kernels.
STATIC_ENV = "FLASHLIB_STATIC_WIDGETS"

#: (pattern, replacement, what it fixes) applied to every page's body HTML.
BODY_FIXES: list[tuple[re.Pattern[str], str, str]] = [
    # docutils: <div role="list" class="citation-list"><div ... role="doc-biblioentry">
    (re.compile(r'(<div class="citation" id="[^"]*") role="doc-biblioentry">'),
     r'\1 role="listitem">', "bibliography entries as list items"),
    # myst-nb: hide-input cells' <summary aria-label="Toggle hidden content">
    (re.compile(r'<summary aria-label="Toggle hidden content">'), "<summary>",
     "code cell summaries named by their text"),
]


#: Columns of shown code that the text column holds at 1280 px (14 px monospace, 0.6 em a
#: character, in 688 px less the block's padding): 76, the book's limit for teaching code.
CODE_COLUMNS = 76
#: Columns that a flashlib-wide block holds on a screen of 1200 px and more; longer lines are
#: a build warning (they would scroll sideways inside their block even there).
MAX_CODE_COLUMNS = 100
#: Columns a block loses to each box around it: an admonition (an exercise, a solution, a
#: note: the theme's margins and padding, 68 px) and a dropdown's body (32 px).
ADMONITION_COLUMNS, DROPDOWN_COLUMNS = 8, 4
#: Classes of a widened block: the book's, and the theme's, whose script folds the "On this
#: page" sidebar while a full-width element is in view.
WIDE_CLASSES = ("flashlib-wide", "full-width")
#: Where the figures' PNGs go, relative to the site's root.
IMAGES = "_images/flashlib"
DATA_PNG = re.compile(r"data:image/png;base64,([A-Za-z0-9+/]+={0,2})")


#: The theme's buttons that do nothing without JavaScript (sidebar toggles, the download menu,
#: full screen): hidden when it is off, as the theme already hides its own ``.pst-js-only``.
NOSCRIPT_STYLE = (
    "<noscript><style>.primary-toggle, .secondary-toggle, .btn-fullscreen-button, "
    ".article-header-buttons .dropdown-toggle, .dropdown-download-buttons "
    "{ display: none !important; }</style></noscript>"
)


def add_colab_link(app: Sphinx, doctree: nodes.document) -> None:
    env = app.env
    source = Path(env.doc2path(env.docname))
    if not is_notebook(source):
        return
    name = source.stem
    lang = app.config.language if app.config.language in EDITIONS else "en"
    folder = "notebooks" if lang == "en" else f"notebooks/{lang}"
    if not (Path(app.srcdir) / folder / f"{name}.ipynb").is_file():
        logger.warning(
            "no %s/%s.ipynb for chapter %s: run `make notebooks`",
            folder,
            name,
            env.docname,
            location=env.docname,
        )
        return
    url = colab_url(repository()[0], release_ref(), name, folder=folder)
    text = "Colab で開く" if lang == "ja" else "Open in Colab"
    link = nodes.reference("", text, refuri=url, internal=False)
    para = nodes.paragraph("", "", link, classes=["colab-link"])
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        doctree.insert(0, para)
    else:
        section.insert(1, para)  # right after the chapter title


def number_exercises(app: Sphinx, env: BuildEnvironment) -> list[str]:
    """Number each chapter's exercises ``(chapter, k)``: "Exercise 2.3" on the site.

    Sphinx numbers enumerable nodes across the whole book when the toc is not numbered (1 to 15
    over four chapters) and would number the root page's without a chapter. Its numbers,
    ``env.toc_fignumbers[docname]["exercise"][id]``, are assigned by the toctree collector's
    ``env-get-updated`` handler, just before this one (a later priority), and read by
    sphinx-exercise's titles and by every cross-reference; here they are replaced by the
    chapter's number (``toc.chapter_number``, also used by the notebooks) and the
    exercise's rank in the chapter. Returns the documents to write again: those numbered."""
    renumbered = []
    for docname, numbers in env.toc_fignumbers.items():
        exercises = numbers.get("exercise")
        if not exercises:
            continue
        chapter = chapter_number(Path(env.doc2path(docname)))
        if chapter is None:
            logger.warning("exercises outside a chapter of _toc.yml", location=docname)
            continue
        ranked = sorted(exercises, key=lambda ident: exercises[ident])
        numbers["exercise"] = {ident: (chapter, k) for k, ident in enumerate(ranked, 1)}
        renumbered.append(docname)
    return renumbered


def accessible_body(app: Sphinx, pagename: str, templatename: str, context: dict,
                    doctree) -> None:
    """Apply :data:`BODY_FIXES` to the page's body HTML; hide the theme's JavaScript-only
    buttons when JavaScript is off (:data:`NOSCRIPT_STYLE`)."""
    context["metatags"] = context.get("metatags", "") + NOSCRIPT_STYLE
    body = context.get("body")
    if not body:
        return
    for pattern, replacement, _ in BODY_FIXES:
        body = pattern.sub(replacement, body)
    context["body"] = body


#: The book's editions: language code -> (the edition's name in its own language, the folder
#: of its site beside the English one's). tools/ja_edition.py builds the Japanese into ja/.
EDITIONS = {"en": ("English", ""), "ja": ("日本語", "ja/")}


def edition_links(language: str, pagename: str) -> dict[str, str]:
    """Relative links from ``pagename`` of the ``language`` edition to the same page of each
    other edition: plain relative paths, so that they work offline and on ``file://``."""
    up = "../" * (pagename.count("/") + (1 if EDITIONS[language][1] else 0))
    return {code: f"{up}{folder}{pagename}.html" for code, (_, folder) in EDITIONS.items()
            if code != language}


def edition_switcher(app: Sphinx, pagename: str, templatename: str, context: dict,
                     doctree) -> None:
    """A link at the top of every page to the same page in the other edition (none in the
    student edition, which has no Japanese site), and ``<link rel="alternate" hreflang>``."""
    language = app.config.language or "en"
    if getattr(app.config, "student_edition", False) or language not in EDITIONS:
        return
    links = edition_links(language, pagename)
    context["metatags"] = context.get("metatags", "") + "".join(
        f'<link rel="alternate" hreflang="{code}" href="{href}">' for code, href in links.items())
    body = context.get("body")
    if not body:
        return
    anchors = " ".join(
        f'<a href="{href}" hreflang="{code}" lang="{code}">{EDITIONS[code][0]}</a>'
        for code, href in links.items())
    label = "言語" if language == "ja" else "Language"
    context["body"] = (f'<nav class="flashlib-edition" aria-label="{label}">{anchors}</nav>\n'
                       + body)


def code_columns(text: str) -> int:
    """Columns of the longest line of a code block (tabs at 8)."""
    return max((len(line.expandtabs()) for line in text.splitlines()), default=0)


def available_columns(block: nodes.Element) -> int:
    """Columns of code that ``block``'s column holds at 1280 px: :data:`CODE_COLUMNS`, less
    what each admonition and dropdown around it takes."""
    columns = CODE_COLUMNS
    parent = block.parent
    while parent is not None:
        if isinstance(parent, nodes.Admonition):
            columns -= ADMONITION_COLUMNS
        elif (type(parent).__name__ == "dropdown_main"
              or "sd-card-body" in parent.get("classes", [])):
            columns -= DROPDOWN_COLUMNS
        parent = parent.parent
    return columns


def mark_wide_code(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Mark each code block (a literal block: shown code, a cell's source, a printed output)
    whose longest line is longer than its column holds (:func:`available_columns`) with
    :data:`WIDE_CLASSES`: on its notebook cell's box (input or output) when it is one, else
    on the block itself. A line over :data:`MAX_CODE_COLUMNS` is a warning."""
    for block in doctree.findall(nodes.literal_block):
        text = block.astext()
        columns = code_columns(text)
        if columns <= available_columns(block):
            continue
        parent = block.parent
        cell_box = isinstance(parent, nodes.container) and (
            {"cell_input", "cell_output"} & set(parent.get("classes", [])))
        box = parent if cell_box else block
        box["classes"] += [c for c in WIDE_CLASSES if c not in box["classes"]]
        if columns > MAX_CODE_COLUMNS:
            line = next(line for line in text.splitlines()
                        if len(line.expandtabs()) == columns)
            logger.warning("a code line of %d columns, more than the %d a page shows "
                           "without scrolling: %r", columns, MAX_CODE_COLUMNS,
                           line.strip()[:60], location=block)


_LANG_IMG = re.compile(r'<img [^>]*class="[^"]*\bflashlib-lang-(?P<lang>[a-z]+)\b[^>]*>')
#: An interactive figure's data on a page (flashlib.book.widgets): its frames, labels, alts.
FIGURE_DATA = re.compile(
    r'(<script type="application/json" class="flashlib-ifig-data">)(?P<data>.*?)(</script>)',
    re.DOTALL)


def keep_own_language(app: Sphinx, pagename: str, templatename: str, context: dict,
                      doctree) -> None:
    """The book's execution draws each PNG figure in both editions' languages
    (flashlib.book.plots.japanese_png); a page keeps its own edition's images and frames."""
    body = context.get("body")
    if not body or "flashlib-lang-" not in body and "framesJa" not in body:
        return
    lang = app.config.language if app.config.language in EDITIONS else "en"
    body = _LANG_IMG.sub(lambda m: m.group(0).replace("<img hidden ", "<img ", 1)
                         if m["lang"] == lang else "", body)

    def own_frames(match: re.Match[str]) -> str:
        data = json.loads(match["data"])
        frames, index = data.pop("framesJa", None), data.pop("indexJa", None)
        if lang == "ja" and frames is not None:
            data["frames"], data["index"] = frames, index
        text = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
        return match.group(1) + text + match.group(3)

    context["body"] = FIGURE_DATA.sub(own_frames, body)


def images_to_files(app: Sphinx, pagename: str, templatename: str, context: dict,
                    doctree) -> None:
    """Write every ``data:image/png;base64,...`` of the page's body to
    ``_images/flashlib/<sha256 prefix>.png`` in the site (once per image) and put its URL,
    relative to the page, in its place: in ``<img src>`` and in the interactive figures'
    JSON frame lists (js/frames.js sets ``img.src`` to them)."""
    body = context.get("body")
    if not body or "data:image/png;base64," not in body:
        return
    folder = Path(app.outdir) / IMAGES
    folder.mkdir(parents=True, exist_ok=True)
    page_uri = app.builder.get_target_uri(pagename)

    def to_file(match: re.Match[str]) -> str:
        png = base64.b64decode(match.group(1))
        name = f"{hashlib.sha256(png).hexdigest()[:20]}.png"
        path = folder / name
        if not path.exists():
            path.write_bytes(png)
        return relative_uri(page_uri, f"{IMAGES}/{name}")

    context["body"] = DATA_PNG.sub(to_file, body)


def dedupe_scripts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Drop repeated <script> entries. Jupyter Book always loads sphinx-thebe and
    sphinx-togglebutton (even with thebe off), and their inline config scripts reach every page
    twice; the repeated ``const THEBE_JS_URL`` is a console error ("Identifier 'THEBE_JS_URL'
    has already been declared")."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        name = getattr(script, "filename", script) or ""  # body-only scripts: None or ""
        key = (str(name), repr(getattr(script, "attributes", {})))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def encrypt_kernel_transport() -> None:
    """Have jupyter_client give CurveZMQ keys to every kernel whose kernelspec says it accepts
    them (ipykernel 7's does). Without keys each such kernel that executes a chapter logs
    "Kernel is running over TCP without encryption" into the build's output. jupyter_client's
    policy is a configurable trait, but myst-nb creates its kernel managers without a config
    to set it through, hence its default here ("auto": kernels that do not declare support
    are started as before). A jupyter_client or pyzmq without Curve support: nothing to do."""
    try:
        import zmq
        from jupyter_client.manager import KernelManager
    except ImportError:  # pragma: no cover - both come with jupyter-book
        return
    policy = KernelManager.class_traits().get("transport_encryption")
    if policy is not None and zmq.has("curve"):
        policy.default_value = "auto"


def setup(app: Sphinx) -> dict:
    os.environ[STATIC_ENV] = "1"
    encrypt_kernel_transport()
    app.connect("doctree-read", add_colab_link)
    app.connect("env-get-updated", number_exercises, priority=900)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    app.connect("html-page-context", accessible_body, priority=900)
    app.connect("html-page-context", keep_own_language, priority=890)
    app.connect("html-page-context", images_to_files, priority=900)
    app.connect("html-page-context", edition_switcher, priority=900)
    app.connect("doctree-resolved", mark_wide_code)
    return {"version": "2.0", "parallel_read_safe": True, "parallel_write_safe": True}
