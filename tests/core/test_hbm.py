"""The memory the teaching functions talk to (flashlib.core.hbm): the plain default changes
nothing, the counting memory sees every access, gives bit-identical results, and its SRAM raises
when a step does not fit."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

from flashlib.algorithms import (
    flash1_forward,
    flash2_backward,
    flash2_forward,
    split_kv_decode,
    standard_attention,
    two_pass_backward,
)
from flashlib.core.hbm import PLAIN, CountingMemory, HBMArray, SRAMCapacityError
from flashlib.studies.io_model import sram_footprint

TEACHING = (standard_attention, flash1_forward, flash2_forward, flash2_backward,
            two_pass_backward, split_kv_decode)

# (n_q, n_k, d, d_v, B_r, B_c): ragged, n = 1, blocks > n, 1 x 1, n_q != n_k, d_v != d
SHAPES = [(100, 70, 16, 12, 32, 16), (1, 1, 4, 4, 8, 8), (7, 9, 8, 8, 64, 128),
          (9, 11, 4, 3, 1, 1), (37, 1, 5, 5, 8, 8), (1, 37, 5, 5, 8, 8)]


def _problem(n_q, n_k, d, d_v, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype)
                 for s in ((n_q, d), (n_k, d), (n_k, d_v), (n_q, d_v)))


@pytest.mark.parametrize("fn", TEACHING, ids=lambda f: f.__name__)
def test_teaching_functions_default_to_the_plain_memory(fn):
    assert inspect.signature(fn).parameters["mem"].default is PLAIN


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_counting_memory_gives_the_plain_result_bit_for_bit(shape, dtype):
    n_q, n_k, d, d_v, B_r, B_c = shape
    q, k, v, do = _problem(n_q, n_k, d, d_v, dtype=dtype)
    mem = CountingMemory()
    Q, K, V = mem.inputs(Q=q, K=k, V=v)
    np.testing.assert_array_equal(np.asarray(standard_attention(Q, K, V, mem)),
                                  standard_attention(q, k, v))
    np.testing.assert_array_equal(np.asarray(flash1_forward(Q, K, V, B_r, B_c, mem)),
                                  flash1_forward(q, k, v, B_r, B_c))
    o, lse = flash2_forward(q, k, v, B_r, B_c)
    for got, want in zip(flash2_forward(Q, K, V, B_r, B_c, mem), (o, lse), strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
        assert np.asarray(got).dtype == dtype
    for backward in (flash2_backward, two_pass_backward):
        mem = CountingMemory(score_tiles=2)
        args = mem.inputs(Q=q, K=k, V=v, O=o, L=lse, dO=do)
        for got, want in zip(backward(*args, B_r, B_c, mem),
                             backward(q, k, v, o, lse, do, B_r, B_c), strict=True):
            np.testing.assert_array_equal(np.asarray(got), want)


def test_hbm_arrays_are_reached_only_through_the_memory():
    mem = CountingMemory()
    (Q,) = mem.inputs(Q=np.ones((4, 2)))
    with pytest.raises(TypeError, match="selects rows only"):
        Q[0, 1]
    with pytest.raises(TypeError, match="selects rows only"):
        Q[::2]
    assert isinstance(Q[1:3], HBMArray) and Q[1:3].shape == (2, 2) and mem.total == 0
    with pytest.raises(TypeError, match="counts HBMArrays"):
        mem.read(np.ones(3))
    with pytest.raises(TypeError, match="counts HBMArrays"):
        next(mem.blocks(2, np.ones((4, 2))))
    with pytest.raises(ValueError, match="different lengths"):
        next(mem.blocks(2, Q, mem.empty("X", (3,), float)))
    with pytest.raises(ValueError, match="outside its 4 rows"):
        mem.write(Q, 3, np.zeros((2, 2)))
    assert "HBMArray('Q'" in repr(Q) and Q.ndim == 2 and len(Q) == 4


def test_loads_are_copies_and_every_element_is_counted():
    mem = CountingMemory()
    Q, O = mem.inputs(Q=np.arange(10.0).reshape(5, 2), O=np.zeros((5, 2)))
    seen = []
    for i, Q_i, O_i in mem.blocks(2, Q, O):
        mem.write(O, i, Q_i * 2)
        O_i += 100  # a copy in SRAM: HBM is unchanged
        seen.append(i)
    assert seen == [0, 2, 4]
    np.testing.assert_array_equal(np.asarray(O), 2 * np.asarray(Q))
    assert mem.reads == {"Q": 10, "O": 10} and mem.writes == {"O": 10}
    assert [(e.op, e.name, e.i, e.rows) for e in mem.log] == [
        ("read", "Q", 0, 2), ("read", "O", 0, 2), ("write", "O", 0, 2),
        ("read", "Q", 1, 2), ("read", "O", 1, 2), ("write", "O", 1, 2),
        ("read", "Q", 2, 1), ("read", "O", 2, 1), ("write", "O", 2, 1)]
    assert mem.total == 30 and mem.peak_sram == 8  # two blocks of 2 x 2


BACKWARD = {"backward": flash2_backward, "two_pass_backward": two_pass_backward}


@pytest.mark.parametrize("order", ["v1", "v2", "backward", "two_pass_backward"])
@pytest.mark.parametrize("shape", SHAPES + [(40, 40, 16, 16, 32, 4), (40, 40, 8, 4, 4, 32)],
                         ids=str)
def test_peak_sram_equals_the_modelled_footprint(order, shape):
    """The last two shapes make the two-pass schedule's peak step pass 2's (dQ_i larger than
    dK_j and dV_j) and pass 1's."""
    n_q, n_k, d, d_v, B_r, B_c = shape
    q, k, v, do = _problem(n_q, n_k, d, d_v)
    want = sum(sram_footprint(order, B_r, B_c, d, d_v=d_v, n_q=n_q, n_k=n_k).values())

    def run(M):
        mem = CountingMemory(M, score_tiles=2 if order in BACKWARD else 1)
        if order in BACKWARD:
            o, lse = flash2_forward(q, k, v, B_r, B_c)
            BACKWARD[order](*mem.inputs(Q=q, K=k, V=v, O=o, L=lse, dO=do), B_r, B_c, mem)
        else:
            fn = flash1_forward if order == "v1" else flash2_forward
            fn(*mem.inputs(Q=q, K=k, V=v), B_r, B_c, mem)
        return mem

    assert run(None).peak_sram == want
    # an SRAM of exactly that size runs; one element less raises, naming the step
    assert run(want).peak_sram == want
    with pytest.raises(SRAMCapacityError, match=rf"needs {want} elements of SRAM, more "
                                                rf"than M = {want - 1}"):
        run(want - 1)


