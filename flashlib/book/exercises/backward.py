"""Checkers for the exercises of the backward chapter.

check_delta              ``delta_from_P(P, dP)`` and ``delta_from_O(O, dO)``: D two ways, equal,
                         and the second forms no (N, N) array (memory probe)
check_ds_tile            ``ds_tile(P_ij, dP_ij, D_i) -> dS_ij``: one tile of dS, against autograd
                         (torch) or the softmax's Jacobian (float64) when torch is missing
check_p_from_base2       ``p_from_base2(S_ij, M_i) -> P_ij``: P recovered from a base-2
                         logsumexp; the ln 2 mistake recognised and named
check_finite_differences ``fd_grad(f, X, h) -> grad``: central differences, then the gradient
                         check of the 4 x 3 attention problem
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.algorithms import safe_softmax
from flashlib.book.exercises import Feedback, LearnerError, call_learner, checker, fmt, names
from flashlib.core.constants import LN2, LOG2E
from flashlib.core.measure import measure_peak
from flashlib.fast.naive import naive_attention_backward
from flashlib.studies.backward import attention_loss, lse_base2, softmax_vjp

__all__ = [
    "DELTA_CASES",
    "TILE_CASES",
    "FD_PROBLEM",
    "check_delta",
    "check_ds_tile",
    "check_p_from_base2",
    "check_finite_differences",
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


# --- D two ways -----------------------------------------------------------------------------

#: (label, n_q, n_k, d_v) of :func:`check_delta`: n_q, n_k and d_v all different first, so
#: that a sum over the wrong axis has the wrong shape; then a square one, where it has not.
DELTA_CASES = [
    ("37 queries, 29 keys, d_v = 8", 37, 29, 8),
    ("one query row (1 x 5, d_v = 3)", 1, 5, 3),
    ("one key (6 x 1, d_v = 4)", 6, 1, 4),
    ("square (7 x 7, d_v = 7)", 7, 7, 7),
]
#: The memory probe of delta_from_O: N rows, d_v columns (an (N, N) float64 array is 32 MiB).
DELTA_PROBE = (2048, 8)


def _delta_P_hint(got: np.ndarray, p: dict[str, np.ndarray]) -> str:
    P, dP = p["P"], p["dP"]
    variants = [
        (np.sum(dP, axis=-1), "that is rowsum(dP): multiply by P entry by entry first, "
         "D_i = sum_j P_ij dP_ij"),
        (np.sum(P, axis=-1), "that is rowsum(P) (all ones): D_i = sum_j P_ij dP_ij"),
        (np.sum(dP * P, axis=0), "you summed over the queries (axis 0): D_i sums over the "
         "keys j of row i (axis=-1)"),
        (np.sum(dP @ P.T, axis=-1), "dP @ P.T mixes row i with every row j: multiply "
         "elementwise, dP * P, then sum each row"),
    ]
    for value, hint in variants:
        if value.shape == got.shape and _close(got, value):
            return hint
    return "D_i = rowsum(dP_i * P_i): multiply elementwise, sum over the keys (axis=-1)"


def _delta_O_hint(got: np.ndarray, p: dict[str, np.ndarray]) -> str:
    O, dO = p["O"], p["dO"]
    variants = [
        (np.sum(O, axis=-1), "that is rowsum(O): multiply by dO entry by entry first, "
         "D_i = sum_c dO_ic O_ic"),
        (np.sum(dO, axis=-1), "that is rowsum(dO): D_i = sum_c dO_ic O_ic"),
        (np.sum(dO * O, axis=0), "you summed over the rows (axis 0): D_i sums over the "
         "columns c of row i (axis=-1)"),
        (np.sum(dO @ O.T, axis=-1), "dO @ O.T pairs row i of dO with every row of O: "
         "multiply elementwise, dO * O, then sum each row"),
    ]
    for value, hint in variants:
        if value.shape == got.shape and _close(got, value):
            return hint
    return "D_i = rowsum(dO_i * O_i): multiply elementwise, sum over the columns (axis=-1)"


@checker("D two ways",
         forbid=names("flashlib.algorithms.delta_from_O",
                      "flashlib.studies.backward.delta_from_P"))
def check_delta(fb: Feedback, delta_from_P: Callable[..., Any],
                delta_from_O: Callable[..., Any] | None = None) -> None:
    """Check ``delta_from_P(P, dP)`` and ``delta_from_O(O, dO)``: both equal
    D = rowsum(dP * P) on ragged shapes (vectors (N_q,)), equal to each other, and
    ``delta_from_O`` allocates no (N, N) array (N = 2048, d_v = 8: a probe of its memory)."""
    for label, n_q, n_k, d_v in DELTA_CASES:
        p = _softmax_problem(n_q, n_k, d_v, seed=n_q + n_k)
        want = np.sum(p["dP"] * p["P"], axis=-1)
        name = f"delta_from_P, {label}"
        with fb.case(name) as case:
            got, _ = call_learner(delta_from_P, p["P"].copy(), p["dP"].copy())
            got = _as_vector(got, n_q, {n_k: "keys"})
            if not _close(got, want):
                fb.fail(f"{name}: {_delta_P_hint(got, p)}")
                return
        if case.failed:
            return
    fb.ok(f"delta_from_P equals rowsum(dP * P) on {len(DELTA_CASES)} shapes")
    if delta_from_O is None:
        fb.fail("pass your second function too: check_delta(delta_from_P, delta_from_O)")
        return
    for label, n_q, n_k, d_v in DELTA_CASES:
        p = _softmax_problem(n_q, n_k, d_v, seed=n_q + n_k)
        name = f"delta_from_O, {label}"
        with fb.case(name) as case:
            got, _ = call_learner(delta_from_O, p["O"].copy(), p["dO"].copy())
            got = _as_vector(got, n_q, {d_v: "columns"})
            from_P = _as_array(call_learner(delta_from_P, p["P"].copy(), p["dP"].copy())[0],
                               (n_q,), "D")
            if not _close(got, np.sum(p["dO"] * p["O"], axis=-1)):
                fb.fail(f"{name}: {_delta_O_hint(got, p)}")
                return
            if not _close(got, from_P):
                fb.fail(f"{name}: your two functions disagree (largest difference "
                        f"{np.max(np.abs(got - from_P)):.3g})")
                return
        if case.failed:
            return
    fb.ok("delta_from_O equals delta_from_P: rowsum(dO * O) = rowsum(dP * P), since dP = dO V^T "
          "and O = P V")
    N, d_v = DELTA_PROBE
    rng = np.random.default_rng(1)
    O, dO = rng.standard_normal((N, d_v)), rng.standard_normal((N, d_v))
    label = f"memory probe (N = {N}, d_v = {d_v})"
    with fb.case(label):
        (got, _), peak = measure_peak(call_learner, delta_from_O, O, dO)
        limit = N * N * O.itemsize // 4
        if peak >= limit:
            fb.fail(f"{label}: delta_from_O allocated {peak / 2**20:.1f} MiB, as much as an "
                    f"(N, N) matrix ({N * N * O.itemsize / 2**20:.0f} MiB): dO @ O.T pairs "
                    "every row with every row; multiply elementwise and sum each row")
        else:
            fb.ok(f"{label}: {peak / 2**20:.2f} MiB allocated, no (N, N) array: D costs "
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


def _reference_dS(p: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    """dS of the whole problem by autograd when torch is here, else by the softmax's Jacobian
    (float64; the two agree to rounding)."""
    from flashlib.book.autograd import score_grads, torch_available

    if torch_available():
        return score_grads(p["S"], p["V"], p["dO"]), "autograd"
    return softmax_vjp(p["P"], p["dP"]), "the softmax's Jacobian"


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
