"""The executable schedule (flashlib.studies.tiling): the tile order of each loop order, the
widget's frames drawn from the event log, workers sharing the outer loop, and exactness across very
unequal blocks."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from flashlib.algorithms import flash1_forward, flash2_forward, standard_attention
from flashlib.book.chapters.tiling import tiling_frames, tiling_widget_data
from flashlib.studies import io_model as io
from flashlib.studies.tiling import (
    exactness_table,
    logged_tiles,
    program_accesses,
    run_counted,
    simulate_parallel_outer_loop,
)


def _problem(n_q, n_k, d, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in ((n_q, d), (n_k, d), (n_k, d)))


@pytest.mark.parametrize(("n_q", "n_k", "B_r", "B_c"),
                         [(5, 7, 2, 3), (64, 64, 16, 16), (1, 1, 8, 8), (9, 4, 1, 1),
                          (10, 30, 16, 128), (30, 10, 128, 16)])
def test_logged_tiles_follow_the_loop_order(n_q, n_k, B_r, B_c):
    T_r, T_c = math.ceil(n_q / B_r), math.ceil(n_k / B_c)
    assert logged_tiles(n_q, n_k, B_r, B_c, "v1") == [(i, j) for j in range(T_c)
                                                        for i in range(T_r)]
    assert logged_tiles(n_q, n_k, B_r, B_c, "v2") == [(i, j) for i in range(T_r)
                                                        for j in range(T_c)]


@pytest.mark.parametrize("order", ["v1", "v2"])
@pytest.mark.parametrize(("n", "B_r", "B_c"), [(100, 32, 16), (48, 16, 64), (20, 1, 7)])
def test_frames_are_the_log_step_by_step(order, n, B_r, B_c):
    frames = tiling_frames(n, B_r, B_c, order, d=4)
    json.dumps(frames, allow_nan=False)  # JSON-able, no NaN
    steps = frames["steps"]
    T_r, T_c = frames["T_r"], frames["T_c"]
    assert len(steps) == 1 + T_r * T_c and steps[0]["tile"] is None
    assert [tuple(s["tile"]) for s in steps[1:]] == logged_tiles(n, n, B_r, B_c, order)
    # the traffic of the last step is the closed form's, per array
    model = io.traffic(order, n, n, 4, B_r=B_r, B_c=B_c)
    last = steps[-1]
    for a, r, w in zip(frames["arrays"], last["reads"], last["writes"], strict=True):
        assert r == model.reads.get(a, 0) and w == model.writes.get(a, 0), a
    # cumulative counts grow exactly where the step's events move an array
    for prev, step in zip(steps, steps[1:], strict=False):
        assert all(e[0] in ("read", "write") for e in step["events"])
        for k, a in enumerate(frames["arrays"]):
            for op, key in (("read", "reads"), ("write", "writes")):
                moved = any(e[:2] == [op, a] for e in step["events"])
                assert (step[key][k] > prev[key][k]) == moved, (a, op)
    # SRAM: the tile's blocks, then "S"; the modelled footprint is the largest step
    peak = sum(io.sram_footprint(order, B_r, B_c, 4, n_q=n, n_k=n).values())
    assert max(s["sram_elements"] for s in steps) == peak
    for s in steps[1:]:
        i, j = s["tile"]
        assert s["sram"][-1] == ["S", None]
        assert ["K", j] in s["sram"] and ["V", j] in s["sram"] and ["Q", i] in s["sram"]
    # finished rows: v2 finishes a block per T_c steps, v1 only in its last outer iteration
    done_counts = [len(s["done"]) for s in steps]
    assert done_counts[-1] == T_r and done_counts == sorted(done_counts)
    if order == "v2":
        assert all(len(steps[1 + k * T_c - 1 + T_c]["done"]) == k + 1 for k in range(T_r))
    else:
        assert all(len(s["done"]) == 0 for s in steps[: 1 + (T_c - 1) * T_r])


@pytest.mark.parametrize("order", ["v1", "v2"])
def test_running_m_and_l_of_the_chosen_row_end_at_the_true_statistics(order):
    n, B_r, B_c, d, row = 50, 16, 8, 4, 37
    frames = tiling_frames(n, B_r, B_c, order, d=d, row=row)
    Q, K, V = _problem(n, n, d)  # the same seed as tiling_frames
    s = Q[row] @ K.T / math.sqrt(d)
    last = frames["steps"][-1]
    assert last["keys_seen"] == n
    assert last["m"] == pytest.approx(float(s.max()), rel=1e-3)
    assert last["l"] == pytest.approx(float(np.exp(s - s.max()).sum()), rel=1e-3)
    _, L = flash2_forward(Q, K, V, B_r, B_c)
    assert last["m"] + math.log(last["l"]) == pytest.approx(float(L[row]), abs=1e-3)
    seen = [st["keys_seen"] for st in frames["steps"]]
    assert seen == sorted(seen) and len(set(seen)) == math.ceil(n / B_c) + 1  # 0 and 7 blocks
    ms = [st["m"] for st in frames["steps"] if st["m"] is not None]
    assert ms == sorted(ms)  # the running maximum never decreases


def test_widget_table_is_light():
    data = tiling_widget_data([48, 100], [16, 32, 64])
    assert set(data["configs"]) == {f"{n}-{a}-{b}-{o}" for n in (48, 100) for a in (16, 32, 64)
                                    for b in (16, 32, 64) for o in ("v1", "v2")}
    size = len(json.dumps(data, separators=(",", ":")))
    assert size < 250_000, size
    with pytest.raises(ValueError, match="row must be below n"):
        tiling_frames(10, 4, 4, "v1", row=10)
    with pytest.raises(ValueError, match="order must be one of"):
        tiling_frames(10, 4, 4, "v3")


def test_parallel_outer_loop_of_algorithm_1_loses_updates():
    Q, K, V = _problem(100, 90, 8)
    ref = standard_attention(Q, K, V)
    racy = simulate_parallel_outer_loop("v1", Q, K, V, 32, 16, workers=2)
    # 6 key blocks, 2 workers: 3 rounds; in each, every O_i, l_i, m_i (4 blocks) loses one
    assert racy.lost_updates == racy.rounds * math.ceil(100 / 32) * 3
    assert racy.rounds == 3 and np.max(np.abs(racy.O - ref)) > 0.1
    # in turn (as with a lock on each O_i), the same workers give Algorithm 1's result
    serial = simulate_parallel_outer_loop("v1", Q, K, V, 32, 16, workers=2, concurrent=False)
    assert serial.lost_updates == 0
    np.testing.assert_array_equal(serial.O, flash1_forward(Q, K, V, 32, 16))


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_parallel_outer_loop_of_flashattention2_is_exact(workers):
    Q, K, V = _problem(100, 90, 8, seed=workers)
    want, _ = flash2_forward(Q, K, V, 16, 32)
    for concurrent in (True, False):
        got = simulate_parallel_outer_loop("v2", Q, K, V, 16, 32, workers=workers,
                                           concurrent=concurrent)
        assert got.lost_updates == 0
        np.testing.assert_array_equal(got.O, want)  # each worker owns its rows of O


UNEQUAL = [(16, 128), (128, 16), (400, 400), (1, 128), (128, 1), (7, 5)]


def test_exact_across_very_unequal_blocks_float64():
    rows = exactness_table(200, 150, 16, UNEQUAL, dtype=np.float64)
    for r in rows:
        assert r["v1"] <= 1e-12 and r["v2"] <= 1e-12, r
    tiny = exactness_table(9, 7, 4, [(1, 1)], dtype=np.float64)[0]
    assert tiny["v1"] <= 1e-14 and tiny["v2"] <= 1e-14


def test_float32_error_is_at_most_twice_standard_attentions():
    """flash-attn's rule: at most 2x a plain implementation's error in the same dtype (or a
    few float32 roundings of an O(1) output)."""
    floor = 8 * float(np.finfo(np.float32).eps)
    for r in exactness_table(200, 150, 16, UNEQUAL + [(1, 1)], dtype=np.float32):
        assert r["v1"] <= max(2 * r["standard"], floor), r
        assert r["v2"] <= max(2 * r["standard"], floor), r


def test_run_counted_orders_and_errors():
    Q, K, V = _problem(10, 12, 4)
    assert run_counted("standard", Q, K, V).mem.traffic.writes["S"] == 120
    with pytest.raises(ValueError, match="needs dO"):
        run_counted("backward", Q, K, V, 4, 4)
    with pytest.raises(ValueError, match="order must be one of"):
        run_counted("v3", Q, K, V, 4, 4)


# --- the programs of a run ------------------------------------------------------------------

def _programs(run, stage):
    return [p for p in run["programs"] if p["stage"] == stage]


@pytest.mark.parametrize(("n_q", "n_k", "B_r", "B_c"),
                         [(10, 7, 4, 3), (64, 64, 16, 16), (1, 1, 8, 8), (9, 11, 1, 1)])
def test_program_accesses_of_the_two_backward_schedules(n_q, n_k, B_r, B_c):
    T_r, T_c = math.ceil(n_q / B_r), math.ceil(n_k / B_c)
    one = program_accesses("backward", n_q, n_k, B_r, B_c)
    assert (one["T_r"], one["T_c"]) == (T_r, T_c)
    # dQ = 0 before the launch; D by one program per query block; then one per key block
    assert [(s["stage"], s["side"], s["programs"], s["writes"]) for s in one["stages"]] == [
        (-1, None, 1, ["dQ"]), (0, "q", T_r, ["D"]), (1, "kv", T_c, ["dQ", "dK", "dV"])]
    assert one["writers"]["dQ"] == [T_c] * T_r  # every key block's program adds into dQ_i
    assert one["writers"]["dK"] == one["writers"]["dV"] == [1] * T_c
    assert one["shared"] == (["dQ"] if T_c > 1 else [])
    for p in _programs(one, 1):
        j = p["block"]
        assert p["reads"]["K"] == p["reads"]["V"] == [[j, j + 1]]
        assert p["reads"]["Q"] == p["reads"]["dQ"] == [[0, T_r]]  # read-modify-write of dQ
        assert p["writes"]["dQ"] == [[0, T_r]] and p["writes"]["dK"] == [[j, j + 1]]
    two = program_accesses("two_pass_backward", n_q, n_k, B_r, B_c)
    assert [(s["stage"], s["side"], s["programs"], s["writes"]) for s in two["stages"]] == [
        (0, "q", T_r, ["D"]), (1, "kv", T_c, ["dK", "dV"]), (2, "q", T_r, ["dQ"])]
    assert all(c == 1 for counts in two["writers"].values() for c in counts)
    assert two["shared"] == []
    if T_r > 1 and T_c > 1:  # with one block, "own" and "all" coincide
        assert one["stages"][2]["reads_by_program"] == {
            "Q": "all", "K": "own", "V": "own", "L": "all", "dO": "all", "dQ": "all",
            "D": "all"}
        assert one["stages"][2]["writes_by_program"] == {"dQ": "all", "dK": "own", "dV": "own"}
        assert one["stages"][0]["writes_by_program"] == {"dQ": "init"}
        assert two["stages"][2]["reads_by_program"] == {
            "Q": "own", "K": "all", "V": "all", "L": "own", "dO": "own", "D": "own"}
        assert two["stages"][2]["writes_by_program"] == {"dQ": "own"}
    for p in _programs(two, 2):
        i = p["block"]
        assert p["reads"]["Q"] == [[i, i + 1]] and p["reads"]["K"] == [[0, T_c]]
        assert p["writes"] == {"dQ": [[i, i + 1]]} and "dQ" not in p["reads"]
    json.dumps(one), json.dumps(two)


def test_program_accesses_of_the_forward_orders_match_the_parallel_simulation():
    """Algorithm 1's programs share O, l, m (the lost updates of
    simulate_parallel_outer_loop); FlashAttention-2's share nothing."""
    assert program_accesses("v1", 10, 7, 4, 3)["shared"] == ["O", "l", "m"]
    assert program_accesses("v2", 10, 7, 4, 3)["shared"] == []


def test_program_accesses_depend_on_blocks_not_rows():
    """Which blocks each program moves is the same with blocks of 16 rows or of 1: the widget
    runs the cheaper one."""
    for order in ("backward", "two_pass_backward"):
        big, small = (program_accesses(order, 64, 48, 16, 16),
                      program_accesses(order, 4, 3, 1, 1))
        assert big["programs"] == small["programs"] and big["writers"] == small["writers"]


def test_program_accesses_bad_inputs():
    with pytest.raises(ValueError, match="order must be one of"):
        program_accesses("standard", 4, 4, 2, 2)
    with pytest.raises(ValueError, match="n_q must be a positive integer"):
        program_accesses("backward", 0, 4, 2, 2)
    with pytest.raises(TypeError, match="B_c must be an integer"):
        program_accesses("backward", 4, 4, 2, 2.0)
