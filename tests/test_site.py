"""Browser tests of the built site (_build/html, made by `make book`).

Serves the site on 127.0.0.1 and opens every page in headless Chromium driven by Playwright
(the browser: :func:`find_chromium`). Every page must load with no failed request, no request
leaving 127.0.0.1 and no console error; every interactive figure must be visible and each of its
sliders must change the figure; every image needs alt text (or a caption); every chapter links to
its notebook on Colab. Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import colab_link  # scripts/ is on sys.path (tests/conftest.py)
import pytest

import notebooks

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
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
NOT_PAGES = {"genindex.html", "search.html", "index.html"}  # index.html: redirect to the root


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


def site_pages() -> list[str]:
    """Every content page of the built site, relative to _build/html."""
    if not (SITE / "index.html").is_file():
        return []
    return sorted(
        str(p.relative_to(SITE))
        for p in SITE.rglob("*.html")
        if p.name not in NOT_PAGES and not p.relative_to(SITE).parts[0].startswith("_")
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    if not (SITE / "index.html").is_file():
        pytest.fail(f"{SITE} is missing: run `make book` first (make test does it)")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser_context():
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    user_data = tempfile.mkdtemp(prefix="flashlib-chromium-")
    with sync_playwright() as pw:
        try:
            context = pw.chromium.launch_persistent_context(
                user_data,
                executable_path=chromium,
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": 1280, "height": 900},
                service_workers="block",
            )
        except PlaywrightError as error:
            browser = chromium or "Playwright's own Chromium"
            pytest.fail(f"cannot start {browser}: set CHROMIUM to "
                        "a Chromium or Chrome, install one (Debian: apt-get install chromium), "
                        "or run `.venv/bin/python -m playwright install chromium` (see "
                        f"README.md)\n{str(error)[:500]}")
        yield context
        context.close()
    shutil.rmtree(user_data, ignore_errors=True)


def test_site_was_built() -> None:
    assert (SITE / "index.html").is_file(), f"{SITE} is missing: run `make book` first"
    pages = site_pages()
    assert "book/intro.html" in pages, f"no book/intro.html among {pages}"


def test_no_page_repeats_a_script() -> None:
    """scripts/colab_link.py dedupe_scripts: sphinx-thebe's config script, repeated, is a
    console error (the browser test would catch it only on pages it opens)."""
    assert site_pages(), f"{SITE} is missing: run `make book` first"
    for page_path in site_pages():
        text = (SITE / page_path).read_text(encoding="utf-8")
        scripts = re.findall(r"<script\b[^>]*>.*?</script>", text, re.S)
        repeated = {s[:100] for s in scripts if scripts.count(s) > 1}
        assert not repeated, f"{page_path}: repeated <script> elements: {repeated}"


@pytest.mark.parametrize("page_path", site_pages() or ["<missing _build/html: run make book>"])
def test_page(server: str, browser_context, page_path: str) -> None:
    if page_path.startswith("<"):
        pytest.fail(f"{SITE} is missing: run `make book` first (make test does it)")
    outside: list[str] = []
    failed: list[str] = []
    errors: list[str] = []

    def route(route) -> None:
        host = urlparse(route.request.url).hostname
        if route.request.url.startswith("data:") or host == "127.0.0.1":
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page = browser_context.new_page()
    page.route("**/*", route)
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
    page.on(
        "response",
        lambda r: failed.append(f"{r.url} (HTTP {r.status})") if r.status >= 400 else None,
    )
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{server}/{page_path}", wait_until="load")
        page.wait_for_load_state("networkidle")
        # wait for MathJax (vendored) to typeset, and for the fonts it then requests
        page.wait_for_function("() => !window.MathJax || !!(MathJax.startup || {}).promise")
        page.evaluate("() => window.MathJax && MathJax.startup.promise.then(() => true)")
        page.wait_for_load_state("networkidle")

        # every image has alt text or a caption
        missing_alt = page.eval_on_selector_all(
            "main img",
            """imgs => imgs.filter(img => {
                 const alt = (img.getAttribute('alt') || '').trim();
                 const meaningful = alt && !/\\.(png|svg|jpe?g)$/i.test(alt);
                 const fig = img.closest('figure');
                 return !meaningful && !(fig && fig.querySelector('figcaption'));
               }).map(img => img.src.slice(0, 80))""",
        )
        assert not missing_alt, f"{page_path}: images without alt text or caption: {missing_alt}"

        # notebook chapters link to their notebook on Colab
        colab = page.locator("p.colab-link a")
        if (ROOT / "notebooks" / f"{Path(page_path).stem}.ipynb").is_file():
            assert colab.count() == 1, f"{page_path}: no 'Open in Colab' link"
        if colab.count():
            href = colab.first.get_attribute("href")
            name = Path(page_path).stem
            assert href.startswith("https://colab.research.google.com/github/"), href
            assert href == colab_link.colab_url(*notebooks.repository(), name), href
            assert (ROOT / "notebooks" / f"{name}.ipynb").is_file(), href

        # every interactive figure is visible and each slider changes its figure
        figures = page.locator(".flashlib-ifig")
        for i in range(figures.count()):
            fig = figures.nth(i)
            fig.scroll_into_view_if_needed()
            img = fig.locator("img")
            assert fig.is_visible() and img.is_visible(), f"{page_path}: figure {i} not visible"
            assert img.evaluate("i => i.complete && i.naturalWidth > 0"), f"figure {i}: no image"
            sliders = fig.locator("input[type=range]")
            assert sliders.count() >= 1, f"{page_path}: figure {i} has no slider"
            for k in range(sliders.count()):
                slider = sliders.nth(k)
                before = img.get_attribute("src")
                value, top = int(slider.input_value()), int(slider.get_attribute("max"))
                new = value - 1 if value == top else value + 1
                slider.evaluate(
                    "(s, v) => { s.value = String(v);"
                    " s.dispatchEvent(new Event('input', {bubbles: true})); }",
                    new,
                )
                after = img.get_attribute("src")
                name = slider.get_attribute("data-name")
                assert after != before, f"{page_path}: figure {i}, slider {name} changed nothing"
                assert img.evaluate("i => i.complete && i.naturalWidth > 0")
                slider.evaluate(
                    "(s, v) => { s.value = String(v);"
                    " s.dispatchEvent(new Event('input', {bubbles: true})); }",
                    value,
                )
                assert img.get_attribute("src") == before, f"{page_path}: {name} not reversible"

        page.evaluate("window.scrollTo(0, 0)")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = SCREENSHOTS / (page_path.replace("/", "__").removesuffix(".html") + ".png")
        page.screenshot(path=str(shot), full_page=True)
    finally:
        page.close()

    assert not outside, f"{page_path}: requests leaving 127.0.0.1: {outside}"
    assert not failed, f"{page_path}: failed requests: {failed}"
    assert not errors, f"{page_path}: console errors: {errors}"


def test_find_chromium(monkeypatch, tmp_path) -> None:
    browser = tmp_path / "my-chrome"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    monkeypatch.setenv("CHROMIUM", str(browser))
    assert find_chromium() == str(browser)
    monkeypatch.setenv("CHROMIUM", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="CHROMIUM"):
        find_chromium()
    monkeypatch.delenv("CHROMIUM")
    snap = tmp_path / "chromium-browser"
    snap.write_text("#!/bin/sh\nexec /snap/bin/chromium \"$@\"\n")
    snap.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_chromium() is None  # the snap wrapper is skipped: Playwright's own browser
    (tmp_path / "google-chrome").write_text("#!/bin/sh\n")
    (tmp_path / "google-chrome").chmod(0o755)
    assert find_chromium() == str(tmp_path / "google-chrome")
