"""The memory model (flashlib.core.hbm): the teaching functions are plain numpy on numpy
arrays; run by a counting memory on its HBM arrays they give the same bits, every access is
seen, and its SRAM raises when a step does not fit."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

from flashlib.algorithms import (
    flash1_forward,
    flash2_backward,
    flash2_forward,
    masked_flash_forward,
    split_kv_decode,
    standard_attention,
    two_pass_backward,
)
from flashlib.core.hbm import (
    CountingMemory,
    HBMArray,
    SRAMCapacityError,
    Traffic,
    UncountableError,
)
from flashlib.core.loops import LoopTracker
from flashlib.core.masks import causal_bottom_right, causal_top_left
from flashlib.studies.io_model import sram_footprint, traffic

#: The teaching functions' arrays whose rows are keys: the caller's convention.
KEYS = {"K", "V", "dK", "dV"}

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
def test_teaching_functions_take_no_memory_and_return_numpy(fn):
    """No ``mem`` argument: on numpy arrays a teaching function is plain numpy."""
    assert "mem" not in inspect.signature(fn).parameters
    q, k, v, do = _problem(9, 11, 4, 3)
    if fn in (flash2_backward, two_pass_backward):
        out = fn(q, k, v, *flash2_forward(q, k, v, 4, 5), do, 4, 5)
    elif fn is split_kv_decode:
        out = fn(q[:1], k, v, 3, 2)
    elif fn is standard_attention:
        out = fn(q, k, v)
    else:
        out = fn(q, k, v, 4, 5)
    for x in out if isinstance(out, tuple) else (out,):
        assert type(x) is np.ndarray


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_counting_memory_gives_the_plain_result_bit_for_bit(shape, dtype):
    n_q, n_k, d, d_v, B_r, B_c = shape
    q, k, v, do = _problem(n_q, n_k, d, d_v, dtype=dtype)
    mem = CountingMemory(key_side=KEYS)
    Q, K, V = mem.inputs(Q=q, K=k, V=v)
    np.testing.assert_array_equal(mem.run(standard_attention, Q, K, V),
                                  standard_attention(q, k, v))
    np.testing.assert_array_equal(mem.run(flash1_forward, Q, K, V, B_r, B_c),
                                  flash1_forward(q, k, v, B_r, B_c))
    o, lse = flash2_forward(q, k, v, B_r, B_c)
    for got, want in zip(mem.run(flash2_forward, Q, K, V, B_r, B_c), (o, lse), strict=True):
        np.testing.assert_array_equal(got, want)
        assert type(got) is np.ndarray and got.dtype == dtype
    for backward in (flash2_backward, two_pass_backward):
        mem = CountingMemory(score_tiles=2, key_side=KEYS)
        args = mem.inputs(Q=q, K=k, V=v, O=o, L=lse, dO=do)
        for got, want in zip(mem.run(backward, *args, B_r, B_c),
                             backward(q, k, v, o, lse, do, B_r, B_c), strict=True):
            np.testing.assert_array_equal(got, want)


def _copy_doubled(Q, O, B):
    """A toy schedule: O_i = 2 Q_i, block by block."""
    for i in range(0, len(Q), B):
        Q_i, O_i = Q[i : i + B], O[i : i + B]  # load Q_i, O_i
        O[i : i + B] = Q_i * 2  # write O_i
        O_i += 100  # a copy in SRAM: HBM is unchanged
    return O


def test_loads_are_copies_and_every_element_is_counted():
    mem = CountingMemory(key_side=KEYS)
    Q, O = mem.inputs(Q=np.arange(10.0).reshape(5, 2), O=np.zeros((5, 2)))
    out = mem.run(_copy_doubled, Q, O, 2)
    np.testing.assert_array_equal(out, 2 * Q.data)
    np.testing.assert_array_equal(O.data, 2 * Q.data)
    assert mem.traffic.reads == {"Q": 10, "O": 10} and mem.traffic.writes == {"O": 10}
    assert [(e.op, e.name, e.i, e.rows) for e in mem.log] == [
        ("read", "Q", 0, 2), ("write", "O", 0, 2), ("read", "O", 0, 2),
        ("read", "Q", 1, 2), ("write", "O", 1, 2), ("read", "O", 1, 2),
        ("read", "Q", 2, 1), ("write", "O", 2, 1), ("read", "O", 2, 1)]
    assert mem.traffic.total == 30 and mem.peak_sram == 8  # two blocks of 2 x 2


def _unbound(Q):
    np.zeros_like(Q)[0:1] = 1.0  # an HBM array never bound to a variable
    return Q


def test_hbm_arrays_are_reached_only_inside_a_run():
    mem = CountingMemory(key_side=KEYS)
    (Q,) = mem.inputs(Q=np.ones((4, 2)))
    block = Q[1:3]  # the rows in HBM: free, and no traffic
    assert isinstance(block, HBMArray) and block.shape == (2, 2) and len(block) == 2
    assert block.dtype == np.float64 and block.ndim == 2 and mem.traffic.total == 0
    assert "HBMArray('Q'[1:3]" in repr(block) and "HBMArray('Q'," in repr(Q)
    with pytest.raises(TypeError, match="inside CountingMemory.run"):
        np.asarray(block)
    with pytest.raises(TypeError, match="inside CountingMemory.run"):
        Q[0, 1]
    with pytest.raises(TypeError, match="inside CountingMemory.run"):
        Q[0:1] = 0.0
    with pytest.raises(TypeError, match="whole rows"):
        Q[0, 1] = 0.0
    with pytest.raises(TypeError, match="named after the variable"):
        mem.run(_unbound, Q)
    assert mem.traffic.total == 0


def _array_api(Q, K):
    """What a teaching function may do with HBM arrays and their blocks."""
    N, d = Q.shape
    S = np.asarray(Q @ K.T, like=Q)  # read Q, K (whole); write S (whole)
    O = np.empty_like(Q, shape=(N, 1))  # allocated, not written
    m = np.full_like(Q, -np.inf, shape=N)  # allocated and written (the fill)
    for i in range(0, N, 2):
        S_i = S[i : i + 2]
        acc_i = np.zeros_like(S_i)  # like a block: on chip, nothing read
        assert type(acc_i) is np.ndarray and acc_i.shape == (len(S_i), len(K))
        m[i : i + 2] = np.maximum(m[i : i + 2], S_i.max(axis=1))  # read, write
        O[i : i + 2] = np.sum(S_i + acc_i, axis=1, keepdims=True)
        O[i : i + 2] += S_i[:, :1]  # read O_i, add, write O_i
    return O, m, S


def test_numpy_on_hbm_arrays():
    q, k = np.arange(10.0).reshape(5, 2), np.ones((3, 2))
    mem = CountingMemory(key_side=KEYS)
    O, m, S = mem.run(_array_api, *mem.inputs(Q=q, K=k))
    s = q @ k.T
    np.testing.assert_array_equal(S, s)
    np.testing.assert_array_equal(m, s.max(axis=1))
    np.testing.assert_array_equal(O[:, 0], s.sum(axis=1) + s[:, 0])
    assert mem.traffic.reads == {"Q": 10, "K": 6, "S": 15, "m": 5, "O": 5}
    assert mem.traffic.writes == {"S": 15, "m": 5 + 5, "O": 5 + 5}
    assert [e.i for e in mem.log if e.op == "write" and e.name == "O"] == [0, 0, 1, 1, 2, 2]


def _nested(X, seen):
    for i in range(0, len(X), 3):
        seen.append((i, [j for j in range(0, len(X), 4)]))


def test_loop_tracker_runs_plain_numpy_and_reports_the_loops():
    order = []

    class Reverse(LoopTracker):
        def _order(self, r, outermost):
            return list(r)[::-1] if outermost else r

        def _begin_iteration(self, loop):
            order.append((len(self._loops), loop.index))

    seen = []
    Reverse().run(_nested, np.arange(10), seen)
    assert seen == [(9, [0, 4, 8]), (6, [0, 4, 8]), (3, [0, 4, 8]), (0, [0, 4, 8])]
    assert order[:4] == [(1, 3), (2, 0), (2, 1), (2, 2)]  # depth, block index
    seen.clear()
    _nested(np.arange(10), seen)  # called directly: builtin range
    assert [i for i, _ in seen] == [0, 3, 6, 9]


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
        mem = CountingMemory(M, score_tiles=2 if order in BACKWARD else 1, key_side=KEYS)
        if order in BACKWARD:
            o, lse = flash2_forward(q, k, v, B_r, B_c)
            args = mem.inputs(Q=q, K=k, V=v, O=o, L=lse, dO=do)
            mem.run(BACKWARD[order], *args, B_r, B_c)
        else:
            fn = flash1_forward if order == "v1" else flash2_forward
            mem.run(fn, *mem.inputs(Q=q, K=k, V=v), B_r, B_c)
        return mem

    assert run(None).peak_sram == want
    # an SRAM of exactly that size runs; one element less raises, naming the step
    assert run(want).peak_sram == want
    with pytest.raises(SRAMCapacityError, match=rf"needs {want} elements of SRAM, more "
                                                rf"than M = {want - 1}"):
        run(want - 1)


def test_tiles_are_logged_with_what_sram_holds():
    q, k, v, _ = _problem(5, 7, 2, 2)
    mem = CountingMemory(key_side=KEYS)
    mem.run(flash1_forward, *mem.inputs(Q=q, K=k, V=v), 2, 3)
    tiles = [e for e in mem.log if e.op == "tile"]
    assert [(e.i, e.j) for e in tiles] == [(i, j) for j in range(3) for i in range(3)]
    assert tiles[0].held == (("K", 0), ("V", 0), ("Q", 0), ("O", 0), ("l", 0), ("m", 0),
                             ("S", None))
    assert tiles[-1].rows == 1 and tiles[-1].elements == 1 * 1  # ragged 1 x 1 corner
    mem = CountingMemory(key_side=KEYS)
    mem.run(flash2_forward, *mem.inputs(Q=q, K=k, V=v), 2, 3)
    tiles = [e for e in mem.log if e.op == "tile"]
    assert [(e.i, e.j) for e in tiles] == [(i, j) for i in range(3) for j in range(3)]
    assert tiles[4].held == (("Q", 1), ("O_i", 1), ("l_i", 1), ("m_i", 1), ("K", 1), ("V", 1),
                             ("S", None))


def _keeps(Q, K):
    """A query loop (4 x 2 blocks) keeping acc_i (3 elements) on chip, over a key loop."""
    for i in range(0, len(Q), 4):
        Q_i = Q[i : i + 4]  # 8 elements
        acc_i = np.zeros(3)  # on chip while this query block runs
        for j in range(0, len(K), 1):
            acc_i = acc_i + (Q_i @ K[j : j + 1].T).sum()  # K_j: 2 elements, S_ij: 4
    late_i = np.zeros(100)  # after the loops: nothing held
    return acc_i + late_i[:3]


def test_block_arrays_count_against_the_sram():
    def run(M):
        mem = CountingMemory(M, key_side=KEYS)
        mem.run(_keeps, *mem.inputs(Q=np.zeros((4, 2)), K=np.zeros((2, 2))))
        return mem

    mem = run(None)
    assert mem.peak_sram == 8 + 3 + 2 + 4
    tiles = [e for e in mem.log if e.op == "tile"]
    assert [e.held for e in tiles] == [(("Q", 0), ("acc_i", 0), ("K", j), ("S", None))
                                       for j in range(2)]
    assert run(17).peak_sram == 17
    held = r"\(Q\[0\]: 8, acc_i\[0\]: 3, K\[0\]: 2, S: 4\)"
    with pytest.raises(SRAMCapacityError, match=r"computing tile \(i=0, j=0\) needs 17 .*" + held):
        run(16)


def test_split_kv_decode_equals_standard_attention():
    for n_k, splits, B_c in [(100, 4, 8), (37, 3, 5), (5, 8, 2), (64, 1, 64)]:
        q, k, v, _ = _problem(1, n_k, 8, 6, seed=n_k)
        want = standard_attention(q, k, v)
        got = split_kv_decode(q, k, v, splits, B_c)
        assert np.max(np.abs(got - want)) <= 1e-14
        mem = CountingMemory(key_side=KEYS)
        counted = mem.run(split_kv_decode, *mem.inputs(Q=q, K=k, V=v), splits, B_c)
        np.testing.assert_array_equal(counted, got)
    q32, k32, v32, _ = _problem(2, 50, 8, 8, dtype=np.float32)
    assert split_kv_decode(q32, k32, v32, 3, 16).dtype == np.float32
    assert math.isclose(float(np.abs(split_kv_decode(q32, k32, v32, 3, 16)
                                     - standard_attention(q32, k32, v32)).max()), 0,
                        abs_tol=1e-6)


# --- what the memory cannot count is refused, by line (issue 32) ----------------------------


def _flash2_renamed(Q, K, V, B_r, B_c):
    """flash2_forward with Triton's names (acc, l, m): the memory reads no variable name."""
    N_q, N_k, d_v = len(Q), len(K), V.shape[1]
    scale = 1 / math.sqrt(Q.shape[1])
    O = np.empty_like(Q, shape=(N_q, d_v))
    L = np.empty_like(Q, shape=N_q)
    for i in range(0, N_q, B_r):
        q = Q[i : i + B_r]
        acc = np.zeros((len(q), d_v), Q.dtype)
        l = np.zeros(len(q), Q.dtype)
        m = np.full(len(q), -np.inf, Q.dtype)
        for j in range(0, N_k, B_c):
            k, v = K[j : j + B_c], V[j : j + B_c]
            s = scale * (q @ k.T)
            m_new = np.maximum(m, s.max(axis=1))
            p = np.exp(s - m_new[:, None])
            alpha = np.exp(m - m_new)
            l = alpha * l + p.sum(axis=1)
            acc = alpha[:, None] * acc + p @ v
            m = m_new
        O[i : i + B_r] = acc / l[:, None]
        L[i : i + B_r] = m + np.log(l)
    return O, L


