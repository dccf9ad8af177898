"""Checkers for the exercises of the masking chapter (book/masking.md).

check_tile_class       ``tile_class(i0, i1, j0, j1, lo, hi, start, stop) -> "empty" | "partial"
                       | "full"``: a tile's class from the band and the real keys start <= j <
                       stop (padding on both sides), checked as a property against the dense
                       mask over random tiles
check_blind_rows       ``blind_rows(n_q, n_k, d_v) -> (rows, O_rows, lse_rows)``: the rows that
                       see no key under the bottom-right causal mask, and their output
check_guarded_forward  ``guarded_forward(Q, K, V, mask, B_r, B_c) -> (O, L)``: the careless
                       kernel :func:`careless_forward` fixed, fed all-masked tiles and a row
                       blind in one tile whose scores in the next lie far below 0 (which
                       catches the guard stored into m)
check_window_size      ``window_size_for(W) -> (left, right)``: flash-attn's ``window_size`` for
                       "W tokens including the current one"
check_tile_keep        ``tile_keep(seed, offset, head, i0, i1, j0, j1, p) -> (i1 - i0, j1 - j0)
                       bool``: a tile's dropout keep-mask from Philox4x32-10, equal to
                       :func:`flashlib.core.philox.dropout_keep` on the tile's positions
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import (
    ATTENTION,
    Feedback,
    LearnerError,
    call_learner,
    checker,
    names,
    shape_problem,
    variants,
    warned,
)
from flashlib.core.masks import (
    band_tile_class,
    causal_bottom_right,
    dense_mask,
    key_padding,
    padded,
    sliding_window,
)
from flashlib.core.philox import dropout_keep
from flashlib.fast.naive import naive_attention
from flashlib.studies.masking import blind_row_problem

__all__ = [
    "TILE_CASES",
    "careless_forward",
    "check_tile_class",
    "check_blind_rows",
    "check_guarded_forward",
    "check_window_size",
    "check_tile_keep",
]

CLASSES = ("empty", "partial", "full")


def _tile_cases(count: int = 60, seed: int = 0) -> list[tuple[int, ...]]:
    """(n_q, n_k, B_r, B_c, lo, hi, start, stop) drawn at random; lo, hi may be None (no
    bound); the real keys are start <= j < stop (padding on the left, on the right, or both)."""
    rng = np.random.default_rng(seed)
    # the edges first: one entry, blocks larger than the problem, no real key, a band that
    # hides everything (lo > hi); then random problems (every tile of each is a call of the
    # student's function: 60 problems are about 2,500 calls)
    cases: list[tuple[int, ...]] = [(1, 1, 1, 1, None, None, 0, 1),
                                    (5, 3, 8, 8, 0, None, 0, 3),
                                    (6, 7, 4, 3, None, None, 2, 2),
                                    (9, 9, 3, 3, 2, 1, 0, 9)]
    for _ in range(count):
        n_q, n_k = (int(x) for x in rng.integers(1, 40, size=2))
        lo = None if rng.random() < 0.3 else int(rng.integers(-15, 6))
        hi = None if rng.random() < 0.3 else int(rng.integers(-5, 15))
        stop = int(rng.integers(0, n_k + 1)) if rng.random() < 0.5 else n_k
        start = int(rng.integers(0, stop + 1)) if rng.random() < 0.5 else 0
        cases.append((n_q, n_k, int(rng.integers(1, 12)), int(rng.integers(1, 12)), lo, hi,
                      start, stop))
    return cases


#: The random problems of :func:`check_tile_class` (fixed seed): every tile of each.
TILE_CASES = _tile_cases()


def _dense_band(n_q: int, n_k: int, lo: int | None, hi: int | None, start: int,
                stop: int) -> np.ndarray:
    rel = np.arange(n_k)[None, :] - np.arange(n_q)[:, None]  # j - i
    keys = np.arange(n_k)[None, :]
    seen = (keys >= start) & (keys < stop)
    if lo is not None:
        seen = seen & (rel >= lo)
    if hi is not None:
        seen = seen & (rel <= hi)
    return np.broadcast_to(seen, (n_q, n_k))


def _band_with_start(i0: int, i1: int, j0: int, j1: int, lo: int | None, hi: int | None,
                     start: int, stop: int | None) -> str:
    """The class of a tile of the band with real keys start <= j < stop (stop None: no end),
    from :func:`band_tile_class` on the keys from max(j0, start): full only if no key of the
    tile is left padding."""
    first = max(j0, start)
    if first >= j1:
        return "empty"
    got = band_tile_class(i0, i1, first, j1, lo, hi, stop)
    return "partial" if got == "full" and first > j0 else got


def _wrong_tile_class(kind: str, i0: int, i1: int, j0: int, j1: int, lo: int | None,
                      hi: int | None, start: int, stop: int) -> str:
    """The usual mistakes, to recognise them."""
    if kind == "no left padding":
        return band_tile_class(i0, i1, j0, j1, lo, hi, stop)
    if kind == "no padding":
        return band_tile_class(i0, i1, j0, j1, lo, hi, None)
    if kind == "start excluded":  # start taken as the last padding key
        return _band_with_start(i0, i1, j0, j1, lo, hi, start + 1, stop)
    if kind == "full despite left padding":
        first = max(j0, start)
        return "empty" if first >= j1 else band_tile_class(i0, i1, first, j1, lo, hi, stop)
    if kind == "exclusive ends":  # i1 and j1 taken as the last row and key (off by one)
        return _band_with_start(i0, i1 + 1, j0, j1 + 1, lo, hi, start, stop)
    got = _band_with_start(i0, i1, j0, j1, lo, hi, start, stop)
    if kind == "never empty":
        return "partial" if got == "empty" else got
    if kind == "never full":
        return "partial" if got == "full" else got
    raise ValueError(kind)


_TILE_HINTS = {
    "no left padding": "the left padding is ignored: keys j < start are hidden too, so a tile "
    "that reaches below start is never full, and one that ends at or below it is empty",
    "no padding": "the padding is ignored: only keys start <= j < stop are real, so a tile "
    "that reaches outside them is never full, and one wholly outside them is empty",
    "start excluded": "off by one at start: key start is the first real key (start <= j), "
    "not the last padding one",
    "full despite left padding": "a tile whose first keys are left padding (j0 < start) is "
    "partial, never full: those keys are hidden from every row",
    "exclusive ends": "off by one: i1 and j1 are one past the tile's last row and key (the "
    "last ones are i1 - 1 and j1 - 1)",
    "never empty": "you never answer empty: a tile whose every entry is hidden is skipped",
    "never full": "you never answer full: a tile whose every entry is visible needs no mask",
}


@checker("tile class",
         forbid=names("flashlib.core.masks.band_tile_class", "flashlib.core.masks.tile_class",
                      "flashlib.core.masks.classify_tiles"))
def check_tile_class(fb: Feedback, fn: Callable[..., Any]) -> None:
    """Check ``tile_class(i0, i1, j0, j1, lo, hi, start, stop)`` on every tile of
    :data:`TILE_CASES` against the dense mask (row i sees key j when i + lo <= j <= i + hi and
    start <= j < stop; lo or hi None: no bound)."""
    wrong: list[tuple[tuple, str, str]] = []
    checked = 0
    for n_q, n_k, B_r, B_c, lo, hi, start, stop in TILE_CASES:
        dense = _dense_band(n_q, n_k, lo, hi, start, stop)
        for i0 in range(0, n_q, B_r):
            for j0 in range(0, n_k, B_c):
                i1, j1 = min(i0 + B_r, n_q), min(j0 + B_c, n_k)
                tile = dense[i0:i1, j0:j1]
                want = "empty" if not tile.any() else "full" if tile.all() else "partial"
                args = (i0, i1, j0, j1, lo, hi, start, stop)
                got, _ = call_learner(fn, *args)
                checked += 1
                if got not in CLASSES:
                    raise LearnerError(f"tile_class{args} returned {got!r}: return one of the "
                                       "strings 'empty', 'partial', 'full'")
                if got != want:
                    wrong.append((args, got, want))
    if not wrong:
        fb.ok(f"all {checked} tiles of {len(TILE_CASES)} random problems (windows, causal "
              "diagonals, padding on either side, ragged tiles) classified as the dense mask "
              "says")
        return
    args, got, want = wrong[0]
    hint = next((h for kind, h in _TILE_HINTS.items()
                 if all(_wrong_tile_class(kind, *a) == g for a, g, _ in wrong)), "")
    fb.fail(f"{len(wrong)} of {checked} tiles wrong; the first: tile_class{args} returned "
            f"{got!r}, the dense mask says {want!r}" + (f": {hint}" if hint else ""))


# --- the rows that see no key ----------------------------------------------------------------

#: (n_q, n_k, d_v) of :func:`check_blind_rows`: more queries than keys, equal, fewer.
BLIND_CASES = [(5, 2, 3), (9, 4, 2), (7, 1, 4), (4, 4, 2), (3, 8, 2), (1, 1, 1)]


@checker("rows that see no key",
         forbid=names(ATTENTION))
def check_blind_rows(fb: Feedback, fn: Callable[[int, int, int], Any]) -> None:
    """Check ``blind_rows(n_q, n_k, d_v) -> (rows, O_rows, lse_rows)`` under the bottom-right
    causal mask: the row indices with no visible key, their outputs (len(rows), d_v) and their
    logsumexps (len(rows),), as FlashAttention returns them."""
    for n_q, n_k, d_v in BLIND_CASES:
        label = f"n_q = {n_q}, n_k = {n_k}"
        with fb.case(label):
            got, warns = call_learner(fn, n_q, n_k, d_v)
            if not (isinstance(got, tuple) and len(got) == 3):
                fb.fail(f"{label}: return a tuple (rows, O_rows, lse_rows)")
                continue
            rows = np.asarray(got[0]).ravel()
            want = np.flatnonzero(~dense_mask(causal_bottom_right, n_q, n_k).any(axis=1))
            if rows.tolist() != want.tolist():
                extra = len(rows) - len(want)
                if len(want) and not len(rows):
                    hint = ("that is the top-left alignment (SDPA's is_causal), where row 0 "
                            "always sees key 0; bottom-right row i sees j <= i + n_k - n_q")
                elif len(want) and rows.tolist() == list(range(n_q - len(rows), n_q)):
                    hint = ("those are the last rows: bottom-right aligns the last query with "
                            "the last key, so it is the first rows that see nothing")
                elif extra in (-1, 1) and len(want) + len(rows) > 1:
                    hint = ("off by one: row i sees key 0 once i + n_k - n_q >= 0, so rows "
                            "0 .. n_q - n_k - 1 see nothing")
                else:
                    hint = "row i sees key j when j <= i + n_k - n_q"
                fb.fail(f"{label}: rows {rows.tolist()}, expected {want.tolist()}: {hint}")
                continue
            O_rows = np.asarray(got[1], dtype=np.float64)
            lse_rows = np.asarray(got[2], dtype=np.float64)
            problem = (shape_problem(O_rows, (len(want), d_v), "O_rows")
                       or shape_problem(lse_rows, (len(want),), "lse_rows"))
            if problem:
                fb.fail(f"{label}: {problem}")
            elif np.isnan(O_rows).any() or np.isnan(lse_rows).any():
                fb.fail(f"{label}: NaN is what a plain softmax gives (0 / 0); flash kernels "
                        "return O = 0 and lse = -inf for such rows")
            elif (O_rows != 0).any():
                fb.fail(f"{label}: O on a row that sees no key is 0 (an empty sum of values)")
            elif not np.isneginf(lse_rows).all():
                fb.fail(f"{label}: lse is the log of an empty sum of exponentials: log(0) = "
                        "-inf, as flashlib returns it (a backward pass then gives the row "
                        "P = 0 itself: exp(S - lse) would be exp(-inf + inf) = NaN)")
            elif warns:
                fb.fail(f"{label}: right answer, but {warned(warns[0])}")
            else:
                fb.ok(f"{label}: rows {want.tolist()}, O = 0 and lse = -inf there (flash-attn "
                      "stores +inf instead, so that its backward's exp(S - lse) is 0)")


# --- find the NaN ----------------------------------------------------------------------------


def careless_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray, B_r: int,
                     B_c: int) -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2's forward with a boolean mask (N_q, N_k), one head, every tile
    computed: NaN as soon as a row meets a tile where it sees no key before any where it
    does."""
    N_q, N_k, scale = Q.shape[0], K.shape[0], 1 / math.sqrt(Q.shape[1])
    O, L = np.zeros((N_q, V.shape[1])), np.zeros(N_q)
    for i0 in range(0, N_q, B_r):
        i1 = min(i0 + B_r, N_q)
        O_i, l_i = np.zeros((i1 - i0, V.shape[1])), np.zeros(i1 - i0)
        m_i = np.full(i1 - i0, -np.inf)
        for j0 in range(0, N_k, B_c):
            j1 = min(j0 + B_c, N_k)
            S_ij = scale * (Q[i0:i1] @ K[j0:j1].T)
            S_ij = np.where(mask[i0:i1, j0:j1], S_ij, -np.inf)
            m_new = np.maximum(m_i, S_ij.max(axis=1))
            P_ij = np.exp(S_ij - m_new[:, None])
            alpha = np.exp(m_i - m_new)
            l_i = alpha * l_i + P_ij.sum(axis=1)
            O_i = alpha[:, None] * O_i + P_ij @ V[j0:j1]
            m_i = m_new
        O[i0:i1] = O_i / l_i[:, None]
        L[i0:i1] = m_i + np.log(l_i)
    return O, L


