"""Sphinx extension: an "Open in Colab" link under the title of every notebook chapter.

Registered in _config.yml (``sphinx: local_extensions: colab_link: scripts/``). The link points
at the chapter's generated notebook, ``notebooks/<name>.ipynb`` (``make notebooks``), on GitHub:

    https://colab.research.google.com/github/<org>/<repo>/blob/<branch>/notebooks/<name>.ipynb

where ``<org>/<repo>`` and ``<branch>`` come from ``repository:`` in _config.yml (the only place
the URL is configured). A chapter without its notebook is a build warning (so ``-W`` fails).

It also sets ``FLASHLIB_STATIC_WIDGETS=1`` for the kernels that execute the chapters, so that
:func:`flashlib.widgets.interactive_figure` renders its no-kernel HTML version for the website.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

COLAB = "https://colab.research.google.com/github"


def colab_url(repository_url: str, branch: str, name: str) -> str:
    """Colab URL of notebooks/<name>.ipynb in a github.com repository."""
    parsed = urlparse(repository_url)
    if parsed.netloc != "github.com":
        raise ValueError(f"repository url must be a github.com URL, got {repository_url!r}")
    repo = parsed.path.strip("/").removesuffix(".git")
    return f"{COLAB}/{repo}/blob/{branch}/notebooks/{name}.ipynb"


def _is_notebook(path: Path) -> bool:
    """A MyST Markdown notebook declares a kernelspec in its front matter."""
    head = path.read_text(encoding="utf-8").split("\n---", 1)[0]
    return path.suffix == ".md" and head.startswith("---") and "kernelspec:" in head


def add_colab_link(app: Sphinx, doctree: nodes.document) -> None:
    env = app.env
    source = Path(env.doc2path(env.docname))
    if not _is_notebook(source):
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
    options = app.config.html_theme_options
    url = colab_url(options["repository_url"], options.get("repository_branch", "main"), name)
    link = nodes.reference("", "Open in Colab", refuri=url, internal=False)
    para = nodes.paragraph("", "", link, classes=["colab-link"])
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        doctree.insert(0, para)
    else:
        section.insert(1, para)  # right after the chapter title


def dedupe_scripts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Drop repeated <script> entries (sphinx-thebe adds its config twice under Jupyter Book,
    a console error: "Identifier 'THEBE_JS_URL' has already been declared")."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        name = getattr(script, "filename", script) or ""  # body-only scripts: None or ""
        key = (str(name), repr(getattr(script, "attributes", {})))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app: Sphinx) -> dict:
    os.environ["FLASHLIB_STATIC_WIDGETS"] = "1"
    app.connect("doctree-read", add_colab_link)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
