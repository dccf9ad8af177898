"""The benchmark command runs (tiny sizes: a test that it works, not a timing assertion), writes
its JSON with machine details, and flashlib's numerics never import torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from flashlib import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, tmp_path, cwd=ROOT):
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONWARNINGS="error",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-m", "flashlib.bench", *args, "--out", str(out)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_cpu_command_tiny(tmp_path):
    proc, res = _run(["cpu", "--n", "48", "--heads", "2", "--d", "8", "--repeats", "2",
                      "--blocks", "16x16,8x32", "--causal", "--no-redraw"], tmp_path)
    assert "torch_sdpa" in proc.stdout and "naive_inplace" in proc.stdout
    assert "causal / non-causal" in proc.stdout
    assert "%|" in proc.stderr  # the tqdm progress bar
    m = res["machine"]
    for key in ("cpu_model", "cpu_count", "numpy", "torch", "blas", "threads", "clock",
                "flashlib", "matplotlib", "threadpoolctl", "architecture"):
        assert key in m, key
    assert m["flashlib"]["version"] == __import__("flashlib").__version__
    if sys.platform.startswith("linux"):
        assert {"family", "model", "flags", "caches"} <= set(m), sorted(m)
        assert set(m["flags"]) >= {"avx2", "avx512f"}
    assert m["threads"] == 1 and m["torch_threads"] == 1 and m["clock"] == "cpu"
    assert "FLASH_ATTENTION" in res["sdpa_backend"] and "SDPA backend" in proc.stdout
    assert "widget_redraw" not in res
    assert all(pool["num_threads"] == 1 for pool in m["blas"] if pool["internal_api"] != "openmp")
    assert res["sgemm_peak_gflops"] > 0
    assert [(r["n"], r["causal"]) for r in res["runs"]] == [(48, False), (48, True)]
    impls = {row["impl"] for row in res["runs"][0]["rows"]}
    assert impls == {"naive", "naive_inplace", "flash_v1", "flash", "flash_16x16",
                     "flash_8x32", "torch_sdpa", "torch_naive"}
    for row in res["runs"][0]["rows"]:
        assert len(row["times_s"]) == 2 and row["median_s"] > 0
        assert {"gflops", "peak_fraction", "vs_naive_inplace", "vs_torch_sdpa"} <= set(row)
    assert res["defaults"] == {"block_q": bench.BLOCK_Q, "block_k": bench.BLOCK_K}


def test_ladder_command_tiny_without_torch(tmp_path):
    proc, res = _run(["ladder", "--n", "40", "--heads", "1", "--d", "4", "--repeats", "1",
                      "--no-torch", "--no-peak", "--no-progress", "--no-redraw"], tmp_path)
    rows = res["runs"][0]["rows"]
    assert [r["impl"] for r in rows][0] == "naive_inplace"
    assert len(rows) == 1 + len(bench.RUNGS)
    assert "torch" not in res["machine"] and res["sgemm_peak_gflops"] is None
    assert "sdpa_backend" not in res


def test_threads_above_one_force_the_wall_clock(tmp_path):
    proc, res = _run(["ladder", "--n", "24", "--heads", "1", "--d", "4", "--repeats", "1",
                      "--threads", "2", "--no-peak", "--no-progress", "--no-redraw"], tmp_path)
    assert res["machine"]["clock"] == "wall" and res["machine"]["threads"] == 2
    assert "wall clock" in res["clock_note"] and "wall clock" in proc.stdout


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
from flashlib.plots import new_figure
from flashlib.widgets import interactive_figure

glue("x", 1.0, display=False)


def draw_line(a):
    fig, ax = new_figure()
    ax.plot([0, 1], [0, a])
    return fig


interactive_figure(draw_line, {"a": [1, 2, 3]}, alt="A line")
```

```{code-cell} ipython3
raise RuntimeError("cells after the last widget are not run")
```
"""


def test_widgets_command_times_every_toc_widget(tmp_path):
    book = tmp_path / "book"
    book.mkdir()
    (book / "tiny.md").write_text(TINY_CHAPTER)
    (book / "plain.md").write_text(TINY_CHAPTER.split("```{code-cell}")[0])
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/tiny\nchapters:\n  - file: book/plain\n")
    assert bench.toc_chapters(str(tmp_path / "_toc.yml")) == [
        str(tmp_path / "book" / "tiny.md"), str(tmp_path / "book" / "plain.md")]
    proc, res = _run(["widgets", "--repeats", "2"], tmp_path, cwd=tmp_path)
    (w,) = res["widget_redraw"]["widgets"]
    assert w["chapter"] == os.path.join("book", "tiny.md") and w["widget"] == "draw_line"
    assert w["frames"] == 3 and 0 < w["redraw_s"] and 0 < w["sweep_median_s"] <= w["sweep_max_s"]
    assert "draw_line" in proc.stdout and "redraw ms" in proc.stdout
    # without a _toc.yml (flashlib used outside the book) the widgets are skipped, not an error
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    proc, res = _run(["widgets"], tmp_path, cwd=empty)
    assert "_toc.yml" in res["widget_redraw"]["skipped"] and "skipped" in proc.stdout


def test_numerics_do_not_import_torch():
    code = (
        "import sys, numpy as np, flashlib, flashlib.ladder, flashlib.bench\n"
        "x = np.ones((2, 4, 8), np.float32)\n"
        "flashlib.flash_attention(x, x, x)\n"
        "assert 'torch' not in sys.modules, 'flashlib imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_time_calls_round_robin_and_validation():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = bench.time_calls(calls, 3, warmup=False)
    assert order == ["a", "b"] * 3
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    with pytest.raises(ValueError, match="clock"):
        bench.time_calls(calls, 1, clock="sundial")
    with pytest.raises(ValueError, match="repeats"):
        bench.time_calls(calls, 0)


def test_flops_and_summary():
    assert bench.attention_flops(8, 4096, 4096, 64) == 4 * 8 * 4096**2 * 64
    assert bench.attention_flops(1, 10, 10, 2, causal=True) == 400
    rows = bench.summarise({"naive_inplace": [2.0, 4.0, 3.0], "flash": [1.5, 1.5, 1.5]},
                           flops=3e9, peak=2e9)
    flash = next(r for r in rows if r["impl"] == "flash")
    assert flash["vs_naive_inplace"] == pytest.approx(0.5)
    assert flash["peak_fraction"] == pytest.approx(1.0)
    assert np.isclose(flash["gflops"], 2.0)
