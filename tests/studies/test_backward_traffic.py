"""FlashAttention-1's backward (Algorithm 4) against FlashAttention-2's and the two-pass
backward: every array's HBM traffic, counted by the counting memory, equals its formula; dQ's
extra traffic (over writing dQ once) is 2 T_c n_q d for both single-kernel schedules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashlib.algorithms import flash1_backward
from flashlib.core.hbm import CountingMemory
from flashlib.studies.backward import backward_traffic_table, flash1_backward_traffic
from flashlib.studies.tiling import KEY_SIDE


@settings(max_examples=30, deadline=None)
@given(n_q=st.integers(1, 40), n_k=st.integers(1, 40), d=st.integers(1, 6),
       d_v=st.integers(1, 6), B_r=st.integers(1, 45), B_c=st.integers(1, 45))
def test_flash1_backward_traffic_formula_equals_the_counts(n_q, n_k, d, d_v, B_r, B_c):
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal(s) for s in ((n_q, d), (n_k, d), (n_k, d_v),
                                                     (n_q, d_v)))
    s = q @ k.T / math.sqrt(d)
    m = s.max(axis=1)
    l = np.exp(s - m[:, None]).sum(axis=1)  # noqa: E741
    o = (np.exp(s - m[:, None]) / l[:, None]) @ v
    mem = CountingMemory(key_side=KEY_SIDE, score_tiles=2)
    mem.run(flash1_backward, *mem.inputs(Q=q, K=k, V=v, O=o, l=l, m=m, dO=do), B_r, B_c)
    formula = flash1_backward_traffic(n_q, n_k, d, B_r=B_r, B_c=B_c, d_v=d_v)
    assert mem.traffic.reads == formula.reads
    assert mem.traffic.writes == formula.writes


@pytest.mark.parametrize(("n_q", "n_k", "d", "d_v", "B_r", "B_c"), [
    (37, 29, 8, 5, 8, 6), (64, 64, 16, 16, 16, 16), (1, 9, 4, 4, 4, 2), (9, 1, 3, 2, 2, 4)])
def test_table_counts_equal_formulas_and_dq_extra(n_q, n_k, d, d_v, B_r, B_c):
    rows = {r["schedule"]: r for r in backward_traffic_table(n_q, n_k, d, B_r=B_r, B_c=B_c,
                                                             d_v=d_v)}
    t_c = -(-n_k // B_c)
    for row in rows.values():
        assert row["total"] == row["formula_total"] == row["reads"] + row["writes"]
    for name in ("flash1_backward", "flash2_backward"):
        assert rows[name]["dq_extra"] == 2 * t_c * n_q * d  # read T_c times, written 1 + T_c
    assert rows["two_pass_backward"]["dq_extra"] == 0  # written once
    # FA-1 - FA-2: O read in every pass but the one FA-2's D makes, dO once less, no D
    # written, dK and dV initialised in HBM
    diff = rows["flash1_backward"]["total"] - rows["flash2_backward"]["total"]
    assert diff == (t_c - 1) * n_q * d_v - n_q * d_v - n_q + n_k * (d + d_v)
