"""What the browser tests share: the Chromium they drive, a local server, page weights, axe-core.

tests/site/test_site.py opens every page of the built site;
tests/site/test_widgets_browser.py opens a page made of widget outputs. Both drive headless
Chromium with Playwright (:func:`find_chromium`) and serve files from 127.0.0.1 (:func:`serve`).
axe-core (the accessibility rules engine) is vendored in tests/vendor/axe-core (``bash
tools/vendor_axe.sh`` refreshes it; its version is pinned there), so the tests need no
network.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

from tools.browser import CHROMIUM_ARGS, find_chromium
from tools.paths import ROOT

AXE = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
#: axe-core impacts that fail a page.
AXE_FAILING = ("critical", "serious")
#: Largest page weight: every byte the browser loads for a page (HTML, scripts, styles, fonts).
MAX_PAGE_BYTES = 3_500_000
#: Page weights measured by the tests of this session, printed at the end (tests/conftest.py).
PAGE_WEIGHTS: dict[str, int] = {}


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
def chromium(env: dict[str, str] | None = None) -> Iterator[object]:
    """A headless Chromium (Playwright Browser), with ``env`` as its environment if given;
    fails the test with what to install."""
    import pytest
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    executable = find_chromium()
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=executable, headless=True,
                                         args=CHROMIUM_ARGS, env=env)
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


ARTIFACTS = ROOT / "test-artifacts"


def write_weights() -> None:
    """test-artifacts/page-weights.json: the weights this run measured (tests/conftest.py)."""
    if PAGE_WEIGHTS:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "page-weights.json").write_text(
            json.dumps(dict(sorted(PAGE_WEIGHTS.items())), indent=1) + "\n", encoding="utf-8")
