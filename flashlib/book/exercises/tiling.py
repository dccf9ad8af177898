"""Checkers for the exercises of the tiling chapter (book/tiling.md).

check_tiled_state      ``tiled_state(Q, K, V, B_r, B_c) -> (m, l, acc)``: the online-softmax state
                       of every row over all the keys, computed tile by tile, on ragged shapes
                       and scores near -800; no (n, n) array allocated
check_tile_schedule    ``tile_schedule(n_q, n_k, B_r, B_c, order) -> [(i, j), ...]``: the tiles
                       in the order each loop order computes them, against the event log
check_o_writes         ``o_writes(N, B_r, B_c, order)``: the block writes of O each order makes
check_square_block     ``square_block(M, d) -> B``: the largest square block whose step of
                       FlashAttention-2 fits in an SRAM of M elements
check_cap_reason       the score tile with B_r capped at another multiple of d (a letter of
                       the variant's choices, :data:`CAP_CHOICES` in the book, or a function
                       returning it)

Over 500 lines (about 510): one checker per exercise, whose cases and diagnoses are code;
the mistakes each must catch are data, in mistakes/tiling.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import (
    ATTENTION,
    MERGES,
    Feedback,
    LearnerError,
    call_learner,
    checker,
    names,
    shape_problem,
    variants,
    warned,
)
from flashlib.book.exercises.memory import measure_peak
from flashlib.studies.io_model import block_counts
from flashlib.studies.tiling import logged_tiles

__all__ = [
    "STATE_CASES",
    "O_WRITES_PROBLEM",
    "CAP_CHOICES",
    "check_tiled_state",
    "check_tile_schedule",
    "check_o_writes",
    "check_square_block",
    "step_elements",
    "check_cap_reason",
]

#: (n_q, n_k, d, d_v, B_r, B_c, kind) of :func:`check_tiled_state`: ragged last blocks, one
#: row, blocks larger than n, 1 x 1 blocks, n_q != n_k and d_v != d, large scores (a missing
#: rescale shows), and scores all near -800 (a running maximum started at 0 underflows).
STATE_CASES = [
    ("ragged last blocks (100 x 70, B_r = 32, B_c = 16, d_v = 12)",
     (100, 70, 16, 12, 32, 16, "random")),
    ("one query row (1 x 37, B_r = B_c = 8)", (1, 37, 8, 8, 8, 8, "random")),
    ("blocks larger than n (7 x 9, 64 x 128)", (7, 9, 8, 8, 64, 128, "random")),
    ("1 x 1 blocks (9 x 11)", (9, 11, 4, 3, 1, 1, "random")),
    ("large scores (60 x 50, B_r = 16, B_c = 8)", (60, 50, 8, 8, 16, 8, "large")),
    ("every score near -800 (20 x 30, B_r = B_c = 8)", (20, 30, 8, 8, 8, 8, "negative")),
]
#: The memory probe: no array of n_q x n_k elements (or a quarter of it) may be allocated.
PROBE = (1024, 1024, 16, 64, 64)


def _problem(n_q: int, n_k: int, d: int, d_v: int, kind: str = "random", seed: int = 0
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V: random; "large": scores of about +-20; "negative": every scaled score within
    about 15 of -800, so that exp(S) underflows to 0 and only exp(S - m) survives."""
    rng = np.random.default_rng(seed)
    Q, K = rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d))
    V = rng.standard_normal((n_k, d_v))
    if kind == "large":
        Q *= 8.0
    elif kind == "negative":
        c = math.sqrt(800 * math.sqrt(d))  # tau * (-c) * c = -800 along the first axis
        Q, K = 0.3 * Q, 0.3 * K
        Q[:, 0], K[:, 0] = -c, c
    return Q, K, V


def _state(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, ...]:
    """The exact state (m, l, acc) of every row over all the keys, in float64."""
    S = Q @ K.T / math.sqrt(Q.shape[1])
    m = S.max(axis=1)
    P = np.exp(S - m[:, None])
    return m, P.sum(axis=1), P @ V


