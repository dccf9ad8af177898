"""Checkers for the exercises of the backward chapter.

check_delta_with_dlse    ``delta_with_dlse(O, dO, dL) -> D'``: the D of dS = P * (dP - D') when
                         the logsumexp L has a gradient dL too, against autograd; no (N, N)
                         array (memory probe)
check_ds_tile            ``ds_tile(P_ij, dP_ij, D_i) -> dS_ij``: one tile of dS, against autograd
                         (torch) or the softmax's Jacobian (float64) when torch is missing
check_p_from_base2       ``p_from_base2(S_ij, M_i) -> P_ij``: P recovered from a base-2
                         logsumexp; the ln 2 mistake recognised and named
check_finite_differences ``fd_grad(f, X, h) -> grad``: central differences, then the gradient
                         check of the 4 x 3 attention problem
check_masked_backward    ``masked_flash2_backward(Q, K, V, O, L, dO, mask, B_r, B_c) -> (dQ, dK,
                         dV)``: FlashAttention-2's tiled backward with a boolean mask, against
                         autograd (or the naive backward) on ragged shapes and rows that see no
                         key; each usual mistake named; no (N, N) array (memory probe)
check_flash1_backward    ``flash1_backward(Q, K, V, O, l, m, dO, mask, B_r, B_c) -> (dQ, dK,
                         dV)``: FlashAttention-1's Algorithm 4 with a boolean mask, from m and
                         l (rows that see no key: m = -inf, l = 0), dQ_i read and written at
                         every step; each usual mistake named; the loop order from the row
                         blocks it reads (key blocks outside)
check_dropout_tile_backward ``dropout_tile_backward(Q_i, K_j, V_j, dO_i, L_i, D_i, i, j,
                         p_drop, seed) -> (dQ_i, dK_j, dV_j)``: one tile's share of the
                         backward with dropout, its mask regenerated from Philox; summed over
                         every tile, against the materialised mask's gradients

Over 500 lines (about 760): one checker per exercise, whose cases and diagnoses are code;
the mistakes each must catch are data, in mistakes/backward.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.algorithms import flash2_dropout_forward, safe_softmax
from flashlib.book.exercises import (
    Feedback,
    LearnerError,
    call_learner,
    checker,
    fmt,
    names,
    warned,
)
from flashlib.book.exercises.grader_adapter import is_remote
from flashlib.book.exercises.memory import measure_peak
from flashlib.core.constants import LN2, LOG2E
from flashlib.core.masks import causal_bottom_right, dense_mask, key_padding
from flashlib.core.philox import dropout_keep
from flashlib.fast.naive import naive_attention, naive_attention_backward
from flashlib.studies.backward import attention_loss, lse_base2, softmax_vjp
from flashlib.studies.masking import blind_row_problem

__all__ = [
    "DELTA_CASES",
    "TILE_CASES",
    "FD_PROBLEM",
    "check_delta_with_dlse",
    "check_ds_tile",
    "check_p_from_base2",
    "check_finite_differences",
    "MASKED_PROBE",
    "check_masked_backward",
    "check_flash1_backward",
    "DROPOUT_CASES",
    "check_dropout_tile_backward",
]


def _as_array(result: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    """The learner's result as a float64 array of ``shape``, or a LearnerError saying what is
    wrong with it.  A column (n, 1) is accepted for a vector (n,)."""
    try:
        x = np.asarray(result, dtype=np.float64)
    except (TypeError, ValueError):
        raise LearnerError(f"return {what} as an array, got {type(result).__name__}") from None
    if x.ndim == 0:
        raise LearnerError(f"you returned one number; {what} has shape {shape}")
    if len(shape) == 1 and x.shape == (shape[0], 1):
        x = x[:, 0]
    if x.shape != shape:
        raise LearnerError(f"{what} has shape {x.shape}, expected {shape}")
    return x


def _as_vector(result: Any, n_q: int, wrong_axis: dict[int, str]) -> np.ndarray:
    """The learner's D as a vector (n_q,); a vector as long as the other axis says so."""
    shape = np.shape(result)
    if len(shape) == 1 and shape[0] != n_q and shape[0] in wrong_axis:
        raise LearnerError(f"D has shape {shape}, one entry per {wrong_axis[shape[0]][:-1]}: "
                           f"D has one entry per query row, so sum over the "
                           f"{wrong_axis[shape[0]]} (axis=-1)")
    return _as_array(result, (n_q,), "D")


def _close(a: np.ndarray, b: np.ndarray, tol: float = 1e-10) -> bool:
    return bool(np.max(np.abs(a - b), initial=0.0) <= tol * max(1.0, float(np.max(np.abs(b),
                                                                                   initial=0.0))))


def _softmax_problem(n_q: int, n_k: int, d_v: int, seed: int, logit: float = 1.0
                     ) -> dict[str, np.ndarray]:
    """P = softmax(S), V, O = P V, dO, dP = dO V^T for random scores S (float64)."""
    rng = np.random.default_rng(seed)
    S = rng.standard_normal((n_q, n_k)) * logit
    V, dO = rng.standard_normal((n_k, d_v)), rng.standard_normal((n_q, d_v))
    P = safe_softmax(S)
    return {"S": S, "P": P, "V": V, "O": P @ V, "dO": dO, "dP": dO @ V.T}


# --- D when the logsumexp has a gradient too ------------------------------------------------

#: (label, n_q, n_k, d_v) of :func:`check_delta_with_dlse`: n_q, n_k and d_v all different
#: first, so that a sum over the wrong axis has the wrong shape; then a square one, where it
#: has not.
DELTA_CASES = [
    ("37 queries, 29 keys, d_v = 8", 37, 29, 8),
    ("one query row (1 x 5, d_v = 3)", 1, 5, 3),
    ("one key (6 x 1, d_v = 4)", 6, 1, 4),
    ("square (7 x 7, d_v = 7)", 7, 7, 7),
]
#: The memory probe of delta_with_dlse: N rows, d_v columns (an (N, N) float64 array is 32 MiB).
DELTA_PROBE = (2048, 8)


def _reference_dS(p: dict[str, np.ndarray], dL: np.ndarray | None = None
                  ) -> tuple[np.ndarray, str]:
    """dS of the whole problem (with the logsumexp's gradient dL when given) by autograd when
    torch is here, else by the softmax's Jacobian plus dL_i P_ij (float64; the two agree to
    rounding), and the name of the source."""
    from flashlib.book.autograd import score_grads, torch_available

    if torch_available():
        return score_grads(p["S"], p["V"], p["dO"], dL), "autograd"
    dS = softmax_vjp(p["P"], p["dP"])
    if dL is not None:
        dS = dS + dL[:, None] * p["P"]
    return dS, "the softmax's Jacobian"