def test_renamed_locals_count_the_same_sram():
    """Renaming O_i, l_i, m_i to acc, l, m once changed the peak from 800 to 640 elements
    silently; what the key loop keeps from before is on chip whatever its name."""
    q, k, v, _ = _problem(64, 64, 8, 8)
    peaks = {}
    for fn in (flash2_forward, _flash2_renamed):
        mem = CountingMemory(key_side=KEYS)
        out = mem.run(fn, *mem.inputs(Q=q, K=k, V=v), 16, 16)
        np.testing.assert_array_equal(out[0], flash2_forward(q, k, v, 16, 16)[0])
        peaks[fn.__name__] = mem.peak_sram
        tile = next(e for e in mem.log if e.op == "tile")
        assert [name for name, _ in tile.held][1:4] == (
            ["O_i", "l_i", "m_i"] if fn is flash2_forward else ["acc", "l", "m"])
    assert peaks == {"flash2_forward": 800, "_flash2_renamed": 800}
    assert sum(sram_footprint("v2", 16, 16, 8).values()) == 800


def _while_loop(Q, O, B):
    i = 0
    while i < len(Q):
        O[i : i + B] = Q[i : i + B] * 2
        i += B
    return O


def _list_of_range(Q, O, B):
    for i in list(range(0, len(Q), B)):
        O[i : i + B] = Q[i : i + B] * 2
    return O