def _mistake(Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int, *,
             rescale_O: bool = True, rescale_l: bool = True, l_after: bool = False,
             scale: bool = True, ragged: bool = True, m_start: float = -np.inf,
             running_max: bool = True) -> tuple[np.ndarray, ...]:
    """FlashAttention-2's loop, returning (m, l, acc), with one of the usual mistakes switched
    on (for the diagnoses)."""
    N_q, N_k = len(Q), len(K)
    tau = 1 / math.sqrt(Q.shape[1]) if scale else 1.0
    stop_k = N_k if ragged else N_k - N_k % B_c
    m, l, acc = np.empty(N_q), np.empty(N_q), np.empty((N_q, V.shape[1]))
    with np.errstate(all="ignore"):
        for i in range(0, N_q, B_r):
            Q_i = Q[i : i + B_r]
            O_i, l_i = np.zeros((len(Q_i), V.shape[1])), np.zeros(len(Q_i))
            m_i = np.full(len(Q_i), m_start)
            for j in range(0, stop_k, B_c):
                S = tau * (Q_i @ K[j : j + B_c].T)
                m_new = np.maximum(m_i, S.max(axis=1)) if running_max else S.max(axis=1)
                P = np.exp(S - m_new[:, None])
                alpha = np.exp(m_i - m_new)
                if l_after:
                    l_i = alpha * (l_i + P.sum(axis=1))
                else:
                    l_i = (alpha if rescale_l else 1) * l_i + P.sum(axis=1)
                O_i = (alpha[:, None] if rescale_O else 1) * O_i + P @ V[j : j + B_c]
                m_i = m_new
            m[i : i + B_r], l[i : i + B_r], acc[i : i + B_r] = m_i, l_i, O_i
    return m, l, acc


def _tile_average(Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_c: int, weighted: bool
                  ) -> np.ndarray:
    """The conceptual mistake: each key tile's own softmax output, averaged over the tiles
    (plainly, or weighted by the tiles' numbers of keys)."""
    S = Q @ K.T / math.sqrt(Q.shape[1])
    outs, sizes = [], []
    for j in range(0, len(K), B_c):
        P = np.exp(S[:, j : j + B_c] - S[:, j : j + B_c].max(axis=1, keepdims=True))
        outs.append(P @ V[j : j + B_c] / P.sum(axis=1, keepdims=True))
        sizes.append(min(B_c, len(K) - j))
    return np.average(np.stack(outs), axis=0, weights=sizes if weighted else None)


_M0 = ("m_i starts at 0, not -inf: on rows whose scores are all near -800, m stays 0, "
       "exp(S_ij - 0) underflows to 0 and l = acc = 0, so the output is lost (0 / 0); start "
       "from m_i = -inf, the maximum of nothing (Exercise 3.3)")
_MISTAKES = [
    (dict(rescale_O=False), "acc (O_i) is not rescaled when the running maximum grows: "
     "O_i = diag(exp(m_i - m_new)) O_i + P~_ij V_j"),
    (dict(rescale_l=False), "l_i is not rescaled when the running maximum grows: "
     "l_i = exp(m_i - m_new) l_i + rowsum(P~_ij)"),
    (dict(rescale_O=False, rescale_l=False), "neither acc (O_i) nor l_i is rescaled when the "
     "running maximum grows (is alpha computed after m_i = m_new? then it is always 1): "
     "multiply both by exp(m_i - m_new), with the old m_i"),
    (dict(l_after=True), "l_i = alpha (l_i + rowsum(P~_ij)) also shrinks the new tile's sum, "
     "which is already measured against m_new: l_i = alpha l_i + rowsum(P~_ij)"),
    (dict(scale=False), "the scores are not scaled: S_ij = Q_i K_j^T / sqrt(d)"),
    (dict(ragged=False), "the last, shorter block of keys is skipped: loop with "
     "range(0, N_k, B_c) (ceil(N_k / B_c) blocks), not N_k // B_c blocks"),
    (dict(m_start=0.0), _M0),
]
_AVERAGE = ("each tile's softmax is normalised by its own sum and the tiles are averaged: a "
            "tile whose scores are larger must weigh more; keep one running m_i, l_i, acc per "
            "row across the tiles, rescaling l_i and acc by exp(m_i - m_new)")