def _delta_dlse_hint(got: np.ndarray, p: dict[str, np.ndarray], dL: np.ndarray) -> str:
    D = np.sum(p["dO"] * p["O"], axis=-1)
    variants = [
        (D, "that is the chapter's D: it leaves dL out. L_i = log sum_j exp(S_ij), so "
         "dL_i / dS_ij = P_ij and dL adds dL_i P_ij to dS_ij: fold it into D"),
        (D + dL, "the sign of dL: dS = P * (dP - D) + dL P = P * (dP - (D - dL))"),
        (-dL, "D' still holds rowsum(dO * O): dS = P * (dP - D) + dL P"),
        (dL, "D' still holds rowsum(dO * O), and dL enters with a minus sign: "
         "D' = D - dL"),
        (np.sum(p["O"], axis=-1) - dL, "rowsum(O) is not D: D_i = sum_c dO_ic O_ic"),
    ]
    for value, hint in variants:
        if value.shape == got.shape and _close(got, value):
            return hint
    return ("dS = P * (dP - D) + dL P must equal P * (dP - D'): D' = rowsum(dO * O) - dL, "
            "one number per row")


@checker("D when L has a gradient")
def check_delta_with_dlse(fb: Feedback, delta_with_dlse: Callable[..., Any]) -> None:
    """Check ``delta_with_dlse(O, dO, dL) -> D'`` (O, dO: (N_q, d_v), dL: (N_q,)): the vector
    for which ``dS = P * (dP - D')`` is the gradient of ``sum(dO * O) + sum(dL * L)`` (L the
    rows' logsumexp), against autograd (or the softmax's Jacobian without torch), on ragged
    shapes; and that it allocates no (N, N) array (N = 2048, d_v = 8: a probe of its
    memory)."""
    source = ""
    for label, n_q, n_k, d_v in DELTA_CASES:
        p = _softmax_problem(n_q, n_k, d_v, seed=n_q + n_k)
        dL = np.random.default_rng(n_q * n_k).standard_normal(n_q)
        want, source = _reference_dS(p, dL)
        with fb.case(label) as case:
            got, _ = call_learner(delta_with_dlse, p["O"].copy(), p["dO"].copy(), dL.copy())
            if np.shape(got) == (n_q, n_q) and n_q > 1:
                raise LearnerError("D' has shape (N_q, N_q): dL is a vector of N_q numbers, "
                                   "subtract it as it is (dL[:, None] broadcasts against "
                                   "the vector to a matrix)")
            got = _as_vector(got, n_q, {d_v: "columns"})
            dS = p["P"] * (p["dP"] - got[:, None])
            if not _close(dS, want, 1e-9):
                fb.fail(f"{label}: {_delta_dlse_hint(got, p, dL)}")
                return
        if case.failed:
            return
    fb.ok(f"P * (dP - D') equals {source}'s dS on {len(DELTA_CASES)} shapes: "
          "D' = rowsum(dO * O) - dL")
    N, d_v = DELTA_PROBE
    rng = np.random.default_rng(1)
    O, dO, dL = rng.standard_normal((N, d_v)), rng.standard_normal((N, d_v)), \
        rng.standard_normal(N)
    label = f"memory probe (N = {N}, d_v = {d_v})"
    with fb.case(label):
        (got, _), peak = measure_peak(call_learner, delta_with_dlse, O, dO, dL)
        limit = N * N * O.itemsize // 4
        if peak >= limit:
            fb.fail(f"{label}: delta_with_dlse allocated {peak / 2**20:.1f} MiB, as much as an "
                    f"(N, N) matrix ({N * N * O.itemsize / 2**20:.0f} MiB): dO @ O.T pairs "
                    "every row with every row; multiply elementwise and sum each row")
        else:
            fb.ok(f"{label}: {peak / 2**20:.2f} MiB allocated, no (N, N) array: D' costs "
                  "O(N d) memory")


# --- dS for one tile ------------------------------------------------------------------------

#: (label, n_q, n_k, rows, cols) of :func:`check_ds_tile`: the tile rows x cols of a problem
#: of n_q x n_k scores.  The square tile comes first, so that subtracting D along the wrong
#: axis shows as a wrong value rather than a broadcasting error.
TILE_CASES = [
    ("square tile (rows 4:8, keys 8:12 of 12 x 16)", 12, 16, (4, 8), (8, 12)),
    ("ragged tile (rows 16:20, keys 8:13 of 20 x 13)", 20, 13, (16, 20), (8, 13)),
    ("one row (row 0, keys 0:7 of 5 x 7)", 5, 7, (0, 1), (0, 7)),
]


@checker("dS for one tile",
         forbid=names("flashlib.studies.backward.softmax_vjp"))
def check_ds_tile(fb: Feedback, ds_tile: Callable[..., Any]) -> None:
    """Check ``ds_tile(P_ij, dP_ij, D_i) -> dS_ij``: P_ij and dP_ij (B_r, B_c) tiles, D_i
    (B_r,) the rows' D = rowsum(dO * O), against the tile of dS = d loss / dS computed by
    autograd (or the softmax's Jacobian without torch)."""
    source = ""
    for label, n_q, n_k, (r0, r1), (c0, c1) in TILE_CASES:
        p = _softmax_problem(n_q, n_k, 6, seed=n_q * n_k, logit=2.0)
        dS, source = _reference_dS(p)
        D = np.sum(p["dO"] * p["O"], axis=-1)
        P_ij, dP_ij, D_i = p["P"][r0:r1, c0:c1], p["dP"][r0:r1, c0:c1], D[r0:r1]
        want = dS[r0:r1, c0:c1]
        with fb.case(label) as case:
            got, _ = call_learner(ds_tile, P_ij.copy(), dP_ij.copy(), D_i.copy())
            got = _as_array(got, P_ij.shape, "dS_ij")
            if _close(got, want, 1e-9):
                continue
            square = P_ij.shape[0] == P_ij.shape[1]
            variants = [
                (P_ij * dP_ij, "D_i is missing: dS_ij = P_ij * (dP_ij - D_i)"),
                (dP_ij - D_i[:, None], "multiply by P_ij: dS_ij = P_ij * (dP_ij - D_i)"),
                (P_ij * dP_ij - D_i[:, None], "parenthesise: P_ij * (dP_ij - D_i), not "
                 "P_ij * dP_ij - D_i"),
                (P_ij * (D_i[:, None] - dP_ij), "the sign is reversed: dP_ij - D_i"),
                (dP_ij * (P_ij - D_i[:, None]), "it is P_ij * (dP_ij - D_i), not "
                 "dP_ij * (P_ij - D_i)"),
            ]
            if square:
                variants.append((P_ij * (dP_ij - D_i[None, :]), "D_i has one entry per row: "
                                 "subtract D_i[:, None], not D_i (which numpy lines up with "
                                 "the columns)"))
            hint = next((h for v, h in variants if _close(got, v, 1e-9)),
                        f"expected {fmt(want[0])} in the first row, got {fmt(got[0])}")
            fb.fail(f"{label}: {hint}")
            return
        if case.failed:
            return
    fb.ok(f"dS_ij = P_ij * (dP_ij - D_i) equals {source} on {len(TILE_CASES)} tiles")


# --- P from a base-2 logsumexp --------------------------------------------------------------