def _nan_cases() -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int,
                               int]]:
    """(label, Q, K, V, mask, B_r, B_c): all-masked tiles of several kinds, then a row blind in
    its first key tile whose visible scores, in the next, lie near -800."""
    rng = np.random.default_rng(0)
    masks = [
        ("a sliding window of 4 keys (12 x 12, B_r = B_c = 4): later rows' first tile is "
         "all masked", 4, 4, dense_mask(sliding_window(3, 0), 12, 12)),
        ("bottom-right causal, 9 queries, 4 keys: the first rows see no key", 4, 2,
         dense_mask(causal_bottom_right, 9, 4)),
        ("padding: sequence of 5 real keys in 10, the last tile all masked", 3, 5,
         dense_mask(key_padding(5), 6, 10)),
        ("left padding: the first 5 keys hidden", 3, 4,
         dense_mask(lambda i, j, n_q, n_k: j >= 5, 6, 10)),
        ("no mask at all (6 x 7)", 4, 3, np.ones((6, 7), dtype=bool)),
        ("a window and padding together", 4, 4,
         dense_mask(padded(sliding_window(2, 1), 7), 10, 10)),
    ]
    cases = []
    for label, B_r, B_c, mask in masks:
        n_q, n_k = mask.shape
        Q, K, V = (rng.standard_normal((n, 5)) for n in (n_q, n_k, n_k))
        cases.append((label, Q, K, V, mask, B_r, B_c))
    # Issue 23's case: row 1 sees only keys 5-8, in the second key tile, with scores near -800.
    Q, K, V = (rng.standard_normal((8, n)) for n in (4, 4, 3))
    Q[0] = 10.0  # so that row 1's score with key j is 5 * sum(K_j)
    K[4:] = FAR_SCORE / 20 + 0.05 * rng.standard_normal((4, 4))
    mask = np.ones((8, 8), dtype=bool)
    mask[0, :4] = False
    cases.append((f"8 queries, 8 keys, d = 4, blocks 4 x 4: row 1 sees only keys 5-8, with "
                  f"scores near {FAR_SCORE:g}", Q, K, V, mask, 4, 4))
    Q, K, V, mask = blind_row_problem(shift=FAR_SCORE)
    cases.append((f"window (2, 0) bottom-right, 10 queries, 8 keys, blocks 5 x 4: rows 9 and "
                  f"10 see nothing in the first key tile and, in the second, scores near "
                  f"{FAR_SCORE:g}", Q, K, V, mask, 5, 4))
    return cases


