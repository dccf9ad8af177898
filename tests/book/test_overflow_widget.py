"""The overflow chapter's widget (book/overflow.md, "Try it"): its y-axis labels clear their
tick labels at every slider position.

The widget's figure is laid out once, at the default position (float16: one-digit ticks), and
that layout is kept for every redraw (flashlib.book.plots.freeze_layout); with float64 the
ticks reach 400 and ran into the label (issue 24). The test runs the chapter's own cell.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tools.paths import ROOT

pytest.importorskip("matplotlib")


def widget_namespace() -> dict:
    """The chapter's widget cell run up to its interactive_figure call."""
    from flashlib.algorithms import safe_softmax
    from flashlib.studies.overflow import naive_softmax

    source = (ROOT / "book" / "overflow.md").read_text()
    cells = re.findall(r"```\{code-cell\} ipython3\n(.*?)```", source, re.S)
    (cell,) = [c for c in cells if "def draw_row" in c]
    namespace = {"np": np, "DTYPES": ["float16", "float32", "float64"],
                 "safe_softmax": safe_softmax, "naive_softmax": naive_softmax}
    code = "\n".join(line for line in cell.splitlines() if not line.startswith(":tags:"))
    exec(code.split("interactive_figure(\n")[0], namespace)  # noqa: S102
    return namespace


def test_y_labels_clear_the_ticks_at_every_position():
    from flashlib.book.plots import figure_png, freeze_layout

    ns = widget_namespace()
    fig = ns["draw_row"](12, "float16")  # the default: the layout every redraw keeps
    figure_png(fig)
    freeze_layout(fig)
    overlaps = []
    for largest in ns["LARGEST"]:
        for dtype in ns["DTYPES"]:
            fig = ns["draw_row"](largest, dtype)
            figure_png(fig)
            renderer = fig.canvas.get_renderer()
            for ax in fig.axes:
                label = ax.yaxis.label.get_window_extent(renderer)
                overlaps += [(largest, dtype, tick.get_text()) for tick in ax.get_yticklabels()
                             if tick.get_text()
                             and tick.get_window_extent(renderer).overlaps(label)]
    assert not overlaps, overlaps