#: (label, n_q, n_k, rows, cols, logit scale, shift) of :func:`check_p_from_base2`: tiles of
#: scaled scores S (natural units, shifted by ``shift``) and M, the base-2 logsumexp of their
#: whole rows.  The shifted case has L < 0, where the wrong base makes P too large.
BASE2_CASES = [
    ("square tile (rows 8:16, keys 16:24 of 20 x 50)", 20, 50, (8, 16), (16, 24), 2.0, 0.0),
    ("ragged tile (rows 16:20, keys 40:50 of 20 x 50)", 20, 50, (16, 20), (40, 50), 2.0, 0.0),
    ("scores shifted down by 12 (L < 0), rows 0:3, keys 5:9", 3, 9, (0, 3), (5, 9), 1.0,
     -12.0),
]


@checker("P from a base-2 logsumexp",
         forbid=names("flashlib.studies.backward.p_from_lse", "flashlib.algorithms.recompute_P"))
def check_p_from_base2(fb: Feedback, p_from_base2: Callable[..., Any]) -> None:
    """Check ``p_from_base2(S_ij, M_i) -> P_ij``: S_ij a (B_r, B_c) tile of scaled scores in
    natural units, M_i (B_r,) the base-2 logsumexp of those rows (M = m2 + log2(l2) =
    L log2 e, what an exp2 kernel saves): P_ij = exp2(S_ij log2 e - M_i) = exp(S_ij - M_i ln 2).
    """
    for label, n_q, n_k, (r0, r1), (c0, c1), logit, shift in BASE2_CASES:
        rng = np.random.default_rng(n_q + n_k)
        S = rng.standard_normal((n_q, n_k)) * logit + shift
        M = lse_base2(S)
        L = M * LN2
        S_ij, M_i = S[r0:r1, c0:c1], M[r0:r1]
        want = np.exp(S_ij - L[r0:r1, None])
        with fb.case(label) as case:
            got, _ = call_learner(p_from_base2, S_ij.copy(), M_i.copy())
            got = _as_array(got, S_ij.shape, "P_ij")
            if np.allclose(got, want, rtol=1e-9, atol=0):
                continue
            factor = np.exp(L[r0:r1] - M_i)
            tile_lse = np.log(np.sum(np.exp(S_ij), axis=1))
            variants = [
                (np.exp(S_ij - M_i[:, None]),
                 f"the ln 2 mistake: M is a base-2 logsumexp (M = L log2 e), and exp(S - M) "
                 f"treats it as natural; each row comes out multiplied by exp(L - M) = "
                 f"exp(-L (log2 e - 1)), here between {factor.min():.3g} and "
                 f"{factor.max():.3g}.  Use exp(S - M ln 2) or exp2(S log2 e - M)"),
                (np.exp2(S_ij - M_i[:, None]), "exp2 needs the scores in base 2 too: "
                 "exp2(S log2 e - M)"),
                (np.exp(S_ij - M_i[:, None] * LOG2E), "converted the wrong way: L = M ln 2 "
                 "(M = L log2 e), not M log2 e = M / ln 2"),
                (np.exp(S_ij - tile_lse[:, None]), "you normalised over the tile: P_ij uses "
                 "the logsumexp of the whole row (the M you are given), not of this tile's "
                 "keys"),
            ]
            if S_ij.shape[0] == S_ij.shape[1]:
                variants.append((np.exp(S_ij - M_i[None, :] * LN2), "M_i has one entry per "
                                 "row: M_i[:, None]"))
            hint = next((h for v, h in variants if np.allclose(got, v, rtol=1e-9, atol=1e-300)),
                        f"expected {fmt(want[0])} in the first row, got {fmt(got[0])}")
            fb.fail(f"{label}: {hint}")
            return
        if case.failed:
            return
    fb.ok(f"P recovered from the base-2 logsumexp on {len(BASE2_CASES)} tiles: "
          "exp2(S log2 e - M) = exp(S - M ln 2)")


# --- finite differences ---------------------------------------------------------------------

#: The 4 x 3 problem of :func:`check_finite_differences` (Q, K, V and dO are 4 x 3, seed 0),
#: and the step it passes.
FD_PROBLEM = {"n": 4, "d": 3, "seed": 0, "h": 1e-5}
#: The step of the first cases, on the function below.
_CUBIC_H = 1e-2


def _cubic(x: np.ndarray) -> float:
    """sum(w x^3) + (sum x)^2, w = 1, 2, ...: every entry's derivative different (weights),
    and each depending on the others (the square), so that a perturbation left behind shows.
    Its central difference with step h is exactly 3 w x^2 + w h^2 + 2 sum(x)."""
    w = np.arange(1.0, x.size + 1).reshape(x.shape)
    return float(np.sum(w * x**3) + np.sum(x) ** 2)


def _cubic_central(x: np.ndarray, h: float) -> np.ndarray:
    w = np.arange(1.0, x.size + 1).reshape(x.shape)
    return 3 * w * x**2 + w * h**2 + 2 * np.sum(x)


def _fd_variants(x: np.ndarray, h: float) -> list[tuple[np.ndarray, str]]:
    """The usual mistakes, computed on :func:`_cubic`: (their result, the hint)."""
    forward = np.empty_like(x)
    no_restore = np.empty_like(x)
    y = x.copy()
    f0 = _cubic(x)
    for k in np.ndindex(x.shape):
        z = x.copy()
        z[k] += h
        forward[k] = (_cubic(z) - f0) / h
        y[k] += h  # perturbed and never put back
        plus = _cubic(y)
        y[k] -= 2 * h
        no_restore[k] = (plus - _cubic(y)) / (2 * h)
    ones = np.ones_like(x)
    all_at_once = np.full_like(x, (_cubic(x + h * ones) - _cubic(x - h * ones)) / (2 * h))
    central = _cubic_central(x, h)
    return [
        (forward, "that is a forward difference (f(x + h) - f(x)) / h, off by about h f''/2: "
         "use (f(x + h) - f(x - h)) / (2 h), off by about h^2 f'''/6"),
        (2 * central, "divide by 2 h: the two points are 2 h apart"),
        (central / 2, "divide by 2 h, not 4 h"),
        (no_restore, "put each entry back after perturbing it: the perturbations are "
         "piling up"),
        (all_at_once, "perturb one entry at a time: moving every entry together gives one "
         "directional derivative, the same number everywhere"),
        (_cubic_central(x, 0.0), "use the step h you are given (the checker compares with "
         "the central difference at that h)"),
    ]


@checker("finite-difference gradient check",
         forbid=names("flashlib.studies.backward.central_difference",
                      "flashlib.studies.backward.fd_attention_grads"))
