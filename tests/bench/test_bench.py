"""The benchmark command (flashlib.bench) runs (tiny sizes: a test that it works, not a timing
assertion), writes its JSON with machine details, and flashlib's numerics never import torch.
The timer it uses is flashlib.core.measure's (tests/core/test_measure.py)."""

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
from flashlib.bench.__main__ import missing_dependencies
from flashlib.core import measure
from flashlib.core.constants import BLOCK_K, BLOCK_Q
from flashlib.studies.ladder import RUNGS
from tools.paths import ROOT


def _run(args, tmp_path, cwd=ROOT):
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONWARNINGS="error",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
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


@pytest.mark.slow  # the benchmark's command line, end to end
def test_cpu_command_tiny(tmp_path):
    torch = pytest.importorskip("torch")
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
    assert "torch_note" not in res
    assert all(pool["num_threads"] == 1 for pool in m["blas"] if pool["internal_api"] != "openmp")
    assert res["sgemm_peak_gflops"] > 0
    assert set(res["sgemm_peaks_gflops"]) == {"numpy", "torch"}
    assert res["sgemm_peaks_gflops"]["numpy"] == res["sgemm_peak_gflops"]
    assert "% own peak" in proc.stdout and "numpy" in proc.stdout
    assert [(r["n"], r["causal"]) for r in res["runs"]] == [(48, False), (48, True)]
    impls = {row["impl"] for row in res["runs"][0]["rows"]}
    assert impls == {"naive", "naive_inplace", "flash_v1", "flash", "flash_16x16",
                     "flash_8x32", "torch_sdpa", "torch_naive"}
    assert res["runs"][1]["flops"] == res["runs"][0]["flops"] / 2
    peaks = res["sgemm_peaks_gflops"]
    for row in res["runs"][0]["rows"]:
        assert len(row["times_s"]) == 2 and row["median_s"] > 0
        assert {"gflops", "peak_fraction", "vs_naive_inplace", "vs_torch_sdpa"} <= set(row)
        # each implementation against its own library's peak, measured once in this run
        lib = "torch" if row["impl"].startswith("torch") else "numpy"
        assert row["peak_library"] == lib
        assert row["peak_fraction"] == pytest.approx(row["gflops"] / peaks[lib])
    assert res["defaults"] == {"block_q": BLOCK_Q, "block_k": BLOCK_K}


def test_ladder_command_tiny_without_torch(tmp_path):
    proc, res = _run(["ladder", "--n", "40", "--heads", "1", "--d", "4", "--repeats", "1",
                      "--no-torch", "--no-peak", "--no-progress"], tmp_path)
    rows = res["runs"][0]["rows"]
    assert [r["impl"] for r in rows][0] == "naive_inplace"
    assert len(rows) == 1 + len(RUNGS)
    assert "threads (wall clock)" in proc.stdout and "10 threads" in proc.stdout
    assert res["runs"][0]["threads_rung"]["speedup"] > 0
    assert "torch" not in res["machine"] and res["sgemm_peak_gflops"] is None
    assert "sdpa_backend" not in res


def test_threads_above_one_force_the_wall_clock(tmp_path):
    proc, res = _run(["ladder", "--n", "24", "--heads", "1", "--d", "4", "--repeats", "1",
                      "--threads", "2", "--no-peak", "--no-progress"], tmp_path)
    assert res["machine"]["clock"] == "wall" and res["machine"]["threads"] == 2
    assert "wall clock" in res["clock_note"] and "wall clock" in proc.stdout


def test_defaults_match_the_sweep_cited_by_constants():
    """The block sweep of ``bench cpu`` is the one flashlib.core.constants cites for the default
    tile."""
    import inspect
    import re

    from flashlib.core.constants import BLOCK_K, BLOCK_Q

    with open(ROOT / "flashlib" / "core" / "constants.py", encoding="utf-8") as f:
        header = next(line for line in f if re.match(r"#\s+B_r x B_c\s", line))
    cited = tuple((int(r), int(c)) for r, c in re.findall(r"(\d+)x(\d+)", header))
    assert bench.DEFAULT_BLOCKS == cited
    assert (BLOCK_Q, BLOCK_K) in bench.DEFAULT_BLOCKS
    params = inspect.signature(bench.run).parameters
    assert params["blocks"].default == bench.DEFAULT_BLOCKS
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 4), dtype=np.float32)
    calls = bench.cpu_calls(q, q, q, causal=False, blocks=bench.DEFAULT_BLOCKS,
                            with_torch=False)
    flash_rows = [name for name in calls if name.startswith("flash_") and name != "flash_v1"]
    assert len(flash_rows) == len(bench.DEFAULT_BLOCKS) - 1  # the default tile is "flash"
    assert f"flash_{BLOCK_Q}x{BLOCK_K}" not in calls and "flash" in calls


