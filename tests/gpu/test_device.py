"""flashlib.gpu's plumbing: capability detection (every kind of machine, by its one rule
function), Triton's interpreter set-up and import order, the page's plain messages without
torch or triton, the launch grid, and the implementations layer (layouts, SDPA backends)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from flashlib.gpu import grid
from flashlib.gpu.device import INTERPRETER_BF16_REASON, decide
from tools.paths import ROOT

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_TRITON = importlib.util.find_spec("triton") is not None


def _python(code: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=300)


# ---- the rules, one machine at a time ---------------------------------------------------------

BOTH = {"torch_version": "2.13.0", "triton_version": "3.7.1"}


def test_hopper_with_flash_attn_runs_everything():
    caps = decide(**BOTH, flash_attn_version="2.8.3", cuda_version="12.8",
                  device_name="NVIDIA H100", compute_capability=(9, 0))
    assert caps.mode == "cuda" and caps.device == "cuda" and caps.flash_attn and caps.sdpa
    assert caps.dtype_refusal("bfloat16") is None and caps.notes == ()
    assert "compiled for NVIDIA H100 (compute capability 9.0)" in caps.summary()


def test_turing_runs_triton_and_sdpa_and_flash_attn_says_why_not():
    caps = decide(**BOTH, flash_attn_version="2.8.3", device_name="Tesla T4",
                  compute_capability=(7, 5))
    assert caps.mode == "cuda" and not caps.flash_attn and caps.sdpa
    assert any("flash-attn refuses this GPU (Tesla T4, compute capability 7.5)" in n
               for n in caps.notes)
    assert "bfloat16 needs compute capability 8.0" in caps.dtype_refusal("bfloat16")
    assert caps.dtype_refusal("float16") is None


def test_pascal_falls_back_to_the_interpreter():
    caps = decide(**BOTH, device_name="Tesla P100", compute_capability=(6, 0))
    assert caps.mode == "interpreter" and caps.device == "cpu"
    assert any("older than Triton supports (7.0, Volta)" in n for n in caps.notes)


def test_no_gpu_runs_the_interpreter_and_refuses_bfloat16():
    caps = decide(**BOTH)
    assert caps.mode == "interpreter" and not caps.cuda and not caps.flash_attn
    assert caps.dtype_refusal("bfloat16") == INTERPRETER_BF16_REASON
    assert "interpreter on the CPU" in caps.summary()
    assert any("flash-attn is not installed" in n and "--no-build-isolation" in n
               for n in caps.notes)


def test_the_environment_variable_wins():
    forced = decide(**BOTH, device_name="NVIDIA A100", compute_capability=(8, 0),
                    interpret_env="1")
    assert forced.mode == "interpreter" and "although a CUDA GPU is present" in forced.notes[0]
    off = decide(**BOTH, interpret_env="0")
    assert off.mode == "unavailable" and not off.triton
    assert "there is no CUDA GPU here; unset TRITON_INTERPRET" in off.notes[0]


def test_old_triton_interpreter_with_new_numpy_is_refused_in_words():
    """Triton 3.6's interpreter calls int() on one-element arrays, an error from numpy 2.4."""
    old = decide(torch_version="2.11.0", triton_version="3.6.0", numpy_version="2.4.6")
    assert old.mode == "unavailable" and "install triton>=3.7" in old.notes[0]
    assert decide(torch_version="2.11.0", triton_version="3.6.0",
                  numpy_version="2.3.5").mode == "interpreter"
    assert decide(torch_version="2.11.0", triton_version="3.6.0", numpy_version="2.5.2",
                  compute_capability=(9, 0)).mode == "cuda"  # compiled: no interpreter
    assert decide(**BOTH, numpy_version="2.4.6").mode == "interpreter"


@pytest.mark.parametrize(("torch_version", "triton_version", "missing"), [
    (None, "3.7.1", "torch is not installed"),
    ("2.13.0", None, "triton is not installed"),
    (None, None, "torch and triton are not installed"),
])
def test_missing_packages_are_named(torch_version, triton_version, missing):
    caps = decide(torch_version=torch_version, triton_version=triton_version)
    assert caps.mode == "unavailable" and missing in caps.notes[0]
    assert 'pip install "flashlib[gpu]"' in caps.notes[0]
    assert caps.sdpa == (torch_version is not None)