def check_finite_differences(fb: Feedback, fd_grad: Callable[..., Any]) -> None:
    """Check ``fd_grad(f, X, h) -> grad``, the central-difference gradient of the scalar
    function f at X (one entry perturbed by +h and -h at a time, X left as it was): first on
    a cubic whose central difference is known exactly, then as the gradient check
    of attention on the 4 x 3 problem (:data:`FD_PROBLEM`) against the analytic dQ, dK, dV."""
    rng = np.random.default_rng(3)
    for shape in ((4, 3), (5,), (2, 3, 2)):
        x = rng.standard_normal(shape)
        want = _cubic_central(x, _CUBIC_H)  # exact
        name = f"sum(w X^3) + sum(X)^2, X of shape {shape}, h = {_CUBIC_H:g}"
        with fb.case(name) as case:
            given = x.copy()
            got, _ = call_learner(fd_grad, _cubic, given, _CUBIC_H)
            got = _as_array(got, shape, "the gradient")
            if not np.array_equal(given, x):
                fb.fail(f"{name}: your function changed the X it was given: perturb a copy, "
                        "or put each entry back")
                return
            if not _close(got, want, 1e-8):
                hint = next((h for v, h in _fd_variants(x, _CUBIC_H) if _close(got, v, 1e-8)),
                            f"expected {fmt(want.ravel()[:3])}..., got {fmt(got.ravel()[:3])}...")
                fb.fail(f"{name}: {hint}")
                return
        if case.failed:
            return
    fb.ok("central differences, one entry at a time, X left unchanged")
    n, d, seed, h = FD_PROBLEM["n"], FD_PROBLEM["d"], FD_PROBLEM["seed"], FD_PROBLEM["h"]
    r = np.random.default_rng(seed)
    Q, K, V, dO = (r.standard_normal((n, d)) for _ in range(4))
    grads = naive_attention_backward(Q, K, V, dO)
    fs = [lambda X: attention_loss(X, K, V, dO), lambda X: attention_loss(Q, X, V, dO),
          lambda X: attention_loss(Q, K, X, dO)]
    errors = []
    label = f"gradient check of attention on the {n} x {d} problem, h = {h:g}"
    with fb.case(label):
        for name, f, X, g in zip(("dQ", "dK", "dV"), fs, (Q, K, V), grads, strict=True):
            got, _ = call_learner(fd_grad, f, X.copy(), h)
            got = _as_array(got, X.shape, name)
            errors.append(float(np.max(np.abs(got - g)) / np.max(np.abs(g))))
        if max(errors) <= 1e-7:
            fb.ok(f"{label}: your finite differences match the analytic dQ, dK, dV to "
                  f"{max(errors):.1e} (relative)")
        else:
            fb.fail(f"{label}: relative errors {', '.join(f'{e:.1e}' for e in errors)} for "
                    "dQ, dK, dV: central differences with this h should agree to about 1e-10")


# --- the tiled backward with a mask ---------------------------------------------------------

#: The memory probe of :func:`check_masked_backward`: N queries and keys, head dimension d,
#: blocks B x B (an (N, N) float64 array is 8 MiB).
MASKED_PROBE = (1024, 8, 64)


def _masked_cases() -> list[tuple[str, tuple[np.ndarray, ...], np.ndarray, int, int]]:
    """(label, (Q, K, V, dO), mask, B_r, B_c) of :func:`check_masked_backward`, float64.  The
    first cases have no row that sees no key (so that a mask ignored in the backward shows as
    a wrong value, not as NaN); then rows that see no key, rows blind in one tile, and scores
    near -800."""
    rng = np.random.default_rng(7)

    def problem(n_q: int, n_k: int, d: int = 5, d_v: int = 3) -> tuple[np.ndarray, ...]:
        return (rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d)),
                rng.standard_normal((n_k, d_v)), rng.standard_normal((n_q, d_v)))

    cases = [
        ("causal bottom-right, 13 queries, 17 keys, blocks 4 x 6", problem(13, 17),
         dense_mask(causal_bottom_right, 13, 17), 4, 6),
        ("padding: 9 real keys of 14, 11 queries, blocks 5 x 4", problem(11, 14),
         dense_mask(key_padding(9), 11, 14), 5, 4),
        ("bottom-right causal, 9 queries, 4 keys, blocks 3 x 3: rows 1-5 see no key",
         problem(9, 4), dense_mask(causal_bottom_right, 9, 4), 3, 3),
        ("one query, blocks larger than the problem (1 x 5, blocks 2 x 8)", problem(1, 5),
         np.ones((1, 5), dtype=bool), 2, 8),
    ]
    for shift in (0.0, -800.0):
        Q, K, V, mask = blind_row_problem(shift=shift)
        dO = np.random.default_rng(3).standard_normal((len(Q), V.shape[1]))
        near = "" if shift == 0 else f", their scores near {shift:g}"
        cases.append((f"window (2, 0) bottom-right, 10 x 8, blocks 5 x 4: rows 1, 2 see no "
                      f"key, rows 9, 10 none in the first key tile{near}", (Q, K, V, dO),
                      mask, 5, 4))
    return cases


def _masked_backward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, O: np.ndarray,
                     L: np.ndarray, dO: np.ndarray, mask: np.ndarray, B_r: int, B_c: int,
                     mistake: str | None = None) -> tuple[np.ndarray, ...]:
    """FlashAttention-2's backward with a boolean mask, right (``mistake=None``) or with one of
    the usual mistakes (see :data:`_MASKED_HINTS`), to recognise them."""
    N_q, N_k = len(Q), len(K)
    tau = 1 / np.sqrt(Q.shape[1])
    g = {"no tau": 1.0, "tau twice": tau * tau}.get(mistake or "", tau)
    D = np.zeros(N_q) if mistake == "no D" else np.sum(dO * O, axis=1)
    L_exp = L if mistake == "NaN" else np.where(np.isneginf(L), 0.0, L)
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    kept_K, kept_V = np.zeros((B_c, K.shape[1])), np.zeros((B_c, V.shape[1]))
    for j in range(0, N_k, B_c):
        K_j, V_j = K[j : j + B_c], V[j : j + B_c]
        w = len(K_j)
        if mistake != "no reset":
            kept_K[:], kept_V[:] = 0, 0
        dK_j, dV_j = kept_K[:w], kept_V[:w]
        for i in range(0, N_q, B_r):
            Q_i, dO_i = Q[i : i + B_r], dO[i : i + B_r]
            S_ij = (1.0 if mistake == "no tau in S" else tau) * (Q_i @ K_j.T)
            if mistake != "mask ignored":
                S_ij = np.where(mask[i : i + B_r, j : j + B_c], S_ij, -np.inf)
            P_ij = np.exp(S_ij - L_exp[i : i + B_r, None])
            dV_j += (tau if mistake == "tau on dV" else 1.0) * (P_ij.T @ dO_i)
            dP_ij = dO_i @ V_j.T
            D_i = (np.sum(P_ij * dP_ij, axis=1) if mistake == "tile D"
                   else D[i : i + B_r])
            dS_ij = P_ij * (dP_ij - D_i[:, None])
            if mistake == "dQ written":
                dQ[i : i + B_r] = g * (dS_ij @ K_j)
            else:
                dQ[i : i + B_r] += g * (dS_ij @ K_j)
            dK_j += g * (dS_ij.T @ Q_i)
        dK[j : j + B_c], dV[j : j + B_c] = dK_j, dV_j
    return dQ, dK, dV


