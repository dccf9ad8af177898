"""Checkers for the exercises of the optimisation-ladder chapter.

Each checker runs the learner's function on several cases, awkward ones included, and returns
a :class:`flashlib.book.exercises.Feedback` that names the failing case and what to try.
Exceptions and numpy warnings from the learner's code are reported, never raised.

check_scores_base2      fold scale and log2(e) into Q: exp2 of the result is exp(scale q k^T)
check_pv_and_rowsum     one matmul with [V | 1] gives P V and the row sums of P
check_needs_rescale     the conditional-rescaling test of rung 5, -inf rows included
check_causal_tiles      how many tiles a causal FlashAttention computes, and how many it masks
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import Feedback, LearnerError, call_learner, checker, names, warned
from flashlib.core.constants import LOG2E
from flashlib.core.masks import causal_tiles
from flashlib.studies.ladder import RESCALE_THRESHOLD

__all__ = [
    "check_scores_base2",
    "check_pv_and_rowsum",
    "check_needs_rescale",
    "check_causal_tiles",
]


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """The learner's result; a numpy warning is a LearnerError here, as an exception is."""
    result, warns = call_learner(fn, *args)
    if warns:
        raise LearnerError(f"{warned(warns[0])}")
    return result


@checker("scores in base 2")
def check_scores_base2(
    fb: Feedback, fn: Callable[[np.ndarray, np.ndarray, float], np.ndarray]
) -> None:
    """``fn(q, k, scale)`` -> ``t`` with ``exp2(t) == exp(scale * q @ k.T)``, q's dtype kept."""
    rng = np.random.default_rng(0)
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        for n_q, n_k, d in ((5, 7, 4), (1, 3, 8)):
            q = rng.standard_normal((n_q, d)).astype(dtype)
            k = rng.standard_normal((n_k, d)).astype(dtype)
            scale = 1 / np.sqrt(d)
            name = f"{np.dtype(dtype).name} q {q.shape}, k {k.shape}"
            with fb.case(name):
                got = np.asarray(_call(fn, q, k, scale))
                want = scale * (q.astype(np.float64) @ k.T.astype(np.float64)) * LOG2E
                _compare_scores(fb, name, got, want, dtype, tol)
    # Large q and k with a small scale: q k^T overflows before a constant applied after the
    # matmul can bring it back; folded into q, the constant keeps the product in range.
    for dtype, size, scale in ((np.float32, 1e20, 1e-30), (np.float64, 1e160, 1e-300)):
        q = (size * rng.standard_normal((3, 4))).astype(dtype)
        k = (size * rng.standard_normal((5, 4))).astype(dtype)
        name = f"{np.dtype(dtype).name} |q|, |k| ~ {size:.0e}, scale {scale:.0e}"
        with fb.case(name):
            result, warns = call_learner(fn, q, k, scale)
            got = np.asarray(result)
            want = (q.astype(np.float64) * (scale * LOG2E)) @ k.T.astype(np.float64)
            overflow = any("overflow" in str(w) for w in warns)
            if overflow or (got.shape == want.shape and not np.all(np.isfinite(got))):
                fb.fail(f"{name}: q k^T overflowed: the constant is multiplied after the "
                        "matmul, too late to keep the product in range; fold it into q "
                        "first, (q * c) @ k.T (n_q x d multiplications, not n_q x n_k)")
            elif warns:
                fb.fail(f"{name}: {warned(warns[0])}")
            else:
                _compare_scores(fb, name, got, want, dtype, 1e-5)


def _compare_scores(fb: Feedback, name: str, got: np.ndarray, want: np.ndarray,
                dtype: Any, tol: float) -> None:
    """One verdict on the learner's base-2 scores ``got`` against the float64 ``want``."""
    if got.shape != want.shape:
        fb.fail(f"{name}: shape {got.shape}, expected (n_q, n_k) = {want.shape}")
    elif got.dtype != dtype:
        fb.fail(f"{name}: dtype {got.dtype}, expected {np.dtype(dtype).name}: cast "
                "the constant scale * LOG2E to q's dtype (q.dtype.type(...)) so "
                "numpy does not promote")
    elif np.allclose(got, want / LOG2E, rtol=tol, atol=tol):
        fb.fail(f"{name}: that is scale * q k^T in natural-log units; multiply "
                "by log2(e) = LOG2E too, so that exp2 of it equals exp of the "
                "score")
    elif not np.allclose(got, want, rtol=tol, atol=tol):
        fb.fail(f"{name}: values off by up to "
                f"{np.max(np.abs(got - want)):.3g}; expected "
                "(q * (scale * LOG2E)) @ k.T")
    else:
        fb.ok(f"{name}: exp2 of your scores equals exp(scale q k^T)")


