"""Sphinx extension: the student edition of the site (``make book-student``), every solution
removed.

Registered in _config.yml (``sphinx: local_extensions``); it does nothing unless the config value
``student_edition`` is true, which ``make book-student`` sets through the environment
(``FLASHLIB_STUDENT_EDITION=1``: Jupyter Book 1 has no command-line config override). Then:

- every solution is removed from the pages: the ``solution`` nodes of sphinx-exercise, gated
  (``{solution-start}`` ... ``{solution-end}``, code cells included) or not. sphinx-exercise's
  own ``hide_solutions`` cannot do it: it drops the ``{solution-start}`` node only, so the
  solution's content stays on the page and the orphaned ``{solution-end}`` node stops the
  writer (executablebooks/sphinx-exercise#89); here the gated solutions are merged first (its
  transform) and the merged nodes removed after (``doctree-read``), before anything is
  written or indexed for search;
- the "Open in Colab" link (tools/book_extension.py) points at notebooks/student/<name>.ipynb,
  the notebook without solutions (``make notebooks`` writes both);
- the chapters' sources are not copied into the site (``html_copy_source = False``: the
  ``_sources/*.md`` files hold the solutions), and the theme's buttons that download them are
  gone (its "print to PDF" button stays);
- the execution cache is ``make book``'s, ``_build/.jupyter_cache``, unless _config.yml names
  one: the chapters are the same notebooks (solutions still execute, their outputs are not
  shown), so the student build executes nothing after ``make book`` and only reads the cache;
- the site's title says "(student edition)".
"""

from __future__ import annotations

import os
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util import logging
from sphinx_exercise.nodes import solution_end_node, solution_node, solution_start_node

from tools.colab import colab_url
from tools.paths import ROOT
from tools.project import repository
from tools.toc import is_notebook

logger = logging.getLogger(__name__)

ENV = "FLASHLIB_STUDENT_EDITION"
STUDENT_FOLDER = "notebooks/student"
SHARED_CACHE = ROOT / "_build" / ".jupyter_cache"


def enabled(config: Config) -> bool:
    return bool(config.student_edition)


def configure(app: Sphinx, config: Config) -> None:
    if not enabled(config):
        return
    config.html_copy_source = False
    if not config.nb_execution_cache_path:
        config.nb_execution_cache_path = str(SHARED_CACHE)
    config.html_title = f"{config.html_title or config.project} (student edition)"


def remove_solutions(app: Sphinx, doctree: nodes.document) -> None:
    if not enabled(app.config):
        return
    for kind in (solution_node, solution_start_node, solution_end_node):
        for node in list(doctree.findall(kind)):
            node.parent.remove(node)
    source = Path(app.env.doc2path(app.env.docname))
    if not is_notebook(source):
        return
    if not (ROOT / STUDENT_FOLDER / f"{source.stem}.ipynb").is_file():
        logger.warning("no %s/%s.ipynb for chapter %s: run `make notebooks`", STUDENT_FOLDER,
                       source.stem, app.env.docname, location=app.env.docname)
    for para in doctree.findall(nodes.paragraph):
        if "colab-link" in para["classes"]:
            for ref in para.findall(nodes.reference):
                ref["refuri"] = colab_url(*repository(), source.stem, folder=STUDENT_FOLDER)


def drop_source_buttons(app: Sphinx, pagename: str, templatename: str, context: dict,
                        doctree) -> None:
    """Remove sphinx-book-theme's "download source" buttons (their files are not copied)."""
    if not enabled(app.config):
        return
    for group in context.get("header_buttons", []):
        if group.get("label") == "download-buttons":
            group["buttons"] = [b for b in group["buttons"] if b.get("label") not in
                                ("download-source-button", "download-notebook-button")]


def setup(app: Sphinx) -> dict:
    app.add_config_value("student_edition", os.environ.get(ENV, "") not in ("", "0"), "env")
    app.connect("config-inited", configure)
    app.connect("doctree-read", remove_solutions, priority=600)  # after book_extension's link
    app.connect("html-page-context", drop_source_buttons, priority=600)  # after the theme's
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