#: The scores of the last case of :func:`check_guarded_forward`: far enough below 0 that
#: exp(S - 0) underflows in float64, so that a guard stored into m_i shows.
FAR_SCORE = -800.0


@checker("find the NaN",
         forbid=names(ATTENTION))
def check_guarded_forward(fb: Feedback, fn: Callable[..., Any]) -> None:
    """Check ``guarded_forward(Q, K, V, mask, B_r, B_c) -> (O, L)`` against masked attention on
    tiles where a row sees no key (before it sees some, or at all): no NaN, no warning, O = 0
    and L = -inf on rows that see no key; and on a row blind in one tile whose scores in the
    next lie near -800, where a guard stored into m_i underflows."""
    for label, Q, K, V, mask, B_r, B_c in _nan_cases():
        n_q, d_v = len(Q), V.shape[1]
        with fb.case(label):
            got, warns = call_learner(fn, Q.copy(), K.copy(), V.copy(), mask.copy(), B_r, B_c)
            if not (isinstance(got, tuple) and len(got) == 2):
                fb.fail(f"{label}: return (O, L)")
                continue
            O, L = (np.asarray(x, dtype=np.float64) for x in got)
            problem = shape_problem(O, (n_q, d_v), "O") or shape_problem(L, (n_q,), "L")
            if problem:
                fb.fail(f"{label}: {problem}")
                continue
            want, lse = naive_attention(Q, K, V, mask=mask, return_lse=True)
            blind = ~mask.any(axis=1)
            bad = ~np.isfinite(O).all(axis=1)
            lost = ~blind & (O == 0).all(axis=1) & np.isneginf(L) & (want != 0).any(axis=1)
            if bad[~blind].any():
                fb.fail(f"{label}: NaN on rows that do see keys (rows "
                        f"{(np.flatnonzero(bad & ~blind) + 1).tolist()}, counted from 1): "
                        "their first tile was all masked, so m_new = -inf and exp(S - m_new) "
                        "= exp(-inf - (-inf)) = NaN; exponentiate against 0 while the maximum "
                        "is still -inf")
            elif bad.any():
                fb.fail(f"{label}: NaN or inf on the rows that see no key: l_i = 0 there; "
                        "give O = 0 (do not divide by 0)")
            elif lost.any():
                fb.fail(f"{label}: rows {(np.flatnonzero(lost) + 1).tolist()} (counted from 1) "
                        "see keys but came out as O = 0, L = -inf: you stored the guard's 0 in "
                        "m_i. After a tile where the row saw nothing its running maximum is "
                        "then 0, not -inf, and exp(S - 0) of scores near "
                        f"{FAR_SCORE:g} underflows to 0. Keep m_i = m_new (still -inf) and use "
                        "0 only inside the exponents")
            elif np.max(np.abs(O - want)) > 1e-9:
                fb.fail(f"{label}: O differs from masked attention by "
                        f"{np.max(np.abs(O - want)):.3g}")
            elif not np.isneginf(L[blind]).all():
                fb.fail(f"{label}: L on a row that sees no key must be -inf (log of an empty "
                        f"sum), got {L[blind][~np.isneginf(L[blind])][0]!r}")
            elif np.max(np.abs(L[~blind] - lse[~blind]), initial=0.0) > 1e-9 * max(
                    1.0, float(np.max(np.abs(lse[~blind]), initial=0.0))):
                fb.fail(f"{label}: O is right but L is not the logsumexp m_i + log(l_i)")
            elif warns:
                fb.fail(f"{label}: right answer, but {warned(warns[0])}: the guard "
                        "must avoid computing -inf - (-inf) and log(0), not hide the result")
            else:
                fb.ok(f"{label}: equals masked attention, O = 0 and L = -inf on rows that see "
                      "no key")


