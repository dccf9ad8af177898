"""What the browser tests share: the Chromium they drive, a local server, page weights, axe-core.

tests/test_site.py opens every page of the built site; tests/test_widgets_browser.py opens a
page made of widget outputs. Both drive headless Chromium with Playwright
(:func:`find_chromium`) and serve files from 127.0.0.1 (:func:`serve`). axe-core (the
accessibility rules engine) is vendored in tests/vendor/axe-core (``bash
scripts/vendor_axe.sh`` refreshes it; its version is pinned there), so the tests need no
network.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AXE = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
#: Browsers looked for on PATH, in order, when $CHROMIUM is not set.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: axe-core impacts that fail a page.
AXE_FAILING = ("critical", "serious")
#: Largest page weight: every byte the browser loads for a page (HTML, scripts, styles, fonts).
MAX_PAGE_BYTES = 3_500_000
#: Page weights measured by the tests of this session, printed at the end (tests/conftest.py).
PAGE_WEIGHTS: dict[str, int] = {}


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


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 (a free port); yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A headless Chromium (Playwright Browser); fails the test with what to install."""
    import pytest
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    executable = find_chromium()
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=executable, headless=True,
                                         args=CHROMIUM_ARGS)
        except PlaywrightError as error:
            name = executable or "Playwright's own Chromium"
            pytest.fail(f"cannot start {name}: set CHROMIUM to a Chromium or Chrome, install "
                        "one (Debian: apt-get install chromium), or run `.venv/bin/python -m "
                        f"playwright install chromium` (see README.md)\n{str(error)[:500]}")
        try:
            yield browser
        finally:
            browser.close()


def axe_violations(page) -> list[str]:
    """axe-core's critical and serious violations on the page, one line each (rule, impact,
    up to three elements)."""
    page.add_script_tag(content=AXE.read_text(encoding="utf-8"))
    found = page.evaluate(
        """async (failing) => {
             const result = await axe.run(document, {resultTypes: ['violations']});
             return result.violations.filter(v => failing.includes(v.impact)).map(v =>
               `${v.impact} ${v.id} (${v.help}): ` +
               v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(' | '));
           }""",
        list(AXE_FAILING),
    )
    return list(found)


def page_weight(page) -> int:
    """Bytes of every response the page has loaded so far, decoded (the document, scripts,
    styles, fonts, images), from the browser's Resource Timing entries; a response the
    browser could not size (another origin without Timing-Allow-Origin) counts 0."""
    return int(page.evaluate(
        """() => performance.getEntriesByType('navigation')
                   .concat(performance.getEntriesByType('resource'))
                   .reduce((sum, e) => sum + (e.decodedBodySize || 0), 0)"""))


def axe_version() -> str:
    return json.loads((AXE.parent / "package.json").read_text(encoding="utf-8"))["version"]
