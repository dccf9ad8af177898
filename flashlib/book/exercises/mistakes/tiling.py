"""The tiling chapter's declared mistakes (flashlib.book.exercises.tiling)."""

from __future__ import annotations

import functools
import math

import numpy as np

from flashlib.book.exercises.registry import Mistake, declare_mistakes
from flashlib.book.exercises.tiling import (
    check_cap_reason,
    check_o_writes,
    check_square_block,
    check_tile_schedule,
    check_tiled_state,
)

# ---- 4.1 the tiled state (m, l, acc) ---------------------------------------------------------


def _tiled_state(Q, K, V, B_r, B_c, *, rescale_O=True, rescale_l=True, l_after=False,
                 scale=True, ragged=True, m_start=-np.inf, running_max=True, whole_S=False,
                 average=None, output="state", divide=False):
    """A learner's tiled_state, right by default, with one of the usual mistakes by keyword
    (each found by running it)."""
    N_q, N_k, d_v = Q.shape[0], K.shape[0], V.shape[1]
    tau = 1 / math.sqrt(Q.shape[1]) if scale else 1.0
    if whole_S:  # the (N, N) matrix the probe must catch
        S = tau * (Q @ K.T)
        m = S.max(axis=1)
        P = np.exp(S - m[:, None])
        return m, P.sum(axis=1), P @ V
    if average is not None:  # each tile's own softmax, the tiles averaged
        outs, sizes = [], []
        for j in range(0, N_k, B_c):
            S = tau * (Q @ K[j : j + B_c].T)
            P = np.exp(S - S.max(axis=1, keepdims=True))
            outs.append(P @ V[j : j + B_c] / P.sum(axis=1, keepdims=True))
            sizes.append(len(S[0]))
        O = np.average(outs, axis=0, weights=sizes if average == "weighted" else None)
        return np.zeros(N_q), np.ones(N_q), O
    m, l, acc = np.empty(N_q), np.empty(N_q), np.empty((N_q, d_v))
    stop_k = N_k if ragged else N_k - N_k % B_c
    for i in range(0, N_q, B_r):
        Q_i = Q[i : i + B_r]
        O_i, l_i = np.zeros((len(Q_i), d_v)), np.zeros(len(Q_i))
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
        m[i : i + B_r], l[i : i + B_r] = m_i, l_i
        acc[i : i + B_r] = O_i / l_i[:, None] if divide else O_i
    if output == "O,L":
        return acc / l[:, None], m + np.log(l)
    if output == "O":
        return acc / l[:, None]
    return m, l, acc


def _state(**mistake):
    return functools.partial(_tiled_state, **mistake)


def wrong_shapes(Q, K, V, B_r, B_c):
    return (np.zeros(3),) * 3


def acc_transposed(*args):
    m, l, acc = _tiled_state(*args)
    return m, l, acc.T


def a_number(*args):
    return 42


