"""The book's Sphinx extension: what the site adds to Jupyter Book, fixed once at build time.

Registered in _config.yml (``sphinx: local_extensions: tools.book_extension: ./``); the root is
on ``sys.path`` because Jupyter Book adds the ``local_extensions`` folders to it.

- **"Open in Colab"** under the title of every notebook chapter, pointing at its generated
  notebook on GitHub (``make notebooks``)::

      https://colab.research.google.com/github/<org>/<repo>/blob/<branch>/notebooks/<name>.ipynb

  ``<org>/<repo>`` and ``<branch>`` come from ``repository:`` in _config.yml (the only place
  the URL is configured), read by ``tools.project.repository()``, the URL built by
  ``tools.colab.colab_url``. A chapter without its notebook
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
- **No repeated scripts** (:func:`dedupe_scripts`) and **encrypted kernel connections**
  (:func:`encrypt_kernel_transport`): two build-log and console-error fixes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging

from tools.colab import colab_url
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
    if not (Path(app.srcdir) / "notebooks" / f"{name}.ipynb").is_file():
        logger.warning(
            "no notebooks/%s.ipynb for chapter %s: run `make notebooks`",
            name,
            env.docname,
            location=env.docname,
        )
        return
    url = colab_url(*repository(), name)
    link = nodes.reference("", "Open in Colab", refuri=url, internal=False)
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
    return {"version": "2.0", "parallel_read_safe": True, "parallel_write_safe": True}