#: The usual mistakes of the masked backward and what :func:`check_masked_backward` says.
_MASKED_HINTS = {
    "no D": "dV is right but dK and dQ are not: D is missing. dS_ij = P_ij * (dP_ij - D_i), "
    "with D = rowsum(dO * O) computed once before the loops",
    "tile D": "D_i is the whole row's rowsum(dO_i * O_i), computed once before the loops; "
    "rowsum(P_ij * dP_ij) over one tile covers only that tile's keys",
    "no tau": "dQ and dK are 1/tau = sqrt(d) times too large: S = tau Q K^T, so "
    "dQ_i += tau dS_ij K_j and dK_j += tau dS_ij^T Q_i",
    "tau twice": "dQ and dK carry tau twice (tau^2): S_ij = tau Q_i K_j^T brings one tau "
    "into dQ and dK, put it in once (in dS or in the two updates, not both)",
    "no tau in S": "dV is wrong, so P_ij is: recompute it from the scaled scores "
    "S_ij = tau Q_i K_j^T (L is the logsumexp of those)",
    "tau on dV": "dV is tau times too small: dV_j = sum_i P_ij^T dO_i has no tau (the scale "
    "enters dQ and dK only)",
    "dQ written": "dQ is only the last key block's share: dQ_i = tau sum_j dS_ij K_j sums over "
    "every key block, so add into dQ (+=), starting from zeros, instead of assigning",
    "no reset": "dK_j and dV_j carry over from the previous key block: set both to zero at the "
    "start of each key block j",
    "mask ignored": "the mask is ignored in the backward: hidden entries have P_ij = 0; set "
    "S_ij = -inf there before the exponential, as the forward did",
}

_NAN_HINT = ("NaN in dQ, dK or dV: on a row that sees no key L_i = -inf, and exp(S_ij - L_i) "
             "= exp(-inf - (-inf)) = NaN on its masked scores; use the forward's guard, "
             "subtract 0 where L_i = -inf (every score of that row is -inf, so P = 0)")


def _grads_close(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> list[bool]:
    return [bool(g.shape == w.shape and np.all(np.isfinite(g)) and _close(g, w, 1e-9))
            for g, w in zip(got, want, strict=True)]


def _masked_reference(Q: np.ndarray, K: np.ndarray, V: np.ndarray, dO: np.ndarray,
                      mask: np.ndarray) -> tuple[tuple[np.ndarray, ...], str]:
    """dQ, dK, dV by torch autograd (rows that see no key give 0), or, without torch,
    flashlib's naive backward; and the source's name."""
    from flashlib.book.autograd import attention_grads, torch_available

    if torch_available():
        return attention_grads(Q, K, V, dO, mask=mask), "autograd"
    return (naive_attention_backward(Q, K, V, dO, mask=mask),
            "flashlib's naive_attention_backward (torch is not installed here, so autograd "
            "is not used)")


def _masked_hint(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...],
                 args: tuple[Any, ...], ok: list[bool]) -> str:
    """What is wrong with a finite answer: a known mistake, else which gradient is off."""
    for mistake, hint in _MASKED_HINTS.items():
        if all(_grads_close(got, _masked_backward(*args, mistake=mistake))):
            return hint
    names = [n for n, good in zip(("dQ", "dK", "dV"), ok, strict=True) if not good]
    errs = ", ".join(f"{n} by {_rel(g, w):.2g}" for n, g, w, good
                     in zip(("dQ", "dK", "dV"), got, want, ok, strict=True) if not good)
    if not ok[2]:
        where = "dV = sum_i P_ij^T dO_i is wrong, so P_ij is: check its recompute and the mask"
    elif not ok[1]:
        where = "dV is right, so P is: dS_ij = P_ij * (dP_ij - D_i) or the dK_j update is not"
    else:
        where = ("dK and dV are right: dQ_i is a sum over every key block, "
                 "dQ_i += tau dS_ij K_j")
    return f"{' and '.join(names)} differ ({errs}, relative): {where}"


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b), initial=0.0) / max(1e-300, float(np.max(np.abs(b),
                                                                             initial=0.0))))


@checker("the tiled backward with a mask",
         forbid=names("flashlib.fast.backward.flash_attention_backward",
                      "flashlib.fast.naive.naive_attention_backward"))
def check_masked_backward(fb: Feedback, masked_flash2_backward: Callable[..., Any]) -> None:
    """Check ``masked_flash2_backward(Q, K, V, O, L, dO, mask, B_r, B_c) -> (dQ, dK, dV)``:
    FlashAttention-2's backward with a boolean mask (N_q, N_k), O and L from the masked
    forward (L = -inf on rows that see no key), against autograd (or, without torch, the
    naive backward) on ragged shapes, rows that see no key, rows blind in one tile and scores
    near -800; no numpy warning; then a probe of its memory: no (N, N) array."""
    source = ""
    for label, (Q, K, V, dO), mask, B_r, B_c in _masked_cases():
        O, L = naive_attention(Q, K, V, mask=mask, return_lse=True)
        want, source = _masked_reference(Q, K, V, dO, mask)
        with fb.case(label) as case:
            got, warns = call_learner(masked_flash2_backward, Q.copy(), K.copy(), V.copy(),
                                      O.copy(), L.copy(), dO.copy(), mask.copy(), B_r, B_c)
            if not (isinstance(got, tuple | list) and len(got) == 3):
                raise LearnerError("return the tuple (dQ, dK, dV)")
            got = tuple(_as_array(x, w.shape, name)
                        for x, w, name in zip(got, want, ("dQ", "dK", "dV"), strict=True))
            ok = _grads_close(got, want)
            if all(ok):
                if warns:
                    fb.fail(f"{label}: right answer, but {warned(warns[0])}: the guard "
                            "must avoid computing -inf - (-inf), not hide its NaN")
                    return
                continue
            if not all(np.isfinite(x).all() for x in got):
                blind = not mask.any(axis=1).all()
                fb.fail(f"{label}: " + (_NAN_HINT if blind else
                                        "NaN or inf in dQ, dK or dV: P_ij = exp(S_ij - L_i) "
                                        "is at most 1 on a row that sees keys"))
                return
            fb.fail(f"{label}: {_masked_hint(got, want, (Q, K, V, O, L, dO, mask, B_r, B_c), ok)}")
            return
        if case.failed:
            return
    fb.ok(f"dQ, dK, dV equal {source} on {len(_masked_cases())} problems: ragged blocks, "
          "padding, rows that see no key, rows blind in one tile, scores near -800")
    N, d, B = MASKED_PROBE
    rng = np.random.default_rng(5)
    Q, K, V, dO = (rng.standard_normal((N, d)) for _ in range(4))
    mask = dense_mask(causal_bottom_right, N, N)
    O, L = naive_attention(Q, K, V, mask=mask, return_lse=True)
    label = f"memory probe (N = {N}, d = {d}, blocks {B} x {B})"
    with fb.case(label):
        _, peak = measure_peak(call_learner, masked_flash2_backward, Q, K, V, O, L, dO, mask,
                               B, B)
        limit = N * N * 8 // 4
        if peak >= limit:
            fb.fail(f"{label}: {peak / 2**20:.1f} MiB allocated, as much as an (N, N) matrix "
                    f"({N * N * 8 / 2**20:.0f} MiB): compute S_ij, P_ij, dP_ij and dS_ij one "
                    "B_r x B_c tile at a time")
        else:
            fb.ok(f"{label}: {peak / 2**20:.2f} MiB allocated, no (N, N) array")


