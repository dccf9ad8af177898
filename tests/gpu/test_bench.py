"""``python -m flashlib.bench gpu``: what can be tested without a GPU, the options, the case
grid, the TFLOP/s accounting, the results file's schema and provenance, the plain "no CUDA"
exit, and the timing loop itself with a stand-in timer on CPU tensors (the Triton kernels in the
interpreter, SDPA, naive PyTorch)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from flashlib.bench import gpu as gb
from flashlib.gpu import results

HAVE_GPU_STACK = all(importlib.util.find_spec(m) for m in ("torch", "triton"))


def test_default_sweep_is_the_issue_s():
    args = gb.parse_args([])
    cases = gb.plan(args)
    assert args.n == [512, 1024, 2048, 4096, 8192, 16384] and args.d == [64, 128]
    assert args.dtype == ["float16", "bfloat16"] and args.passes == ["fwd", "fwd+bwd"]
    assert set(args.impl) == {"triton", "flash_attn", "sdpa_flash", "sdpa_efficient",
                              "sdpa_cudnn", "sdpa_math", "naive_torch"}
    assert len(cases) == 6 * 2 * 2 * 2 * 2 * 7
    assert {c.causal for c in cases} == {False, True}
    # flash-attn's benchmark sizes: 16k tokens, hidden 2048
    assert all(c.batch * c.n == 16384 and c.heads * c.d == 2048 for c in cases)


def test_options_narrow_the_sweep():
    args = gb.parse_args(["--n", "1000", "--d", "96", "--dtype", "float32", "--impl", "triton",
                          "--pass", "fwd", "--causal-only", "--tokens", "4000"])
    assert gb.plan(args) == [gb.Case("triton", "fwd", "float32", True, 1000, 96, 4, 21)]
    assert len(gb.plan(gb.parse_args(["--no-causal", "--impl", "triton"]))) == 48


@pytest.mark.parametrize("argv", [["--d", "8"], ["--n", "0"], ["--impl", "cudnn"],
                                  ["--dtype", "int8"], ["--causal-only", "--no-causal"],
                                  ["--pass", "bwd"]])
def test_bad_options_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        gb.parse_args(argv)
    assert exit_.value.code == 2 and "usage:" in capsys.readouterr().err


def test_plan_lists_cases_without_a_gpu(capsys):
    assert gb.main(["--plan", "--n", "512", "--d", "64", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert "impl=flash_attn passes=fwd+bwd dtype=float16 causal=True n=512 d=64" in out
    assert out.strip().endswith("28 cases")


@pytest.mark.skipif(not HAVE_GPU_STACK, reason="needs torch and triton")
def test_no_cuda_is_said_plainly_with_status_1(tmp_path, capsys):
    """``python -m flashlib.bench gpu`` (its main) on this machine: a sentence, status 1,
    nothing written."""
    import torch

    from flashlib.bench.__main__ import main

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    assert main(["gpu", "--out", str(tmp_path / "gpu.json")]) == 1
    err = capsys.readouterr().err
    assert "needs a CUDA GPU, and torch sees none on this machine" in err
    assert "torch.cuda.is_available() is False" in err
    assert not (tmp_path / "gpu.json").exists()


# ---- accounting and the data file --------------------------------------------------------------

def test_tflops_accounting():
    # 4 * batch * heads * n^2 * d FLOPs per forward
    assert results.attention_flops(2, 16, 1024, 1024, 64) == 4 * 2 * 16 * 1024**2 * 64
    assert results.attention_flops(1, 1, 10, 10, 16, causal=True) == 4 * 100 * 16 / 2
    assert results.attention_flops(1, 1, 10, 10, 16, passes="bwd") == 2.5 * 4 * 100 * 16
    assert results.attention_flops(1, 1, 10, 10, 16, passes="fwd+bwd") == 3.5 * 4 * 100 * 16
    # 1 ms for 4 * 16 * 32 * 1024^2 * 64 FLOPs: 137.4 TFLOP/s; causal counts half
    assert results.tflops(1.0, 16, 32, 1024, 64) == pytest.approx(137.438953472)
    assert results.tflops(1.0, 16, 32, 1024, 64, causal=True) == pytest.approx(68.719476736)
    with pytest.raises(ValueError, match="ms must be a positive time"):
        results.tflops(0.0, 1, 1, 1, 16)
    with pytest.raises(ValueError, match="passes must be one of"):
        results.attention_flops(1, 1, 1, 1, 16, passes="backward")
    with pytest.raises(TypeError, match="batch must be an integer"):
        results.attention_flops(1.0, 1, 1, 1, 16)


def _file(rows) -> dict:
    return {"schema": results.SCHEMA, "command": "python -m flashlib.bench gpu",
            "provenance": {key: None for key in results.PROVENANCE_KEYS}, "settings": {},
            "rows": rows}


def test_schema_accepts_what_make_row_writes_and_catches_corruption(tmp_path):
    good = _file([results.make_row("triton", "fwd", "float16", True, 1024, 64, 16, 32, ms=1.0,
                                   peak_bytes=10),
                  results.make_row("flash_attn", "fwd", "float16", True, 1024, 64, 16, 32,
                                   error="flash-attn is not installed")])
    assert results.check_results(good) == []
    assert good["rows"][0]["tflops"] == pytest.approx(68.719476736)
    bad = json.loads(json.dumps(good))
    bad["rows"][0]["tflops"] = 99.0
    del bad["provenance"]["driver"]
    bad["rows"][1]["error"] = None
    problems = results.check_results(bad)
    assert any("does not follow from ms" in p for p in problems)
    assert "provenance lacks 'driver'" in problems
    assert any("needs either ms or error" in p for p in problems)
    assert results.check_results([]) == ["a results file holds a JSON object, got list"]
    with pytest.raises(ValueError, match="not both or neither"):
        results.make_row("triton", "fwd", "float16", False, 1, 16, 1, 1)

    assert results.tflops_by_impl(good, n=1024, d=64, causal=True, dtype="float16") == {
        "triton": pytest.approx(68.719476736), "flash_attn": None}
    assert results.tflops_by_impl(good, n=512, d=64, causal=True, dtype="float16") == {}

    (tmp_path / "a.json").write_text(json.dumps(good))
    assert results.load_results([tmp_path]) == [good]
    (tmp_path / "b.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"b\.json: .*does not follow from ms"):
        results.load_results([tmp_path])


def test_provenance_names_every_field(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(gb, "_nvidia_smi", lambda field: {"driver_version": "570.86.15",
                                                          "memory.total": "143771 MiB"}[field])
    prov = gb.provenance()
    assert set(results.PROVENANCE_KEYS) <= set(prov)
    assert prov["driver"] == "570.86.15" and prov["torch"] and prov["date"].endswith("+00:00")
    assert "version" in prov["flashlib"]


# ---- the timing loop, on CPU tensors with a stand-in timer ------------------------------------

@pytest.mark.skipif(not HAVE_GPU_STACK, reason="needs torch and triton")
def test_run_cases_on_cpu_with_a_stand_in_timer():
    """Every implementation through the same loop: rows with times where they run here, the
    reason where not (flash-attn missing, SDPA backends that refuse the CPU)."""
    import flashlib.gpu  # noqa: F401  (before triton)

    calls = []

    def timer(fn, grads):
        fn()
        calls.append(len(grads))
        return 2.0

    cases = [gb.Case(impl, passes, "float32", causal, 32, 16, 1, 2)
             for impl in gb.DEFAULT_IMPLS for passes in ("fwd", "fwd+bwd")
             for causal in (False, True)]
    seen = []
    rows = gb.run_cases(cases, device="cpu", timer=timer, peak=lambda fn: None,
                        progress=False, on_row=lambda rows: seen.append(len(rows)))
    assert seen == list(range(1, len(cases) + 1))
    assert results.check_results(_file(rows)) == []
    by = {(r["impl"], r["pass"], r["causal"]): r for r in rows}
    for impl in ("triton", "sdpa_math", "naive_torch"):
        for passes in ("fwd", "fwd+bwd"):
            row = by[(impl, passes, True)]
            assert row["ms"] == 2.0 and row["error"] is None, row
            assert row["tflops"] == pytest.approx(
                results.tflops(2.0, 1, 2, 32, 16, causal=True, passes=passes))
    assert "flash-attn is not installed" in by[("flash_attn", "fwd", False)]["error"]
    assert by[("sdpa_efficient", "fwd", False)]["error"].startswith(
        "sdpa_efficient cannot run these inputs here")
    assert set(calls) == {0, 3}  # fwd+bwd resets the three gradients between calls


@pytest.mark.skipif(not HAVE_GPU_STACK, reason="needs torch and triton")
def test_main_on_a_pretend_gpu_writes_a_valid_file(tmp_path, monkeypatch, capsys):
    """The command's path on a CUDA machine, with the GPU and the timing loop stood in: the
    provenance, partial saves, the schema check, the table and the file."""
    import flashlib.gpu
    from flashlib.gpu.device import decide

    caps = decide(torch_version="2.13.0", triton_version="3.7.1", cuda_version="12.8",
                  device_name="NVIDIA H200", compute_capability=(9, 0))
    monkeypatch.setattr(flashlib.gpu, "capabilities", lambda: caps)
    out = tmp_path / "gpu.json"

    def fake_run(cases, *, timer, progress, on_row):
        rows = []
        for i, c in enumerate(cases):
            kw = dict(ms=0.5 * (i + 1), peak_bytes=1000) if c.impl != "flash_attn" else dict(
                error="flash-attn is not installed")
            rows.append(results.make_row(c.impl, c.passes, c.dtype, c.causal, c.n, c.d,
                                         c.batch, c.heads, **kw))
            on_row(rows)
            if len(rows) == 10:  # a partial save happened
                assert len(json.loads(out.read_text())["rows"]) == 10
        return rows

    monkeypatch.setattr(gb, "run_cases", fake_run)
    argv = ["--n", "512", "1024", "--d", "64", "--dtype", "float16", "--out", str(out)]
    assert gb.main(argv) == 0
    data = json.loads(out.read_text())
    assert results.check_results(data) == [] and len(data["rows"]) == 56
    assert data["provenance"]["gpu"] == "NVIDIA H200"
    assert data["provenance"]["compute_capability"] == "9.0"
    assert data["command"] == "python -m flashlib.bench gpu " + " ".join(argv)
    printed = capsys.readouterr().out
    assert "TFLOP/s" in printed and "triton" in printed and f"wrote {out}" in printed
