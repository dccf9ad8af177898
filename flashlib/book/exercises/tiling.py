"""Checkers for the exercises of the tiling chapter (book/tiling.md).

check_flash2_forward   ``flash2_forward(Q, K, V, B_r, B_c) -> O`` or ``(O, L)``: equal to standard
                       attention on ragged shapes, and no (n, n) array allocated
check_tile_schedule    ``tile_schedule(n_q, n_k, B_r, B_c, order) -> [(i, j), ...]``: the tiles
                       in the order each loop order computes them, against the event log
check_o_writes         ``o_writes(N, B_r, B_c, order)``: the block writes of O each order makes
check_block_sizes      ``block_sizes(M, d) -> (B_r, B_c)``: Algorithm 1's rule
check_cap_reason       why B_r is capped by d (a letter of :data:`CAP_CHOICES`, or a function
                       returning it)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.algorithms import standard_attention
from flashlib.book.exercises import Feedback, LearnerError, call_learner, checker
from flashlib.core.measure import measure_peak
from flashlib.studies.io_model import block_counts, paper_block_sizes
from flashlib.studies.tiling import logged_tiles

__all__ = [
    "FORWARD_CASES",
    "O_WRITES_PROBLEM",
    "CAP_CHOICES",
    "check_flash2_forward",
    "check_tile_schedule",
    "check_o_writes",
    "check_block_sizes",
    "check_cap_reason",
]

#: (n_q, n_k, d, B_r, B_c, logit scale) of :func:`check_flash2_forward`: ragged last blocks,
#: one row, blocks larger than n, 1 x 1 blocks, n_q != n_k, scores large enough that a
#: missing rescale shows.
FORWARD_CASES = [
    ("ragged last blocks (100 x 70, B_r = 32, B_c = 16)", (100, 70, 16, 32, 16, 1.0)),
    ("one query row (1 x 37, B_r = B_c = 8)", (1, 37, 8, 8, 8, 1.0)),
    ("blocks larger than n (7 x 9, 64 x 128)", (7, 9, 8, 64, 128, 1.0)),
    ("1 x 1 blocks (9 x 11)", (9, 11, 4, 1, 1, 1.0)),
    ("large scores (60 x 50, B_r = 16, B_c = 8)", (60, 50, 8, 16, 8, 8.0)),
]
#: The memory probe: no array of n_q x n_k elements (or a quarter of it) may be allocated.
PROBE = (1024, 1024, 16, 64, 64)


def _problem(n_q: int, n_k: int, d: int, logit: float = 1.0, seed: int = 0
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((n_q, d)) * logit
    return Q, rng.standard_normal((n_k, d)), rng.standard_normal((n_k, d))


def _variant(Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int, B_c: int, *,
             rescale_O: bool = True, rescale_l: bool = True, divide: bool = True,
             scale: bool = True, ragged: bool = True) -> np.ndarray:
    """FlashAttention-2's forward with one of the usual mistakes switched on (for the hints)."""
    N_q, N_k = Q.shape[0], K.shape[0]
    tau = 1 / math.sqrt(Q.shape[1]) if scale else 1.0
    stop_q = N_q if ragged else N_q - N_q % B_r
    stop_k = N_k if ragged else N_k - N_k % B_c
    O = np.zeros((N_q, V.shape[1]))
    for i in range(0, stop_q, B_r):
        Q_i = Q[i : i + B_r]
        O_i, l_i, m_i = np.zeros((len(Q_i), V.shape[1])), np.zeros(len(Q_i)), None
        for j in range(0, stop_k, B_c):
            S = tau * (Q_i @ K[j : j + B_c].T)
            m_new = S.max(axis=1) if m_i is None else np.maximum(m_i, S.max(axis=1))
            P = np.exp(S - m_new[:, None])
            alpha = np.zeros(len(Q_i)) if m_i is None else np.exp(m_i - m_new)
            l_i = (alpha if rescale_l else 1) * l_i + P.sum(axis=1)
            O_i = (alpha[:, None] if rescale_O else 1) * O_i + P @ V[j : j + B_c]
            m_i = m_new
        O[i : i + B_r] = O_i / l_i[:, None] if divide and stop_k else O_i
    return O