# --- FlashAttention-1's backward (Algorithm 4) with a mask --------------------------------


def _flash1_state(Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What FlashAttention-1's masked forward leaves in HBM: O, and for each row the maximum
    m of its visible scores and the sum l of exp(S - m) over them; a row that sees no key has
    m = -inf, l = 0 and O = 0 (float64)."""
    S = np.where(mask, Q @ K.T / np.sqrt(Q.shape[1]), -np.inf)
    m = S.max(axis=1)
    seen = ~np.isneginf(m)
    E = np.exp(S - np.where(seen, m, 0.0)[:, None])
    l = E.sum(axis=1)  # noqa: E741
    O = (E / np.where(seen, l, 1.0)[:, None]) @ V  # noqa: E741
    return O, l, m


def _flash1_model(Q: np.ndarray, K: np.ndarray, V: np.ndarray, O: np.ndarray,  # noqa: E741
                  l: np.ndarray, m: np.ndarray, dO: np.ndarray, mask: np.ndarray,  # noqa: E741
                  B_r: int, B_c: int, mistake: str | None = None) -> tuple[np.ndarray, ...]:
    """Algorithm 4 with a mask, right (``mistake=None``) or with one of the usual mistakes
    (see :data:`_FLASH1_HINTS`), to recognise them."""
    tau = 1 / np.sqrt(Q.shape[1])
    blind = np.isneginf(m)
    m_safe, l_safe = np.where(blind, 0.0, m), np.where(blind, 1.0, l)
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for j in range(0, len(K), B_c):
        K_j, V_j = K[j : j + B_c], V[j : j + B_c]
        dK_j, dV_j = np.zeros_like(K_j), np.zeros_like(V_j)
        for i in range(0, len(Q), B_r):
            Q_i, O_i, dO_i = Q[i : i + B_r], O[i : i + B_r], dO[i : i + B_r]
            l_i, m_i = l_safe[i : i + B_r, None], m_safe[i : i + B_r, None]
            S_ij = tau * (Q_i @ K_j.T)
            if mistake != "mask ignored":
                S_ij = np.where(mask[i : i + B_r, j : j + B_c], S_ij, -np.inf)
            P_ij = {"no l": np.exp(S_ij - m_i), "l as a log": np.exp(S_ij - m_i - l_i),
                    "times l": np.exp(S_ij - m_i) * l_i}.get(mistake or "",
                                                             np.exp(S_ij - m_i) / l_i)
            dV_j += P_ij.T @ dO_i
            dP_ij = dO_i @ V_j.T
            D_i = (np.sum(P_ij * dP_ij, axis=1) if mistake == "tile D"
                   else np.sum(dO_i * O_i, axis=1))
            dS_ij = P_ij * (dP_ij - D_i[:, None])
            if mistake == "dQ overwritten":
                dQ[i : i + B_r] = tau * (dS_ij @ K_j)
            else:
                dQ[i : i + B_r] = dQ[i : i + B_r] + tau * (dS_ij @ K_j)
            dK_j += tau * (dS_ij.T @ Q_i)
        dK[j : j + B_c], dV[j : j + B_c] = dK_j, dV_j
    return dQ, dK, dV


#: The usual mistakes of FlashAttention-1's backward and what :func:`check_flash1_backward`
#: says.
_FLASH1_HINTS = {
    "dQ overwritten": "dQ holds only the last key block's share: dQ_i = tau sum_j dS_ij K_j, "
    "so each step reads dQ_i from HBM, adds tau dS_ij K_j and writes it back "
    "(dQ_i <- dQ_i + tau dS_ij K_j), starting from dQ = 0",
    "no l": "P_ij is l_i times too large: exp(S_ij - m_i) is the unnormalised tile; "
    "Algorithm 4 rescales it, P_ij = diag(l_i)^-1 exp(S_ij - m_i)",
    "l as a log": "l_i is the rows' sum of exp(S - m_i), not its logarithm: "
    "P_ij = exp(S_ij - m_i) / l_i (the logsumexp would be L_i = m_i + log l_i)",
    "times l": "divide by l_i, do not multiply: P_ij = diag(l_i)^-1 exp(S_ij - m_i)",
    "tile D": "D_i is the whole row's rowsum(dO_i * O_i) (Algorithm 4 reads O_i at every "
    "step for it); rowsum(P_ij * dP_ij) over one tile covers only that tile's keys",
    "mask ignored": "the mask is ignored in the backward: hidden entries have P_ij = 0; set "
    "S_ij = -inf there before the exponential, as the forward did",
}

_FLASH1_NAN_HINT = ("NaN in dQ, dK or dV: a row that sees no key has m_i = -inf and l_i = 0, "
                    "so exp(S_ij - m_i) / l_i is exp(-inf - (-inf)) / 0 there; guard both, "
                    "m_i -> 0 and l_i -> 1 on such rows (every score of the row is -inf, so "
                    "P = 0)")


class _Watched(np.ndarray):
    """An input whose row blocks the learner's loop reads are counted (``name``: the array's
    name; slices and results of arithmetic carry no name and are not counted), to tell which
    loop is outside: Algorithm 4 reads K and V once and Q, dO once per key block."""

    reads: dict[str, int]
    name: str | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self.name = None

    def __getitem__(self, key: Any) -> Any:
        out = super().__getitem__(key)
        if self.name is not None and isinstance(out, np.ndarray):
            rows = out.shape[0] if out.ndim == self.ndim else 1
            self.reads[self.name] = self.reads.get(self.name, 0) + rows
        return out


def _watched(arrays: dict[str, np.ndarray], reads: dict[str, int]) -> dict[str, np.ndarray]:
    out = {}
    for name, x in arrays.items():
        w = x.copy().view(_Watched)
        w.name, w.reads = name, reads
        out[name] = w
    return out


_FLASH1_ARGS = ("Q", "K", "V", "O", "l", "m", "dO", "mask")


@checker("FlashAttention-1's backward (Algorithm 4) with a mask",
         forbid=names("flashlib.algorithms.flash1_backward",
                      "flashlib.algorithms.flash2_backward",
                      "flashlib.algorithms.two_pass_backward",
                      "flashlib.fast.backward.flash_attention_backward",
                      "flashlib.fast.naive.naive_attention_backward"))
def check_flash1_backward(fb: Feedback, flash1_backward: Callable[..., Any]) -> None:
    """Check ``flash1_backward(Q, K, V, O, l, m, dO, mask, B_r, B_c) -> (dQ, dK, dV)``:
    FlashAttention-1's Algorithm 4 (no dropout) with a boolean mask (N_q, N_k), from the
    masked forward's O, m and l (m = -inf, l = 0 on rows that see no key), against autograd
    (or, without torch, the naive backward) on the problems of
    :func:`check_masked_backward`; no numpy warning; then which loop is outside (key blocks,
    as Algorithm 4), from the row blocks of Q and K the loop reads: in Jupyter only, since
    in the grader the learner's function runs in another process."""
    source = ""
    for label, (Q, K, V, dO), mask, B_r, B_c in _masked_cases():
        O, l, m = _flash1_state(Q, K, V, mask)  # noqa: E741
        p = dict(zip(_FLASH1_ARGS, (Q, K, V, O, l, m, dO, mask), strict=True))
        want, source = _masked_reference(Q, K, V, dO, mask)
        with fb.case(label) as case:
            got, warns = call_learner(flash1_backward, *(p[x].copy() for x in _FLASH1_ARGS),
                                      B_r, B_c)
            if not (isinstance(got, tuple | list) and len(got) == 3):
                raise LearnerError("return the tuple (dQ, dK, dV)")
            got = tuple(_as_array(x, w.shape, name)
                        for x, w, name in zip(got, want, ("dQ", "dK", "dV"), strict=True))
            ok = _grads_close(got, want)
            if all(ok):
                if warns:
                    fb.fail(f"{label}: right answer, but {warned(warns[0])}: the guard "
                            "must avoid computing -inf - (-inf) and 0 / 0, not hide their "
                            "NaN")
                    return
                continue
            if not all(np.isfinite(x).all() for x in got):
                blind = not mask.any(axis=1).all()
                fb.fail(f"{label}: " + (_FLASH1_NAN_HINT if blind else
                                        "NaN or inf in dQ, dK or dV: P_ij = exp(S_ij - m_i) "
                                        "/ l_i is at most 1 on a row that sees keys"))
                return
            args = tuple(p[x] for x in _FLASH1_ARGS) + (B_r, B_c)
            hint = next((h for mistake, h in _FLASH1_HINTS.items()
                         if all(_grads_close(got, _flash1_model(*args, mistake=mistake)))),
                        None)
            if hint is None:
                wrong = [n for n, good in zip(("dQ", "dK", "dV"), ok, strict=True) if not good]
                hint = (f"{' and '.join(wrong)} differ from {source}: "
                        + ("dV = sum_i P_ij^T dO_i is wrong, so P_ij is: "
                           "P_ij = exp(S_ij - m_i) / l_i with S_ij = tau Q_i K_j^T, masked"
                           if not ok[2] else "dV is right, so P is: check "
                           "dS_ij = P_ij * (dP_ij - D_i) and the dQ_i, dK_j updates"))
            fb.fail(f"{label}: {hint}")
            return
        if case.failed:
            return
    fb.ok(f"dQ, dK, dV equal {source} on {len(_masked_cases())} problems, from m and l: "
          "ragged blocks, padding, rows that see no key, scores near -800")
    if is_remote(flash1_backward):
        return  # the loop's reads happen in the grader's process, out of sight
    label, n, B = "loop order (12 queries, 12 keys, blocks 4 x 4, no key hidden)", 12, 4
    rng = np.random.default_rng(20)
    Q, K, V, dO = (rng.standard_normal((n, 4)) for _ in range(4))
    mask = np.ones((n, n), dtype=bool)
    reads: dict[str, int] = {}
    p = _watched(dict(zip(_FLASH1_ARGS, (Q, K, V, *_flash1_state(Q, K, V, mask), dO, mask),
                          strict=True)), reads)
    with fb.case(label):
        call_learner(flash1_backward, *(p[x] for x in _FLASH1_ARGS), B, B)
        times = {x: reads.get(x, 0) / n for x in ("Q", "K")}
        if times["K"] > 1 and times["Q"] <= 1:
            fb.fail(f"{label}: your loop reads K {times['K']:g} times and Q once: the query "
                    "blocks are outside. Algorithm 4 puts the key blocks outside: each "
                    "program loads K_j, V_j once and keeps dK_j, dV_j on chip while the "
                    "query blocks stream by, so that dQ_i, not dK_j and dV_j, is read and "
                    "written in HBM at every step")
        elif times["K"] == 1 and times["Q"] > 1:
            fb.ok(f"{label}: K read once, Q once per key block: key blocks outside, as "
                  "Algorithm 4")
