"""The dQ race, simulated: two or three programs read-modify-writing one block of dQ lose
updates in every interleaving but the serial ones; atomic adds and the interpreter's one-by-one
order always give the sum; with real shares (each key block's scale * dS_ij @ K_j) the serial
sum is the gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashlib.algorithms import flash2_forward, standard_attention_backward
from flashlib.studies.dq_race import (
    interleavings,
    interpreter_schedule,
    race_table,
    run_schedule,
)


@pytest.mark.parametrize("programs", [1, 2, 3, 4])
def test_only_the_serial_orders_are_right(programs):
    table = race_table(programs)
    assert table["interleavings"] == math.factorial(2 * programs) // 2**programs
    assert table["plain_right"] == math.factorial(programs)  # one program at a time
    assert table["plain_lost"] == table["interleavings"] - math.factorial(programs)
    assert table["atomic_right"] == table["interleavings"]
    assert table["interpreter_right"] is True


def test_a_lost_update_is_one_share_missing():
    shares = np.array([[1.0, 2.0], [10.0, 20.0]])
    both_load_first = [(0, "load"), (1, "load"), (0, "store"), (1, "store")]
    np.testing.assert_array_equal(run_schedule(shares, both_load_first), shares[1])
    np.testing.assert_array_equal(
        run_schedule(shares, [(0, "atomic"), (1, "atomic")]), shares.sum(0))
    np.testing.assert_array_equal(run_schedule(shares, interpreter_schedule(2)),
                                  shares.sum(0))
    np.testing.assert_array_equal(run_schedule(shares, interpreter_schedule(2, atomic=True)),
                                  shares.sum(0))


def test_every_interleaving_is_a_valid_order():
    for order in interleavings(3):
        assert len(order) == 6
        for p in range(3):
            assert order.index((p, "load")) < order.index((p, "store"))
    assert len({tuple(o) for o in interleavings(3)}) == 90


def test_real_dq_shares_sum_to_the_gradient_only_without_a_race():
    """Query block 0's share from each key block's program, as flash2_backward adds them."""
    rng = np.random.default_rng(0)
    Q, K, V, dO = (rng.standard_normal(s) for s in ((8, 4), (12, 4), (12, 4), (8, 4)))
    O, L = flash2_forward(Q, K, V, 4, 6)
    scale = 1 / math.sqrt(4)
    D = np.sum(dO * O, axis=1)
    shares = []
    for j in (0, 6):  # two programs, one per key block of 6
        P = np.exp(scale * Q[:4] @ K[j : j + 6].T - L[:4, None])
        dS = P * (dO[:4] @ V[j : j + 6].T - D[:4, None])
        shares.append(scale * dS @ K[j : j + 6])
    want = standard_attention_backward(Q, K, V, dO)[0][:4]
    got = run_schedule(np.array(shares), interpreter_schedule(2))
    assert np.abs(got - want).max() <= 1e-12
    raced = run_schedule(np.array(shares), [(0, "load"), (1, "load"), (1, "store"),
                                            (0, "store")])
    assert np.abs(raced - want).max() > 1e-3  # program 1's share lost


def test_bad_steps_are_refused():
    with pytest.raises(ValueError, match="stores before it loads"):
        run_schedule(np.ones((2, 1)), [(0, "store")])
    with pytest.raises(ValueError, match="'load', 'store' or 'atomic'"):
        run_schedule(np.ones((2, 1)), [(0, "add")])
