"""Where things are in the repository, in one place (the tools and the tests import these)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
NOTEBOOKS = ROOT / "notebooks"
BUILD = ROOT / "_build"
BUILD_HTML = BUILD / "html"
STUDENT_HTML = BUILD / "student" / "_build" / "html"
