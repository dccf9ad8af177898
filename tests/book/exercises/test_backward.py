"""The checkers of the backward chapter (flashlib.book.exercises.backward) accept right
answers, survive crashing or unattempted ones, and recognise the common wrong ones, saying in
one line what went wrong."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.book import autograd as ag
from flashlib.book.exercises import NOT_ATTEMPTED
from flashlib.book.exercises import backward as bx
from flashlib.core.constants import LN2, LOG2E
from tests.helpers import assert_fails_with, crashing, not_attempted, text

# ---- D two ways ----------------------------------------------------------------------------

def delta_P(P, dP):
    return np.sum(dP * P, axis=-1)


def delta_O(O, dO):
    return np.sum(dO * O, axis=-1)


def test_delta_accepts_right_answers():
    fb = bx.check_delta(delta_P, delta_O)
    assert fb.passed, text(fb)
    assert "no (N, N) array" in text(fb)
    einsum = bx.check_delta(lambda P, dP: np.einsum("ij,ij->i", P, dP),
                            lambda O, dO: np.einsum("ij,ij->i", O, dO))
    assert einsum.passed, text(einsum)
    column = bx.check_delta(lambda P, dP: delta_P(P, dP)[:, None],  # (n, 1) is accepted
                            lambda O, dO: (dO * O).sum(axis=1, keepdims=True))
    assert column.passed, text(column)


def test_delta_not_attempted_crashing_and_missing_second_function():
    assert bx.check_delta(not_attempted, delta_O).problems == [NOT_ATTEMPTED]
    assert bx.check_delta(delta_P, not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(bx.check_delta(crashing, delta_O), "your function raised ValueError: oops")
    assert_fails_with(bx.check_delta(delta_P), "pass your second function too")
    assert_fails_with(bx.check_delta(lambda P, dP: 0.5, delta_O), "one number")


@pytest.mark.parametrize(("fn_P", "fn_O", "phrase"), [
    (lambda P, dP: np.sum(dP * P, axis=0), delta_O, "sum over the keys (axis=-1)"),
    (lambda P, dP: np.sum(dP, axis=-1), delta_O, "that is rowsum(dP)"),
    (lambda P, dP: np.sum(P, axis=-1), delta_O, "rowsum(P) (all ones)"),
    (lambda P, dP: np.sum(dP @ P.T, axis=-1), delta_O, "dP @ P.T mixes row i"),
    (delta_P, lambda O, dO: np.sum(dO * O, axis=0), "sum over the columns (axis=-1)"),
    (delta_P, lambda O, dO: np.sum(O, axis=-1), "that is rowsum(O)"),
    (delta_P, lambda O, dO: np.sum(dO, axis=-1), "that is rowsum(dO)"),
    (delta_P, lambda O, dO: np.sum(dO @ O.T, axis=-1), "dO @ O.T pairs row i"),
    (delta_P, lambda O, dO: np.diag(dO @ O.T), "as much as an (N, N) matrix"),
])
def test_delta_recognises_common_mistakes(fn_P, fn_O, phrase):
    assert_fails_with(bx.check_delta(fn_P, fn_O), phrase)


def test_delta_square_case_catches_the_wrong_axis():
    """On the square case a column sum has the right shape: the value gives it away."""
    calls = []

    def cols_when_square(P, dP):
        calls.append(P.shape)
        return np.sum(dP * P, axis=0 if P.shape[0] == P.shape[1] else -1)

    assert_fails_with(bx.check_delta(cols_when_square, delta_O), "square",
                      "you summed over the queries (axis 0)")


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
    assert_fails_with(bx.check_ds_tile(lambda P, dP, D: P[:1]), "dS_ij has shape")


@pytest.mark.parametrize(("fn", "phrase"), [
    (lambda P, dP, D: P * dP, "D_i is missing"),
    (lambda P, dP, D: dP - D[:, None], "multiply by P_ij"),
    (lambda P, dP, D: P * dP - D[:, None], "parenthesise"),
    (lambda P, dP, D: P * (D[:, None] - dP), "the sign is reversed"),
    (lambda P, dP, D: dP * (P - D[:, None]), "not dP_ij * (P_ij - D_i)"),
    (lambda P, dP, D: P * (dP - D), "subtract D_i[:, None]"),
    (lambda P, dP, D: 2 * P, "expected"),
])
def test_ds_tile_recognises_common_mistakes(fn, phrase):
    assert_fails_with(bx.check_ds_tile(fn), phrase)


# ---- P from a base-2 logsumexp -------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda S, M: np.exp2(S * LOG2E - M[:, None]),
                                lambda S, M: np.exp(S - M[:, None] * LN2)])
def test_p_from_base2_accepts_right_answers(fn):
    fb = bx.check_p_from_base2(fn)
    assert fb.passed, text(fb)


def test_p_from_base2_not_attempted_and_crashing():
    assert bx.check_p_from_base2(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(bx.check_p_from_base2(crashing), "your function raised ValueError: oops")


def _tile_softmax(S, M):
    e = np.exp(S - S.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize(("fn", "phrases"), [
    (lambda S, M: np.exp(S - M[:, None]), ("the ln 2 mistake", "exp(S - M ln 2)",
                                           "multiplied by exp(L - M)")),
    (lambda S, M: np.exp2(S - M[:, None]), ("exp2 needs the scores in base 2",)),
    (lambda S, M: np.exp(S - M[:, None] * LOG2E), ("not M log2 e = M / ln 2",)),
    (lambda S, M: np.exp(S - M[:, None] / LN2), ("not M log2 e = M / ln 2",)),
    (_tile_softmax, ("normalised over the tile",)),
    (lambda S, M: np.exp(S - M[None, :] * LN2), ("M_i[:, None]",)),
])
def test_p_from_base2_recognises_common_mistakes(fn, phrases):
    assert_fails_with(bx.check_p_from_base2(fn), *phrases)


def test_the_ln2_mistake_is_named_on_the_shifted_case_too():
    """Where L < 0 the wrong base makes P too large: still the ln 2 mistake."""
    def wrong_only_when_shifted(S, M):
        return np.exp(S - M[:, None] * (1.0 if S.max() < -5 else LN2))

    fb = bx.check_p_from_base2(wrong_only_when_shifted)
    assert_fails_with(fb, "scores shifted down", "the ln 2 mistake")


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


def fd_variant(forward=False, divisor=2.0, restore=True, copy=True, all_at_once=False,
               own_h=None):
    def fd(f, X, h):
        h = own_h or h
        X = np.array(X, dtype=float) if copy else X
        grad = np.empty_like(X)
        if all_at_once:
            return np.full_like(X, (f(X + h) - f(X - h)) / (2 * h))
        f0 = f(X)
        for k in np.ndindex(X.shape):
            orig = X[k]
            X[k] = orig + h
            plus = f(X)
            if forward:
                grad[k] = (plus - f0) / h
            else:
                X[k] = orig - h if restore else X[k] - 2 * h
                grad[k] = (plus - f(X)) / (divisor * h)
            if restore:
                X[k] = orig
        return grad
    return fd


def test_finite_differences_accepts_the_right_answer():
    fb = bx.check_finite_differences(fd_right)
    assert fb.passed, text(fb)
    assert "match the analytic dQ, dK, dV" in text(fb)
    in_place = fd_variant(copy=False)  # perturbs X itself and puts every entry back: fine
    assert bx.check_finite_differences(in_place).passed


def test_finite_differences_not_attempted_and_crashing():
    assert bx.check_finite_differences(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(bx.check_finite_differences(crashing),
                      "your function raised ValueError: oops")
    assert_fails_with(bx.check_finite_differences(lambda f, X, h: np.zeros(3)), "has shape")


@pytest.mark.parametrize(("fn", "phrase"), [
    (fd_variant(forward=True), "forward difference"),
    (fd_variant(divisor=1.0), "divide by 2 h: the two points"),
    (fd_variant(divisor=4.0), "not 4 h"),
    (fd_variant(restore=False), "put each entry back"),
    (fd_variant(copy=False, restore=False), "changed the X it was given"),
    (fd_variant(all_at_once=True), "perturb one entry at a time"),
    (fd_variant(own_h=1e-6), "use the step h you are given"),
])
def test_finite_differences_recognise_common_mistakes(fn, phrase):
    assert_fails_with(bx.check_finite_differences(fn), phrase)


def test_finite_differences_in_float32_fail_the_attention_check():
    """Right on the cubic (float64 there), but casting to float32 ruins the gradient check."""
    def fd32(f, X, h):
        if X.shape == (4, 3) and abs(h - 1e-5) < 1e-12:
            X = X.astype(np.float32)
            grad = np.empty_like(X)
            for k in np.ndindex(X.shape):
                orig = X[k]
                X[k] = orig + np.float32(h)
                plus = f(X.astype(np.float32))
                X[k] = orig - np.float32(h)
                minus = f(X)
                X[k] = orig
                grad[k] = (plus - minus) / (2 * h)
            return grad
        return fd_right(f, X, h)

    assert_fails_with(bx.check_finite_differences(fd32), "gradient check of attention",
                      "should agree to about 1e-10")
