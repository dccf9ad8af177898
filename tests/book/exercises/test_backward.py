"""The checkers of the backward chapter (flashlib.book.exercises.backward) accept right
answers and survive crashing or unattempted ones; the common wrong ones, each with the line
that says what went wrong, are declared in flashlib/book/exercises/mistakes/backward.py
(tests/book/exercises/test_declared_mistakes.py)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from flashlib import flash_attention_backward
from flashlib.book import autograd as ag
from flashlib.book.exercises import NOT_ATTEMPTED
from flashlib.book.exercises import backward as bx
from flashlib.book.exercises.mistakes import backward as mistakes
from flashlib.core.accuracy import assert_error_within
from flashlib.core.constants import LN2, LOG2E
from flashlib.fast.naive import naive_attention
from flashlib.studies.masking import blind_row_problem
from tests.helpers import (
    assert_fails_with,
    book_solution,
    crashing,
    not_attempted,
    plain_attention_backward,
    text,
)

try:
    from tests.helpers import torch_grads
except ImportError:  # pragma: no cover
    torch_grads = None

# ---- D when L has a gradient ---------------------------------------------------------------

DLSE_SOLUTION = book_solution("backward", "ex-backward-delta")["delta_with_dlse"]


def dlse_right(O, dO, dL):
    return np.sum(dO * O, axis=-1) - dL


def test_delta_with_dlse_accepts_right_answers():
    for fn in (DLSE_SOLUTION, dlse_right,
               lambda O, dO, dL: np.einsum("ij,ij->i", O, dO) - dL,
               lambda O, dO, dL: (dO * O).sum(axis=1, keepdims=True) - dL[:, None]):
        fb = bx.check_delta_with_dlse(fn)
        assert fb.passed, text(fb)
        assert "no (N, N) array" in text(fb)


def test_delta_with_dlse_not_attempted_and_crashing():
    assert bx.check_delta_with_dlse(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(bx.check_delta_with_dlse(crashing), "your function raised ValueError: oops")


# ---- dS for one tile -----------------------------------------------------------------------

def ds_right(P, dP, D):
    return P * (dP - D[:, None])


@pytest.mark.parametrize("torch_here", [True, False])
def test_ds_tile_accepts_the_right_answer(monkeypatch, torch_here):
    if not torch_here:
        monkeypatch.setattr(ag, "torch_available", lambda: False)
    fb = bx.check_ds_tile(ds_right)
    assert fb.passed, text(fb)
    assert ("autograd" if torch_here else "the softmax's Jacobian") in text(fb)


def test_ds_tile_not_attempted_and_crashing():
    assert bx.check_ds_tile(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(bx.check_ds_tile(crashing), "your function raised ValueError: oops")


# ---- P from a base-2 logsumexp -------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda S, M: np.exp2(S * LOG2E - M[:, None]),
                                lambda S, M: np.exp(S - M[:, None] * LN2)])
def test_p_from_base2_accepts_right_answers(fn):
    fb = bx.check_p_from_base2(fn)
    assert fb.passed, text(fb)


def test_p_from_base2_not_attempted_and_crashing():
    assert bx.check_p_from_base2(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(bx.check_p_from_base2(crashing), "your function raised ValueError: oops")


# ---- finite differences --------------------------------------------------------------------

def fd_right(f, X, h):
    X = np.array(X, dtype=float)
    grad = np.empty_like(X)
    for k in np.ndindex(X.shape):
        orig = X[k]
        X[k] = orig + h
        plus = f(X)
        X[k] = orig - h
        minus = f(X)
        X[k] = orig
        grad[k] = (plus - minus) / (2 * h)
    return grad


def test_finite_differences_accepts_the_right_answer():
    fb = bx.check_finite_differences(fd_right)
    assert fb.passed, text(fb)
    assert "match the analytic dQ, dK, dV" in text(fb)
    # perturbs X itself and puts every entry back: fine
    in_place = functools.partial(mistakes._fd, copy=False)
    assert bx.check_finite_differences(in_place).passed


def test_finite_differences_not_attempted_and_crashing():
    assert bx.check_finite_differences(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(bx.check_finite_differences(crashing),
                      "your function raised ValueError: oops")


# ---- the tiled backward with a mask --------------------------------------------------------

MASKED_SOLUTION = book_solution("backward", "ex-backward-masked")["masked_flash2_backward"]


@pytest.mark.parametrize("torch_here", [True, False])
def test_masked_backward_accepts_right_answers(monkeypatch, torch_here):
    if torch_here and not ag.torch_available():
        pytest.skip("torch is not installed")
    monkeypatch.setattr(ag, "torch_available", lambda: torch_here)
    for fn in (MASKED_SOLUTION, mistakes._masked_backward):
        fb = bx.check_masked_backward(fn)
        assert fb.passed, text(fb)
        assert ("autograd" if torch_here else "naive_attention_backward") in text(fb)
        assert "no (N, N) array" in text(fb)


def test_masked_backward_not_attempted_and_crashing():
    assert bx.check_masked_backward(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(bx.check_masked_backward(crashing), "your function raised ValueError: oops")


@pytest.mark.parametrize(("score", "dtype"), [(-800.0, np.float64), (-1000.0, np.float64),
                                              (-100.0, np.float32)])
def test_masked_backwards_on_rows_blind_in_one_tile(score, dtype):
    """Issue 23's "done when": the book's masked backward (Exercise 7.5's solution) and
    flashlib's flash_attention_backward agree with float64 autograd (or the plain backward)
    on rows that see no key and rows blind in one tile whose scores in the next lie far
    below 0."""
    Q, K, V, mask = blind_row_problem(shift=score, dtype=dtype)
    dO = np.random.default_rng(3).standard_normal((len(Q), V.shape[1])).astype(dtype)
    O, L = naive_attention(Q, K, V, mask=mask, return_lse=True)
    assert np.isneginf(L[~mask.any(axis=1)]).all()
    if torch_grads is not None and ag.torch_available():
        want = torch_grads(Q, K, V, dO, mask=mask)[1:]
    else:
        want = plain_attention_backward(*(x.astype(np.float64) for x in (Q, K, V, dO)),
                                        mask=mask)
    plain = plain_attention_backward(Q, K, V, dO, mask=mask)  # the same dtype's own error
    with np.errstate(invalid="raise", divide="raise"):
        book = MASKED_SOLUTION(Q, K, V, O, L, dO, mask, 5, 4)
    lib = flash_attention_backward(Q, K, V, O, L, dO, mask=mask)
    # In float32, flash-attn's gradient rule: at most 3x plain attention's error in the same
    # dtype (facts.md).  flash_attention_backward's dQ is checked in float64 only: in float32
    # its error on these scores is about 20x plain's (noted in the branch's report).
    for got in (book, lib) if dtype == np.float64 else (book,):
        for g, p, w in zip(got, plain, want, strict=True):
            assert np.isfinite(g).all()
            if dtype == np.float64:
                assert np.max(np.abs(g - w)) <= 1e-10 * max(1.0, float(np.max(np.abs(w))))
            else:
                assert_error_within(g, p, w, factor=3.0)
    assert all(np.isfinite(g).all() for g in lib)


# ---- the backward with dropout, one tile (7.7) -------------------------------------------------

DROPOUT_SOLUTION = book_solution("backward", "ex-backward-dropout-tile")["dropout_tile_backward"]


def test_dropout_tile_backward_solution_not_attempted_and_crashing():
    fb = bx.check_dropout_tile_backward(DROPOUT_SOLUTION)
    assert fb.passed, text(fb)
    assert bx.check_dropout_tile_backward(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(bx.check_dropout_tile_backward(crashing),
                      "your function raised ValueError: oops")


def test_dropout_tile_backward_refuses_the_library_backward():
    from flashlib.algorithms import flash2_dropout_backward

    def via_library(Q_i, K_j, V_j, dO_i, L_i, D_i, i, j, p_drop, seed):
        flash2_dropout_backward(Q_i, K_j, V_j, Q_i[:, :1], L_i, dO_i, p_drop, seed, 1, 1)
        return Q_i, K_j, V_j

    assert_fails_with(bx.check_dropout_tile_backward(via_library), "refused",
                      "flash2_dropout_backward")