# --- 7.7 the backward with dropout, one tile ---------------------------------------------------

#: (label, N_q, N_k, d, d_v, B_r, B_c, p_drop, seed) of :func:`check_dropout_tile_backward`.
DROPOUT_CASES: list[tuple[str, int, int, int, int, int, int, float, int]] = [
    ("37 queries, 29 keys, blocks 8 x 6, p = 0.3", 37, 29, 8, 5, 8, 6, 0.3, 2024),
    ("one query, one key, p = 0.5", 1, 1, 4, 4, 4, 4, 0.5, 7),
    ("blocks larger than N: 7 x 9, blocks 16 x 16, p = 0.1", 7, 9, 8, 8, 16, 16, 0.1, 11),
    ("1 x 1 blocks, 9 queries, 11 keys, p = 0.6", 9, 11, 4, 3, 1, 1, 0.6, 2**40 + 3),
    ("64 x 48, blocks 16 x 32, p = 0.2", 64, 48, 16, 16, 16, 32, 0.2, 99),
]

#: The usual mistakes of a dropout backward tile: {name: hint}; :func:`_dropout_tile` computes
#: each, and the checker names the one the learner's gradients equal.
DROPOUT_HINTS: dict[str, str] = {
    "no_scale": "the 1/(1 - p) scale is missing: the forward divided the kept entries by "
                "1 - p, so dV and dP take Z / (1 - p), not Z",
    "dv_scale_only": "dP = (dO_i V_j^T) * Z_ij is missing the 1/(1 - p) scale that dV has: "
                     "the forward's O used P * Z / (1 - p), so both take it",
    "local_counters": "your mask is drawn with the tile's own indices (0, 1, ...), so the "
                      "backward's bits differ from the forward's: the counters are the "
                      "positions in the whole matrix, rows i .. i + B_r - 1 and keys "
                      "j .. j + B_c - 1",
    "swapped": "rows and keys are swapped in the counter, so the backward's bits differ from "
               "the forward's: dropout_keep(seed, head, rows, cols, p) with rows the queries",
    "dropped_p_in_ds": "dS_ij = P_ij * (dP_ij - D_i) takes the undropped P_ij: the dropout "
                       "is already in dP_ij (the softmax's Jacobian is that of P, not of "
                       "P * Z)",
    "dp_not_dropped": "dP_ij = dO_i V_j^T must go through the mask: dP_ij = (dO_i V_j^T) * "
                      "Z_ij / (1 - p), since the forward multiplied P by Z / (1 - p) before V",
    "dv_not_dropped": "dV_j takes the dropped probabilities: (P_ij * Z_ij)^T dO_i / (1 - p), "
                      "as the forward's O used P * Z / (1 - p)",
    "no_tau": "dQ and dK are missing the scale tau = 1/sqrt(d) (dS is the gradient of the "
              "scaled scores S = tau Q K^T)",
}