def _range_in_a_variable(Q, O, B):
    starts = range(0, len(Q), B)
    for i in starts:
        O[i : i + B] = Q[i : i + B] * 2
    return O


def _over_arange(Q, O, B):
    for i in np.arange(0, len(Q), B):
        O[i : i + B] = Q[i : i + B] * 2
    return O


@pytest.mark.parametrize(("fn", "match"), [
    (_while_loop, r"_while_loop, line \d+: a while loop"),
    (_list_of_range, r"_list_of_range, line \d+: range\(\.\.\.\) used other than as a for"),
    (_range_in_a_variable, r"line \d+: range\(\.\.\.\) used other than"),
    (_over_arange, r"_over_arange, line \d+: a block of Q sliced in a loop over something "
                   r"else than range"),
])
def test_loops_the_memory_cannot_see_are_refused(fn, match):
    """Each of these once logged 0 tiles and counted without a word."""
    mem = CountingMemory(key_side=KEYS)
    Q, O = mem.inputs(Q=np.arange(10.0).reshape(5, 2), O=np.zeros((5, 2)))
    with pytest.raises(UncountableError, match=match):
        mem.run(fn, Q, O, 2)
    assert mem.traffic == Traffic({}, {})  # refused before anything moved
    np.testing.assert_array_equal(fn(Q.data, np.zeros((5, 2)), 2), 2 * Q.data)  # plain numpy


