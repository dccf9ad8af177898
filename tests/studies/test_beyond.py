"""The Beyond chapter's merge tree (flashlib.studies.beyond.split_kv_tree): its root is the
library's split-KV output, behind the library's checks."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.fast.decoding import decode_attention, split_ranges
from flashlib.studies.beyond import split_kv_tree


def test_split_kv_tree_root_is_the_output_and_its_checks():
    rng = np.random.default_rng(5)
    q, K, V = rng.standard_normal((2, 8)), rng.standard_normal((100, 8)), rng.standard_normal(
        (100, 3))
    ranges, levels = split_kv_tree(q, K, V, 7)
    assert ranges == split_ranges(100, 7) and len(levels[0]) == len(ranges)
    _, l, acc = levels[-1][0]
    np.testing.assert_allclose(acc / l[:, None], decode_attention(q, K, V, n_splits=7),
                               atol=1e-13)
    for bad, err, match in [
        ({"n_splits": 0}, ValueError, "n_splits must be a positive integer"),
        ({"n_splits": 2.5}, TypeError, "n_splits must be an integer"),
        ({"K": np.zeros((0, 8)), "V": np.zeros((0, 3))}, ValueError, "at least one row"),
        ({"q": q[None], "K": K[None], "V": V[None]}, ValueError, "must be 2-D"),
        ({"q": q[None]}, ValueError, "equal leading"),
        ({"V": V[:50]}, ValueError, "v must have as many rows as k"),
        ({"q": np.full((1, 8), np.nan)}, ValueError, "q must contain only finite values"),
        ({"q": np.ones((1, 8), dtype=int)}, TypeError, "q must have a floating dtype")]:
        args = {"q": q, "K": K, "V": V, "n_splits": 3, **bad}
        with pytest.raises(err, match=match):
            split_kv_tree(args["q"], args["K"], args["V"], args["n_splits"])


def test_fa3_timeline_schedules():
    """The tensor cores run one matmul at a time, each warpgroup's steps follow its data
    dependencies, and the overlaps shorten a tile: serial > pipelined > ping-pong (per tile)."""
    from flashlib.studies.beyond import fa3_timeline

    share, tiles = 0.5, 5
    per_tile = {}
    for schedule, steps in (("serial", tiles), ("ping-pong", 2 * tiles), ("pipelined", tiles)):
        ops = fa3_timeline(schedule, share, tiles)
        mm = sorted((a, b) for _, a, b, kind, _ in ops if kind == "matmul")
        assert len(mm) == 2 * steps  # S_j = Q K_j^T and P_j V_j per tile
        assert all(b1 <= a2 + 1e-12 for (_, b1), (a2, _) in zip(mm, mm[1:], strict=False))
        soft = [(a, b) for _, a, b, kind, _ in ops if kind == "softmax"]
        assert len(soft) == steps and all(abs(b - a - 2 * share) < 1e-12 for a, b in soft)
        # a tile's softmax starts after its QK and ends before its PV
        for row in {r for r, *_ in ops}:
            by_name = {name: (a, b) for r, a, b, _, name in ops if r == row}
            for j in range(1, tiles + 1):
                if f"exp_{j}" in by_name and f"QK_{j}" in by_name:
                    assert by_name[f"QK_{j}"][1] <= by_name[f"exp_{j}"][0] + 1e-12
        for j in range(1, tiles + 1):
            names = [(r, a, b, n) for r, a, b, _, n in ops]
            for r, _, b, n in names:
                if n == f"exp_{j}":
                    pv = [a2 for r2, a2, _, n2 in names if n2 == f"P_{j}V_{j}"
                          and (r2 == r or schedule == "pipelined")]
                    assert min(pv) >= b - 1e-12
        per_tile[schedule] = max(b for _, _, b, _, _ in ops) / steps
    assert per_tile["serial"] == pytest.approx(2 + 2 * share)
    assert per_tile["ping-pong"] < per_tile["pipelined"] < per_tile["serial"]
    for bad, err in [(("fast", 0.5, 2), "schedule"), (("serial", 0.0, 2), "exp_share"),
                     (("serial", True, 2), "exp_share"), (("serial", 0.5, 0), "tiles")]:
        with pytest.raises(ValueError, match=err):
            fa3_timeline(*bad)


@pytest.mark.parametrize(("lengths", "P", "S"), [([13, 40, 27], 8, 2), ([50, 6, 31], 4, 4),
                                                 ([1], 16, 3), ([0, 5], 1, 2)])
def test_paged_layout_is_a_consistent_pool(lengths, P, S):
    """Every page of a table is owned by that sequence's block, only a last page is part
    full, rows add up to the lengths, and the splits are runs of ceil(T / S) entries."""
    from flashlib.studies.beyond import paged_layout

    lay = paged_layout(lengths, P, S, spare=3)
    assert lay.owner[-3:] == [None] * 3 and lay.rows[-3:] == [0] * 3
    for b, (n, table, splits) in enumerate(zip(lengths, lay.tables, lay.splits, strict=True)):
        assert len(table) == -(-n // P) == len(splits)
        assert [lay.owner[p] for p in table] == [(b, t) for t in range(len(table))]
        assert sum(lay.rows[p] for p in table) == n
        assert all(lay.rows[p] == P for p in table[:-1])
        runs = split_ranges(len(table), S)  # as paged_kv_decode cuts the table
        assert splits == [s for s, (a, b) in enumerate(runs) for _ in range(a, b)]
    assert sorted(p for t in lay.tables for p in t) == list(range(len(lay.owner) - 3))


def test_paged_layout_refuses_bad_sizes():
    from flashlib.studies.beyond import paged_layout

    with pytest.raises(ValueError, match="page_size"):
        paged_layout([3], 0, 1)
    with pytest.raises(ValueError, match="n_splits"):
        paged_layout([3], 4, 0)