# --- flash-attn's window_size ----------------------------------------------------------------


#: Exercise 6.4's variants (flashlib.book.exercises.variants): the window, in words, and the
#: flash-attn ``(left, right)`` it is, as ``left = a W + b``, ``right = c W + e``.  Variant 0
#: (the book's) is a centred window of 2W - 1 tokens; 2 is the page's Transformers
#: ``sliding_window``.
WINDOW_VARIANTS = variants.declare("6.4", [
    {"window": "each token sees 2W - 1 tokens centred on itself", "left": (1, -1),
     "right": (1, -1)},
    {"window": "each token sees itself, the W tokens before it and the W tokens after it",
     "left": (1, 0), "right": (1, 0)},
    {"window": "each token sees W tokens, itself included, and none after it (Transformers' "
               "sliding_window=W)", "left": (1, -1), "right": (0, 0)},
    {"window": "each token sees itself and the W tokens before it, none after it",
     "left": (1, 0), "right": (0, 0)},
    {"window": "each token sees itself and the W - 1 tokens after it, none before it",
     "left": (0, 0), "right": (1, -1)},
    {"window": "each token sees itself and the W tokens after it, none before it",
     "left": (0, 0), "right": (1, 0)},
], lambda p: f"window_size_for(W) for the window: {p['window']}")