def _shapes(Q, K):
    n, d = np.shape(Q)
    out = np.asarray(np.zeros((n, 1)) + np.size(K) + len(Q) + Q.shape[1] + np.ndim(Q) + d,
                     like=Q)  # written: 5 elements
    return out


def test_shapes_are_free():
    """np.shape(Q) once read all of Q."""
    mem = CountingMemory(key_side=KEYS)
    out = mem.run(_shapes, *mem.inputs(Q=np.ones((5, 2)), K=np.ones((3, 2))))
    assert out[0, 0] == 6 + 5 + 2 + 2 + 2
    assert mem.traffic == Traffic({}, {"out": 5})


@pytest.mark.parametrize("causal", ["top_left", "bottom_right", False])
@pytest.mark.parametrize(("n_q", "n_k", "B_r", "B_c"),
                         [(64, 64, 16, 16), (50, 70, 16, 8), (70, 50, 8, 16), (9, 11, 1, 1)])
def test_masked_flash_forward_is_counted(causal, n_q, n_k, B_r, B_c):
    """It allocated O and L with np.empty (not like Q): under the memory nothing was written to
    O or L.  Now its traffic is FlashAttention-2's with the empty tiles skipped: the closed
    form's, except that a query block that sees no key never loads its Q_i (the closed form
    counts all of Q)."""
    visible = {"top_left": causal_top_left, "bottom_right": causal_bottom_right,
               False: lambda i, j, n_q, n_k: np.ones((len(i), len(j)), bool)}[causal]
    q, k, v, _ = _problem(n_q, n_k, 8, 6)
    mem = CountingMemory(key_side=KEYS)
    O, L = mem.run(masked_flash_forward, *mem.inputs(Q=q, K=k, V=v), visible, B_r, B_c)
    O_plain, L_plain = masked_flash_forward(q, k, v, visible, B_r, B_c)
    np.testing.assert_array_equal(O, O_plain)
    np.testing.assert_array_equal(L, L_plain)
    model = traffic("v2", n_q, n_k, 8, d_v=6, B_r=B_r, B_c=B_c, causal=causal)
    got = mem.traffic
    assert got.writes == model.writes == {"O": n_q * 6, "L": n_q}
    assert {a: got.reads[a] for a in ("K", "V")} == {a: model.reads[a] for a in ("K", "V")}
    assert got.reads["Q"] <= model.reads["Q"]
    if causal != "bottom_right" or n_q <= n_k:  # every query block sees a key
        assert got == model


