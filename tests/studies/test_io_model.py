"""The HBM IO model (flashlib.studies.io_model): every closed form equals, element for element,
what a counting memory sees when the teaching functions run (ragged tails, blocks larger than n, 1
x 1 blocks, n_q != n_k, d_v != d), for every (N, d, M) tested; the SRAM of M elements is never
exceeded by the blocks the model derives from M; the bounds and the roofline hold."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from flashlib.algorithms import split_kv_decode, standard_attention
from flashlib.core.hbm import CountingMemory, SRAMCapacityError
from flashlib.core.masks import causal_mask, causal_tiles
from flashlib.studies import io_model as io
from flashlib.studies.tiling import KEY_SIDE as KEYS
from flashlib.studies.tiling import count_io, run_counted, schedule_counts

# (n_q, n_k, d, d_v, B_r, B_c)
SHAPES = [(100, 70, 16, 12, 32, 16), (1, 1, 4, 4, 8, 8), (7, 9, 8, 8, 64, 128),
          (9, 11, 4, 3, 1, 1), (37, 1, 5, 5, 8, 8), (1, 37, 5, 5, 8, 8), (64, 64, 8, 8, 16, 32),
          (50, 50, 4, 4, 16, 128), (50, 50, 4, 4, 128, 16)]


def _problem(n_q, n_k, d, d_v, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s) for s in ((n_q, d), (n_k, d), (n_k, d_v), (n_q, d_v)))


def _nonzero(counter):
    return {k: v for k, v in counter.items() if v}


@pytest.mark.parametrize("order", ["standard", "v1", "v2", "backward", "two_pass_backward"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_counted_equals_the_closed_form_per_array(order, shape):
    n_q, n_k, d, d_v, B_r, B_c = shape
    q, k, v, do = _problem(n_q, n_k, d, d_v)
    run = run_counted(order, q, k, v, B_r, B_c, dO=do)
    model = io.traffic(order, n_q, n_k, d, d_v=d_v, B_r=B_r, B_c=B_c)
    assert _nonzero(run.mem.traffic.reads) == model.reads
    assert _nonzero(run.mem.traffic.writes) == model.writes
    assert run.mem.traffic.total == model.total == model.total_reads + model.total_writes
    if order in ("standard", "v1", "v2"):  # and the output is standard attention's
        o = run.output[0] if order == "v2" else run.output
        assert np.max(np.abs(o - standard_attention(q, k, v))) <= 1e-12


@pytest.mark.parametrize("order", ["v1", "v2"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_block_counts_from_the_log_equal_the_closed_form(order, shape):
    n_q, n_k, d, d_v, B_r, B_c = shape
    q, k, v, _ = _problem(n_q, n_k, d, d_v)
    got = schedule_counts(run_counted(order, q, k, v, B_r, B_c).mem.log)
    want = io.block_counts(order, n_q, n_k, B_r, B_c)
    for key in ("tiles", "loads", "stores", "inits", "rescales", "normalisations"):
        assert got[key] == want[key], key
    assert want["tiles"] == want["T_r"] * want["T_c"]


def _theorem2_cases():
    """(order, N, d, M): M from the smallest SRAM that holds a step up to N d, blocks kept
    >= N / 24 so that the runs stay quick."""
    for order in ("v1", "v2", "backward", "two_pass_backward"):
        for N, d in [(64, 8), (100, 16), (257, 4), (33, 16), (130, 32)]:
            smallest = sum(io.sram_footprint(order, 1, 1, d).values())
            for M in sorted({smallest, 2 * d * d + 1, 3 * d * d, 4 * d * d, 8 * d * d + 5,
                             N * d // 2 + 7, N * d}):
                if smallest <= M <= N * d and math.ceil(M / (4 * d)) >= N / 24:
                    yield order, N, d, M


@pytest.mark.parametrize(("order", "N", "d", "M"), list(_theorem2_cases()))
def test_theorem2_counting_memory_of_size_M_matches_the_model(N, d, M, order):
    """The blocks derived from M (rule="fit") never exceed the SRAM of M elements, and the
    counted traffic is the closed form, exactly."""
    B_r, B_c = io.block_sizes(M, d, order, rule="fit")
    assert sum(io.sram_footprint(order, B_r, B_c, d).values()) <= M
    q, k, v, do = _problem(N, N, d, d, seed=M)
    run = run_counted(order, q, k, v, B_r, B_c, M=M, dO=do)  # raises if a step exceeds M
    model = io.traffic(order, N, N, d, B_r=B_r, B_c=B_c)
    assert run.mem.traffic.total == model.total == io.io_count(N, d, M, order, rule="fit")
    assert run.mem.peak_sram <= M
    if order in ("v1", "v2"):
        o = run.output[0] if order == "v2" else run.output
        assert np.max(np.abs(o - standard_attention(q, k, v))) <= 1e-12


@pytest.mark.parametrize(("N", "d", "M"), [(64, 8, 256), (64, 8, 100), (100, 16, 2048)])
@pytest.mark.parametrize("order", ["v1", "v2"])
def test_paper_blocks_counted_with_an_unbounded_sram(N, d, M, order):
    assert count_io(N, d, M, order, rule="paper") == io.io_count(N, d, M, order)
    assert count_io(N, d, None, "standard") == io.io_count(N, d, None, "standard") \
        == 4 * N * N + 4 * N * d


def test_paper_block_sizes_and_their_cap():
    assert io.paper_block_sizes(98304, 64) == (64, 384)  # 192 KB of fp16, d = 64
    assert io.paper_block_sizes(98304, 128) == (128, 192)
    assert io.paper_block_sizes(100, 64) == (1, 1)
    for M, d in itertools.product([1, 7, 64, 1000, 12345, 10**6], [1, 3, 64, 128]):
        B_r, B_c = io.paper_block_sizes(M, d)
        assert B_c == math.ceil(M / (4 * d)) and B_r == min(B_c, d)
        assert B_r * B_c <= M / 4 + d  # the cap keeps S_ij within M / 4 (+ the ceiling)
        assert io.block_sizes(M, d) == (B_r, B_c)
        assert io.block_sizes(M, d, "v2") == (B_c, B_r)


def test_fit_rule_is_the_largest_block_of_the_paper_shape_that_fits():
    for M, d, order in itertools.product([19, 100, 1000, 5000, 33000, 98304], [4, 16, 64],
                                         ["v1", "v2", "backward", "two_pass_backward"]):
        try:
            B_r, B_c = io.block_sizes(M, d, order, rule="fit")
        except ValueError as err:
            assert "cannot hold one step" in str(err)
            assert sum(io.sram_footprint(order, 1, 1, d).values()) > M
            continue
        outer = B_r if order == "v2" else B_c
        paper = io.block_sizes(M, d, order)
        assert outer <= max(paper)
        assert sum(io.sram_footprint(order, B_r, B_c, d).values()) <= M
        if outer < max(paper):  # one more row does not fit
            b = outer + 1
            bigger = (b, min(b, d)) if order == "v2" else (min(b, d), b)
            assert sum(io.sram_footprint(order, *bigger, d).values()) > M
        if sum(io.sram_footprint(order, *paper, d).values()) <= M:
            assert (B_r, B_c) == paper


def test_paper_blocks_overflow_an_sram_of_M_at_small_M():
    """The paper's rule is right up to a constant: at M = 4 d^2 its step needs more than M."""
    N, d = 64, 8
    M = 4 * d * d
    B_r, B_c = io.block_sizes(M, d)
    assert sum(io.sram_footprint("v1", B_r, B_c, d).values()) > M
    q, k, v, _ = _problem(N, N, d, d)
    with pytest.raises(SRAMCapacityError, match=f"more than M = {M}"):
        run_counted("v1", q, k, v, B_r, B_c, M=M)