def _side_hint(got: int, want: int, side: str) -> str:
    where = "before" if side == "left" else "after"
    if got == -1:
        return f"{side} = -1 means no bound in flash-attn (an infinite window), not zero keys"
    if want == 0:
        return (f"{side} = {got} lets each query see {got} keys {where} it (with "
                f"causal=False the window alone must hide them): {side} = 0")
    if got == 0:
        return f"{side} = 0 hides the keys {where} the current one; this window sees {want}"
    if abs(got - want) == 1:
        return (f"{side} = {got} sees {got} keys {where} the current one, not {want}: "
                "flash-attn's bounds are inclusive and count from the diagonal key")
    return f"{side} = {got} sees {got} keys {where} the current one, not {want}"


@checker("flash-attn window_size",
         forbid=names("flashlib.core.masks.window_from"))
def check_window_size(fb: Feedback, fn: Callable[[int], Any]) -> None:
    """Check ``window_size_for(W) -> (left, right)``: flash-attn's ``window_size``, with
    causal=False, for the student's variant of the window (:data:`WINDOW_VARIANTS`; the
    book's: each token sees 2W - 1 tokens centred on itself)."""
    p = variants.variant("6.4")
    for W in (1, 4, 16, 4096):
        label = f"W = {W}"
        want = (p["left"][0] * W + p["left"][1], p["right"][0] * W + p["right"][1])
        with fb.case(label):
            got, _ = call_learner(fn, W)
            try:
                left, right = (int(x) for x in got)
            except (TypeError, ValueError):
                fb.fail(f"{label}: return a pair (left, right) of integers, got {got!r}")
                continue
            if (left, right) == want:
                fb.ok(f"{label}: window_size = {want}, {sum(want) + 1} keys per row")
                continue
            if (right, left) == want:
                hint = ("left counts the keys before the current one and right those after "
                        "it: you swapped them")
            else:
                hint = "; ".join(_side_hint(g, w, side) for g, w, side in
                                 ((left, want[0], "left"), (right, want[1], "right"))
                                 if g != w)
            fb.fail(f"{label}: window_size = ({left}, {right}): {hint}")