def test_numerics_do_not_import_torch():
    code = (
        "import sys, numpy as np, flashlib, flashlib.studies.ladder, flashlib.bench\n"
        "x = np.ones((2, 4, 8), np.float32)\n"
        "flashlib.flash_attention(x, x, x)\n"
        "assert 'torch' not in sys.modules, 'flashlib imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_tile_breakdown_scales_one_tile_by_the_tile_count(monkeypatch):
    ticks = iter(range(10**6))
    monkeypatch.setitem(measure.CLOCKS, "cpu", lambda: float(next(ticks)))  # every call: 1 s
    parts = bench.tile_breakdown(1, 100, 4, 32, 16, repeats=3)
    assert parts == {"matmuls": 28.0, "exp2 + row sum": 28.0}  # ceil(100/32) * ceil(100/16)


def test_public_helpers_are_exported():
    for name in ("cpu_details", "flashlib_source", "report", "run", "tile_breakdown"):
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
    # each implementation against its own library's peak
    rows = bench.summarise({"flash": [1.0], "torch_sdpa": [0.5]}, flops=3e9,
                           peak={"numpy": 6e9, "torch": 12e9})
    fractions = {r["impl"]: (r["peak_fraction"], r["peak_library"]) for r in rows}
    assert fractions == {"flash": (pytest.approx(0.5), "numpy"),
                         "torch_sdpa": (pytest.approx(0.5), "torch")}


def test_sgemm_peaks_measures_each_library_once():
    pytest.importorskip("torch")
    peaks = bench.sgemm_peaks(("numpy", "torch"), sizes=(32, 64), repeats=1)
    assert set(peaks) == {"numpy", "torch"} and all(x > 0 for x in peaks.values())
    assert bench.own_library("torch_sdpa") == "torch" and bench.own_library("flash") == "numpy"
    with pytest.raises(ValueError, match="library"):
        bench.sgemm_peaks(("mkl",), sizes=(8,), repeats=1)


def test_torch_missing_is_reported_not_a_traceback(tmp_path, monkeypatch):
    """Without torch the cpu suite times everything else and says why torch is left out (the
    packaging test runs the command in a venv without torch)."""
    from flashlib.bench import suites

    monkeypatch.setattr(suites, "torch_available", lambda: False)
    res = bench.run("cpu", ns=[16], heads=1, d=4, repeats=1, blocks=[(8, 8)],
                    peak_sgemm=False, progress=False)
    assert "torch is not installed" in res["torch_note"]
    assert "torch_sdpa" not in {row["impl"] for row in res["runs"][0]["rows"]}
    assert res["torch_note"] in bench.report(res)
    assert "torch_note" not in bench.run("cpu", ns=[16], heads=1, d=4, repeats=1,
                                         blocks=[(8, 8)], with_torch=False, peak_sgemm=False,
                                         progress=False)


def test_missing_bench_dependencies_are_named(monkeypatch, capsys):
    import importlib.util

    from flashlib.bench import __main__ as cli

    assert missing_dependencies() == []  # the test environment has the bench extra
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tqdm" else real(name, *a))
    assert cli.main(["cpu"]) == 2
    err = capsys.readouterr().err
    assert "tqdm" in err and 'pip install "flashlib[bench]"' in err


@pytest.mark.parametrize("args", [["--blocks", "16xq"], ["--repeats", "0"], ["--threads", "0"]])
def test_bad_options_are_usage_errors(args, capsys):
    from flashlib.bench import __main__ as cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ladder", "--n", "8", "--heads", "1", "--d", "2", "--no-peak",
                  "--no-progress", *args])
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


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
@pytest.mark.slow  # the benchmark's command line, end to end
def test_targets_command_tiny(tmp_path):
    """``targets``: every figure against its target, the BLAS kernel, the exp2 state, the load,
    the raw medians; with more than one core the wall-clock figures too."""
    pytest.importorskip("torch")
    proc, res = _run(["targets", "--n", "64", "--heads", "2", "--d", "8", "--repeats", "1",
                      "--threads", "2", "--no-progress"], tmp_path)
    from flashlib.bench.targets import BACKWARD_FLOPS, REPORTED, TARGETS

    assert set(res["figures"]) == {key for key, *_ in TARGETS} | {key for key, _ in REPORTED}
    # torch's backward alone is a difference of two medians: at this size on a loaded machine
    # it may be noise, and then its two figures are skipped, saying why
    noisy = {"bwd_peak_ratio", "bwd_1t_vs_torch"} if "torch_backward_note" in res else set()
    assert all(res["figures"][key] is not None and res["figures"][key] > 0
               for key in res["figures"] if key not in noisy)
    if noisy:
        assert res["torch_backward_note"] in proc.stdout
        return
    for _, text, op, target in TARGETS:
        assert text.format(t=2) in proc.stdout and f"{op} {target:g}" in proc.stdout
    for _, text in REPORTED:
        assert text.format(t=2) in proc.stdout
    # the fractions of each library's own peak, both peaks measured once in this run
    peaks, fr, one = res["sgemm_peaks_gflops"], res["peak_fractions"], res["one_thread_s"]
    flops = res["flops"]["forward"]
    assert res["flops"]["backward"] == BACKWARD_FLOPS * flops
    assert fr["flash"] == pytest.approx(flops / one["flash"] / peaks["numpy"] / 1e9)
    assert fr["torch_sdpa"] == pytest.approx(flops / one["torch_sdpa"] / peaks["torch"] / 1e9)
    assert fr["torch_backward"] == pytest.approx(
        BACKWARD_FLOPS * flops / res["torch_backward_only_s"] / peaks["torch"] / 1e9)
    assert res["figures"]["fwd_peak_ratio"] == pytest.approx(fr["flash"] / fr["torch_sdpa"])
    assert res["figures"]["bwd_peak_ratio"] == pytest.approx(
        fr["flash_backward"] / fr["torch_backward"])
    assert "fraction of its own library's peak" in proc.stdout and "sgemm peak" in proc.stdout
    assert "kernel" in proc.stdout and "exp2 / exp" in proc.stdout
    assert res["exp2_state"]["ratio"] > 0 and isinstance(res["exp2_state"]["slow"], bool)
    assert "torch autograd backward only" in proc.stdout
    assert set(res["threads_speedup"]) == {"flash", "flash_backward", "torch_sdpa"}
    assert res["machine"]["threads"] == 1
    if hasattr(os, "getloadavg"):
        assert "load average" in proc.stdout and len(res["load_average"]["after"]) == 3