@pytest.mark.parametrize("causal", [True, "bottom_right"])
@pytest.mark.parametrize(("n_q", "n_k", "B_r", "B_c"),
                         [(100, 100, 16, 32), (70, 100, 16, 16), (100, 70, 32, 8),
                          (9, 11, 1, 1), (64, 64, 128, 16)])
@pytest.mark.parametrize("order", ["v1", "v2", "backward", "two_pass_backward"])
def test_causal_traffic_visits_exactly_the_tiles_with_a_visible_entry(order, causal, n_q, n_k,
                                                                      B_r, B_c):
    """Independent count: a tile is visited iff the causal mask shows one of its entries."""
    d, d_v = 4, 3
    vis = causal_mask(n_q, n_k, causal)
    rows_q = rows_k = tiles = 0
    for i0 in range(0, n_q, B_r):
        r = min(B_r, n_q - i0)
        loaded = 0
        for j0 in range(0, n_k, B_c):
            c = min(B_c, n_k - j0)
            if vis[i0 : i0 + r, j0 : j0 + c].any():
                rows_q += r
                loaded += c
                tiles += 1
        rows_k += loaded
    got = io.traffic(order, n_q, n_k, d, d_v=d_v, B_r=B_r, B_c=B_c, causal=causal)
    full = io.traffic(order, n_q, n_k, d, d_v=d_v, B_r=B_r, B_c=B_c)
    if order == "v1":
        assert got.reads["Q"] == rows_q * d and got.reads["l"] == rows_q
        assert got.writes["O"] == (n_q + rows_q) * d_v
    elif order == "v2":
        assert got.reads.get("K", 0) == rows_k * d and got.reads.get("V", 0) == rows_k * d_v
    elif order == "backward":
        assert got.reads["dQ"] == rows_q * d and got.writes["dQ"] == (n_q + rows_q) * d
    else:  # pass 1 streams the visible Q_i past each K_j, pass 2 the visible K_j past each Q_i
        assert got.reads["Q"] == (n_q + rows_q) * d and got.reads.get("dQ", 0) == 0
        assert got.reads["K"] == (n_k + rows_k) * d and got.writes["dQ"] == n_q * d
    assert got.total <= full.total
    assert causal_tiles(n_q, n_k, B_r, B_c, causal)[0] == tiles


