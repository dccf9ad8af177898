"""Sphinx extension: an "Open in Colab" link under the title of every notebook chapter.

Registered in _config.yml (``sphinx: local_extensions: colab_link: scripts/``). The link points
at the chapter's generated notebook, ``notebooks/<name>.ipynb`` (``make notebooks``), on GitHub:

    https://colab.research.google.com/github/<org>/<repo>/blob/<branch>/notebooks/<name>.ipynb

where ``<org>/<repo>`` and ``<branch>`` come from ``repository:`` in _config.yml (the only place
the URL is configured), read by ``notebooks.repository()`` (scripts/notebooks.py; scripts/ is on
``sys.path`` because Jupyter Book adds the ``local_extensions`` folders to it).
A chapter without its notebook is a build warning (so ``-W`` fails).

It also sets ``FLASHLIB_STATIC_WIDGETS=1`` for the kernels that execute the chapters, so that
:func:`flashlib.book.widgets.interactive_figure` renders its no-kernel HTML version for the
website, and has those kernels' connections encrypted (:func:`encrypt_kernel_transport`).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

from notebooks import is_notebook, repository

logger = logging.getLogger(__name__)

COLAB = "https://colab.research.google.com/github"


def colab_url(repository_url: str, branch: str, name: str, folder: str = "notebooks") -> str:
    """Colab URL of <folder>/<name>.ipynb (default notebooks/) in a github.com repository."""
    parsed = urlparse(repository_url)
    if parsed.netloc != "github.com":
        raise ValueError(f"repository url must be a github.com URL, got {repository_url!r}")
    repo = parsed.path.strip("/").removesuffix(".git")
    return f"{COLAB}/{repo}/blob/{branch}/{folder.strip('/')}/{name}.ipynb"


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
    os.environ["FLASHLIB_STATIC_WIDGETS"] = "1"
    encrypt_kernel_transport()
    app.connect("doctree-read", add_colab_link)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
