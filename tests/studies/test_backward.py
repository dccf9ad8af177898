"""The backward chapter's numerics (flashlib.studies.backward, flashlib.book.autograd): the
identities D = rowsum(dP * P) = rowsum(dO * O) and P = exp(S - L), finite differences and their
step, the gradient-checking ladder (torch optional), dQ's bits under shuffled program orders, the
bytes saved for backward, the FLOPs of recomputing (modelled and counted), the base-2 trap,
and the widget's table."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from flashlib.algorithms import (
    flash2_backward,
    flash2_forward,
    safe_softmax,
    standard_attention_backward,
    two_pass_backward,
)
from flashlib.book import autograd as ag
from flashlib.core.constants import LN2, LOG2E
from flashlib.core.measure import measure_peak
from flashlib.fast.forward import flash_attention
from flashlib.fast.naive import naive_attention_backward
from flashlib.studies import backward as g
from flashlib.studies import io_model as io
from tests.helpers import torch_grads


def _problem(n_q, n_k, d, d_v=None, seed=0, lead=()):
    d_v = d if d_v is None else d_v
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((*lead, *s)) for s in ((n_q, d), (n_k, d), (n_k, d_v),
                                                            (n_q, d_v)))


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / max(1e-300, float(np.max(np.abs(b)))))


# --- the identities -------------------------------------------------------------------------

@pytest.mark.parametrize("lead", [(), (2, 3)])
@pytest.mark.parametrize(("n_q", "n_k", "d_v"), [(37, 29, 8), (1, 5, 3), (6, 1, 4)])
def test_D_two_ways(lead, n_q, n_k, d_v):
    rng = np.random.default_rng(0)
    P = safe_softmax(rng.standard_normal((*lead, n_q, n_k)) * 3)
    V, dO = rng.standard_normal((*lead, n_k, d_v)), rng.standard_normal((*lead, n_q, d_v))
    O, dP = P @ V, dO @ np.swapaxes(V, -1, -2)
    D_P, D_O = g.delta_from_P(P, dP), g.delta_from_O(O, dO)
    assert D_P.shape == D_O.shape == (*lead, n_q)
    assert _rel(D_O, D_P) <= 1e-13


def test_D_from_O_forms_no_n_by_n_array():
    N, d_v = 4096, 8
    O, dO = np.ones((N, d_v)), np.ones((N, d_v))
    _, peak = measure_peak(g.delta_from_O, O, dO)
    assert peak <= 4 * N * d_v * 8  # a product N x d_v and the result, never N x N


@pytest.mark.parametrize(("n_q", "n_k", "B_r", "B_c"), [(37, 29, 16, 8), (1, 7, 4, 4),
                                                        (9, 11, 1, 1), (7, 9, 64, 128)])
def test_P_recomputed_tile_by_tile_is_softmax(n_q, n_k, B_r, B_c):
    Q, K, V, _ = _problem(n_q, n_k, 8)
    _, L = flash2_forward(Q, K, V, B_r, B_c)
    P = g.recompute_P(Q, K, L, B_r, B_c)
    assert _rel(P, safe_softmax(Q @ K.T / math.sqrt(8))) <= 1e-14
    assert np.max(np.abs(P.sum(axis=1) - 1)) <= 1e-14


def test_softmax_vjp_is_the_formula_and_autograd():
    Q, K, V, dO = _problem(12, 9, 4)
    S = Q @ K.T
    P, dP = safe_softmax(S), dO @ V.T
    dS = g.softmax_vjp(P, dP)
    assert _rel(dS, P * (dP - g.delta_from_P(P, dP)[:, None])) <= 1e-13
    assert _rel(dS, ag.score_grads(S, V, dO)) <= 1e-13


def test_identity_table():
    rows = {r["dtype"]: r for r in g.identity_table()}
    for key in ("D_two_ways", "D_vs_float64", "P_recomputed", "row_sums", "dS_formula"):
        assert rows["float64"][key] <= 4e-15, key
        assert 0 < rows["float32"][key] <= 2e-6, key


# --- finite differences ---------------------------------------------------------------------

def test_central_difference_of_a_cubic_is_exact_up_to_h_squared():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3))
    x0 = x.copy()
    w = np.arange(1.0, 13).reshape(4, 3)
    grad = g.central_difference(lambda y: float(np.sum(w * y**3)), x, h=1e-2)
    assert np.max(np.abs(grad - (3 * w * x**2 + w * 1e-4))) <= 1e-9
    np.testing.assert_array_equal(x, x0)  # left alone
    default = g.central_difference(lambda y: float(np.sum(w * y**3)), x)
    assert np.max(np.abs(default - 3 * w * x**2)) <= 1e-8 * np.max(np.abs(3 * w * x**2))
    assert g.FD_STEP == pytest.approx(6.055e-6, rel=1e-3)


@pytest.mark.parametrize(("causal", "padding"), [(False, 0), ("bottom_right", 0), (False, 3)])
def test_fd_attention_grads_match_the_analytic_gradient(causal, padding):
    Q, K, V, dO = _problem(7, 9, 3, d_v=2, seed=1)
    mask = None
    if padding:
        mask = np.ones((1, 9), dtype=bool)
        mask[:, -padding:] = False
    fd = g.fd_attention_grads(Q, K, V, dO, causal=causal, mask=mask)
    exact = naive_attention_backward(Q, K, V, dO, causal=causal, mask=mask)
    for a, b in zip(fd, exact, strict=True):
        assert np.max(np.abs(a - b)) <= 1e-8 * max(1.0, float(np.max(np.abs(b))))
    if padding:  # padded keys: zero gradient, exactly, in both
        assert not exact[1][-padding:].any() and np.max(np.abs(fd[1][-padding:])) <= 1e-9


def test_fd_step_sweep_has_the_V_shape():
    rows = g.fd_step_sweep()
    central = {r["h"]: r["central"] for r in rows}
    forward = {r["h"]: r["forward"] for r in rows}
    best = min(central, key=central.get)
    assert 1e-7 <= best <= 1e-4 and central[best] <= 1e-9  # near eps^(1/3)
    assert central[1e-12] > 100 * central[best]  # rounding wins at tiny steps
    assert central[1e-2] > 100 * central[best]  # truncation wins at large ones
    assert all(central[h] < forward[h] / 10 for h in (1e-1, 1e-2, 1e-3, 1e-4))
    assert min(forward.values()) > 10 * central[best]  # forward's best is sqrt(eps)-ish


# --- the ladder -----------------------------------------------------------------------------

SMALL_CASES = (g.LADDER_CASES[0], g.LADDER_CASES[1],
               g.LadderCase("2 heads, 6 x 9 x 4, padded, causal", (2,), 6, 9, 4, 4, 4,
                            "bottom_right", 2),
               g.LadderCase("13 x 10 x 4, ragged", (), 13, 10, 4, 4, 8, False, 0))


def _check_ladder(rows, autograd):
    by_step = {r["step"]: r for r in rows}
    assert list(by_step) == ["finite differences (float64)", "torch autograd (float64)",
                             "tiled backward (float64)", "naive backward (float32)",
                             "tiled backward (float32)", "flash2_backward (float32)",
                             "two_pass_backward (float32)"]
    labels = [c.label for c in SMALL_CASES]
    for step, row in by_step.items():
        assert list(row["errors"]) == labels
        for label, err in row["errors"].items():
            if err is None:
                continue
            limit = {"finite": 1e-8, "torch": 1e-14, "tiled backward (float64)": 1e-14}
            bound = next((v for k, v in limit.items() if step.startswith(k)), 2e-6)
            assert 0 <= err <= bound, (step, label, err)
            if "float32" in step:
                assert err > 1e-9, (step, label)  # float32 rounding, not float64 by mistake
    assert all(v is not None for v in by_step["finite differences (float64)"]["errors"].values())
    teach = by_step["two_pass_backward (float32)"]["errors"]
    assert teach[labels[0]] is not None and teach[labels[3]] is not None
    assert teach[labels[1]] is None and teach[labels[2]] is None  # masks: library only
    autograd_errors = by_step["torch autograd (float64)"]["errors"].values()
    assert all((e is None) == (not autograd) for e in autograd_errors)
    json.dumps(rows)


def test_gradient_ladder_with_and_without_autograd():
    _check_ladder(g.gradient_ladder(SMALL_CASES, autograd=ag.attention_grads), True)
    rows = g.gradient_ladder(SMALL_CASES)
    _check_ladder(rows, False)
    assert "not installed" in rows[1]["note"]


def test_book_ladder_says_so_when_torch_is_missing(monkeypatch):
    assert ag.torch_available()
    _check_ladder(ag.ladder(SMALL_CASES), True)
    monkeypatch.setattr(ag, "torch_available", lambda: False)
    rows = ag.ladder(SMALL_CASES)
    _check_ladder(rows, False)
    assert rows[1]["note"] == ag.TORCH_MISSING
    for fn, args in ((ag.attention_grads, _problem(3, 3, 2)), (ag.score_grads, (np.ones((2, 2)),
                                                                               np.ones((2, 1)),
                                                                               np.ones((2, 1))))):
        with pytest.raises(ModuleNotFoundError, match="torch is not installed"):
            fn(*args)


@pytest.mark.parametrize(("causal", "mask_kind"), [(False, None), (True, None),
                                                   ("bottom_right", "rows")])
def test_book_attention_grads_match_the_tests_torch_reference(causal, mask_kind):
    Q, K, V, dO = _problem(9, 7, 4, d_v=3, lead=(2,))
    mask = None
    if mask_kind:
        mask = np.ones((2, 9, 7), dtype=bool)
        mask[:, 3] = False  # a row that sees no key
    got = ag.attention_grads(Q, K, V, dO, causal=causal, mask=mask)
    _, *want = torch_grads(Q, K, V, dO, causal=causal, mask=mask)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)


# --- determinism ----------------------------------------------------------------------------

def _visits(X, seen):
    for i in range(0, len(X), 3):
        inner = [j for j in range(0, len(X), 4)]
        seen.append((i, inner, X[i : i + 3]))


def test_program_order_shuffles_only_the_outer_loop():
    X, seen = np.arange(10), []
    g.ProgramOrder(np.random.default_rng(0)).run(_visits, X, seen)
    for i, inner, X_i in seen:
        assert inner == [0, 4, 8]
        np.testing.assert_array_equal(X_i, X[i : i + 3])
    starts = [i for i, _, _ in seen]
    assert sorted(starts) == [0, 3, 6, 9] and starts != [0, 3, 6, 9]


def test_shuffled_programs_change_dQ_bits_only_in_flash2_order():
    Q, K, V, dO = (x.astype(np.float32) for x in _problem(64, 64, 16, seed=2))
    O, L = flash2_forward(Q, K, V, 16, 8)
    plain1 = flash2_backward(Q, K, V, O, L, dO, 16, 8)
    plain2 = two_pass_backward(Q, K, V, O, L, dO, 16, 8)
    rng = np.random.default_rng(5)
    runs1 = [g.ProgramOrder(rng).run(flash2_backward, Q, K, V, O, L, dO, 16, 8)
             for _ in range(4)]
    runs2 = [g.ProgramOrder(rng).run(two_pass_backward, Q, K, V, O, L, dO, 16, 8)
             for _ in range(4)]
    assert any(not np.array_equal(r[0], plain1[0]) for r in runs1)
    for r in runs1:
        assert _rel(r[0], plain1[0]) <= 1e-6
        np.testing.assert_array_equal(r[1], plain1[1])  # dK, dV: summed inside one program
        np.testing.assert_array_equal(r[2], plain1[2])
    for r in runs2:
        for a, b in zip(r, plain2, strict=True):
            np.testing.assert_array_equal(a, b)


def test_ulp_distance():
    x = np.array([1.0, 1.0, 0.0, -0.0, 1e-30, -2.0], dtype=np.float32)
    up = np.nextafter(x, np.float32(np.inf))
    assert ulp_list(x, x) == [0] * 6
    assert ulp_list(x, up) == [1] * 6
    assert ulp_list(np.float32([0.0]), np.float32([-0.0])) == [0]
    tiny = np.float32([np.finfo(np.float32).smallest_subnormal])
    assert ulp_list(tiny, -tiny) == [2]
    assert ulp_list(np.float32([1.0]), np.float32([2.0])) == [2**23]
    assert ulp_list(np.float64([1.0]), np.float64([2.0])) == [2**52]
    assert ulp_list(np.float16([1.0]), np.float16([-1.0])) == [2 * 15360]
    with pytest.raises(TypeError, match="one dtype"):
        g.ulp_distance(np.float32([1.0]), np.float64([1.0]))
    with pytest.raises(TypeError, match="float arrays"):
        g.ulp_distance(np.int32([1]), np.int32([1]))


def ulp_list(a, b):
    return [int(u) for u in g.ulp_distance(a, b)]


def test_determinism_table():
    rows = {(r["schedule"], r["dtype"]): r for r in g.determinism_table(n=64, d=16, B_r=16,
                                                                        B_c=8, runs=5)}
    for dtype, eps in (("float32", 1.2e-7), ("float64", 2.3e-16)):
        one, two = rows["backward", dtype], rows["two_pass_backward", dtype]
        assert one["distinct"] > 1 and one["entries_differ"] > 0.1 and one["max_ulps"] >= 1
        assert one["max_diff"] <= 8 * eps and one["max_diff_ulps"] <= 8
        assert one["error"] <= 1e3 * eps and one["dK_dV_same"]
        assert sum(one["ulps"].values()) == 64 * 16
        assert two["distinct"] == 1 and two["max_ulps"] == 0 and two["max_diff"] == 0
        assert two["ulps"]["0"] == 64 * 16 and two["dK_dV_same"]
    json.dumps(list(rows.values()))


# --- saved bytes and FLOPs ------------------------------------------------------------------

def test_saved_bytes_are_the_arrays_the_forward_keeps():
    n, d = 300, 16
    q, k, v, do = (x.astype(np.float16) for x in _problem(n, n, d))
    o, lse = flash_attention(q, k, v, return_lse=True)
    flash = g.saved_bytes(n, n, d, "flash", dtype=np.float16)
    assert flash["O"] == o.nbytes and flash["L"] == lse.nbytes
    assert flash["D"] == g.delta_from_O(o.astype(np.float32), do.astype(np.float32)).nbytes
    standard = g.saved_bytes(n, n, d, "standard", dtype="float16")
    assert standard == {"P": n * n * 2, "O": o.nbytes}
    assert g.saved_bytes(n, n, d, "flash", dtype="float64")["L"] == n * 8
    assert g.saved_bytes(4, 6, 3, "standard", d_v=5, dtype="float32") == {"P": 96, "O": 80}


def test_saved_table_grows_linearly_in_n():
    rows = g.saved_table([1024, 2048, 4096], d=64)
    ratios = [r["ratio"] for r in rows]
    assert 15 < ratios[0] < 17 and 1.9 < ratios[1] / ratios[0] < 2.1
    assert 1.9 < ratios[2] / ratios[1] < 2.1
    assert rows[0]["flash"] == 1024 * (64 * 2 + 4 + 4)


def test_backward_flops_accounting():
    for order, ratio in (("standard", 2.0), ("backward", 2.5), ("two_pass_backward", 3.5)):
        f = g.backward_flops(4096, 4096, 64, order=order)
        assert f["forward"] == io.attention_flops(4096, 4096, 64)
        assert f["ratio"] == ratio and f["total"] == f["gradients"] + f["recompute"]
        c = g.backward_flops(4096, 4096, 64, order=order, causal=True)
        assert c["total"] == f["total"] / 2 and c["ratio"] == ratio
    assert g.backward_flops(10, 10, 4, d_v=2, order="backward")["forward"] == 2 * 100 * 6


@pytest.mark.parametrize(("n_q", "n_k", "d", "d_v", "B_r", "B_c"),
                         [(37, 29, 8, 8, 8, 16), (9, 11, 4, 3, 1, 1), (7, 9, 8, 5, 64, 128)])
def test_counted_matmul_flops_equal_the_model(n_q, n_k, d, d_v, B_r, B_c):
    Q, K, V, dO = _problem(n_q, n_k, d, d_v)
    (O, L), forward = g.count_matmul_flops(flash2_forward, Q, K, V, B_r, B_c)
    assert type(O) is np.ndarray and type(L) is np.ndarray
    assert forward == g.backward_flops(n_q, n_k, d, d_v=d_v)["forward"]
    for fn, order in ((flash2_backward, "backward"), (two_pass_backward, "two_pass_backward")):
        grads, flops = g.count_matmul_flops(fn, Q, K, V, O, L, dO, B_r, B_c)
        assert flops == g.backward_flops(n_q, n_k, d, d_v=d_v, order=order)["total"]
        for a, b in zip(grads, fn(Q, K, V, O, L, dO, B_r, B_c), strict=True):
            np.testing.assert_array_equal(a, b)  # counting changes nothing
    # the teaching standard backward recomputes P from Q K^T too: the FlashAttention count
    _, flops = g.count_matmul_flops(standard_attention_backward, Q, K, V, dO)
    assert flops == g.backward_flops(n_q, n_k, d, d_v=d_v, order="backward")["total"]


def test_count_matmul_flops_counts_products():
    a, b = np.ones((3, 4)), np.ones((4, 5))
    assert g.count_matmul_flops(lambda x, y: x @ y, a, b)[1] == 2 * 3 * 4 * 5
    assert g.count_matmul_flops(lambda x, y: np.matmul(x, y) + x @ y, a, b)[1] == 4 * 60
    batched = np.ones((2, 3, 4))
    assert g.count_matmul_flops(lambda x, y: x @ y, batched, b)[1] == 2 * 2 * 3 * 4 * 5
    assert g.count_matmul_flops(lambda x: np.exp(x).sum(), a)[1] == 0


# --- the base-2 trap ------------------------------------------------------------------------

def test_base2_logsumexp_and_recovering_P():
    rng = np.random.default_rng(0)
    S = rng.standard_normal((5, 40)) * 4
    L = np.log(np.sum(np.exp(S), axis=1))
    M = g.lse_base2(S)
    assert np.max(np.abs(M - L * LOG2E)) <= 1e-13
    P = safe_softmax(S)
    assert _rel(g.p_from_lse(S, M, base="2"), P) <= 1e-14
    assert _rel(g.p_from_lse(S, L, base="e"), P) <= 1e-14
    wrong = g.p_from_lse(S, M, base="e")
    np.testing.assert_allclose(wrong / P, np.broadcast_to(np.exp(L * (1 - LOG2E))[:, None],
                                                          P.shape), rtol=1e-12)
    assert g.p_from_lse(S, M * LN2) == pytest.approx(P, rel=1e-12)


@pytest.mark.parametrize(("logit", "shift"), [(1.0, 0.0), (3.0, 0.0), (1.0, -20.0)])
def test_base2_trap(logit, shift):
    t = g.base2_trap(logit=logit, shift=shift)
    assert np.allclose(t["M_over_L"], LOG2E, rtol=1e-12)
    assert np.allclose(t["right_row_sums"], 1, rtol=1e-13)
    np.testing.assert_allclose(t["wrong_row_sums"], t["predicted_factor"], rtol=1e-12)
    assert t["factor_error"] <= 1e-12
    if shift == 0:
        assert np.all(t["L"] > 0) and np.all(t["predicted_factor"] < 1)  # rows sum to < 1
    else:
        assert np.all(t["L"] < 0) and np.all(t["predicted_factor"] > 1)  # rows sum to > 1


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="method must be one of"):
        g.saved_bytes(4, 4, 2, "paged")
    with pytest.raises(TypeError, match="dtype must be float16"):
        g.saved_bytes(4, 4, 2, dtype="int8")
    with pytest.raises(ValueError, match="n_q must be a non-negative integer"):
        g.saved_bytes(-1, 4, 2)
    with pytest.raises(ValueError, match="order must be one of"):
        g.backward_flops(4, 4, 2, order="v2")
    with pytest.raises(ValueError, match="base must be"):
        g.p_from_lse(np.ones((2, 2)), np.ones(2), base="10")