# --- a tile's dropout keep-mask ----------------------------------------------------------------

#: (seed, offset, head, i0, i1, j0, j1, p) of :func:`check_tile_keep`: tiles away from the
#: origin, a non-square tile, one row, a seed above 2**32 (the key's high word), an offset.
KEEP_CASES: list[tuple[int, int, int, int, int, int, int, float]] = [
    (2024, 0, 0, 0, 8, 0, 8, 0.2),
    (2024, 0, 3, 16, 24, 40, 52, 0.2),
    (7, 0, 1, 5, 6, 0, 33, 0.5),
    (2**40 + 12345, 0, 2, 32, 48, 16, 32, 0.1),
    (2024, 3, 0, 8, 16, 24, 32, 0.3),
    (99, 0, 5, 64, 96, 0, 32, 0.9),
]


def _keep_variants(seed: int, offset: int, head: int, i0: int, i1: int, j0: int, j1: int,
                   p: float) -> dict[str, np.ndarray]:
    """The usual wrong keep-masks of a tile, each with the hint that names its mistake."""
    rows, cols = np.arange(i0, i1)[:, None], np.arange(j0, j1)
    local_r, local_c = np.arange(i1 - i0)[:, None], np.arange(j1 - j0)
    low = seed & 0xFFFFFFFF
    return {
        "the counter holds the tile's own indices (0, 1, ...), so every tile draws the same "
        "bits: use the positions in the whole matrix, rows i0 .. i1 - 1 and keys j0 .. j1 - 1":
            dropout_keep(seed, head, local_r, local_c, p, offset),
        "rows and keys are swapped in the counter: it is (row i, key j, head, offset)":
            dropout_keep(seed, head, cols[None, :], rows, p, offset),
        "this keeps an entry with probability p: an entry is dropped when its word is below "
        "floor(p * 2**32) and kept when it is at least that":
            ~dropout_keep(seed, head, rows, cols, p, offset),
        "the key is the seed's low 32 bits only: the key is two words, (seed & 0xFFFFFFFF, "
        "seed >> 32)":
            dropout_keep(low, head, rows, cols, p, offset),
        "the offset is missing from the counter (its fourth word)":
            dropout_keep(seed, head, rows, cols, p, 0),
        "the head is missing from the counter (its third word): every head would drop the "
        "same entries":
            dropout_keep(seed, 0, rows, cols, p, offset),
    }


