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
- the "Open in Colab" link (tools/book_extension.py) points at <name>.ipynb in the student
  notebooks' repository (``<repository>-student``, built by ``make student-notebooks`` from
  notebooks/student/ and published with the release: tools/student_notebooks.py), at the
  release tag: a repository without solutions, so that no edit of the link reaches one;
- the instructor's pages (:data:`INSTRUCTOR_PAGES`: the guide, its checker table and sample
  report, which name the checkers' accepted answers) are not built: the table of contents
  is _toc.yml without them (written to :data:`STUDENT_TOC`), and a page's link to one
  becomes plain text;
- no button or link leads to the repository (it holds every solution): the theme's
  repository button is off and its repository URL unset;
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

import yaml
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util import logging
from sphinx_exercise.nodes import solution_end_node, solution_node, solution_start_node

from tools.colab import colab_link
from tools.paths import ROOT
from tools.toc import is_notebook

logger = logging.getLogger(__name__)

ENV = "FLASHLIB_STUDENT_EDITION"
STUDENT_FOLDER = "notebooks/student"
SHARED_CACHE = ROOT / "_build" / ".jupyter_cache"
#: Pages of the book for teachers only (their files, as _toc.yml names them).
INSTRUCTOR_PAGES = ("book/instructor",)
#: The student edition's table of contents: _toc.yml without INSTRUCTOR_PAGES.
STUDENT_TOC = ROOT / "_build" / "student" / "_toc.yml"


def student_toc(toc: dict) -> dict:
    """A table of contents (_toc.yml's data) without :data:`INSTRUCTOR_PAGES` (and without a
    part left empty)."""
    def keep(entries: list[dict]) -> list[dict]:
        kept = []
        for entry in entries:
            if entry.get("file", "").removesuffix(".md") in INSTRUCTOR_PAGES:
                continue
            entry = dict(entry)
            if "sections" in entry:
                entry["sections"] = keep(entry["sections"])
            kept.append(entry)
        return kept

    out = dict(toc)
    if "chapters" in out:
        out["chapters"] = keep(out["chapters"])
    if "parts" in out:
        out["parts"] = [dict(part, chapters=keep(part.get("chapters", [])))
                        for part in out["parts"]]
        out["parts"] = [part for part in out["parts"] if part["chapters"]]
    return out


def enabled(config: Config) -> bool:
    return bool(config.student_edition)


def configure(app: Sphinx, config: Config) -> None:
    if not enabled(config):
        return
    config.html_copy_source = False
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    STUDENT_TOC.parent.mkdir(parents=True, exist_ok=True)
    STUDENT_TOC.write_text("# The student edition's table of contents (tools/student_edition.py)"
                           "\n" + yaml.safe_dump(student_toc(toc), sort_keys=False),
                           encoding="utf-8")
    config.external_toc_path = str(STUDENT_TOC.relative_to(ROOT))
    options = dict(config.html_theme_options or {})
    options["use_repository_button"] = False
    for key in ("repository_url", "repository_branch", "path_to_docs"):
        options.pop(key, None)
    config.html_theme_options = options
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
                ref["refuri"] = colab_link(source.stem, student=True)


def unlink_instructor_pages(app: Sphinx, doctree: nodes.document) -> None:
    """A link to an instructor's page (not in the student edition) becomes its words."""
    if not enabled(app.config):
        return
    from sphinx.addnodes import pending_xref

    here = Path(app.env.docname).parent
    for ref in list(doctree.findall(pending_xref)):
        if ref.get("reftype") != "doc":
            continue
        target = ref.get("reftarget", "")
        resolved = target.lstrip("/") if target.startswith("/") else (here / target).as_posix()
        if resolved in INSTRUCTOR_PAGES:
            ref.replace_self(nodes.emphasis("", "the instructor guide (in the teachers' "
                                                "edition)"))


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
    app.connect("doctree-read", unlink_instructor_pages)
    app.connect("html-page-context", drop_source_buttons, priority=600)  # after the theme's
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
