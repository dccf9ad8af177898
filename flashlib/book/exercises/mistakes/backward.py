"""The backward chapter's declared mistakes (flashlib.book.exercises.backward)."""

from __future__ import annotations

import functools

import numpy as np

from flashlib.book.exercises.backward import (
    check_delta_with_dlse,
    check_dropout_tile_backward,
    check_ds_tile,
    check_finite_differences,
    check_flash1_backward,
    check_masked_backward,
    check_p_from_base2,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes
from flashlib.core.constants import LN2, LOG2E
from flashlib.core.philox import dropout_keep

# ---- 7.1 D when L has a gradient -------------------------------------------------------------


def no_dl(O, dO, dL):
    return np.sum(dO * O, axis=-1)


def plus_dl(O, dO, dL):
    return np.sum(dO * O, axis=-1) + dL


def minus_dl_only(O, dO, dL):
    return -dL


def dl_only(O, dO, dL):
    return dL


def rowsum_o(O, dO, dL):
    return np.sum(O, axis=-1) - dL


def dl_as_a_column(O, dO, dL):
    return np.sum(dO * O, axis=-1) - dL[:, None]


def through_n_by_n(O, dO, dL):
    return np.diag(dO @ O.T) - dL


declare_mistakes(
    check_delta_with_dlse,
    Mistake("dL left out", (no_dl,), ("it leaves dL out",)),
    Mistake("+ dL", (plus_dl,), ("the sign of dL",)),
    Mistake("-dL only", (minus_dl_only,), ("D' still holds rowsum(dO * O)",)),
    Mistake("dL only", (dl_only,), ("enters with a minus sign",)),
    Mistake("rowsum(O)", (rowsum_o,), ("rowsum(O) is not D",)),
    Mistake("dL as a column", (dl_as_a_column,), ("has shape (N_q, N_q)",)),
    Mistake("an N x N product", (through_n_by_n,), ("as much as an (N, N) matrix",)),
)


# ---- 7.2 dS for one tile ---------------------------------------------------------------------

def no_d(P, dP, D):
    return P * dP


def no_p(P, dP, D):
    return dP - D[:, None]


def unparenthesised(P, dP, D):
    return P * dP - D[:, None]


def sign_reversed(P, dP, D):
    return P * (D[:, None] - dP)


def p_and_dp_swapped(P, dP, D):
    return dP * (P - D[:, None])


def d_not_a_column(P, dP, D):
    return P * (dP - D)


def twice_p(P, dP, D):
    return 2 * P


def one_row(P, dP, D):
    return P[:1]


declare_mistakes(
    check_ds_tile,
    Mistake("D_i missing", (no_d,), ("D_i is missing",)),
    Mistake("P_ij missing", (no_p,), ("multiply by P_ij",)),
    Mistake("no parentheses", (unparenthesised,), ("parenthesise",)),
    Mistake("the sign reversed", (sign_reversed,), ("the sign is reversed",)),
    Mistake("P and dP swapped", (p_and_dp_swapped,), ("not dP_ij * (P_ij - D_i)",)),
    Mistake("D_i not a column", (d_not_a_column,), ("subtract D_i[:, None]",)),
    Mistake("something else", (twice_p,), ("expected",)),
    Mistake("one row", (one_row,), ("dS_ij has shape",)),
)


# ---- 7.3 P from a base-2 logsumexp -----------------------------------------------------------

def natural_exp(S, M):
    return np.exp(S - M[:, None])


def exp2_of_natural_scores(S, M):
    return np.exp2(S - M[:, None])


def times_log2e(S, M):
    return np.exp(S - M[:, None] * LOG2E)


def over_ln2(S, M):
    return np.exp(S - M[:, None] / LN2)


def tile_softmax(S, M):
    e = np.exp(S - S.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def m_as_a_row(S, M):
    return np.exp(S - M[None, :] * LN2)


def wrong_only_when_shifted(S, M):  # where L < 0 the wrong base makes P too large
    return np.exp(S - M[:, None] * (1.0 if S.max() < -5 else LN2))


declare_mistakes(
    check_p_from_base2,
    Mistake("the ln 2 mistake", (natural_exp,),
            ("the ln 2 mistake", "exp(S - M ln 2)", "multiplied by exp(L - M)")),
    Mistake("exp2 of natural scores", (exp2_of_natural_scores,),
            ("exp2 needs the scores in base 2",)),
    Mistake("M times log2 e", (times_log2e,), ("not M log2 e = M / ln 2",)),
    Mistake("M over ln 2", (over_ln2,), ("not M log2 e = M / ln 2",)),
    Mistake("the tile's own softmax", (tile_softmax,), ("normalised over the tile",)),
    Mistake("M as a row", (m_as_a_row,), ("M_i[:, None]",)),
    Mistake("the ln 2 mistake on shifted scores", (wrong_only_when_shifted,),
            ("scores shifted down", "the ln 2 mistake")),
)


# ---- 7.4 finite differences ------------------------------------------------------------------

def _fd(f, X, h, *, forward=False, divisor=2.0, restore=True, copy=True, all_at_once=False,
        own_h=None):
    """Central differences, right by default, with one of the usual mistakes by keyword."""
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


def _differences(**mistake):
    return functools.partial(_fd, **mistake)


def in_float32(f, X, h):
    """Right on the cubic (float64 there), but casting to float32 ruins the gradient check."""
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
    return _fd(f, X, h)


def wrong_shape(f, X, h):
    return np.zeros(3)


declare_mistakes(
    check_finite_differences,
    Mistake("a forward difference", (_differences(forward=True),), ("forward difference",)),
    Mistake("divided by h", (_differences(divisor=1.0),), ("divide by 2 h: the two points",)),
    Mistake("divided by 4 h", (_differences(divisor=4.0),), ("not 4 h",)),
    Mistake("entries not put back", (_differences(restore=False),), ("put each entry back",)),
    Mistake("X changed", (_differences(copy=False, restore=False),),
            ("changed the X it was given",)),
    Mistake("every entry at once", (_differences(all_at_once=True),),
            ("perturb one entry at a time",)),
    Mistake("its own h", (_differences(own_h=1e-6),), ("use the step h you are given",)),
    Mistake("in float32", (in_float32,),
            ("gradient check of attention", "should agree to about 1e-10")),
    Mistake("the wrong shape", (wrong_shape,), ("has shape",)),
)


# ---- 7.5 the tiled backward with a mask ------------------------------------------------------

def _masked_backward(Q, K, V, O, L, dO, mask, B_r, B_c, mistake=None):
    """A learner's masked FlashAttention-2 backward, written apart from the checker's own
    model of the mistakes: right, or with one mistake."""
    tau = 1 / np.sqrt(Q.shape[1])
    D = np.sum(dO * O, axis=1)
    if mistake == "no D":
        D = np.zeros_like(D)
    unguarded = mistake in ("NaN", "NaN zeroed")
    L_use = L if unguarded else np.where(L == -np.inf, 0.0, L)
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for j in range(0, len(K), B_c):
        K_j, V_j = K[j:j + B_c], V[j:j + B_c]
        if mistake == "no reset":  # buffers allocated once, zeroed once
            if j == 0:
                buf_K, buf_V = np.zeros((B_c, K.shape[1])), np.zeros((B_c, V.shape[1]))
            dK_j, dV_j = buf_K[:len(K_j)], buf_V[:len(K_j)]
        else:
            dK_j, dV_j = np.zeros_like(K_j), np.zeros_like(V_j)
        for i in range(0, len(Q), B_r):
            Q_i, dO_i = Q[i:i + B_r], dO[i:i + B_r]
            S_ij = Q_i @ K_j.T if mistake == "unscaled S" else tau * (Q_i @ K_j.T)
            S_ij = np.where(mask[i:i + B_r, j:j + B_c], S_ij, -np.inf)
            P_ij = np.exp(S_ij - L_use[i:i + B_r, None])
            if mistake == "NaN zeroed":
                P_ij = np.nan_to_num(P_ij)  # right values, after a warning
            dV_j += (tau if mistake == "tau on dV" else 1.0) * (P_ij.T @ dO_i)
            dP_ij = dO_i @ V_j.T
            D_i = np.sum(P_ij * dP_ij, axis=1) if mistake == "tile D" else D[i:i + B_r]
            dS_ij = P_ij * (dP_ij - D_i[:, None])
            g = {"no tau": 1.0, "tau twice": tau * tau}.get(mistake, tau)
            if mistake == "dQ written":
                dQ[i:i + B_r] = g * (dS_ij @ K_j)
            else:
                dQ[i:i + B_r] += g * (dS_ij @ K_j)
            dK_j += g * (dS_ij.T @ Q_i)
        dK[j:j + B_c], dV[j:j + B_c] = dK_j, dV_j
    return dQ, dK, dV


def no_mask(Q, K, V, O, L, dO, mask, B_r, B_c):
    return _masked_backward(Q, K, V, O, L, dO, np.ones_like(mask), B_r, B_c)


def dense(Q, K, V, O, L, dO, mask, B_r, B_c):
    return _masked_backward(Q, K, V, O, L, dO, mask, len(Q), len(K))


def two_gradients(*args):
    return _masked_backward(*args)[:2]


declare_mistakes(
    check_masked_backward,
    *(Mistake(mistake, (functools.partial(_masked_backward, mistake=mistake),), hints)
      for mistake, hints in [
          ("no D", ("D is missing",)),
          ("no tau", ("1/tau = sqrt(d) times too large",)),
          ("tau twice", ("carry tau twice",)),
          ("unscaled S", ("recompute it from the scaled scores",)),
          ("dQ written", ("add into dQ (+=)",)),
          ("tile D", ("over one tile covers only that tile's keys",)),
          ("tau on dV", ("dV is tau times too small",)),
          ("no reset", ("carry over from the previous key block",)),
          ("NaN", ("exp(-inf - (-inf)) = NaN",)),
          ("NaN zeroed", ("numpy warned", "the guard")),
      ]),
    Mistake("the mask ignored", (no_mask,), ("the mask is ignored",)),
    Mistake("one tile of N x N", (dense,), ("as much as an (N, N) matrix",)),
    Mistake("two gradients", (two_gradients,), ("return the tuple (dQ, dK, dV)",)),
)


# ---- 7.6 FlashAttention-1's backward (Algorithm 4) with a mask ------------------------------

def _flash1(Q, K, V, O, l, m, dO, mask, B_r, B_c, mistake=None):
    """A learner's masked Algorithm 4, written apart from the checker's own model of the
    mistakes: right, or with one mistake."""
    tau = 1 / np.sqrt(Q.shape[1])
    if mistake not in ("NaN", "NaN zeroed"):  # the guard: rows that see no key
        blind = m == -np.inf
        m, l = np.where(blind, 0.0, m), np.where(blind, 1.0, l)
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for j in range(0, len(K), B_c):
        K_j, V_j = K[j:j + B_c], V[j:j + B_c]
        dK_j, dV_j = np.zeros_like(K_j), np.zeros_like(V_j)
        for i in range(0, len(Q), B_r):
            Q_i, O_i, dO_i, dQ_i = Q[i:i + B_r], O[i:i + B_r], dO[i:i + B_r], dQ[i:i + B_r]
            S_ij = tau * (Q_i @ K_j.T)
            if mistake != "mask ignored":
                S_ij = np.where(mask[i:i + B_r, j:j + B_c], S_ij, -np.inf)
            if mistake == "P from lse, no l":  # the logsumexp's formula fed with m
                P_ij = np.exp(S_ij - m[i:i + B_r, None])
            elif mistake == "times l":
                P_ij = np.exp(S_ij - m[i:i + B_r, None]) * l[i:i + B_r, None]
            elif mistake == "l as a log":
                P_ij = np.exp(S_ij - m[i:i + B_r, None] - l[i:i + B_r, None])
            else:
                P_ij = np.exp(S_ij - m[i:i + B_r, None]) / l[i:i + B_r, None]
            if mistake == "NaN zeroed":
                P_ij = np.nan_to_num(P_ij)  # right values, after a warning
            dV_j += P_ij.T @ dO_i
            dP_ij = dO_i @ V_j.T
            if mistake == "tile D":
                D_i = np.sum(P_ij * dP_ij, axis=1)
            else:
                D_i = np.sum(dO_i * O_i, axis=1)
            dS_ij = P_ij * (dP_ij - D_i[:, None])
            if mistake == "dQ overwritten":
                dQ[i:i + B_r] = tau * (dS_ij @ K_j)
            else:
                dQ[i:i + B_r] = dQ_i + tau * (dS_ij @ K_j)
            dK_j += tau * (dS_ij.T @ Q_i)
        dK[j:j + B_c], dV[j:j + B_c] = dK_j, dV_j
    return dQ, dK, dV


def query_blocks_outside(Q, K, V, O, l, m, dO, mask, B_r, B_c):
    """The right numbers in FlashAttention-2's forward order: query blocks outside, so that
    dK_j and dV_j (not dQ_i) are read and written in HBM at every step."""
    tau = 1 / np.sqrt(Q.shape[1])
    blind = m == -np.inf
    m, l = np.where(blind, 0.0, m), np.where(blind, 1.0, l)
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for i in range(0, len(Q), B_r):
        Q_i, O_i, dO_i = Q[i:i + B_r], O[i:i + B_r], dO[i:i + B_r]
        dQ_i = np.zeros_like(Q_i)
        D_i = np.sum(dO_i * O_i, axis=1)
        for j in range(0, len(K), B_c):
            K_j, V_j = K[j:j + B_c], V[j:j + B_c]
            S_ij = np.where(mask[i:i + B_r, j:j + B_c], tau * (Q_i @ K_j.T), -np.inf)
            P_ij = np.exp(S_ij - m[i:i + B_r, None]) / l[i:i + B_r, None]
            dS_ij = P_ij * (dO_i @ V_j.T - D_i[:, None])
            dV[j:j + B_c] = dV[j:j + B_c] + P_ij.T @ dO_i
            dK[j:j + B_c] = dK[j:j + B_c] + tau * (dS_ij.T @ Q_i)
            dQ_i += tau * (dS_ij @ K_j)
        dQ[i:i + B_r] = dQ_i
    return dQ, dK, dV


def flash1_two_gradients(*args):
    return _flash1(*args)[:2]


declare_mistakes(
    check_flash1_backward,
    *(Mistake(mistake, (functools.partial(_flash1, mistake=mistake),), hints)
      for mistake, hints in [
          ("dQ overwritten", ("dQ holds only the last key block's share",
                              "dQ_i <- dQ_i + tau dS_ij K_j")),
          ("P from lse, no l", ("l_i times too large", "diag(l_i)^-1 exp(S_ij - m_i)")),
          ("l as a log", ("not its logarithm",)),
          ("times l", ("divide by l_i, do not multiply",)),
          ("tile D", ("covers only that tile's keys",)),
          ("mask ignored", ("the mask is ignored",)),
          ("NaN", ("m_i = -inf and l_i = 0", "guard both")),
          ("NaN zeroed", ("numpy warned", "the guard")),
      ]),
    Mistake("query blocks outside", (query_blocks_outside,),
            ("the query blocks are outside", "dQ_i, not dK_j and dV_j")),
    Mistake("two gradients", (flash1_two_gradients,), ("return the tuple (dQ, dK, dV)",)),
)


# ---- 7.7 the backward with dropout, one tile ---------------------------------------------------

def _dropout_step(Q_i, K_j, V_j, dO_i, L_i, D_i, i, j, p_drop, seed, *, scale_dv=True,
                  scale_dp=True, rows=None, cols=None, drop_dv=True, drop_dp=True,
                  drop_ds=False):
    """The tile's shares with the choices a learner makes (the right ones by default)."""
    tau = 1 / np.sqrt(Q_i.shape[1])
    rows = np.arange(i, i + len(Q_i))[:, None] if rows is None else rows
    cols = np.arange(j, j + len(K_j)) if cols is None else cols
    Z_ij = dropout_keep(seed, 0, rows, cols, p_drop)
    keep = 1 / (1 - p_drop)
    P_ij = np.exp(tau * (Q_i @ K_j.T) - L_i[:, None])
    dV_j = ((P_ij * Z_ij) if drop_dv else P_ij).T @ dO_i * (keep if scale_dv else 1)
    dP_ij = dO_i @ V_j.T
    if drop_dp:
        dP_ij = dP_ij * Z_ij * (keep if scale_dp else 1)
    P_ds = P_ij * Z_ij * keep if drop_ds else P_ij
    dS_ij = P_ds * (dP_ij - D_i[:, None])
    return tau * (dS_ij @ K_j), tau * (dS_ij.T @ Q_i), dV_j


def no_keep_scale(*args):
    return _dropout_step(*args, scale_dv=False, scale_dp=False)


def keep_scale_on_dv_only(*args):
    return _dropout_step(*args, scale_dp=False)


def tile_offsets(Q_i, K_j, V_j, dO_i, L_i, D_i, i, j, p_drop, seed):
    """The mask regenerated with the tile's own indices: not the forward's bits."""
    return _dropout_step(Q_i, K_j, V_j, dO_i, L_i, D_i, i, j, p_drop, seed,
                         rows=np.arange(len(Q_i))[:, None], cols=np.arange(len(K_j)))


def rows_and_keys_swapped(Q_i, K_j, V_j, dO_i, L_i, D_i, i, j, p_drop, seed):
    return _dropout_step(Q_i, K_j, V_j, dO_i, L_i, D_i, i, j, p_drop, seed,
                         rows=np.arange(j, j + len(K_j))[None, :],
                         cols=np.arange(i, i + len(Q_i))[:, None])


def dropout_in_ds(*args):
    return _dropout_step(*args, drop_ds=True)


def dp_not_through_the_mask(*args):
    return _dropout_step(*args, drop_dp=False)


def dv_from_undropped_p(*args):
    return _dropout_step(*args, drop_dv=False)


def a_new_mask(Q_i, K_j, V_j, dO_i, L_i, D_i, i, j, p_drop, seed):
    """A fresh stream mask: not the forward's bits."""
    tau = 1 / np.sqrt(Q_i.shape[1])
    Z_ij = np.random.default_rng(seed).random((len(Q_i), len(K_j))) >= p_drop
    P_ij = np.exp(tau * (Q_i @ K_j.T) - L_i[:, None])
    dV_j = (P_ij * Z_ij).T @ dO_i / (1 - p_drop)
    dS_ij = P_ij * ((dO_i @ V_j.T) * Z_ij / (1 - p_drop) - D_i[:, None])
    return tau * (dS_ij @ K_j), tau * (dS_ij.T @ Q_i), dV_j


def two_shares(*args):
    dQ_i, dK_j, _ = _dropout_step(*args)
    return dQ_i, dK_j


declare_mistakes(
    check_dropout_tile_backward,
    Mistake("no 1/(1 - p) scale", (no_keep_scale,), ("1/(1 - p) scale is missing",)),
    Mistake("the scale on dV only", (keep_scale_on_dv_only,), ("that dV has",)),
    Mistake("the tile's own indices as counters", (tile_offsets,),
            ("the backward's bits differ from the forward's", "tile's own indices")),
    Mistake("rows and keys swapped in the counter", (rows_and_keys_swapped,),
            ("rows and keys are swapped",)),
    Mistake("the dropped P in dS", (dropout_in_ds,), ("undropped P_ij",)),
    Mistake("dP not through the mask", (dp_not_through_the_mask,),
            ("must go through the mask",)),
    Mistake("dV from the undropped P", (dv_from_undropped_p,),
            ("dV_j takes the dropped probabilities",)),
    Mistake("a new mask", (a_new_mask,), ("differ from the gradients with the mask",)),
    Mistake("two shares", (two_shares,), ("return the tuple (dQ_i, dK_j, dV_j)",)),
)