declare_mistakes(
    check_tiled_state,
    # the three of issue 24: each with its own one-line diagnosis
    Mistake("m_i starts at 0", (_state(m_start=0.0),),
            ("m_i starts at 0, not -inf: on rows whose scores are all near -800",
             "l = acc = 0, so the output is lost")),
    Mistake("the tiles' softmaxes averaged", (_state(average="plain"),),
            ("each tile's softmax is normalised by its own sum and the tiles are averaged",)),
    Mistake("the tiles' softmaxes averaged by size", (_state(average="weighted"),),
            ("the tiles are averaged",)),
    Mistake("l rescaled after the new sum", (_state(l_after=True),),
            ("l_i = alpha (l_i + rowsum(P~_ij)) also shrinks the new tile's sum",)),
    # the other usual ones
    Mistake("acc not rescaled", (_state(rescale_O=False),), ("acc (O_i) is not rescaled",)),
    Mistake("l not rescaled", (_state(rescale_l=False),), ("l_i is not rescaled",)),
    Mistake("neither rescaled", (_state(rescale_O=False, rescale_l=False),),
            ("neither acc (O_i) nor l_i is rescaled",)),
    Mistake("scores not scaled", (_state(scale=False),), ("the scores are not scaled",)),
    Mistake("the last block skipped", (_state(ragged=False),),
            ("the last, shorter block of keys is skipped",)),
    Mistake("the last tile's maximum", (_state(running_max=False),),
            ("m is the last tile's maximum",)),
    Mistake("acc divided by l", (_state(divide=True),), ("do not divide acc by l",)),
    Mistake("(O, L)", (_state(output="O,L"),), ("that is (O, L), Algorithm 2's output",)),
    Mistake("O alone", (_state(output="O"),),
            ("return the state (m, l, acc), three arrays; got an array of shape",)),
    Mistake("the whole score matrix", (_state(whole_S=True),),
            ("as much as an (N, N) matrix",)),
    Mistake("wrong shapes", (wrong_shapes,), ("m has shape (3,), expected (100,)",)),
    Mistake("acc transposed", (acc_transposed,),
            ("acc has shape (12, 100), expected (100, 12)", "axes are swapped")),
    Mistake("a number", (a_number,), ("got int",)),
)


# ---- 4.2 the tile schedule -------------------------------------------------------------------