def _as_state(result: Any, n_q: int, d_v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The learner's (m, l, acc) as float64 arrays, or a LearnerError naming what came back."""
    if isinstance(result, tuple) and len(result) == 2:
        raise LearnerError("that is (O, L), Algorithm 2's output: return the state before its "
                           "step 6, (m, l, acc), with no division and no L")
    if not (isinstance(result, tuple | list) and len(result) == 3):
        what = (f"an array of shape {np.shape(result)} (O?)" if isinstance(result, np.ndarray)
                else type(result).__name__)
        raise LearnerError(f"return the state (m, l, acc), three arrays; got {what}")
    try:
        m, l, acc = (np.asarray(x, dtype=np.float64) for x in result)  # noqa: E741
    except (TypeError, ValueError):
        raise LearnerError("return (m, l, acc) as three numpy arrays") from None
    for got, want, what in ((m, (n_q,), "m"), (l, (n_q,), "l"), (acc, (n_q, d_v), "acc")):
        problem = shape_problem(got, want, what)
        if problem:
            raise LearnerError(problem)
    return m, l, acc


def _output(l: np.ndarray, acc: np.ndarray) -> np.ndarray:  # noqa: E741
    with np.errstate(all="ignore"):
        return acc / l[:, None]


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all(np.isfinite(a))) and np.allclose(
        a, b, rtol=1e-9, atol=1e-12)


def _diagnose(m: np.ndarray, l: np.ndarray, acc: np.ndarray,  # noqa: E741
              Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int) -> str:
    """One line naming the mistake that reproduces the learner's state (or output)."""
    o = _output(l, acc)
    m_want, l_want, acc_want = _state(Q, K, V)
    if _close(acc, acc_want / l_want[:, None]):
        return ("acc is already divided by l: the state keeps it unnormalised, "
                "acc = exp(S - m) V (do not divide acc by l; that is step 6)")
    for flags, hint in _MISTAKES:
        m_x, l_x, acc_x = _mistake(Q, K, V, B_r, B_c, **flags)
        if _close(o, _output(l_x, acc_x)) or (
                _close(m, m_x) and _close(l, l_x) and _close(acc, acc_x)):
            return hint
    if any(_close(o, _tile_average(Q, K, V, B_c, w)) for w in (False, True)):
        return _AVERAGE
    if np.all(m == 0) and np.all(l == 0):
        return _M0
    return "compare with Algorithm 2's steps 2 to 5, line by line"


@checker("tiled state (m, l, acc)",
         forbid=names(ATTENTION, MERGES, "flashlib.fast.online.partial_attention",
                      "flashlib.fast.online.partial_blocks"))
def check_tiled_state(fb: Feedback, fn: Callable[..., Any]) -> None:
    """Check ``tiled_state(Q, K, V, B_r, B_c) -> (m, l, acc)``, the online-softmax state of
    every query row over all the keys, against the exact state on ragged shapes, one row,
    blocks larger than n, 1 x 1 blocks, large scores and scores all near -800; then that it
    never allocates an (N_q, N_k) array."""
    for name, (n_q, n_k, d, d_v, B_r, B_c, kind) in STATE_CASES:
        Q, K, V = _problem(n_q, n_k, d, d_v, kind)
        with fb.case(name):
            got, warns = call_learner(fn, Q.copy(), K.copy(), V.copy(), B_r, B_c)
            m, l, acc = _as_state(got, n_q, d_v)  # noqa: E741
            m_want, l_want, acc_want = _state(Q, K, V)
            o, o_want = _output(l, acc), acc_want / l_want[:, None]
            if not _close(o, o_want):
                error = (f"acc / l differs from attention by {np.max(np.abs(o - o_want)):.3g}"
                         if np.all(np.isfinite(o)) else "acc / l is not finite (l = 0 or NaN)")
                fb.fail(f"{name}: {error}: "
                        f"{_diagnose(m, l, acc, Q, K, V, B_r, B_c)}")
            elif not _close(m, m_want):
                if _close(m, np.maximum(m_want, 0.0)):
                    hint = _M0
                elif _close(m, _mistake(Q, K, V, B_r, B_c, running_max=False)[0]):
                    hint = ("m is the last tile's maximum, not the maximum of the row: "
                            "m_new = max(m_i, rowmax(S_ij)), so that exp(m_i - m_new) <= 1")
                else:
                    hint = "m must be the maximum of each row of S = Q K^T / sqrt(d)"
                fb.fail(f"{name}: acc / l is right but m is not the row maximum: {hint}")
            elif not (_close(l, l_want) and _close(acc, acc_want)):
                fb.fail(f"{name}: m and acc / l are right, but l and acc are not measured "
                        "against m: l = rowsum(exp(S - m)), acc = exp(S - m) V (unnormalised: "
                        "do not divide acc by l)")
            elif warns:
                fb.fail(f"{name}: right answer, but {warned(warns[0])}")
            else:
                fb.ok(f"{name}: the exact (m, l, acc)")
    if fb.problems:
        return
    n_q, n_k, d, B_r, B_c = PROBE
    Q, K, V = _problem(n_q, n_k, d, d, seed=1)
    label = f"memory probe (N = {n_q}, B_r = B_c = {B_r})"
    with fb.case(label):
        (got, _), peak = measure_peak(call_learner, fn, Q, K, V, B_r, B_c)
        limit = n_q * n_k * Q.itemsize // 4
        if peak >= limit:
            fb.fail(f"{label}: your function allocated {peak / 2**20:.1f} MiB, as much as an "
                    f"(N, N) matrix ({n_q * n_k * Q.itemsize / 2**20:.0f} MiB): compute S_ij "
                    "one B_r x B_c tile at a time, never Q @ K.T whole")
        else:
            fb.ok(f"{label}: at most {peak / 2**20:.2f} MiB allocated, no (N, N) array")


