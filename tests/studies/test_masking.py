"""flashlib.studies.masking: the problem of rows blind in one tile, the stored-guard mistake,
and where exp underflows (the masking chapter's demo, issue 23)."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.studies.masking import (
    BLIND_ROWS,
    blind_row_problem,
    guard_outcomes,
    stored_guard_forward,
    underflow_score,
)
from tests.helpers import max_err, reference_attention


def test_blind_row_problem_has_both_kinds_of_blind_rows():
    """Rows that see no key, and rows that see none in a computed first key tile and some in
    the second: the case the chapter's text describes."""
    Q, K, V, mask = blind_row_problem()
    p = BLIND_ROWS
    assert Q.shape == (p["n_q"], p["d"]) and K.shape == (p["n_k"], p["d"])
    assert V.shape == (p["n_k"], p["d_v"]) and mask.shape == (p["n_q"], p["n_k"])
    sees_none = ~mask.any(axis=1)
    late = ~mask[:, :p["B_c"]].any(axis=1) & ~sees_none
    assert sees_none.any() and late.any()
    # the late rows' first tile is computed (partial for their query block), not skipped
    block = np.flatnonzero(late)[0] // p["B_r"]
    assert mask[block * p["B_r"] : (block + 1) * p["B_r"], : p["B_c"]].any()


@pytest.mark.parametrize("shift", [-800.0, -1000.0])
def test_shift_moves_the_second_tile_scores(shift):
    Q, K, _, mask = blind_row_problem(shift=shift)
    base_Q, base_K, _, _ = blind_row_problem()
    S = Q @ K.T / np.sqrt(Q.shape[1])
    S0 = base_Q @ base_K.T / np.sqrt(Q.shape[1])
    c = BLIND_ROWS["B_c"]
    assert np.allclose(S[:, c:] - S0[:, c:], shift) and np.allclose(S[:, :c], S0[:, :c])


def test_stored_guard_is_right_near_zero_and_wrong_far_below():
    Q, K, V, mask = blind_row_problem()
    O, L = stored_guard_forward(Q, K, V, mask, BLIND_ROWS["B_r"], BLIND_ROWS["B_c"])
    assert max_err(O, reference_attention(Q, K, V, mask=mask)[0]) < 1e-12
    Q, K, V, mask = blind_row_problem(shift=-800.0)
    O, L = stored_guard_forward(Q, K, V, mask, BLIND_ROWS["B_r"], BLIND_ROWS["B_c"])
    late = ~mask[:, :BLIND_ROWS["B_c"]].any(axis=1) & mask.any(axis=1)
    assert (O[late] == 0).all() and np.isneginf(L[late]).all()


def test_guard_outcomes():
    out = guard_outcomes(-800.0)
    assert out["error"]["guard in the exponent only"] < 1e-12
    assert out["error"]["guard stored in m"] > 0.1
    assert np.isnan(out["results"]["no guard"][0][out["blind_in_first_tile"]]).all()


def test_underflow_score():
    for dtype in (np.float64, np.float32):
        x = underflow_score(dtype)
        assert np.exp(dtype(x - 0.01)) == 0 and np.exp(dtype(x + 0.01)) > 0
    assert round(underflow_score(np.float64), 1) == -745.1
    assert round(underflow_score(np.float32), 1) == -104.0



@pytest.mark.slow  # 6 s: in make test, not in make check's fast loop
def test_dropout_memory_grows_linearly_while_the_mask_grows_quadratically():
    """What the masking chapter's dropout experiment glues: each pass holds less than the
    stored mask at n = 2048, and twice n costs at most about twice the bytes (O(n d) plus
    tiles), where the mask costs four times as much."""
    from flashlib.studies.masking import dropout_memory

    small, large = dropout_memory(1024), dropout_memory(2048)
    assert large["mask_bytes"] == 4 * small["mask_bytes"] == 4 * 1024 * 1024
    assert large["state_bytes"] == 16
    for key in ("forward", "backward"):
        assert 0 < large[key] < large["mask_bytes"] / 4
        assert large[key] < 2.2 * small[key]