def _schedule(n_q, n_k, B_r, B_c, order):
    T_r, T_c = -(-n_q // B_r), -(-n_k // B_c)
    if order == "v1":
        return [(i, j) for j in range(T_c) for i in range(T_r)]
    return [(i, j) for i in range(T_r) for j in range(T_c)]


def the_other_order(a, b, r, c, o):
    return _schedule(a, b, r, c, "v2" if o == "v1" else "v1")


def no_ragged_blocks(a, b, r, c, o):
    if o == "v1":
        return [(i, j) for j in range(b // c) for i in range(a // r)]
    return [(i, j) for i in range(a // r) for j in range(b // c)]


def pairs_swapped(*args):
    return [(j, i) for i, j in _schedule(*args)]


def first_rows(a, b, r, c, o):
    return [(i * r, j * c) for i, j in _schedule(a, b, r, c, o)]


def from_1(*args):
    return [(i + 1, j + 1) for i, j in _schedule(*args)]


def shuffled(*args):
    return sorted(_schedule(*args), key=lambda t: (t[1] * 7 + t[0]) % 5)


declare_mistakes(
    check_tile_schedule,
    Mistake("the other order", (the_other_order,), ("that is the other order",)),
    Mistake("no ragged last blocks", (no_ragged_blocks,), ("ragged last blocks",)),
    Mistake("(j, i)", (pairs_swapped,), ("the pairs are (j, i)",)),
    Mistake("first rows", (first_rows,), ("first rows, not block indices",)),
    Mistake("counted from 1", (from_1,), ("count blocks from 0",)),
    Mistake("the wrong order", (shuffled,), ("right tiles in the wrong order",)),
    Mistake("a number", (a_number,), ("return a list of (i, j) pairs",)),
)


# ---- 4.3 writes of O -------------------------------------------------------------------------

def _o_writes(N, B_r, B_c, order, *, ceil=True, init=False):
    T_r = -(-N // B_r) if ceil else N // B_r
    T_c = -(-N // B_c) if ceil else N // B_c
    return T_r * T_c + init if order == "v1" else T_r


def always_v2(N, r, c, o):
    return _o_writes(N, r, c, "v2")


def always_v1(N, r, c, o):
    return _o_writes(N, r, c, "v1")


def key_blocks(N, r, c, o):
    return -(-N // c)


def with_the_initialisation(*args):
    return _o_writes(*args, init=args[3] == "v1")


def floor(*args):
    return _o_writes(*args, ceil=False)


def floor_for_v2(*args):
    return _o_writes(*args, ceil=args[3] == "v1")


def seven(*args):
    return 7


def words(*args):
    return "many"


declare_mistakes(
    check_o_writes,
    Mistake("FlashAttention-2's count", (always_v2,), ("FlashAttention-2's count",)),
    Mistake("Algorithm 1's count", (always_v1,), ("v2, N = 1500", "that is Algorithm 1's count")),
    Mistake("key blocks", (key_blocks,), ("inside the loop over j",)),
    Mistake("the initialisation counted", (with_the_initialisation,),
            ("initialisation writes O whole",)),
    Mistake("floor(N / B)", (floor,), ("ceil(N / B)",)),
    Mistake("floor(N / B_r) for v2", (floor_for_v2,), ("ceil(N / B_r) query blocks",)),
    Mistake("a number", (seven,), ("T_r = ceil",)),
    Mistake("words", (words,), ("return a number",)),
)


# ---- 4.4 the square block --------------------------------------------------------------------

def _square_block(M, d, *, tile=True, lm=True, blocks=4, ceil=False, paper=False):
    """A learner's square_block: the largest B whose step fits, with a mistake switched on."""
    if paper:
        return -(-M // (4 * d))
    size = lambda b: blocks * b * d + (2 * b if lm else 0) + (b * b if tile else 0)  # noqa: E731
    if ceil:  # solves the quadratic and rounds up
        a, c = 4 * d + 2, -M
        return math.ceil((-a + math.sqrt(a * a - 4 * c)) / 2)
    B = 0
    while size(B + 1) <= M:
        B += 1
    return B


def _block(**mistake):
    return functools.partial(_square_block, **mistake)


def rounded(M, d):
    return round((math.sqrt((4 * d + 2) ** 2 + 4 * M) - 4 * d - 2) / 2)


def one_too_many_at_50000(M, d):
    return _square_block(M, d) + (M == 50_000)


def one_too_few(M, d):
    return max(_square_block(M, d) - 1, 0)


def a_float(M, d):
    return float(_square_block(M, d))


def a_half(M, d):
    return _square_block(M, d) + 0.5


def minus_one_when_nothing_fits(M, d):
    return _square_block(M, d) if M >= 4 * d + 3 else -1


def big(M, d):
    return "big"


declare_mistakes(
    check_square_block,
    Mistake("no score tile", (_block(tile=False),), ("you left out the score tile S_ij",)),
    Mistake("no l and m", (_block(lm=False),), ("you left out l_i and m_i",)),
    Mistake("three blocks", (_block(blocks=3),), ("you left out one B x d block",)),
    Mistake("the paper's B_c", (_block(paper=True),),
            ("that is Algorithm 1's B_c = ceil(M / 4d)",)),
    Mistake("rounded up", (_block(ceil=True),), ("rounded up does not fit: round it down",)),
    Mistake("rounded", (rounded,), ("rounded to the nearest integer may not fit",)),
    Mistake("one too many", (one_too_many_at_50000,), ("does not fit: its step holds",)),
    Mistake("one too few", (one_too_few,), ("fits too",)),
    Mistake("a float", (a_float,), ("give a whole number of rows (an int)",)),
    Mistake("a half", (a_half,), ("give a whole number of rows",)),
    Mistake("-1 when nothing fits", (minus_one_when_nothing_fits,), ("return 0",)),
    Mistake("a word", (big,), ("give a whole number",)),
)


# ---- 4.5 the score tile under another cap (the book's variant: B_r <= 2d) ------------------

def b():
    return "b"


declare_mistakes(
    check_cap_reason,
    Mistake("the page's cap, d", ("b",), ("the tile with B_r capped at d", "= 0.5 M")),
    Mistake("M", ("d",), ("multiply the two bounds", "= 0.5 M")),
    Mistake("M / 8", ("a",), ("multiply the two bounds",)),
    Mistake("not a letter", ("z",), ("one of the letters",)),
    Mistake("None", (None,), ("not attempted yet",)),
    Mistake("b from a function", (b,), ("the tile with B_r capped at d",)),
)