@checker("a tile's dropout mask",
         forbid=names("flashlib.core.philox.dropout_keep"))
def check_tile_keep(fb: Feedback, fn: Callable[..., Any]) -> None:
    """Check ``tile_keep(seed, offset, head, i0, i1, j0, j1, p)``: the keep-mask of rows
    i0 .. i1 - 1 and keys j0 .. j1 - 1 of head ``head``, a (i1 - i0, j1 - j0) boolean array,
    bit for bit :func:`flashlib.core.philox.dropout_keep` at those positions."""
    for seed, offset, head, i0, i1, j0, j1, p in KEEP_CASES:
        label = (f"seed {seed}, offset {offset}, head {head}, rows {i0}..{i1 - 1}, keys "
                 f"{j0}..{j1 - 1}, p = {p}")
        with fb.case(label):
            got, _ = call_learner(fn, seed, offset, head, i0, i1, j0, j1, p)
            got = np.asarray(got)
            problem = shape_problem(got, (i1 - i0, j1 - j0), "the keep-mask")
            if problem:
                fb.fail(f"{label}: {problem}")
                continue
            want = dropout_keep(seed, head, np.arange(i0, i1)[:, None], np.arange(j0, j1), p,
                                offset)
            if got.dtype != np.bool_ and np.array_equal(got, want):
                fb.fail(f"{label}: the right bits, but as {got.dtype}: return booleans "
                        "(True where kept)")
                continue
            if got.dtype == np.bool_ and np.array_equal(got, want):
                fb.ok(f"{label}: {int(want.sum())} of {want.size} kept, the same bits as "
                      "dropout_keep")
                continue
            hint = next((h for h, wrong in _keep_variants(seed, offset, head, i0, i1, j0, j1,
                                                          p).items()
                         if wrong.shape == got.shape and np.array_equal(got, wrong)), None)
            if hint is None:
                differ = int(np.sum(got.astype(bool) != want))
                hint = (f"{differ} of {want.size} bits differ from Philox4x32-10 at the "
                        "counters (i, j, head, offset) keyed by the seed; keep where the first "
                        "output word is >= floor(p * 2**32)")
            fb.fail(f"{label}: {hint}")