_HINTS = [
    (dict(rescale_O=False), "O_i is not rescaled when the running maximum grows: "
     "O_i = diag(exp(m_i - m_new)) O_i + P~_ij V_j"),
    (dict(rescale_l=False), "l_i is not rescaled when the running maximum grows: "
     "l_i = exp(m_i - m_new) l_i + rowsum(P~_ij)"),
    (dict(rescale_O=False, rescale_l=False), "neither O_i nor l_i is rescaled when the "
     "running maximum grows: multiply both by exp(m_i - m_new)"),
    (dict(divide=False), "O_i is never divided by l_i: divide once, after the inner loop"),
    (dict(scale=False), "the scores are not scaled: S_ij = Q_i K_j^T / sqrt(d)"),
    (dict(ragged=False), "the last, shorter block is skipped: loop with range(0, N, B) "
     "(ceil(N / B) blocks), not N // B blocks"),
]


def _as_output(result: Any, n_q: int, d_v: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The learner's O (and L when returned) as float64 arrays, or a LearnerError."""
    L = None
    if isinstance(result, tuple) and len(result) == 2:
        result, L = result
    try:
        O = np.asarray(result, dtype=np.float64)
        L = None if L is None else np.asarray(L, dtype=np.float64)
    except (TypeError, ValueError):
        raise LearnerError(f"return O (an array) or (O, L), got {type(result).__name__}") \
            from None
    if O.shape != (n_q, d_v):
        raise LearnerError(f"O has shape {O.shape}, expected (N_q, d_v) = {(n_q, d_v)}")
    if L is not None and L.shape != (n_q,):
        raise LearnerError(f"L has shape {L.shape}, expected (N_q,) = {(n_q,)}")
    return O, L


@checker("FlashAttention-2 forward")
def check_flash2_forward(fb: Feedback, fn: Callable[..., Any]) -> None:
    """Check ``flash2_forward(Q, K, V, B_r, B_c) -> O`` (or ``(O, L)``) against standard
    attention on ragged shapes, then that it never allocates an (N_q, N_k) array."""
    for name, (n_q, n_k, d, B_r, B_c, logit) in FORWARD_CASES:
        Q, K, V = _problem(n_q, n_k, d, logit)
        with fb.case(name):
            got, warns = call_learner(fn, Q.copy(), K.copy(), V.copy(), B_r, B_c)
            O, L = _as_output(got, n_q, d)
            want = standard_attention(Q, K, V)
            if np.isnan(O).any():
                fb.fail(f"{name}: O contains NaN: start with m_i = -inf, l_i = 0 and compute "
                        "exp(m_i - m_new), which is 0 at the first block")
            elif np.max(np.abs(O - want)) > 1e-9:
                hint = next((h for kw, h in _HINTS
                             if np.max(np.abs(O - _variant(Q, K, V, B_r, B_c, **kw))) <= 1e-9),
                            "compare with the algorithm box line by line")
                fb.fail(f"{name}: O differs from standard attention by "
                        f"{np.max(np.abs(O - want)):.3g}: {hint}")
            elif L is not None and np.max(np.abs(L - _logsumexp(Q, K))) > 1e-9:
                fb.fail(f"{name}: O is right but L is not the logsumexp of the scaled scores: "
                        "L_i = m_i + log(l_i), after the inner loop")
            elif warns:
                fb.fail(f"{name}: right answer, but numpy warned '{warns[0]}'")
            else:
                fb.ok(f"{name}: equals standard attention")
    if fb.problems:
        return
    n_q, n_k, d, B_r, B_c = PROBE
    Q, K, V = _problem(n_q, n_k, d, seed=1)
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


def _logsumexp(Q: np.ndarray, K: np.ndarray) -> np.ndarray:
    S = Q @ K.T / math.sqrt(Q.shape[1])
    m = S.max(axis=1)
    return m + np.log(np.exp(S - m[:, None]).sum(axis=1))


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


@checker("tile schedule")
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

#: The sizes of the question :func:`check_o_writes` asks first (then a few more, so that the
#: formula is checked, not one number).
O_WRITES_PROBLEM = {"N": 1000, "B_r": 64, "B_c": 128}
O_WRITES_CASES = [(1000, 64, 128), (1024, 128, 64), (100, 32, 16), (7, 64, 128)]


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


@checker("writes of O")
def check_o_writes(fb: Feedback, fn: Callable[[int, int, int, str], Any]) -> None:
    """Check ``o_writes(N, B_r, B_c, order)``: the block writes of O (``O[i : i + B_r] =
    ...``; not the initialisation) of Algorithm 1 ("v1") and FlashAttention-2 ("v2") for
    self-attention over N rows, first at :data:`O_WRITES_PROBLEM`."""
    for N, B_r, B_c in O_WRITES_CASES:
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


# --- block sizes from M ---------------------------------------------------------------------

#: (M, d) of :func:`check_block_sizes`: M / 4d not an integer first, so that a missing
#: ceiling shows at once.
BLOCK_CASES = [(1000, 64), (98304, 64), (98304, 128), (100, 64), (12345, 16), (64, 64),
               (5000, 3), (10**6, 128)]


@checker("block sizes from M")
def check_block_sizes(fb: Feedback, fn: Callable[[int, int], Any]) -> None:
    """Check ``block_sizes(M, d) -> (B_r, B_c)``: B_c = ceil(M / 4d), B_r = min(B_c, d)."""
    for M, d in BLOCK_CASES:
        name = f"M = {M}, d = {d}"
        with fb.case(name):
            got, _ = call_learner(fn, M, d)
            try:
                B_r, B_c = got
            except (TypeError, ValueError):
                raise LearnerError(f"return a pair (B_r, B_c), got {got!r}") from None
            want = paper_block_sizes(M, d)
            if (B_r, B_c) == want and all(isinstance(x, (int, np.integer)) for x in got):
                continue
            c = M / (4 * d)
            if (B_r, B_c) == want:
                hint = "right values, but give integers (a block has a whole number of rows)"
            elif (B_c, B_r) == want:
                hint = "the pair is swapped: return (B_r, B_c)"
            elif B_c == M // (4 * d) and B_c != math.ceil(c):
                hint = "B_c = ceil(M / 4d), rounded up, not down"
            elif B_c == math.ceil(c) and B_r == B_c:
                hint = "B_r is capped: B_r = min(B_c, d)"
            elif B_c == math.ceil(c) and B_r == d:
                hint = "B_r = min(B_c, d): when B_c < d, B_r = B_c"
            elif np.isclose(B_c, c):
                hint = "round M / 4d up to an integer: B_c = ceil(M / 4d)"
            else:
                hint = f"expected (B_r, B_c) = {want}"
            fb.fail(f"{name}: got ({B_r}, {B_c}): {hint}")
            return
    fb.ok(f"(B_r, B_c) right for all {len(BLOCK_CASES)} (M, d)")


#: The answers offered for "why is B_r capped by d?" (:func:`check_cap_reason`).
CAP_CHOICES = {
    "a": "it keeps the score tile S_ij (B_r x B_c) within about M / 4, as each of K_j, V_j, "
         "Q_i, O_i is",
    "b": "it reduces Algorithm 1's HBM traffic",
    "c": "the hardware needs B_r to divide d",
    "d": "it keeps O_i smaller than K_j",
}

_CAP_FEEDBACK = {
    "a": "right: B_c = M / 4d rows make K_j, V_j, Q_i, O_i about M / 4 each; with B_r <= d "
         "the tile S_ij has at most d x M / 4d = M / 4 entries, so a step fits in about "
         "5M / 4 (Theorem 2's Theta absorbs the constant)",
    "b": "Algorithm 1's traffic does not depend on B_r: Q, O, l, m are each read T_c times "
         "whatever B_r is; that is why capping B_r costs nothing",
    "c": "nothing requires B_r to divide d (the book's tests use B_r = 7 with d = 4); the cap "
         "bounds the B_r x B_c tile",
    "d": "O_i is B_r x d and K_j is B_c x d, but the cap is about the B_r x B_c score tile",
}


@checker("why B_r is capped by d")
def check_cap_reason(fb: Feedback, answer: Any) -> None:
    """Check the choice among :data:`CAP_CHOICES`: a letter, or a function returning one."""
    if callable(answer):
        answer = call_learner(answer)[0]
    if answer is None:
        fb.fail("not attempted yet: answer with one of the letters " + ", ".join(CAP_CHOICES))
        return
    key = str(answer).strip().lower().strip("()")
    if key not in CAP_CHOICES:
        fb.fail(f"answer with one of the letters {', '.join(CAP_CHOICES)}, got {answer!r}")
    elif key == "a":
        fb.ok(_CAP_FEEDBACK["a"])
    else:
        fb.fail(f"({key}) {_CAP_FEEDBACK[key]}")
