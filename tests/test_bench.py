"""The benchmark command runs (tiny sizes: a test that it works, not a timing assertion), writes
its JSON with machine details, and flashlib's numerics never import torch."""

from __future__ import annotations

import json
import os
import platform
import shutil
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


def _cpuinfo_flags():
    """The first processor's flags in /proc/cpuinfo (None where it has none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return None


def test_cpu_command_tiny(tmp_path):
    torch = pytest.importorskip("torch")
    # run from the repository root, where _toc.yml is: the widgets must still not be timed
    proc, res = _run(["cpu", "--n", "48", "--heads", "2", "--d", "8", "--repeats", "2",
                      "--blocks", "16x16,8x32", "--causal"], tmp_path)
    assert "torch_sdpa" in proc.stdout and "naive_inplace" in proc.stdout
    assert "causal / non-causal" in proc.stdout
    assert "%|" in proc.stderr  # the tqdm progress bar
    m = res["machine"]
    for key in ("cpu_model", "cpu_count", "numpy", "torch", "blas", "threads", "clock",
                "flashlib", "matplotlib", "threadpoolctl", "architecture"):
        assert key in m, key
    assert m["flashlib"]["version"] == __import__("flashlib").__version__
    x86 = platform.machine() in ("x86_64", "AMD64")
    if sys.platform.startswith("linux") and x86 and shutil.which("lscpu"):
        assert {"family", "model", "flags", "caches"} <= set(m), sorted(m)
    cpuinfo = _cpuinfo_flags()
    if cpuinfo:
        assert m["flags"] == {flag: flag in cpuinfo for flag in bench.CPU_FLAGS}
    if "flags" in m:
        assert list(m["flags"]) == list(bench.CPU_FLAGS)
        assert all(isinstance(present, bool) for present in m["flags"].values()), m["flags"]
        assert not m["flags"]["avx2"] or m["architecture"] in ("x86_64", "AMD64")
    assert m["threads"] == 1 and m["torch_threads"] == 1 and m["clock"] == "cpu"
    backend = res["sdpa_backend"]
    assert backend.split(";")[0] in ("FLASH_ATTENTION", "default (torch's choice)"), backend
    if torch.__version__ == "2.13.0+cpu":  # the pinned CPU build runs the flash backend
        assert backend == "FLASH_ATTENTION"
    assert f"torch SDPA backend: {backend}" in proc.stdout
    assert "widget_redraw" not in res
    assert all(pool["num_threads"] == 1 for pool in m["blas"] if pool["internal_api"] != "openmp")
    assert res["sgemm_peak_gflops"] > 0
    assert [(r["n"], r["causal"]) for r in res["runs"]] == [(48, False), (48, True)]
    impls = {row["impl"] for row in res["runs"][0]["rows"]}
    assert impls == {"naive", "naive_inplace", "flash_v1", "flash", "flash_16x16",
                     "flash_8x32", "torch_sdpa", "torch_naive"}
    assert res["runs"][1]["flops"] == res["runs"][0]["flops"] / 2
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
    # cpu and ladder time the widgets only when asked to (--redraw)
    proc, res = _run(["ladder", "--n", "16", "--heads", "1", "--d", "4", "--repeats", "1",
                      "--no-peak", "--no-progress", "--redraw"], tmp_path, cwd=tmp_path)
    assert [w["widget"] for w in res["widget_redraw"]["widgets"]] == ["draw_line"]


def test_toc_chapters_walks_parts_and_sections(tmp_path):
    for name in ("intro", "a", "b", "c"):
        (tmp_path / f"{name}.md").write_text("# x\n")
    (tmp_path / "d.ipynb").write_text("{}")
    (tmp_path / "_toc.yml").write_text(
        "# root: commented.md\nformat: jb-book\nroot: intro\nparts:\n"
        "  - caption: One\n    chapters:\n      - file: a\n        sections:\n"
        "          - file: b.md\n          - url: https://example.org\n"
        "  - caption: Two\n    chapters:\n      - file: d\n      - file: c  # last\n"
        "      - file: missing\n")
    toc = str(tmp_path / "_toc.yml")
    assert bench.toc_chapters(toc) == [
        str(tmp_path / name) for name in ("intro.md", "a.md", "b.md", "d.ipynb", "c.md")]
    assert bench.toc_chapters(str(tmp_path / "none.yml")) == []


def test_defaults_match_the_sweep_cited_by_flash():
    """The block sweep of ``bench cpu`` is the one flashlib.flash cites for its default tile,
    and ``cpu``/``ladder`` do not execute the chapters unless asked."""
    import inspect
    import re

    from flashlib.flash import BLOCK_K, BLOCK_Q

    with open(os.path.join(ROOT, "flashlib", "flash.py"), encoding="utf-8") as f:
        header = next(line for line in f if re.match(r"#\s+B_r x B_c\s", line))
    cited = tuple((int(r), int(c)) for r, c in re.findall(r"(\d+)x(\d+)", header))
    assert bench.DEFAULT_BLOCKS == cited
    assert (BLOCK_Q, BLOCK_K) in bench.DEFAULT_BLOCKS
    params = inspect.signature(bench.run).parameters
    assert params["blocks"].default == bench.DEFAULT_BLOCKS
    assert params["redraw"].default is False
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 4), dtype=np.float32)
    calls = bench.cpu_calls(q, q, q, causal=False, blocks=bench.DEFAULT_BLOCKS,
                            with_torch=False)
    flash_rows = [name for name in calls if name.startswith("flash_") and name != "flash_v1"]
    assert len(flash_rows) == len(bench.DEFAULT_BLOCKS) - 1  # the default tile is "flash"
    assert f"flash_{BLOCK_Q}x{BLOCK_K}" not in calls and "flash" in calls


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


def test_median_times(monkeypatch):
    now = [0.0]
    durations = {"a": iter([5.0, 3.0, 1.0, 2.0]), "b": iter([1.0, 7.0, 7.0, 0.5])}

    def call(name):
        now[0] += next(durations[name])

    monkeypatch.setitem(bench._CLOCKS, "cpu", lambda: now[0])
    med = bench.median_times({"a": lambda: call("a"), "b": lambda: call("b")}, 3)
    assert med == {"a": 2.0, "b": 7.0}  # the warm-up call (5.0 and 1.0) is not counted
    with pytest.raises(ValueError, match="repeats"):
        bench.median_times({"a": lambda: None}, 0)


def test_tile_breakdown_scales_one_tile_by_the_tile_count(monkeypatch):
    ticks = iter(range(10**6))
    monkeypatch.setitem(bench._CLOCKS, "cpu", lambda: float(next(ticks)))  # every call: 1 s
    parts = bench.tile_breakdown(1, 100, 4, 32, 16, repeats=3)
    assert parts == {"matmuls": 28.0, "exp2 + row sum": 28.0}  # ceil(100/32) * ceil(100/16)


def test_public_helpers_are_exported():
    for name in ("cpu_details", "flashlib_source", "report", "median_times"):
        assert name in bench.__all__ and callable(getattr(bench, name))


def test_flops_and_summary():
    assert bench.attention_flops(8, 4096, 4096, 64) == 4 * 8 * 4096**2 * 64
    assert bench.attention_flops(1, 10, 10, 2, causal=True) == 400
    rows = bench.summarise({"naive_inplace": [2.0, 4.0, 3.0], "flash": [1.5, 1.5, 1.5]},
                           flops=3e9, peak=2e9)
    flash = next(r for r in rows if r["impl"] == "flash")
    assert flash["vs_naive_inplace"] == pytest.approx(0.5)
    assert flash["peak_fraction"] == pytest.approx(1.0)
    assert np.isclose(flash["gflops"], 2.0)


def test_set_threads_says_whether_blas_is_pinned(monkeypatch):
    """A chapter pins one thread without the bench extra when it can, and says so when it
    cannot (threadpoolctl missing): set_threads returns False instead of raising."""
    import builtins

    assert bench.set_threads(1) is True  # threadpoolctl is pinned in requirements.txt
    real_import = builtins.__import__

    def no_threadpoolctl(name, *args, **kwargs):
        if name == "threadpoolctl":
            raise ImportError("No module named 'threadpoolctl'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_threadpoolctl)
    assert bench.set_threads(1) is False
    monkeypatch.undo()
    assert bench.set_threads(1) is True
