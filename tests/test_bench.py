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


def _run(args, tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONWARNINGS="error")
    proc = subprocess.run(
        [sys.executable, "-m", "flashlib.bench", *args, "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_cpu_command_tiny(tmp_path):
    proc, res = _run(["cpu", "--n", "48", "--heads", "2", "--d", "8", "--repeats", "2",
                      "--blocks", "16x16,8x32", "--causal"], tmp_path)
    assert "torch_sdpa" in proc.stdout and "naive_inplace" in proc.stdout
    assert "causal / non-causal" in proc.stdout
    assert "%|" in proc.stderr  # the tqdm progress bar
    m = res["machine"]
    for key in ("cpu_model", "cpu_count", "numpy", "torch", "blas", "threads", "clock"):
        assert key in m, key
    assert m["threads"] == 1 and m["torch_threads"] == 1
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
