"""Time every live slider of the notebooks in a real JupyterLab (the round trip a learner sees).

    .venv/bin/python -m tools.lab_widgets_check            # every chapter with a widget
    .venv/bin/python -m tools.lab_widgets_check intro      # one chapter

Starts JupyterLab from .venv on a free local port with copies of the generated notebooks in a
temporary folder, runs each notebook with "Run All" in headless Chromium (the browser of
tests/site/test_site.py), then moves every slider of every interactive figure with the keyboard
through all its values and back, and measures in the page the time from the key press to the
new image in the widget's output, for every setting not shown before (a revisited one comes
from the widget's cache). Fails when a new setting draws nothing or a slider's median redraw
takes longer than ``--limit`` (0.2 s). Not part of `make test` or `.ci/run` (minutes, and its
times depend on the machine's load); `python -m tools.widget_redraw` times the kernel's
share alone.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tools import notebooks
from tools.toc import chapters

# The notebook panel's kernel is idle and every code cell has run.
IDLE = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return kernel && kernel.status === 'idle' && panel.content.widgets.every(
    c => c.model.type !== 'code' || c.model.executionCount !== null);
}"""
KERNEL_IDLE = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return kernel && kernel.status === 'idle';
}"""
# Resolves when the widget output's image changes after a key press on a slider's handle;
# returns the milliseconds it took (or -1 after the timeout).
MOVE = """async (handle, key) => {
  const box = handle.closest('.widget-vbox');
  const img = () => box.querySelector('.widget-output img');
  const before = img() && img().src;
  const t0 = performance.now();
  handle.focus();
  handle.dispatchEvent(new KeyboardEvent('keydown', {key, bubbles: true}));
  handle.dispatchEvent(new KeyboardEvent('keyup', {key, bubbles: true}));
  while (performance.now() - t0 < 10000) {
    const now = img();
    if (now && now.src !== before && now.complete) return performance.now() - t0;
    await new Promise(r => requestAnimationFrame(r));
  }
  return -1;
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapter names (default: all with widgets)")
    parser.add_argument("--limit", type=float, default=0.2,
                        help="seconds per redraw (the median of --moves moves)")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from tools.browser import CHROMIUM_ARGS, find_chromium

    sources = [s for s in chapters() if (not args.chapters or s.stem in args.chapters)
               and "interactive_figure(" in s.read_text(encoding="utf-8")]
    tmp = Path(tempfile.mkdtemp(prefix="flashlib-lab-check-"))
    for source in sources:
        shutil.copy2(notebooks.target(source), tmp / notebooks.target(source).name)
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser",
         f"--port={port}", "--ip=127.0.0.1", f"--ServerApp.root_dir={tmp}",
         "--IdentityProvider.token=", "--ServerApp.password=",
         "--LabApp.expose_app_in_browser=True", f"--LabApp.workspaces_dir={tmp}/.ws",
         f"--LabApp.user_settings_dir={tmp}/.settings", "--LabApp.news_url=",
         "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    failures, times = [], []
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS)
            for source in sources:
                name = notebooks.target(source).name
                # a page per notebook: leaving an edited notebook's page would ask first
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                # ?reset: a fresh workspace, without the notebooks opened before
                page.goto(f"http://127.0.0.1:{port}/lab/tree/{name}?reset")
                page.wait_for_function("() => window.jupyterapp && "
                                       "document.querySelector('.jp-Notebook')")
                page.wait_for_function(KERNEL_IDLE, timeout=120_000, polling=200)
                t0 = time.perf_counter()
                page.evaluate("() => window.jupyterapp.commands.execute("
                              "'notebook:run-all-cells')")
                page.wait_for_function(IDLE, timeout=600_000, polling=500)
                print(f"{name}: ran all cells in {time.perf_counter() - t0:.0f} s")
                boxes = page.locator(".widget-vbox:has(.widget-output img)")
                if boxes.count() == 0:
                    failures.append(f"{name}: no live widget rendered")
                for b in range(boxes.count()):
                    box = boxes.nth(b)
                    handles = box.locator(".noUi-handle, .ui-slider-handle")
                    setting = lambda box=box: tuple(box.locator(  # noqa: E731
                        ".noUi-handle, .ui-slider-handle").evaluate_all(
                        "hs => hs.map(h => h.getAttribute('aria-valuenow'))"))
                    seen = {setting()}
                    for h in range(handles.count()):
                        handle = handles.nth(h)
                        handle.scroll_into_view_if_needed()
                        label = handle.evaluate(
                            "h => h.closest('.widget-hslider, .widget-slider')"
                            ".querySelector('.widget-label').textContent")
                        lo, hi, start = (int(float(handle.get_attribute(a))) for a in (
                            "aria-valuemin", "aria-valuemax", "aria-valuenow"))
                        # up to the end, down to the start, back: only first visits redraw
                        keys = (["ArrowRight"] * (hi - start) + ["ArrowLeft"] * (hi - lo)
                                + ["ArrowRight"] * (start - lo))
                        redraws = []
                        for key in keys:
                            ms = handle.evaluate(MOVE, key)
                            new = setting() not in seen
                            seen.add(setting())
                            if new and ms < 0:
                                failures.append(f"{name}: figure {b}, slider {label}: "
                                                "a new setting drew nothing")
                            elif new:
                                redraws.append(ms)
                        if not redraws:
                            failures.append(f"{name}: figure {b}, slider {label}: no redraw")
                            continue
                        ms = statistics.median(redraws)
                        times += redraws
                        print(f"  figure {b}, slider {label}: median {ms:.0f} ms "
                              f"({', '.join(f'{m:.0f}' for m in redraws)})")
                        if ms > 1000 * args.limit:
                            failures.append(f"{name}: figure {b}, slider {label}: median "
                                            f"{ms:.0f} ms > {1000 * args.limit:.0f} ms")
                page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext"
                              ".shutdown()")
                page.close()
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    if times:
        print(f"{len(times)} redraws: median {statistics.median(times):.0f} ms, "
              f"{min(times):.0f}-{max(times):.0f} ms")
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
