"""The GPU chapter (book/gpu.md) where torch and triton are missing: every code cell runs and
prints plain sentences, never a traceback; and its diagram and exercise stand-ins."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from flashlib.book.chapters.gpu import launch_grid_diagram
from flashlib.book.exercises.gpu import triton_stand_ins
from tools.paths import ROOT

PAGE = ROOT / "book" / "gpu.md"


def _code_cells(text: str) -> list[str]:
    """The page's code cells' sources, in order (MyST ```{code-cell} blocks)."""
    cells, current = [], None
    for line in text.splitlines():
        if current is None and line.startswith("```{code-cell}"):
            current = []
        elif current is not None and line.startswith("```"):
            cells.append("\n".join(f"print({x})" if x.startswith("check_") else x
                                   for x in current if not x.startswith(":tags:")))
            current = None
        elif current is not None:
            current.append(line)
    return cells


@pytest.mark.slow  # runs the GPU chapter's cells
@pytest.mark.parametrize("blocked", [("torch", "triton", "flash_attn"), ("triton",)],
                         ids=["no-torch-no-triton", "torch-without-triton"])
def test_page_without_triton_prints_plain_sentences(tmp_path, blocked):
    """As on a machine with numpy only, or with torch but no triton wheel (macOS, Windows)."""
    from tests.gpu.test_device import BLOCK_TORCH_AND_TRITON

    block = textwrap.dedent(BLOCK_TORCH_AND_TRITON).replace(
        '("torch", "triton", "flash_attn")', repr(tuple(blocked)))
    assert repr(tuple(blocked)) in block
    script = block + "\ndisplay = print\n"
    script += "\n\n".join(_code_cells(PAGE.read_text(encoding="utf-8")))
    (tmp_path / "page.py").write_text(script, encoding="utf-8")
    ran = subprocess.run([sys.executable, "page.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    out = ran.stdout
    assert "Triton kernels: not here." in out
    missing = "torch and triton are" if "torch" in blocked else "triton is"
    assert f"{missing} not installed" in out
    assert "this exercise runs a Triton kernel, which cannot run here" in out
    if "torch" not in blocked:
        assert "sdpa_math: ran" in out


def test_launch_grid_diagram_counts_the_tiles():
    dg = launch_grid_diagram(n=1024, B_r=128, B_c=64, causal=True, program=5)
    svg = dg.svg()
    assert "72 of 128 tiles are visited" in dg.alt and svg.startswith("<svg")
    assert "12 K" in svg  # program 5 streams 12 key tiles of 64: keys 0 .. 767
    # programs numbered from 1 for the reader, as the boxes count blocks: code's 5 is "6"
    assert "Program 6 is highlighted" in dg.alt and "Program 6 (framed)" in svg
    assert ">1</text>" in svg and ">0</text>" not in svg
    with pytest.raises(ValueError, match="program"):
        launch_grid_diagram(n=256, B_r=128, B_c=64, causal=False, program=2)


def test_triton_stand_ins_leave_functions_alone():
    triton, tl = triton_stand_ins()

    @triton.jit
    def piece(i, CAUSAL: tl.constexpr):
        return i

    assert piece(3, True) == 3 and "triton cannot run here" in repr(tl.constexpr)
