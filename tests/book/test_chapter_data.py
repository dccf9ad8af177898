"""The data the backward and GPU chapters' widgets draw (flashlib.book.chapters): JSON-able,
small, fast, and equal to what the numerics compute."""

from __future__ import annotations

import json
import time

import pytest

from flashlib.book.chapters import backward as wd
from flashlib.book.chapters.gpu import launch_grid_widget_data
from flashlib.studies import backward as g
from flashlib.studies import io_model as io

# --- the backward widget --------------------------------------------------------------------

def test_backward_widget_frame():
    one = wd.backward_widget_frame(1024, 128, "backward")
    two = wd.backward_widget_frame(1024, 128, "two_pass_backward")
    for f in (one, two):
        json.dumps(f)
        assert f["saved"]["standard"] == g.saved_bytes(1024, 1024, 64, "standard")
        assert f["saved"]["flash"] == g.saved_bytes(1024, 1024, 64, "flash")
        assert f["traffic"]["total"] == io.traffic(f["order"], 1024, 1024, 64, B_r=128,
                                                   B_c=128).total
        assert (f["programs"]["n_q"], f["programs"]["B_r"], f["programs"]["T_r"]) == (1024, 128,
                                                                                     8)
    assert one["flops"]["ratio"] == 2.5 and two["flops"]["ratio"] == 3.5
    assert one["flops_standard"]["ratio"] == 2.0
    assert one["programs"]["shared"] == ["dQ"] and two["programs"]["shared"] == []
    assert one["programs"]["writers"]["dQ"] == [8] * 8
    # a block larger than n is clipped; a ragged n runs the full problem
    assert wd.backward_widget_frame(100, 256, "backward")["B"] == 100
    ragged = wd.backward_widget_frame(100, 32, "two_pass_backward")["programs"]
    assert (ragged["T_r"], ragged["n_q"]) == (4, 100)


def test_backward_widget_data_is_small_and_fast():
    start = time.process_time()
    data = wd.backward_widget_data([256, 512], [64, 128])
    assert time.process_time() - start < 5
    assert sorted(data["frames"]) == sorted(f"{n}-{b}-{o}" for n in (256, 512) for b in (64, 128)
                                            for o in ("backward", "two_pass_backward"))
    assert len(json.dumps(data)) < 100_000




def test_backward_widget_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="order must be one of"):
        wd.backward_widget_frame(64, 16, "v1")
    with pytest.raises(ValueError, match="B must be a positive integer"):
        wd.backward_widget_frame(64, 0, "backward")


# --- the GPU chapter's launch-grid widget ------------------------------------------------------

def test_launch_grid_widget_data_stops_where_the_kernel_does():
    from flashlib.gpu.grid import cdiv, key_block_end

    data = launch_grid_widget_data([40, 100], [16, 32], [16], d=64)
    assert data["d"] == 64 and len(data["configs"]) == 2 * 2 * 1 * 2
    json.dumps(data)
    assert data["configs"]["100-32-16-off"] == [100] * cdiv(100, 32)
    causal = data["configs"]["100-32-16-on"]
    assert causal == [key_block_end(p, 32, 100, True) for p in range(4)]
    assert causal == [32, 64, 96, 100]  # each block stops after its last row, never past n
    with pytest.raises(ValueError, match="d"):
        launch_grid_widget_data([40], [16], [16], d=0)