def test_targets_report_says_when_exp2_is_slow_or_a_figure_is_missed():
    from flashlib.bench.targets import TARGETS, format_targets

    res = {
        "n": 8, "heads": 1, "d": 2, "dtype": "float32", "repeats": 1, "threads": 1,
        "machine": {"cpu_model": "x", "cpu_count": 1, "numpy": "2", "blas": [],
                    "env": {"OPENBLAS_CORETYPE": "Haswell"}},
        "exp2_state": {"ratio": 3.5, "exp2_us": 70.0, "exp_us": 20.0, "slow": True},
        "figures": dict.fromkeys((key for key, *_ in TARGETS), None)
        | {"fwd_peak_ratio": 0.9, "logits30_vs_normal": 1.2},
        "one_thread_s": {"flash": 1.0}, "memory_bytes": {"flash_backward": 1,
                                                         "naive_backward": 10},
        "threads_note": "1 core(s): skipped",
    }
    text = format_targets(res)
    assert "SLOW-EXP2 STATE" in text and "OPENBLAS_CORETYPE" in text
    assert "MISSED" in text and "met" in text and "skipped" in text


def test_exp2_state_is_a_ratio():
    state = bench.exp2_state(repeats=3)
    assert state["ratio"] == pytest.approx(state["exp2_us"] / state["exp_us"])
    assert state["slow"] == (state["ratio"] > 1.5)


@pytest.mark.parametrize("args, says", [
    (["--n", "0"], "--n must be a positive integer, got 0"),
    (["--heads", "0"], "--heads must be a positive integer, got 0"),
    (["--d", "0"], "--d must be a positive integer, got 0"),
    (["--d", "-3"], "--d must be a positive integer, got -3"),
    (["--n", "x"], "--n must be a positive integer, got 'x'"),
    (["--n", "3000000"], "choose a smaller --n"),
    (["--out", "."], "it is a folder"),
])
def test_sizes_memory_and_out_are_checked_before_the_run(args, says, capsys, monkeypatch):
    from flashlib.bench import __main__ as cli
    from flashlib.bench import suites

    ran = []
    monkeypatch.setattr(suites, "run", lambda *a, **k: ran.append(1))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["cpu", "--no-peak", "--no-progress", *args])
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err
    assert not ran


def test_out_that_cannot_be_created_is_refused_before_the_run(tmp_path, capsys):
    from flashlib.bench import __main__ as cli

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit):
        cli.main(["cpu", "--out", str(blocker / "sub" / "x.json")])
    assert "cannot write the results there" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_accuracy_command(tmp_path, capsys):
    from flashlib.bench import __main__ as cli

    out = tmp_path / "acc.json"
    assert cli.main(["accuracy", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "the rule held in every case" in text and "scale=1e8" in text
    assert json.loads(out.read_text())["failures"] == []
