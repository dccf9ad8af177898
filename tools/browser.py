"""Finding the Chromium that the browser tests and tools/lab_widgets_check.py drive.

$CHROMIUM (which must exist), else the first of :data:`CHROMIUM_NAMES` on PATH that is not
Ubuntu's snap wrapper, else None: Playwright's own Chromium
(``.venv/bin/python -m playwright install chromium``).
"""

from __future__ import annotations

import os
import shutil

#: Browsers looked for on PATH, in order, when $CHROMIUM is not set.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Flags for a headless Chromium on a machine without a display or network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _is_snap_wrapper(path: str) -> bool:
    """Ubuntu's chromium-browser: a script that starts the snap, which Playwright cannot drive
    (the snap cannot see the temporary profile folder)."""
    real = os.path.realpath(path)
    if real.startswith("/snap/"):
        return True
    try:
        with open(real, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") and b"/snap/" in head


def find_chromium() -> str | None:
    """The browser for these tests: $CHROMIUM (which must exist), else the first of
    CHROMIUM_NAMES on PATH that is not a snap wrapper, else None: Playwright's own Chromium
    (``python -m playwright install chromium``)."""
    named = os.environ.get("CHROMIUM")
    if named:
        found = shutil.which(named) or (named if os.path.isfile(named) else None)
        if found is None:
            raise FileNotFoundError(f"CHROMIUM={named!r}: no such browser")
        return found
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found and not _is_snap_wrapper(found):
            return found
    return None