# ---- import order and the page without torch or triton ---------------------------------------

@pytest.mark.skipif(not (HAVE_TORCH and HAVE_TRITON), reason="needs torch and triton")
def test_import_sets_the_interpreter_before_any_kernel(monkeypatch):
    """Without a GPU, ``import flashlib.gpu`` sets TRITON_INTERPRET=1 before any kernel is
    defined, so the kernels are interpreted functions; TRITON_INTERPRET=0 there is refused in
    words when a kernel is asked for."""
    import flashlib.gpu
    from flashlib.gpu import kernels

    caps = flashlib.gpu.capabilities()
    if caps.mode == "cuda":
        pytest.skip("a CUDA GPU is present: the kernels are compiled")
    assert os.environ["TRITON_INTERPRET"] == "1" and kernels.interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(flashlib.gpu.GPUUnavailable, match="there is no CUDA GPU here"):
        flashlib.gpu.require_kernels()


@pytest.mark.skipif(not (HAVE_TORCH and HAVE_TRITON), reason="needs torch and triton")
def test_importing_triton_first_is_explained():
    """``import triton`` before flashlib.gpu builds Triton's own library (tl.zeros, tl.max...)
    compiled; the kernels then refuse, saying what to do, instead of failing deep inside."""
    wrong = _python("""
        import torch
        if torch.cuda.is_available():
            print("import flashlib.gpu before triton"); raise SystemExit(0)
        import triton, flashlib.gpu
        from flashlib.gpu.triton_attention import triton_attention
        x = torch.randn(1, 1, 8, 16)
        try:
            triton_attention(x, x, x)
        except flashlib.gpu.GPUUnavailable as err:
            print(err)
    """)
    assert wrong.returncode == 0 and "Traceback" not in wrong.stderr, wrong.stderr[-3000:]
    assert "import flashlib.gpu before triton" in wrong.stdout


BLOCK_TORCH_AND_TRITON = """
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "triton", "flash_attn"):
                raise ModuleNotFoundError(f"No module named {name!r}")
    sys.meta_path.insert(0, Block())
    import importlib.util
    importlib.util.find_spec = (lambda f: lambda name, *a: None
                                if name.split(".")[0] in ("torch", "triton", "flash_attn")
                                else f(name, *a))(importlib.util.find_spec)
"""


def test_without_torch_and_triton_everything_says_so_plainly():
    """What the chapter and the benchmark do on a machine with numpy only: no traceback."""
    ran = _python(BLOCK_TORCH_AND_TRITON + """
    import flashlib.gpu
    caps = flashlib.gpu.capabilities()
    print(caps.summary())
    from flashlib.gpu import grid, results
    print(grid.launch_grid(1000, 8, 128))
    from flashlib.book.exercises import gpu as ex
    print(ex.check_key_end(None))
    from flashlib.bench.__main__ import main
    print("exit", main(["gpu", "--n", "512"]))
    """)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    out = ran.stdout
    assert "Triton kernels: not here." in out and "torch and triton are not installed" in out
    assert "(8, 8)" in out
    assert "this exercise runs a Triton kernel, which cannot run here" in out
    assert "exit 2" in out and 'pip install "flashlib[bench,gpu]"' in ran.stderr


# ---- the launch grid --------------------------------------------------------------------------