def _on_chip_output(Q, K, V, B_r, B_c):
    """masked_flash_forward's old allocation: O and L as plain numpy arrays."""
    O, L = np.empty((len(Q), V.shape[1])), np.empty(len(Q))
    for i in range(0, len(Q), B_r):
        Q_i = Q[i : i + B_r]
        for j in range(0, len(K), B_c):
            S_ij = Q_i @ K[j : j + B_c].T
        O[i : i + B_r], L[i : i + B_r] = S_ij[:, :1], S_ij[:, 0]
    return O, L


def test_numpy_arrays_kept_across_the_outermost_loop_are_refused():
    q, k, v, _ = _problem(8, 8, 2, 2)
    mem = CountingMemory(key_side=KEYS)
    with pytest.raises(UncountableError, match=r"_on_chip_output, line \d+: O, L are numpy "
                                               r"arrays made before the outermost loop"):
        mem.run(_on_chip_output, *mem.inputs(Q=q, K=k, V=v), 4, 4)
    mem = CountingMemory(key_side=KEYS)  # an input not placed in HBM (and so O, L like it)
    with pytest.raises(UncountableError, match=r"line \d+: Q, O, L are numpy arrays made"):
        mem.run(flash2_forward, q, *mem.inputs(K=k, V=v), 4, 4)


def test_the_key_side_is_the_callers():
    """Without it the memory cannot tell a key loop from a query loop: it says so."""
    q, k, v, _ = _problem(8, 8, 2, 2)
    mem = CountingMemory()
    with pytest.raises(UncountableError, match=r"both run over query blocks.*key_side"):
        mem.run(flash2_forward, *mem.inputs(Q=q, K=k, V=v), 4, 4)
    mem = CountingMemory(key_side={"keys", "values"})  # the caller's names
    keys, values, queries = mem.inputs(keys=k, values=v, queries=q)
    mem.run(flash2_forward, queries, keys, values, 4, 4)
    assert [(e.i, e.j) for e in mem.log if e.op == "tile"] == [(i, j) for i in range(2)
                                                               for j in range(2)]
    with pytest.raises(TypeError, match="key_side"):
        CountingMemory(key_side="K")


def test_a_local_function_with_a_closure_is_counted():
    scale = 3.0

    def scaled(Q, O, B):
        for i in range(0, len(Q), B):
            O[i : i + B] = Q[i : i + B] * scale
        return O

    mem = CountingMemory(key_side=KEYS)
    Q, O = mem.inputs(Q=np.ones((4, 2)), O=np.zeros((4, 2)))
    np.testing.assert_array_equal(mem.run(scaled, Q, O, 2), 3 * np.ones((4, 2)))
    assert mem.traffic == Traffic({"Q": 8}, {"O": 8})