class _Counted(np.ndarray):
    """An array that records the products and reductions numpy computes from it, so that a
    checker can tell one matmul with [V | 1] from ``p @ v`` plus ``p.sum(-1)``."""

    log: list[str]

    def __array_finalize__(self, obj: Any) -> None:  # views and copies share the log
        self.log = getattr(obj, "log", [])

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if ufunc is np.matmul:
            self.log.append("product")
        elif method == "reduce" and ufunc is np.add:
            self.log.append("sum")
        plain = [np.asarray(x) if isinstance(x, _Counted) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(x) if isinstance(x, _Counted) else x
                                  for x in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func in (np.dot, np.einsum, np.tensordot, np.inner, np.vdot):
            self.log.append("product")
        return super().__array_function__(func, types, args, kwargs)

    def __reduce__(self) -> tuple:  # the log travels with the array (grading/grade.py)
        return _rebuild_counted, (np.asarray(self), self.log)

    def __grade_state__(self) -> list[str]:
        """What the grader's sandbox sends back after the learner's call: the log."""
        return list(self.log)

    def __grade_sync__(self, state: list[str]) -> None:
        self.log[:] = [str(entry) for entry in state]


def _rebuild_counted(array: np.ndarray, log: list[str]) -> _Counted:
    out = np.array(array).view(_Counted)
    out.log = log
    return out


def _counted(x: np.ndarray, log: list[str]) -> _Counted:
    out = x.copy().view(_Counted)
    out.log = log
    return out


@checker("row sum in the matmul")
def check_pv_and_rowsum(
    fb: Feedback, fn: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
) -> None:
    """``fn(p, v)`` -> ``(p @ v, p.sum(-1))`` from one matmul of p with [V | 1], and no sum
    over p's rows (the products and sums numpy computes from ``p`` are counted)."""
    rng = np.random.default_rng(1)
    cases = [("p (4, 6), v (6, 3)", rng.random((4, 6)), rng.standard_normal((6, 3))),
             ("p (1, 1), v (1, 5)", rng.random((1, 1)), rng.standard_normal((1, 5))),
             ("batched p (2, 3, 4), v (2, 4, 2)", rng.random((2, 3, 4)),
              rng.standard_normal((2, 4, 2))),
             ("a row of zeros (a row that saw no key)",
              np.vstack([rng.random((1, 5)), np.zeros((1, 5))]),
              rng.standard_normal((5, 2))),
             ("float32 p (3, 4), v (4, 2)", rng.random((3, 4)).astype(np.float32),
              rng.standard_normal((4, 2)).astype(np.float32))]
    for name, p, v in cases:
        with fb.case(name):
            log: list[str] = []
            got = _call(fn, _counted(p, log), v.copy())
            try:
                pv, rowsum = got
            except (TypeError, ValueError):
                fb.fail(f"{name}: return a pair (pv, rowsum), got {type(got).__name__}")
                continue
            pv, rowsum = np.asarray(pv), np.asarray(rowsum)
            tol = 1e-12 if p.dtype == np.float64 else 1e-5
            products, sums = log.count("product"), log.count("sum")
            if pv.shape != p.shape[:-1] + v.shape[-1:]:
                fb.fail(f"{name}: pv has shape {pv.shape}, expected "
                        f"{p.shape[:-1] + v.shape[-1:]}: drop the ones column from the "
                        "product ([..., :-1])")
            elif rowsum.shape != p.shape[:-1]:
                fb.fail(f"{name}: rowsum has shape {rowsum.shape}, expected {p.shape[:-1]}: "
                        "take the last column of the product ([..., -1])")
            elif pv.dtype != p.dtype or rowsum.dtype != p.dtype:
                fb.fail(f"{name}: pv is {pv.dtype} and rowsum {rowsum.dtype} for {p.dtype} "
                        "p and v: the ones column is float64 (np.ones' default) and "
                        "promotes the whole product; make it in v's dtype, "
                        "np.ones(..., v.dtype)")
            elif not np.allclose(pv, p @ v, atol=tol):
                fb.fail(f"{name}: pv differs from p @ v: append the ones column to v "
                        "(along its last axis), not to p")
            elif not np.allclose(rowsum, p.sum(axis=-1), atol=tol):
                fb.fail(f"{name}: rowsum differs from p.sum(-1): the extra column of v must "
                        "be all ones")
            elif sums:
                fb.fail(f"{name}: right values, but the row sums come from a sum over p "
                        "(a second pass over the tile); the exercise asks for them from the "
                        "same matmul as p @ v")
            elif products != 1:
                fb.fail(f"{name}: right values from {products} matrix products of p; the "
                        "exercise asks for exactly one")
            else:
                fb.ok(f"{name}: pv and rowsum correct, from one matmul")


@checker("when to rescale")
def check_needs_rescale(
    fb: Feedback, fn: Callable[[np.ndarray, np.ndarray, float], np.ndarray]
) -> None:
    """``fn(m_old, m_tile, threshold)`` -> boolean array: which rows must rescale (their tile
    maximum exceeds the stale maximum by more than ``threshold``; a row with no max yet,
    ``m_old = -inf``, must rescale as soon as it sees a finite score)."""
    inf = np.inf
    t = RESCALE_THRESHOLD
    cases = [
        ("growth below the threshold", [0.0, 1.0], [t - 0.1, 1.0], [False, False],
         "a max that grows by less than the threshold keeps the stale m"),
        ("growth above the threshold", [0.0, 5.0], [t + 0.5, 5.0 + 2 * t], [True, True],
         "rescale when m_tile > m_old + threshold"),
        ("growth exactly the threshold", [0.0], [t], [False],
         f"exp2({t:g}) = {2.0**t:g} still cannot overflow: use a strict '>'"),
        ("first visible score (m_old = -inf)", [-inf, -inf], [3.0, -50.0], [True, True],
         "a row without a max yet must adopt one: -inf + threshold is still -inf"),
        ("still no visible key (both -inf)", [-inf], [-inf], [False],
         "nothing to rescale in a row that has seen no key; -inf > -inf is False"),
        ("the max went down", [10.0], [-3.0], [False], "a lower tile max never rescales"),
    ]
    for name, m_old, m_tile, want, hint in cases:
        with fb.case(name):
            got = np.asarray(_call(fn, np.array(m_old), np.array(m_tile), t))
            if got.shape != (len(want),) or got.dtype != np.bool_:
                fb.fail(f"{name}: return one boolean per row (shape ({len(want)},)), got "
                        f"{got.dtype} of shape {got.shape}")
            elif not np.array_equal(got, want):
                fb.fail(f"{name}: m_old {m_old}, m_tile {m_tile}: got {got.tolist()}, "
                        f"expected {want}: {hint}")
            else:
                fb.ok(f"{name}: correct")


@checker("causal tiles",
         forbid=names("flashlib.core.masks.causal_tiles", "flashlib.core.masks.classify_tiles"))
def check_causal_tiles(fb: Feedback, fn: Callable[[int, int, int], tuple[int, int]]) -> None:
    """``fn(n, block_q, block_k)`` -> (computed, masked) tile counts of an n x n top-left
    causal score matrix, as :func:`flashlib.core.masks.causal_tiles` (which also returns the
    total)."""
    cases = [(4096, 128, 128), (1000, 128, 128), (256, 64, 128), (256, 128, 64), (10, 3, 4),
             (5, 8, 8)]
    for n, b_r, b_c in cases:
        name = f"n = {n}, block_q = {b_r}, block_k = {b_c}"
        with fb.case(name):
            got = _call(fn, n, b_r, b_c)
            *want, total = causal_tiles(n, n, b_r, b_c)
            try:
                computed, masked = (int(x) for x in got)
            except (TypeError, ValueError):
                fb.fail(f"{name}: return a pair (computed, masked), got {got!r}")
                continue
            if computed == total and want[0] < total:
                fb.fail(f"{name}: you count all {total} tiles; skip the tiles whose first key "
                        "j0 lies beyond the block's last row (j0 > i1 - 1)")
            elif computed != want[0]:
                fb.fail(f"{name}: computed tiles {computed}, expected {want[0]}; a tile is "
                        "needed when some row i < i1 sees its first key j0 (j0 <= i1 - 1), "
                        "and blocks at the end may be ragged")
            elif masked != want[1]:
                fb.fail(f"{name}: masked tiles {masked}, expected {want[1]}; a computed tile "
                        "needs a mask when its top-right entry (i0, j1 - 1) is hidden")
            else:
                fb.ok(f"{name}: {computed} tiles computed of {total}, {masked} masked")