def test_launch_grid_and_tiles():
    assert grid.launch_grid(1000, 32, 128) == (8, 32)
    assert grid.head_dim_block(16) == 16 and grid.head_dim_block(80) == 128
    assert grid.head_dim_block(1) == 16 and grid.head_dim_block(64) == 64
    assert grid.tiles_per_program(256, 256, 64, 64) == [4, 4, 4, 4]
    assert grid.tiles_per_program(256, 256, 64, 64, causal=True) == [1, 2, 3, 4]
    assert grid.tiles_per_program(100, 40, 32, 16, causal=True) == [2, 3, 3, 3]
    counts = grid.tile_counts(256, 256, 64, 64, causal=True)
    assert counts == {"visited": 10, "all": 16, "skipped": 6, "masked": 4}
    assert grid.tile_map(100, 100, 32, 32, causal=True).tolist() == [
        [2, 0, 0, 0], [1, 2, 0, 0], [1, 1, 2, 0], [1, 1, 1, 2]]
    assert grid.tile_map(100, 100, 64, 32).tolist() == [[1, 1, 1, 2], [1, 1, 1, 2]]
    assert grid.tile_counts(16384, 16384, 16, 16, causal=True)["visited"] == 1024 * 1025 // 2
    ragged = grid.tile_counts(100, 100, 64, 64)
    assert ragged["visited"] == 4 and ragged["masked"] == 2  # the last key tile runs past n
    with pytest.raises(ValueError, match="n_q must be a positive integer"):
        grid.launch_grid(0, 1, 64)
    with pytest.raises(TypeError, match="B_r must be an integer"):
        grid.tiles_per_program(10, 10, 1.5, 16)


def test_configs_fall_back_to_smaller_tiles():
    assert grid.configs(64, "float16", "interpreter") == [grid.Config(64, 64, 1, 1)]
    cuda = grid.configs(128, "float32", "cuda")
    assert cuda[0] == grid.Config(128, 32, 8, 2)
    assert cuda[-1].B_r * cuda[-1].B_c < cuda[0].B_r * cuda[0].B_c
    for d, dtype in ((16, "float16"), (64, "bfloat16"), (128, "float16"), (96, "float32")):
        for cfg in grid.configs(d, dtype, "cuda"):
            assert cfg.B_r >= 16 and cfg.B_c >= 16 and not cfg.B_r & (cfg.B_r - 1)


# ---- the implementations layer ---------------------------------------------------------------

@pytest.mark.skipif(not (HAVE_TORCH and HAVE_TRITON), reason="needs torch and triton")
def test_layouts_and_sdpa_backends_in_one_place():
    import torch

    import flashlib.gpu  # noqa: F401  (before triton)
    from flashlib.gpu import GPUUnavailable
    from flashlib.gpu.implementations import (
        IMPLEMENTATIONS,
        attention,
        sdpa_attention,
        to_layout,
        unavailable_reason,
    )

    x = torch.randn(2, 3, 5, 16)
    assert to_layout(x, "bhnd", "bnhd").shape == (2, 5, 3, 16)
    assert to_layout(to_layout(x, "bhnd", "bnhd"), "bnhd", "bhnd").equal(x)
    with pytest.raises(ValueError, match="dst must be one of"):
        to_layout(x, "bhnd", "nhd")
    assert IMPLEMENTATIONS["flash_attn"].layout == "bnhd"
    assert {i.layout for n, i in IMPLEMENTATIONS.items() if n != "flash_attn"} == {"bhnd"}

    if torch.cuda.is_available():
        pytest.skip("the CPU behaviour of SDPA's backends")
    with pytest.raises(GPUUnavailable, match="flash_attn: flash-attn is not installed"):
        attention(x, x, x, "flash_attn")
    # a backend that cannot run on this device: PyTorch's reasons, no warning leaks out
    with pytest.raises(GPUUnavailable, match="sdpa_efficient cannot run these inputs here"):
        sdpa_attention(x, x, x, backend="sdpa_efficient")
    math_o = sdpa_attention(x, x, x, causal=True, backend="sdpa_math")
    assert torch.allclose(math_o, attention(x, x, x, "naive_torch", causal=True), atol=1e-6)
    assert "bottom-right" in unavailable_reason(
        "flash_attn", torch.float16,
        flashlib.gpu.device.decide(torch_version="2", triton_version="3",
                                   flash_attn_version="2.8", compute_capability=(8, 0)),
        n_q=10, n_k=20, causal=True)
    with pytest.raises(ValueError, match="name must be one of"):
        unavailable_reason("cudnn", torch.float16)
