"""Median live redraw time (flashlib.widgets.redraw_time) of every chapter widget.

Runs each chapter's code cells (skipping remove-cell ones) up to its last interactive_figure
call, records (draw, sliders) and times the redraw at the largest setting.
Usage: .venv/bin/python scripts/widget_redraw.py [repeat] [--png DIR]  (run in the repo root)
"sweep": a fresh widget visits every frame once in grid order (first visits, as when a reader
moves a slider); median and max over the frames after the first.
"""
import os
import re
import sys
import time

import jupytext

os.environ.pop("FLASHLIB_STATIC_WIDGETS", None)
sys.path.insert(0, os.getcwd())
from flashlib import widgets  # noqa: E402

with open("_toc.yml") as toc:  # every chapter in the table of contents
    CHAPTERS = [f"{p}.md" for p in re.findall(r"(?:root|file): (book/[\w-]+)", toc.read())]
repeat = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 9
png_dir = sys.argv[sys.argv.index("--png") + 1] if "--png" in sys.argv else None
found = []
orig = widgets.interactive_figure


def recording(draw, sliders, **kw):
    found.append((current, draw, sliders, kw))
    return orig(draw, sliders, **kw)


widgets.interactive_figure = recording
for current in CHAPTERS:
    nb = jupytext.read(current)
    cells = [c for c in nb.cells if c.cell_type == "code"
             and "remove-cell" not in c.metadata.get("tags", [])]
    last = max((i for i, c in enumerate(cells) if "interactive_figure(" in c.source
                and "import" not in c.source.split("interactive_figure(")[0].splitlines()[-1]),
               default=None)
    if last is None:
        continue  # a page without widgets (e.g. the references)
    ns = {"__name__": "__main__"}
    cwd = os.getcwd()
    os.chdir("book")
    try:
        for c in cells[: last + 1]:
            exec(compile(c.source, current, "exec"), ns)
    finally:
        os.chdir(cwd)

for chapter, draw, sliders, kw in found:
    t = widgets.redraw_time(draw, sliders, repeat=repeat)
    fig = orig(draw, sliders, **kw)
    largest = {k: v[-1] for k, v in fig.sliders.items()}
    first = {k: v[0] for k, v in fig.sliders.items()}
    fig.render(largest)
    alt = []
    for _ in range(repeat):  # first values -> largest, time the latter (new redraw_time)
        fig.render(first)
        t0 = time.perf_counter()
        fig.render(largest)
        alt.append(time.perf_counter() - t0)
    alt = sorted(alt)[len(alt) // 2]
    fig = orig(draw, sliders, **kw)
    sweep = []
    for values in fig.grid:
        t0 = time.perf_counter()
        fig.render(values)
        sweep.append(time.perf_counter() - t0)
    sweep = sorted(sweep[1:]) or sweep
    print(f"{chapter:24s} {draw.__name__:12s} redraw_time {t * 1e3:6.1f} ms  "
          f"first->largest {alt * 1e3:6.1f} ms  "
          f"sweep median {sweep[len(sweep) // 2] * 1e3:6.1f} max {sweep[-1] * 1e3:6.1f} ms "
          f"({len(fig.grid)} frames)", flush=True)
    if png_dir:
        os.makedirs(png_dir, exist_ok=True)
        for values in fig.grid:
            name = "-".join(f"{k}{v}" for k, v in values.items())
            path = f"{png_dir}/{os.path.basename(chapter)[:-3]}-{draw.__name__}-{name}.png"
            with open(path, "wb") as f:
                f.write(fig.render(values))
