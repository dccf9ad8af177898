"""Time the live redraw of every widget of the book's chapters (book tooling, run by `make bench`).

    python -m tools.widget_redraw                     # every chapter of _toc.yml
    python -m tools.widget_redraw book/overflow.md    # one chapter's widgets
    python -m tools.widget_redraw --png frames/       # ... and write every frame as a PNG

A reader who moves a slider in Jupyter or Colab waits for ``draw`` and the PNG; this measures
that wait (wall clock) for every ``interactive_figure`` of the chapters.  Each chapter runs its
code cells (``remove-cell`` ones skipped) up to its last widget, in the chapter's folder, with
``flashlib.book.widgets.interactive_figure`` recording every (draw, sliders).  Per widget:
``redraw_s``, :func:`flashlib.book.widgets.redraw_time` at the largest settings (the median of
``--repeats`` redraws), and a sweep of a fresh widget through every frame once in grid order
(first visits, as when a reader moves a slider): ``sweep_median_s`` and ``sweep_max_s`` over the
frames after the first.  The table is printed, the JSON (with the machine's details) written to
``bench-results/widgets.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jupytext
from tabulate import tabulate

from tools.paths import ROOT
from tools.toc import toc_files

_WIDGET_CALL = re.compile(r"^(?!\s*(?:from|import)\b).*\binteractive_figure\s*\(", re.M)


def _label(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` when it lies below it, else as given."""
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(path)


def record_widgets(chapters: Sequence[Path]) -> list[tuple[Path, Callable[..., Any], dict, dict]]:
    """Run each chapter's code cells up to its last widget; every ``interactive_figure`` call
    as (chapter, draw, sliders, keyword arguments), in order."""
    from flashlib.book import widgets

    found: list[tuple[Path, Callable[..., Any], dict, dict]] = []
    original = widgets.interactive_figure
    current = Path()

    def recording(draw, sliders, **kw):
        found.append((current, draw, sliders, kw))
        return original(draw, sliders, **kw)

    static = os.environ.pop(widgets.STATIC_ENV, None)  # time the live redraw
    os.environ.setdefault("MPLBACKEND", "Agg")
    cwd = os.getcwd()
    widgets.interactive_figure = recording
    try:
        for current in chapters:
            nb = jupytext.read(current)
            cells = [c.source for c in nb.cells if c.cell_type == "code"
                     and "remove-cell" not in c.metadata.get("tags", [])]
            last = max((i for i, src in enumerate(cells) if _WIDGET_CALL.search(src)),
                       default=None)
            if last is None:
                continue  # a page without widgets
            namespace: dict[str, Any] = {"__name__": "__main__"}
            os.chdir(current.resolve().parent)
            try:  # glue() and friends print when there is no kernel: keep stdout clean
                with contextlib.redirect_stdout(io.StringIO()):
                    for src in cells[: last + 1]:
                        exec(compile(src, str(current), "exec"), namespace)  # noqa: S102
            finally:
                os.chdir(cwd)
    finally:
        widgets.interactive_figure = original
        if static is not None:
            os.environ[widgets.STATIC_ENV] = static
    return found


def widget_redraw_times(
    chapters: Sequence[Path], *, repeat: int = 5, png_dir: Path | None = None,
    base: Path = ROOT,
) -> list[dict[str, Any]]:
    """One row per widget of ``chapters``: chapter (relative to ``base``), widget, frames,
    ``redraw_s``, ``sweep_median_s`` and ``sweep_max_s`` (see the module docstring)."""
    from flashlib.book import widgets
    from flashlib.core.measure import time_calls

    rows = []
    for chapter, draw, sliders, kw in record_widgets(chapters):
        redraw = widgets.redraw_time(draw, sliders, repeat=repeat)
        fig = widgets.interactive_figure(draw, sliders, **kw)
        pngs: dict[int, bytes] = {}

        def frame(i: int, values: dict, fig=fig, pngs=pngs) -> None:
            pngs[i] = fig.render(values)

        # each frame once, in grid order, no warm-up: first visits, as a reader sees them
        sweep = time_calls({i: functools.partial(frame, i, values)
                            for i, values in enumerate(fig.grid)}, 1, clock="wall", warmup=False)
        if png_dir is not None:
            png_dir.mkdir(parents=True, exist_ok=True)
            for i, values in enumerate(fig.grid):
                name = "-".join(f"{k}{v}" for k, v in values.items())
                (png_dir / f"{chapter.stem}-{draw.__name__}-{name}.png").write_bytes(pngs[i])
        times = [ts[0] for ts in sweep.values()]
        rest = times[1:] or times
        rows.append({
            "chapter": _label(chapter, base), "widget": draw.__name__, "frames": len(times),
            "redraw_s": redraw, "sweep_median_s": statistics.median(rest),
            "sweep_max_s": max(rest),
        })
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "(no widgets found)"
    return tabulate(
        [[r["chapter"], r["widget"], r["frames"], f"{1000 * r['redraw_s']:.1f}",
          f"{1000 * r['sweep_median_s']:.1f}", f"{1000 * r['sweep_max_s']:.1f}"] for r in rows],
        headers=["chapter", "widget", "frames", "redraw ms", "sweep median ms", "max ms"],
        disable_numparse=True, colalign=("left", "left", "right", "right", "right", "right"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", type=Path,
                        help="chapters whose widgets to time (default: every page of --toc)")
    parser.add_argument("--toc", type=Path, default=ROOT / "_toc.yml",
                        help="the table of contents (default: the book's _toc.yml)")
    parser.add_argument("--repeats", type=int, default=5, help="redraws per widget (median)")
    parser.add_argument("--png", type=Path, default=None, metavar="DIR",
                        help="also write every widget frame as a PNG into DIR")
    parser.add_argument("--out", type=Path, default=Path("bench-results") / "widgets.json",
                        help="JSON file (default: %(default)s)")
    args = parser.parse_args(argv)

    from flashlib.bench.machine import machine_info, set_threads

    set_threads(1)
    chapters = args.chapters or toc_files(args.toc)
    rows = widget_redraw_times(chapters, repeat=args.repeats, png_dir=args.png,
                               base=args.toc.parent)
    print(format_table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python -m tools.widget_redraw " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "machine": machine_info(1, "wall"),
        "widgets": rows,
    }, indent=1), encoding="utf-8")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
