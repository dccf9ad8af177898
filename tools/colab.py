"""What Colab needs from the book: the URL that opens a chapter's notebook in Colab, and the
set-up cell that every generated notebook runs first.

- :func:`colab_url`: ``https://colab.research.google.com/github/<org>/<repo>/blob/<branch>/
  notebooks/<name>.ipynb``, the "Open in Colab" link of the site (tools/book_extension.py)
  and of the student edition's site (tools/student_edition.py, ``notebooks/student/``);
- :func:`release_ref` (``v{version}``, the tag the set-up cell installs) and
  :func:`colab_link`: a notebook's Colab URL at that tag, for the "Open in Colab" links and
  the links between notebooks (relative links do not work on Colab); the student edition's
  point at the student notebooks' repository (tools/student_notebooks.py), which holds no
  solution, and their set-up cell installs flashlib's wheel from there
  (:func:`student_wheel_url`);
- :func:`colab_cell`: tools/colab_cell.md's code with ``{url}`` (_config.yml's
  ``repository.url``) and ``{version}`` (pyproject.toml) filled in, a ``#@title`` form cell
  collapsed in Colab and JupyterLab (:data:`COLLAPSED_CODE`) that installs ``flashlib[book]``
  at the tag ``v{version}`` on Colab; tools/convert.py puts it after each notebook's title;
- :func:`student_cell`: the student edition's second cell, after the set-up cell: the
  student's id (``STUDENT_ID = "..."``), from which the exercises' variants are drawn
  (flashlib.book.exercises.variants), and the chapter's variants printed;
- :func:`has_setup_cell`: whether a chapter pasted a set-up cell of its own (the drift check,
  ``python -m tools.notebooks check``, refuses one: the notebooks get the generated one).
"""

from __future__ import annotations

import re
from urllib.parse import urlparse

import nbformat

from tools.paths import ROOT
from tools.project import repository, student_repository, version

COLAB = "https://colab.research.google.com/github"
COLAB_CELL = ROOT / "tools" / "colab_cell.md"
#: Metadata that makes JupyterLab show only a cell's first line and Colab its `#@title` form.
COLLAPSED_CODE = {"cellView": "form", "jupyter": {"source_hidden": True}}


def colab_url(repository_url: str, branch: str, name: str, folder: str = "notebooks") -> str:
    """Colab URL of <folder>/<name>.ipynb (default notebooks/) in a github.com repository."""
    parsed = urlparse(repository_url)
    if parsed.netloc != "github.com":
        raise ValueError(f"repository url must be a github.com URL, got {repository_url!r}")
    repo = parsed.path.strip("/").removesuffix(".git")
    folder = folder.strip("/")
    return f"{COLAB}/{repo}/blob/{branch}/" + (f"{folder}/" if folder else "") + f"{name}.ipynb"


def release_ref() -> str:
    """The git tag of this release, ``v{version}``: what the Colab set-up cell installs, and
    where every Colab link points (a notebook and the flashlib it installs always match)."""
    return f"v{version()}"


def colab_link(name: str, student: bool = False, lang: str = "en") -> str:
    """The Colab URL of notebooks/NAME.ipynb at the release tag; ``student``: NAME.ipynb of
    the student notebooks' repository (tools/student_notebooks.py), which holds no solution;
    ``lang="ja"``: the Japanese notebook (notebooks/ja/, the student repository's ja/).
    The links between notebooks are absolute, because relative ones do not work on Colab."""
    sub = "" if lang == "en" else lang
    if student:
        return colab_url(student_repository(), release_ref(), name, folder=sub)
    return colab_url(repository()[0], release_ref(), name,
                     folder="/".join(p for p in ("notebooks", sub) if p))


def wheel_name() -> str:
    """The file name of flashlib's wheel at this version."""
    return f"flashlib-{version()}-py3-none-any.whl"


def student_wheel_url() -> str:
    """Where the student notebooks' set-up cell installs flashlib from: the wheel in the
    student notebooks' repository, at the release tag (not the repository with solutions)."""
    return f"{student_repository()}/raw/{release_ref()}/wheels/{wheel_name()}"


def colab_cell(student: bool = False, lang: str = "en") -> nbformat.NotebookNode:
    """The set-up cell: tools/colab_cell.md's code with ``{url}`` (_config.yml's
    ``repository.url``) and ``{version}`` (pyproject.toml) filled in, collapsed; with
    ``student``, it installs the wheel of the student notebooks' repository instead; with
    ``lang="ja"`` its title is Japanese and it sets ``FLASHLIB_LANG=ja``, so that the
    checkers and figures speak Japanese (flashlib.book.i18n)."""
    text = COLAB_CELL.read_text(encoding="utf-8")
    code = re.search(r"^```python\n(?P<code>.*?)^```$", text, re.MULTILINE | re.DOTALL)
    if code is None:
        raise ValueError(f"{COLAB_CELL.relative_to(ROOT)}: no ```python block")
    source = code["code"].strip("\n")
    for key, value in (("{url}", repository()[0]), ("{version}", version())):
        if key not in source:
            raise ValueError(f"{COLAB_CELL.relative_to(ROOT)}: no {key} in its code")
        source = source.replace(key, value)
    if student:
        source = source.replace(f"git+{repository()[0]}@v{version()}", student_wheel_url())
    if lang == "ja":
        title, _, rest = source.partition("\n")
        source = (f"#@title セットアップ: Colab ではまずこのセルを実行してください（flashlib "
                  f"{version()} をインストールします）\n{rest}\n\n"
                  "import os\n\n"
                  "os.environ[\"FLASHLIB_LANG\"] = \"ja\"  # チェッカーと図を日本語で表示")
    return nbformat.v4.new_code_cell(source, metadata=COLLAPSED_CODE)


#: The student edition's id cell (:func:`student_cell`); ``{chapter}``: the chapter's number.
STUDENT_CELL = """\
#@title Your student id: put it here, then run this cell
STUDENT_ID = ""  # the id your course grades you by, e.g. "s1234567"

# The exercises whose answer is a number, a letter or a formula ask each
# student their own variant, drawn from the id (the grader checks that one):
from flashlib.book.exercises.variants import use_student

STUDENT_ID = use_student(STUDENT_ID, chapter="{chapter}")"""


STUDENT_CELL_JA = """\
#@title 受講者 ID: ここに入力してから、このセルを実行してください
STUDENT_ID = ""  # 成績をつける ID（例: "s1234567"）

# 答えが数値・文字・式である練習問題は、ID から決まる各自のバリアントを
# 出題します（採点はそのバリアントで行います）:
from flashlib.book.exercises.variants import use_student

STUDENT_ID = use_student(STUDENT_ID, chapter="{chapter}")"""


def student_cell(chapter: int, lang: str = "en") -> nbformat.NotebookNode:
    """The student edition's id cell for chapter number ``chapter``: ``STUDENT_ID`` (or the
    environment variable FLASHLIB_STUDENT_ID when it is empty) sets the student whose variants
    the exercises ask, and the chapter's variants are printed."""
    cell = STUDENT_CELL_JA if lang == "ja" else STUDENT_CELL
    return nbformat.v4.new_code_cell(cell.format(chapter=chapter), metadata=COLLAPSED_CODE)


def has_setup_cell(nb: nbformat.NotebookNode) -> bool:
    """Whether a chapter has its own Colab set-up code (the notebooks get a generated one)."""
    return any("google.colab" in c.source for c in nb.cells if c.cell_type == "code")