# --- the tile schedule ----------------------------------------------------------------------

#: (n_q, n_k, B_r, B_c) of :func:`check_tile_schedule`: exact multiples first (T_r != T_c, so
#: that no mistake mimics another), then random shapes with ragged tails (fixed seed).
SCHEDULE_CASES = [(8, 12, 4, 4), (8, 8, 4, 4)] + [
    tuple(int(x) for x in row) for row in np.column_stack([
        np.random.default_rng(0).integers(5, 60, size=(6, 2)),
        np.random.default_rng(1).integers(2, 17, size=(6, 2))])]


def _schedule_variants(n_q: int, n_k: int, B_r: int, B_c: int, order: str
                       ) -> list[tuple[list, str]]:
    T_r, T_c = -(-n_q // B_r), -(-n_k // B_c)
    other = "v2" if order == "v1" else "v1"

    def tiles(t_r: int, t_c: int, o: str) -> list[tuple[int, int]]:
        return ([(i, j) for j in range(t_c) for i in range(t_r)] if o == "v1" else
                [(i, j) for i in range(t_r) for j in range(t_c)])

    right = tiles(T_r, T_c, order)
    return [
        (tiles(T_r, T_c, other), f"that is the other order: {order} has its outer loop over "
         + ("key blocks j (K_j, V_j stay while every Q_i passes)" if order == "v1" else
            "query blocks i (Q_i stays while every K_j, V_j passes)")),
        (tiles(n_q // B_r, n_k // B_c, order), "the ragged last blocks are missing: there are "
         "ceil(n / B) blocks, the last one shorter"),
        ([(j, i) for i, j in right], "the pairs are (j, i): give (query block i, key block j)"),
        ([(i * B_r, j * B_c) for i, j in right], "those are first rows, not block indices: "
         "give i = row // B_r, j = key // B_c"),
        ([(i + 1, j + 1) for i, j in right], "count blocks from 0, as Python does"),
    ]


@checker("tile schedule",
         forbid=names(ATTENTION, "flashlib.studies.tiling.logged_tiles",
                      "flashlib.studies.tiling.run_counted"))
def check_tile_schedule(fb: Feedback, fn: Callable[[int, int, int, int, str], Any]) -> None:
    """Check ``tile_schedule(n_q, n_k, B_r, B_c, order) -> [(i, j), ...]`` against the tiles in
    the event log of the teaching functions, for "v1" and "v2"."""
    for n_q, n_k, B_r, B_c in SCHEDULE_CASES:
        for order in ("v1", "v2"):
            name = f"{order}, n_q = {n_q}, n_k = {n_k}, B_r = {B_r}, B_c = {B_c}"
            with fb.case(name):
                got, _ = call_learner(fn, n_q, n_k, B_r, B_c, order)
                try:
                    got = [(int(i), int(j)) for i, j in got]
                except (TypeError, ValueError):
                    raise LearnerError("return a list of (i, j) pairs") from None
                want = logged_tiles(n_q, n_k, B_r, B_c, order)
                if got == want:
                    continue
                hint = next((h for v, h in _schedule_variants(n_q, n_k, B_r, B_c, order)
                             if got == v), None)
                if hint is None and sorted(got) == sorted(want):
                    hint = "the right tiles in the wrong order"
                elif hint is None:
                    hint = f"expected {len(want)} tiles starting {want[:4]}, got {got[:4]}"
                fb.fail(f"{name}: {hint}")
                return
    fb.ok(f"the tiles of both orders, in order, on {len(SCHEDULE_CASES)} shapes "
          "(ragged tails included), as the event log records them")


# --- predicting the writes of O -------------------------------------------------------------

#: The sizes of the question :func:`check_o_writes` asks first, variant 0 (the book's; the
#: page's deep dive counted N = 1000, whose counts the page prints); a student's variant has
#: other sizes (:data:`O_WRITES_VARIANTS`).  Then a few more, so that the formula is checked,
#: not one number.
O_WRITES_PROBLEM = {"N": 1500, "B_r": 64, "B_c": 128}
O_WRITES_CASES = [(1000, 64, 128), (1024, 128, 64), (100, 32, 16), (7, 64, 128)]
#: Exercise 4.3's variants (flashlib.book.exercises.variants): the sizes asked first.
O_WRITES_VARIANTS = variants.declare(
    "4.3", [O_WRITES_PROBLEM] + [{"N": N, "B_r": r, "B_c": c}
                                 for N in (600, 900, 1200, 1800, 2200, 2600, 3000)
                                 for r, c in ((32, 64), (64, 128), (64, 256), (128, 64))],
    lambda p: f"o_writes(N, B_r, B_c, order) first at N = {p['N']}, B_r = {p['B_r']}, "
              f"B_c = {p['B_c']}")


def _o_writes_hint(got: float, N: int, B_r: int, B_c: int, order: str) -> str:
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    floor_r, floor_c = N // B_r, N // B_c
    if order == "v1":
        hints = {T_r: "that is one write per query block, FlashAttention-2's count: "
                      "Algorithm 1 writes O_i back after every tile",
                 T_c: "O_i is written back for every query block i inside the loop over j: "
                      "T_r x T_c",
                 T_r * T_c + 1: "the initialisation writes O whole, not a block: count only "
                                "the writes of O_i",
                 floor_r * floor_c: "there are ceil(N / B) blocks: the last is shorter but "
                                    "still written"}
    else:
        hints = {T_r * T_c: "that is Algorithm 1's count: FlashAttention-2 keeps O_i on chip "
                            "and writes it once, after its inner loop",
                 T_c: "FlashAttention-2's outer loop runs over the T_r query blocks",
                 floor_r: "there are ceil(N / B_r) query blocks: the last is shorter but "
                          "still written"}
    return hints.get(got, f"count the writes of O_i: T_r = ceil(N / B_r) = {T_r}, "
                          f"T_c = ceil(N / B_c) = {T_c}")


@checker("writes of O",
         forbid=names(ATTENTION, "flashlib.studies.tiling.count_io",
                      "flashlib.studies.tiling.run_counted",
                      "flashlib.studies.tiling.schedule_counts",
                      "flashlib.studies.io_model.io_count",
                      "flashlib.studies.io_model.block_counts"))
def check_o_writes(fb: Feedback, fn: Callable[[int, int, int, str], Any]) -> None:
    """Check ``o_writes(N, B_r, B_c, order)``: the block writes of O (``O[i : i + B_r] =
    ...``; not the initialisation) of Algorithm 1 ("v1") and FlashAttention-2 ("v2") for
    self-attention over N rows, first at the student's variant of :data:`O_WRITES_PROBLEM`
    (:data:`O_WRITES_VARIANTS`)."""
    p = variants.variant("4.3")
    for N, B_r, B_c in [(p["N"], p["B_r"], p["B_c"]), *O_WRITES_CASES]:
        for order in ("v1", "v2"):
            name = f"{order}, N = {N}, B_r = {B_r}, B_c = {B_c}"
            with fb.case(name):
                got, _ = call_learner(fn, N, B_r, B_c, order)
                if not _is_number(got):
                    raise LearnerError(f"return a number, got {got!r}")
                want = block_counts(order, N, N, B_r, B_c)["stores"]["O"]
                if got == want:
                    fb.ok(f"{name}: {want} block writes of O")
                    continue
                fb.fail(f"{name}: {got:g} is not right: "
                        f"{_o_writes_hint(float(got), N, B_r, B_c, order)}")
                return


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


# --- the largest square block whose step fits in SRAM --------------------------------------

#: (M, d) of :func:`check_square_block`: no exact fit, a tiny d, a head dimension of 128, an
#: M that holds one row block only (B = 1), and one that holds none (0).
SQUARE_CASES = [(1000, 8), (20_000, 16), (50_000, 64), (100_000, 128), (5000, 3),
                (36, 8), (30, 8), (2**16, 32)]


def step_elements(B: int, d: int) -> int:
    """Elements one step of FlashAttention-2 holds with B_r = B_c = B and d_v = d: Q_i, K_j,
    V_j, O_i (B x d each), l_i, m_i (B each) and the score tile S_ij (B x B); the total of
    :func:`flashlib.studies.io_model.sram_footprint` (tested equal)."""
    return B * B + (4 * d + 2) * B


def _largest(M: int, size: Callable[[int], int]) -> int:
    """The largest B >= 0 with size(B) <= M (size grows with B)."""
    B = 0
    while size(B + 1) <= M:
        B += 1
    return B


def largest_square_block(M: int, d: int) -> int:
    """The answer of :func:`check_square_block`: the largest B whose step fits in M."""
    return _largest(M, lambda b: step_elements(b, d))


def _square_mistakes(M: int, d: int) -> list[tuple[int, str]]:
    """(the answer a usual mistake gives at (M, d), its diagnosis)."""
    a = 4 * d + 2  # the step holds B^2 + a B elements
    return [
        (_largest(M, lambda b: 4 * b * d + 2 * b), "you left out the score tile S_ij "
         "(B x B): it is in SRAM too, and it is what makes the footprint quadratic in B"),
        (_largest(M, lambda b: 4 * b * d + b * b), "you left out l_i and m_i (B elements "
         "each)"),
        (_largest(M, lambda b: 3 * b * d + 2 * b + b * b), "you left out one B x d block: "
         "Q_i, K_j, V_j and O_i all stay in SRAM (FlashAttention-2 keeps O_i on chip)"),
        (-(-M // (4 * d)), "that is Algorithm 1's B_c = ceil(M / 4d), whose step holds about "
         "5M / 4: find the largest B whose step fits in M"),
        (math.ceil((math.sqrt(a * a + 4 * M) - a) / 2), "the root of B^2 + (4d + 2) B = M "
         "rounded up does not fit: round it down"),
        (round((math.sqrt(a * a + 4 * M) - a) / 2), "the root of B^2 + (4d + 2) B = M "
         "rounded to the nearest integer may not fit: round it down"),
    ]


def _square_hint(got: Any, M: int, d: int, want: int) -> str:
    """Words for a wrong answer at one (M, d), when no usual mistake explains every case."""
    if not _is_number(got) or not float(got).is_integer():
        return "give a whole number of rows (an int)"
    B = int(got)
    if B < 0:
        return "when not even B = 1 fits, return 0"
    if B > want:
        return (f"B = {B} does not fit: its step holds {step_elements(B, d):,} elements "
                f"> M; round down")
    return (f"B = {B} + 1 fits too ({step_elements(B + 1, d):,} <= M elements): give the "
            "largest")


@checker("the largest square block",
         forbid=names("flashlib.studies.io_model.sram_footprint",
                      "flashlib.studies.io_model.block_sizes",
                      "flashlib.studies.io_model.paper_block_sizes"))
def check_square_block(fb: Feedback, fn: Callable[[int, int], Any]) -> None:
    """Check ``square_block(M, d) -> B``: the largest B such that one step of FlashAttention-2
    with B_r = B_c = B and d_v = d, B^2 + (4d + 2) B elements, fits in M; 0 when none does."""
    answers = []
    for M, d in SQUARE_CASES:
        with fb.case(f"M = {M:,}, d = {d}") as case:
            got, warns = call_learner(fn, M, d)
            answers.append((M, d, got, warns))
        if case.failed:
            return
    wrong = [(M, d, got) for M, d, got, _ in answers if not (
        isinstance(got, int | np.integer) and not isinstance(got, bool)
        and got == largest_square_block(M, d))]
    if not wrong:
        first = next(((M, d, w[0]) for M, d, _, w in answers if w), None)
        if first:
            fb.fail(f"M = {first[0]:,}, d = {first[1]}: right answer, but {warned(first[2])}")
        else:
            fb.ok(f"the largest B for all {len(SQUARE_CASES)} (M, d), including M too small "
                  "for B = 1")
        return
    M, d, got = wrong[0]
    want = largest_square_block(M, d)
    name = f"M = {M:,}, d = {d}"
    if _is_number(got) and float(got) == want:
        fb.fail(f"{name}: right value, but give a whole number of rows (an int), got {got!r}")
        return
    # a usual mistake that gives the learner's answer on every case (not only this one)
    for k, (_, hint) in enumerate(_square_mistakes(M, d)):
        if all(_is_number(g) and g == _square_mistakes(M_, d_)[k][0]
               for M_, d_, g, _ in answers):
            fb.fail(f"{name}: got {got!r}: {hint}")
            return
    fb.fail(f"{name}: got {got!r}: {_square_hint(got, M, d, want)}")


#: The sizes offered for "at most how many entries has the score tile, with B_r capped at
#: cap x d?" (:func:`check_cap_reason`), as fractions of M, and how each is written.
_CAP_SIZES = ((0.125, "M / 8"), (0.25, "M / 4"), (0.5, "M / 2"), (1.0, "M"), (2.0, "2M"))
_LETTERS = "abcde"


def _cap_choices(cap: float, shift: int) -> dict[str, str]:
    return {_LETTERS[i]: _CAP_SIZES[(i + shift) % len(_CAP_SIZES)][1]
            for i in range(len(_CAP_SIZES))}


def _cap_text(cap: float) -> str:
    return "d / 2" if cap == 0.5 else f"{cap:g}d"


#: Exercise 4.5's variants: the cap (B_r <= cap x d) and the order of the letters.  Variant 0
#: (the book's) caps B_r at 2d, its letters in :data:`CAP_CHOICES`'s order.
CAP_VARIANTS = variants.declare(
    "4.5", [{"cap": cap, "choices": _cap_choices(cap, shift)}
            for cap in (2, 4, 0.5, 8) for shift in range(len(_CAP_SIZES))],
    lambda p: f"B_r capped at {_cap_text(p['cap'])}; the letters: " + ", ".join(
        f"({k}) {v}" for k, v in p["choices"].items()))
#: The answers offered in the book's variant (variant 0) of Exercise 4.5.
CAP_CHOICES = dict(CAP_VARIANTS.choices[0]["choices"])


@checker("the score tile under another cap")
def check_cap_reason(fb: Feedback, answer: Any) -> None:
    """Check the letter for "with B_c = ceil(M / 4d) and B_r capped at cap x d, at most how
    many entries has S_ij?" (cap and letters: the student's variant, :data:`CAP_VARIANTS`;
    the book's: :data:`CAP_CHOICES`, cap 2): a letter, or a function returning one."""
    p = variants.variant("4.5")
    cap, choices = p["cap"], p["choices"]
    if callable(answer):
        answer = call_learner(answer)[0]
    if answer is None:
        fb.fail("not attempted yet: answer with one of the letters " + ", ".join(choices))
        return
    key = str(answer).strip().lower().strip("()")
    if key not in choices:
        fb.fail(f"answer with one of the letters {', '.join(choices)}, got {answer!r}")
        return
    got = dict((text, size) for size, text in _CAP_SIZES)[choices[key]]
    right = f"S_ij is B_r x B_c <= {_cap_text(cap)} x M / 4d = {cap / 4:g} M entries"
    if got == cap / 4:
        fb.ok(f"right: {right}; the step then holds about {1 + cap / 4:g} M, still a "
              "constant times M")
    elif got == 0.25:
        fb.fail(f"({key}) {choices[key]} is the tile with B_r capped at d, the page's case: "
                f"here B_r goes up to {_cap_text(cap)}, so {right}")
    else:
        fb.fail(f"({key}) {choices[key]}: multiply the two bounds: {right}")
