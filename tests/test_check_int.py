"""The one integer check (flashlib._validate.check_int) and the arguments that use it: floats and
booleans are a TypeError, values below the minimum a ValueError, each naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib import causal_mask, flash_attention, online_softmax, softmax
from flashlib._validate import check_block, check_int
from flashlib.flash import workspace_bytes
from flashlib.masks import causal_tiles
from flashlib.memory import random_qkv, score_matrix_bytes
from flashlib.online import partial_blocks


@pytest.mark.parametrize("good", [0, 3, np.int64(3), np.int32(-2), np.uint8(7)])
def test_check_int_accepts_python_and_numpy_integers(good):
    assert check_int(good, "n") == int(good) and type(check_int(good, "n")) is int


@pytest.mark.parametrize("bad", [True, False, np.True_, 3.0, 3.5, np.float64(2.0), "3", None,
                                 [3], 3 + 0j])
def test_check_int_refuses_non_integers(bad):
    with pytest.raises(TypeError, match=r"^n_q must be an integer"):
        check_int(bad, "n_q")


def test_check_int_minimum():
    assert check_int(0, "n", minimum=0) == 0
    with pytest.raises(ValueError, match=r"n must be a non-negative integer, got -1"):
        check_int(-1, "n", minimum=0)
    with pytest.raises(ValueError, match=r"block must be a positive integer, got 0"):
        check_int(0, "block", minimum=1)
    with pytest.raises(ValueError, match=r"repeats must be an integer >= 3, got 2"):
        check_int(2, "repeats", minimum=3)


def test_causal_mask_refuses_a_float_size():
    """Regression: causal_mask(3.5, 3) returned a (4, 3) mask."""
    with pytest.raises(TypeError, match="n_q"):
        causal_mask(3.5, 3)
    with pytest.raises(TypeError, match="n_k"):
        causal_mask(3, True)
    with pytest.raises(ValueError, match="n_k"):
        causal_mask(3, -1)
    assert causal_mask(np.int64(2), 3).shape == (2, 3)


def test_workspace_bytes_refuses_a_negative_d_v():
    """Regression: workspace_bytes(..., d_v=-5) returned 32."""
    with pytest.raises(ValueError, match="d_v"):
        workspace_bytes(1, 1, 1, np.float16, d_v=-5)
    with pytest.raises(TypeError, match="batch"):
        workspace_bytes(1, 1, 1, np.float32, batch=True)


@pytest.mark.parametrize(("call", "name"), [
    (lambda bad: check_block(bad, "block_q"), "block_q"),
    (lambda bad: flash_attention(np.ones((4, 2)), np.ones((4, 2)), np.ones((4, 2)),
                                 block_k=bad), "block_k"),
    (lambda bad: online_softmax(np.ones(4), block=bad), "block"),
    (lambda bad: partial_blocks(np.ones((2, 4)), np.ones((4, 3)), bad), "block"),
    (lambda bad: causal_tiles(8, bad, 4, 4), "n_k"),
    (lambda bad: score_matrix_bytes(4, heads=bad), "heads"),
    (lambda bad: random_qkv(bad, 4), "n"),
    (lambda bad: softmax(np.ones(3), axis=bad), "axis"),
])
@pytest.mark.parametrize("bad", [True, 2.0])
def test_booleans_and_floats_are_refused_everywhere(call, name, bad):
    with pytest.raises(TypeError, match=rf"\b{name}\b"):
        call(bad)