def test_tiles_are_logged_with_what_sram_holds():
    q, k, v, _ = _problem(5, 7, 2, 2)
    mem = CountingMemory()
    flash1_forward(*mem.inputs(Q=q, K=k, V=v), 2, 3, mem)
    tiles = [e for e in mem.log if e.op == "tile"]
    assert [(e.i, e.j) for e in tiles] == [(i, j) for j in range(3) for i in range(3)]
    assert tiles[0].held == (("K", 0), ("V", 0), ("Q", 0), ("O", 0), ("l", 0), ("m", 0),
                             ("S", None))
    assert tiles[-1].rows == 1 and tiles[-1].elements == 1 * 1  # ragged 1 x 1 corner
    mem = CountingMemory()
    flash2_forward(*mem.inputs(Q=q, K=k, V=v), 2, 3, mem)
    tiles = [e for e in mem.log if e.op == "tile"]
    assert [(e.i, e.j) for e in tiles] == [(i, j) for i in range(3) for j in range(3)]
    assert tiles[4].held == (("Q", 1), ("O_i", 1), ("l_i", 1), ("m_i", 1), ("K", 1), ("V", 1),
                             ("S", None))


def test_on_chip_arrays_count_against_the_sram():
    mem = CountingMemory(10)
    (Q,) = mem.inputs(Q=np.zeros((4, 2)))
    with pytest.raises(SRAMCapacityError, match="initialising acc on chip"):
        for _ in mem.blocks(4, Q):  # 8 elements loaded
            mem.on_chip(acc=np.zeros(3))
    assert mem.on_chip(x=np.ones(2))[0].shape == (2,)  # outside any loop: nothing held


def test_split_kv_decode_equals_standard_attention():
    for n_k, splits, B_c in [(100, 4, 8), (37, 3, 5), (5, 8, 2), (64, 1, 64)]:
        q, k, v, _ = _problem(1, n_k, 8, 6, seed=n_k)
        want = standard_attention(q, k, v)
        got = split_kv_decode(q, k, v, splits, B_c)
        assert np.max(np.abs(got - want)) <= 1e-14
        mem = CountingMemory()
        counted = np.asarray(split_kv_decode(*mem.inputs(Q=q, K=k, V=v), splits, B_c, mem))
        np.testing.assert_array_equal(counted, got)
    q32, k32, v32, _ = _problem(2, 50, 8, 8, dtype=np.float32)
    assert split_kv_decode(q32, k32, v32, 3, 16).dtype == np.float32
    assert math.isclose(float(np.abs(split_kv_decode(q32, k32, v32, 3, 16)
                                     - standard_attention(q32, k32, v32)).max()), 0,
                        abs_tol=1e-6)