def _dropout_tile(Q_i: np.ndarray, K_j: np.ndarray, V_j: np.ndarray, dO_i: np.ndarray,
                  L_i: np.ndarray, D_i: np.ndarray, i: int, j: int, p_drop: float, seed: int,
                  mistake: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One tile's (dQ_i, dK_j, dV_j) shares, right, or with the named mistake of
    :data:`DROPOUT_HINTS`."""
    tau = 1 / np.sqrt(Q_i.shape[1])
    rows, cols = np.arange(i, i + len(Q_i))[:, None], np.arange(j, j + len(K_j))
    if mistake == "local_counters":
        rows, cols = rows - i, cols - j
    if mistake == "swapped":
        Z = dropout_keep(seed, 0, cols[None, :], rows, p_drop)
    else:
        Z = dropout_keep(seed, 0, rows, cols, p_drop)
    keep = 1.0 if mistake == "no_scale" else 1 / (1 - p_drop)
    P = np.exp(tau * (Q_i @ K_j.T) - L_i[:, None])
    dV = (P if mistake == "dv_not_dropped" else P * Z).T @ dO_i * keep
    dP = dO_i @ V_j.T
    if mistake != "dp_not_dropped":
        dP = dP * Z * (1.0 if mistake == "dv_scale_only" else keep)
    dS = (P * Z * keep if mistake == "dropped_p_in_ds" else P) * (dP - D_i[:, None])
    t = 1.0 if mistake == "no_tau" else tau
    return t * (dS @ K_j), t * (dS.T @ Q_i), dV


def _dropout_problem(case: tuple) -> tuple[np.ndarray, ...]:
    """Q, K, V, dO of a case (float64), and the forward's O and L (with dropout)."""
    _, n_q, n_k, d, d_v, B_r, B_c, p_drop, seed = case
    rng = np.random.default_rng(n_q * 100 + n_k)
    Q, K = rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d))
    V, dO = rng.standard_normal((n_k, d_v)), rng.standard_normal((n_q, d_v))
    O, L = flash2_dropout_forward(Q, K, V, p_drop, seed, B_r, B_c)
    return Q, K, V, dO, O, L


def _run_tiles(tile: Callable[..., Any], case: tuple, problem: tuple[np.ndarray, ...],
               learner: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV): ``tile`` called on every tile (key blocks outside) and its shares summed."""
    _, n_q, n_k, _, _, B_r, B_c, p_drop, seed = case
    Q, K, V, dO, O, L = problem
    D = np.sum(dO * O, axis=1)
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for j in range(0, n_k, B_c):
        for i in range(0, n_q, B_r):
            args = (Q[i : i + B_r], K[j : j + B_c], V[j : j + B_c], dO[i : i + B_r],
                    L[i : i + B_r], D[i : i + B_r], i, j, p_drop, seed)
            if learner:
                got, _ = call_learner(tile, *(x.copy() if isinstance(x, np.ndarray) else x
                                              for x in args))
                if not (isinstance(got, tuple | list) and len(got) == 3):
                    raise LearnerError("return the tuple (dQ_i, dK_j, dV_j) of the tile's "
                                       "shares")
                shapes = (args[0].shape, args[1].shape, args[2].shape)
                got = tuple(_as_array(x, shape, name) for x, shape, name in
                            zip(got, shapes, ("dQ_i", "dK_j", "dV_j"), strict=True))
            else:
                got = tile(*args)
            dQ[i : i + B_r] += got[0]
            dK[j : j + B_c] += got[1]
            dV[j : j + B_c] += got[2]
    return dQ, dK, dV


def _dropout_reference(case: tuple, problem: tuple[np.ndarray, ...]
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The gradients of attention with the dropout mask materialised (float64): the
    derivation, with D = rowsum(P * dP), not the tiles."""
    _, n_q, n_k, d, _, _, _, p_drop, seed = case
    Q, K, V, dO, _, _ = problem
    tau = 1 / np.sqrt(d)
    P = safe_softmax(tau * (Q @ K.T))
    Z = dropout_keep(seed, 0, np.arange(n_q)[:, None], np.arange(n_k), p_drop) / (1 - p_drop)
    dV = (P * Z).T @ dO
    dP = (dO @ V.T) * Z
    dS = P * (dP - np.sum(P * dP, axis=1, keepdims=True))
    return tau * dS @ K, tau * dS.T @ Q, dV


@checker("the backward with dropout, one tile",
         forbid=names("flashlib.algorithms.flash2_dropout_backward",
                      "flashlib.fast.backward.flash_attention_backward",
                      "flashlib.fast.dropout.dropout_backward"))
def check_dropout_tile_backward(fb: Feedback, dropout_tile_backward: Callable[..., Any]
                                ) -> None:
    """Check ``dropout_tile_backward(Q_i, K_j, V_j, dO_i, L_i, D_i, i, j, p_drop, seed) ->
    (dQ_i, dK_j, dV_j)``: one tile's shares of the gradients of attention with dropout (one
    head, h = 0), its mask regenerated with ``dropout_keep``; called on every tile of ragged
    problems and summed, against the gradients with the mask materialised."""
    for case in DROPOUT_CASES:
        label = case[0]
        problem = _dropout_problem(case)
        want = _dropout_reference(case, problem)
        with fb.case(label) as result:
            got = _run_tiles(dropout_tile_backward, case, problem, learner=True)
            ok = _grads_close(got, want)
            if all(ok):
                continue
            hint = next((h for name, h in DROPOUT_HINTS.items() if all(_grads_close(
                got, _run_tiles(lambda *a, m=name: _dropout_tile(*a, mistake=m), case,
                                problem, learner=False)))), None)
            if hint is None:
                wrong = [n for n, good in zip(("dQ", "dK", "dV"), ok, strict=True) if not good]
                hint = (f"{', '.join(wrong)} differ from the gradients with the mask "
                        f"materialised by up to "
                        f"{max(_rel(g, w) for g, w in zip(got, want, strict=True)):.3g} "
                        "(relative): draw Z_ij = dropout_keep(seed, 0, rows, cols, p_drop) "
                        "from the tile's positions, dV_j += (P_ij * Z_ij)^T dO_i / (1 - p), "
                        "dP_ij = (dO_i V_j^T) * Z_ij / (1 - p), dS_ij = P_ij * (dP_ij - D_i)")
            fb.fail(f"{label}: {hint}")
        if result.failed:
            return
    fb.ok(f"dQ, dK, dV summed over every tile equal the gradients with the mask materialised "
          f"on {len(DROPOUT_CASES)} problems: the regenerated bits are the forward's")
