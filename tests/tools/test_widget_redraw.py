"""tools/widget_redraw.py times every widget of the chapters of a table of contents, read by
the one toc reader, tools/toc.py's toc_files (tested in tests/tools/test_toc.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tools.paths import ROOT

pytest.importorskip("matplotlib")

SCRIPT = "tools.widget_redraw"

TINY_CHAPTER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# Tiny

```{code-cell} ipython3
:tags: [remove-cell]
raise RuntimeError("remove-cell cells are skipped")
```

```{code-cell} ipython3
from myst_nb import glue
from flashlib.book.plots import new_figure
from flashlib.book.widgets import interactive_figure
from tools.paths import ROOT
from tools.paths import ROOT

glue("x", 1.0, display=False)


def draw_line(a):
    fig, ax = new_figure()
    ax.plot([0, 1], [0, a])
    return fig


interactive_figure(draw_line, {"a": [1, 2, 3]}, labels={"a": "slope a of the line"},
                   caption="What to notice: the line gets steeper.", alt="A line",
                   fixed={"intercept": 0})
```

```{code-cell} ipython3
raise RuntimeError("cells after the last widget are not run")
```
"""


def _run(args, cwd):
    env = dict(os.environ, PYTHONWARNINGS="error", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", SCRIPT, *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow  # runs every widget cell of the book
def test_times_every_widget_of_the_toc(tmp_path):
    book = tmp_path / "book"
    book.mkdir()
    (book / "tiny.md").write_text(TINY_CHAPTER)
    (book / "plain.md").write_text(TINY_CHAPTER.split("```{code-cell}")[0])
    toc = tmp_path / "_toc.yml"
    toc.write_text("format: jb-book\nroot: book/tiny\nparts:\n  - caption: One\n"
                   "    chapters:\n      - file: book/plain\n")
    out = tmp_path / "widgets.json"
    proc = _run(["--toc", toc, "--repeats", "2", "--out", out, "--png", tmp_path / "png"],
                cwd=tmp_path)
    res = json.loads(out.read_text())
    (w,) = res["widgets"]
    assert w["chapter"] == "book/tiny.md" and w["widget"] == "draw_line"
    assert w["frames"] == 3 and 0 < w["redraw_s"] and 0 < w["sweep_median_s"] <= w["sweep_max_s"]
    assert "draw_line" in proc.stdout and "redraw ms" in proc.stdout
    assert res["machine"]["clock"] == "wall" and "tools.widget_redraw" in res["command"]
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == [
        f"tiny-draw_line-a{a}.png" for a in (1, 2, 3)]
    # one chapter given on the command line; a page without widgets gives an empty table
    proc = _run([book / "plain.md", "--out", out], cwd=tmp_path)
    assert "(no widgets found)" in proc.stdout and json.loads(out.read_text())["widgets"] == []