def test_causal_saves_about_half_of_the_quadratic_traffic():
    N, d, B = 4096, 64, 64
    for order in ("v1", "v2"):
        full = io.traffic(order, N, N, d, B_r=B, B_c=B).total
        causal = io.traffic(order, N, N, d, B_r=B, B_c=B, causal=True).total
        floor = io.minimum_traffic(N, N, d)
        assert 0.45 < (causal - floor) / (full - floor) < 0.55


def test_theorem2_orders_of_growth():
    """N^2 d^2 / M is the right order: counted / (N^2 d^2 / M) stays within constants as N
    and M grow (d <= M <= N d), while standard attention grows like N^2."""
    d = 64
    ratios = []
    for N, M in [(1024, 8192), (4096, 8192), (4096, 65536), (16384, 98304), (16384, 262144)]:
        t = io.theorem2(N, d, M)
        assert t["flash"] == N * N * d * d / M and t["standard"] == N * d + N * N
        ratios.append(io.io_count(N, d, M, "v1") / t["flash"])
        assert io.io_count(N, d, M, "v1") >= io.minimum_traffic(N, N, d)
    assert max(ratios) / min(ratios) < 1.5, ratios
    assert 10 < min(ratios) and max(ratios) < 14  # about 12: 3 arrays of d re-read T_c times


def test_minimum_traffic_is_reached_when_one_block_covers_everything():
    N, d = 100, 16
    assert io.minimum_traffic(N, N, d) == 4 * N * d
    assert io.traffic("v2", N, N, d, B_r=N, B_c=8).total == 4 * N * d + N  # + the logsumexp
    assert io.io_count(N, d, N * d * 4, "v2") == 4 * N * d + N


