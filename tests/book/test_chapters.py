"""flashlib.book.chapters: one module per chapter holds that chapter's diagrams and widget data,
each page imports its own chapter's module only, and no chapter module needs another chapter's
optional dependency (only the precision chapter's needs ml_dtypes)."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys

import pytest

import flashlib.book.chapters as chapters
from tools.paths import ROOT

#: book/<page>.md -> its module in flashlib.book.chapters (named as its exercises module).
PAGE_MODULE = {"intro": "intro", "overflow": "overflow", "online-softmax": "online_softmax",
               "tiling": "tiling", "optimisation-ladder": "ladder", "masking": "masking",
               "backward": "backward", "precision": "precision", "io-model": "io_model",
               "gpu": "gpu", "beyond": "beyond"}

MODULES = sorted(m.name for m in pkgutil.iter_modules(chapters.__path__))


def test_every_chapter_module_belongs_to_a_chapter():
    assert MODULES and set(MODULES) <= set(PAGE_MODULE.values())
    exercises = {m.name for m in pkgutil.iter_modules(
        [str(ROOT / "flashlib" / "book" / "exercises")])}
    assert set(MODULES) <= exercises, "named as the chapter's exercises module"


@pytest.mark.parametrize("page", sorted(PAGE_MODULE))
def test_a_page_imports_its_own_chapter_module_only(page):
    text = (ROOT / "book" / f"{page}.md").read_text(encoding="utf-8")
    used = set(re.findall(r"flashlib\.book\.chapters\.(\w+) import", text))
    assert used <= {PAGE_MODULE[page]}, f"book/{page}.md imports {sorted(used)}"


def test_every_public_name_of_a_chapter_module_is_used_by_its_page_or_tests():
    """Nothing left over from the old shared files: each public function or table is imported
    by its chapter's page (or, for a helper of the page's own, by a test)."""
    pages = {mod: (ROOT / "book" / f"{page}.md").read_text(encoding="utf-8")
             for page, mod in PAGE_MODULE.items()}
    tests = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py"))
    for mod in MODULES:
        module = __import__(f"flashlib.book.chapters.{mod}", fromlist=["__all__"])
        for name in module.__all__:
            if isinstance(getattr(module, name), type):
                continue  # a type a function returns (precision's TableRow)
            assert re.search(rf"\b{name}\b", pages[mod] + tests), (mod, name)


_BLOCKED = """
import sys
sys.modules["ml_dtypes"] = None  # "import ml_dtypes" raises ImportError
import importlib
module = importlib.import_module("flashlib.book.chapters." + sys.argv[1])
if sys.argv[1] == "tiling":  # the widget's data, the diagram: computed without ml_dtypes
    module.tiling_widget_data([20], [8], orders=["v2"])
    module.tiling_diagram()
if sys.argv[1] == "io_model":
    module.io_widget_data([32], [8], [256], count_N=32)
assert "ml_dtypes" not in sys.modules or sys.modules["ml_dtypes"] is None
print("ok")
"""


@pytest.mark.parametrize("module", [m for m in MODULES if m != "precision"])
def test_chapter_modules_import_without_ml_dtypes(module):
    """ml_dtypes is the precision chapter's dependency alone: every other chapter's module
    imports (and the tiling and IO-model widgets compute) with it missing."""
    pytest.importorskip("matplotlib")
    result = subprocess.run([sys.executable, "-c", _BLOCKED, module], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_the_precision_module_names_ml_dtypes_when_it_is_missing():
    code = ('import sys; sys.modules["ml_dtypes"] = None\n'
            "try:\n    import flashlib.book.chapters.precision\n"
            "except ImportError as e:\n    print(e)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert "ml_dtypes" in result.stdout, result.stdout + result.stderr[-2000:]