def test_crossover_M_is_where_tiling_stops_moving_more():
    for N, d in [(1024, 64), (4096, 128), (300, 16)]:
        M = io.crossover_M(N, d)
        std = io.io_count(N, d, None, "standard")
        assert io.io_count(N, d, M, "v1") <= std
        assert io.io_count(N, d, max(d, M - 4 * d), "v1") > std  # the previous block size
        for M2 in range(M, N * d + 1, max(1, (N * d - M) // 50)):
            assert io.io_count(N, d, M2, "v1") <= std
        assert 2 * d * d < M < 4 * d * d  # about 3 d^2 with these exact counts
    assert io.crossover_M(2, 1) is None or io.crossover_M(2, 1) >= 1


def test_decoding_moves_about_2Nd_whatever_the_tiling():
    N, d = 32768, 128
    for B_c in (16, 64, 256):
        v2 = io.traffic("v2", 1, N, d, B_r=1, B_c=B_c).total
        assert 1 <= v2 / (2 * N * d) < 1.001
        for splits in (1, 4, 16, 64):
            split = io.traffic("split_kv", 1, N, d, B_c=B_c, n_splits=splits).total
            assert v2 <= split < 1.01 * v2  # parallelism, not less traffic
    # Algorithm 1's order re-reads the query row and rewrites its O once per key block: a
    # few per cent more with small key blocks, still about 2 N d
    v1 = io.traffic("v1", 1, N, d, B_r=1, B_c=16).total
    assert 1.05 * 2 * N * d < v1 < 1.15 * 2 * N * d


@pytest.mark.parametrize(("n_q", "n_k", "splits", "B_c"),
                         [(1, 100, 4, 8), (1, 37, 3, 5), (2, 64, 5, 16), (1, 5, 8, 2),
                          (1, 20, 1, 8)])
def test_split_kv_counted_equals_the_closed_form(n_q, n_k, splits, B_c):
    q, k, v, _ = _problem(n_q, n_k, 8, 6, seed=n_k)
    mem = CountingMemory(key_side=KEYS)
    out = mem.run(split_kv_decode, *mem.inputs(Q=q, K=k, V=v), splits, B_c)
    assert np.max(np.abs(out - standard_attention(q, k, v))) <= 1e-14
    model = io.traffic("split_kv", n_q, n_k, 8, d_v=6, B_c=B_c, n_splits=splits)
    assert mem.traffic == model  # one type: the counted traffic and the closed form


def test_roofline_from_the_cited_specs():
    a100 = io.GPUS["A100 (1.5 TB/s)"]
    assert io.ridge_point(a100) == pytest.approx(208.0)
    assert io.ridge_point(io.GPUS["A100 (2.0 TB/s)"]) == pytest.approx(156.0)
    assert io.ridge_point(io.GPUS["H100 SXM"]) == pytest.approx(989 / 3.35)
    assert io.ridge_point(io.GPUS["H200 SXM"]) == pytest.approx(989 / 4.8)
    N, d, b = 4096, 64, 2
    flops = io.attention_flops(N, N, d)
    assert flops == 4 * N * N * d and io.attention_flops(N, N, d, causal=True) == flops / 2
    std = io.roofline(a100, flops, io.io_count(N, d, None, "standard") * b)
    assert std["bound"] == "memory" and std["intensity"] < std["ridge"]
    M = a100.sram_per_sm // b  # the SRAM of one SM, in fp16 elements
    flash = io.roofline(a100, flops, io.io_count(N, d, M, "v2") * b)
    assert flash["bound"] == "compute" and flash["time_s"] < std["time_s"]
    decode = io.roofline(a100, io.attention_flops(1, N, d),
                         io.traffic("v2", 1, N, d, B_r=1, B_c=64).total * b)["intensity"]
    assert decode < 1.01  # one query row: about one FLOP per byte, far below any ridge


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="order must be one of"):
        io.traffic("v3", 4, 4, 2, B_r=1, B_c=1)
    with pytest.raises(ValueError, match="n_q must be a non-negative integer"):
        io.traffic("v1", -1, 4, 2, B_r=1, B_c=1)
    with pytest.raises(TypeError, match="B_r must be an integer"):
        io.traffic("v1", 4, 4, 2, B_r=None, B_c=1)
    with pytest.raises(ValueError, match="causal applies to the tiled orders"):
        io.traffic("standard", 4, 4, 2, causal=True)
    with pytest.raises(ValueError, match="causal must be"):
        io.traffic("v2", 4, 4, 2, B_r=1, B_c=1, causal="diagonal")
    with pytest.raises(ValueError, match="M must be a positive integer"):
        io.block_sizes(0, 4)
    with pytest.raises(ValueError, match="rule must be"):
        io.block_sizes(100, 4, rule="best")
    with pytest.raises(ValueError, match="cannot hold one step"):
        io.block_sizes(18, 4, rule="fit")
    with pytest.raises(ValueError, match="order must be"):
        io.sram_footprint("standard", 1, 1, 4)
    with pytest.raises(ValueError, match="order must be 'v1' or 'v2'"):
        io.block_counts("backward", 4, 4, 1, 1)


def test_the_two_backward_schedules_trade_dQ_traffic_for_K_V_rereads():
    """FlashAttention-2's schedule reads and writes dQ once per tile (the atomic adds); the
    two-pass schedule writes dQ once but reads K and V once more per query block (and Q,
    dO, L, D once more in all).  With square blocks and n_q = n_k the totals differ by
    little: what separates the two on a GPU is the recomputation and the atomics."""
    N, d, B = 1024, 64, 64
    one = io.traffic("backward", N, N, d, B_r=B, B_c=B)
    two = io.traffic("two_pass_backward", N, N, d, B_r=B, B_c=B)
    T = N // B
    assert one.reads["dQ"] == T * N * d and one.writes["dQ"] == (T + 1) * N * d
    assert "dQ" not in two.reads and two.writes["dQ"] == N * d
    assert two.reads["K"] == (1 + T) * N * d and one.reads["K"] == N * d
    assert 0.8 < two.total / one.total < 1.2


def test_io_widget_data_counted_runs_equal_the_model():
    from flashlib.book.chapters.io_model import io_widget_data

    data = io_widget_data([48, 100], [8, 16], [32, 256, 2048], count_N=64, count_tiles=64)
    assert data["floor"]["100-16"] == 4 * 100 * 16
    counted = 0
    for key, row in data["rows"].items():
        N, d, M = map(int, key.split("-"))
        assert row["standard"][2] == io.traffic("standard", N, N, d).total
        for order in ("v1", "v2"):
            B_r, B_c, modelled, got = row[order]
            if B_r is None:  # M cannot hold one step of this order
                with pytest.raises(ValueError):
                    io.block_sizes(M, d, order, rule="fit")
                assert modelled is None and got is None
                continue
            assert (B_r, B_c) == io.block_sizes(M, d, order, rule="fit")
            assert modelled == io.traffic(order, N, N, d, B_r=B_r, B_c=B_c).total
            if got is not None:
                assert N <= 64 and got == modelled
                counted += 1
    assert counted >= 4
    assert data["rows"]["48-16-32"]["v1"] == [None, None, None, None]
    assert data["passes"]["48-16-32"]["v1"] is None


def test_io_widget_data_passes_add_up_to_the_model():
    """The widget draws the traffic as what moves once plus what moves again per pass."""
    from flashlib.book.chapters.io_model import io_widget_data

    data = io_widget_data([48, 100], [8, 16], [32, 256, 2048], count_N=0)
    for key, row in data["rows"].items():
        N, d, M = map(int, key.split("-"))
        once, per_pass, passes = data["passes"][key]["standard"]
        assert (once, per_pass, passes) == (4 * N * d, 4 * N * N, 1)
        for order in ("v1", "v2"):
            if row[order][0] is None:
                continue
            B_r, B_c, modelled, _ = row[order]
            once, per_pass, passes = data["passes"][key][order]
            assert once + per_pass * passes == modelled
            assert passes == -(-N // (B_c if order == "v1" else B_r))
        if row["v2"][0] is not None:
            assert sum(data["sram"][key].values()) <= M



def test_minimum_traffic_takes_sizes_of_any_size():
    """numpy integer sizes overflowed int64 silently (a RuntimeWarning and a wrong count)."""
    big = np.uint64(2**64 - 1)
    assert io.minimum_traffic(big, big, 64) == 4 * (2**64 - 1) * 64
    assert io.minimum_traffic(np.int64(2**62), 2**62, 2, 2) == 2**62 * 8
    with pytest.raises(TypeError, match="d must be an integer"):
        io.minimum_traffic(4, 4, 2.5)
