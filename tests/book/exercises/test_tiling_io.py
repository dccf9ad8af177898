"""The checkers of the tiling and IO-model chapters (flashlib.book.exercises.tiling and
.io_model) accept a right answer, survive a crashing or unattempted one, and recognise the
common wrong ones, saying in one line what went wrong."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from flashlib.book.exercises import NOT_ATTEMPTED
from flashlib.book.exercises import io_model as ix
from flashlib.book.exercises import tiling as tx
from flashlib.fast.online import merge_partials
from flashlib.studies import io_model
from flashlib.studies.io_model import crossover_M, sram_footprint
from tests.helpers import (
    assert_fails_with,
    crashing,
    learner_copy,
    max_err,
    not_attempted,
    text,
)
from tools.paths import ROOT

# learners' copies: the library's own functions are refused where the exercise asks for them
merge_partials = learner_copy(merge_partials)
crossover_M = learner_copy(crossover_M)

# ---- the tiled state (m, l, acc) -----------------------------------------------------------

def make_state(rescale_O=True, rescale_l=True, l_after=False, scale=True, ragged=True,
               m_start=-np.inf, running_max=True, whole_S=False, average=None, output="state",
               divide=False):
    """A learner's tiled_state, with one of the usual mistakes (each found by running it)."""
    def tiled_state(Q, K, V, B_r, B_c):
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
        m, l, acc = np.empty(N_q), np.empty(N_q), np.empty((N_q, d_v))  # noqa: E741
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
    return tiled_state


def test_tiled_state_accepts_right_answers():
    fb = tx.check_tiled_state(make_state())
    assert fb.passed, text(fb)
    assert "no (N, N) array" in text(fb)
    assert "every score near -800" in text(fb)
    assert tx.check_tiled_state(lambda *a: list(make_state()(*a))).passed  # a list is fine


def test_tiled_state_not_attempted_and_crashing():
    assert tx.check_tiled_state(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(tx.check_tiled_state(crashing), "your function raised ValueError: oops")


@pytest.mark.parametrize(("kwargs", "phrase"), [
    # the three of issue 24: each with its own one-line diagnosis
    (dict(m_start=0.0), "m_i starts at 0, not -inf: on rows whose scores are all near -800"),
    (dict(average="plain"), "each tile's softmax is normalised by its own sum and the tiles "
                            "are averaged"),
    (dict(average="weighted"), "the tiles are averaged"),
    (dict(l_after=True), "l_i = alpha (l_i + rowsum(P~_ij)) also shrinks the new tile's sum"),
    # the other usual ones
    (dict(rescale_O=False), "acc (O_i) is not rescaled"),
    (dict(rescale_l=False), "l_i is not rescaled"),
    (dict(rescale_O=False, rescale_l=False), "neither acc (O_i) nor l_i is rescaled"),
    (dict(scale=False), "the scores are not scaled"),
    (dict(ragged=False), "the last, shorter block of keys is skipped"),
    (dict(running_max=False), "m is the last tile's maximum"),
    (dict(divide=True), "do not divide acc by l"),
    (dict(output="O,L"), "that is (O, L), Algorithm 2's output"),
    (dict(output="O"), "return the state (m, l, acc), three arrays; got an array of shape"),
])
def test_tiled_state_recognises_the_usual_mistakes(kwargs, phrase):
    assert_fails_with(tx.check_tiled_state(make_state(**kwargs)), phrase)


def test_tiled_state_m_start_0_shows_only_on_very_negative_scores():
    """m_i = 0 is right on every case with a positive row maximum: the checker's case of
    scores near -800 is what catches it, and says why (the output is lost)."""
    fb = tx.check_tiled_state(make_state(m_start=0.0))
    assert len(fb.problems) == 1 and "every score near -800" in fb.problems[0]
    assert "l = acc = 0, so the output is lost" in fb.problems[0]
    Q, K, V = tx._problem(20, 30, 8, 8, "negative")
    S = Q @ K.T / math.sqrt(8)
    assert S.max() < -780 and np.all(np.exp(S) == 0)  # exp alone underflows


def test_tiled_state_memory_probe_catches_the_whole_score_matrix():
    assert_fails_with(tx.check_tiled_state(make_state(whole_S=True)),
                      "as much as an (N, N) matrix")


def test_tiled_state_wrong_shapes():
    assert_fails_with(tx.check_tiled_state(lambda Q, K, V, a, b: (np.zeros(3),) * 3),
                      "m has shape (3,), expected (100,)")
    good = make_state()
    assert_fails_with(tx.check_tiled_state(lambda *a: (good(*a)[0], good(*a)[1],
                                                       good(*a)[2].T)),
                      "acc has shape (12, 100), expected (100, 12)", "axes are swapped")
    assert_fails_with(tx.check_tiled_state(lambda *a: 42), "got int")


def solution_code(chapter, label):
    """The first ```python block of the solution ``label`` in book/<chapter>.md."""
    text = (ROOT / "book" / f"{chapter}.md").read_text(encoding="utf-8")
    start = text.index(f"```{{solution-start}} {label}")
    body = text[start : text.index("```{solution-end}", start)]
    match = re.search(r"```python\n(.*?)\n```", body, re.DOTALL)
    assert match, f"no python block in the solution {label}"
    return match[1]


def test_the_book_solution_passes_and_two_halves_merge():
    """Exercise 4.1's solution in book/tiling.md passes, and two workers' states over the two
    halves of the keys merge (merge_states) into attention over all of them."""
    from flashlib.algorithms import merge_states, standard_attention

    source = solution_code("tiling", "ex-tiling-state")
    namespace = {"np": np, "math": math}
    exec(source, namespace)  # noqa: S102
    fn = namespace["tiled_state"]
    assert tx.check_tiled_state(fn).passed
    Q, K, V = tx._problem(30, 50, 8, 5)
    a, b = fn(Q, K[:23], V[:23], 8, 8), fn(Q, K[23:], V[23:], 8, 8)
    m, l, acc = merge_states(a, b)  # noqa: E741
    assert max_err(acc / l[:, None], standard_attention(Q, K, V)) < 1e-12


# ---- the tile schedule ---------------------------------------------------------------------

def tile_schedule(n_q, n_k, B_r, B_c, order):
    T_r, T_c = -(-n_q // B_r), -(-n_k // B_c)
    if order == "v1":
        return [(i, j) for j in range(T_c) for i in range(T_r)]
    return [(i, j) for i in range(T_r) for j in range(T_c)]


def test_tile_schedule_accepts_right_answer():
    fb = tx.check_tile_schedule(tile_schedule)
    assert fb.passed, text(fb)


@pytest.mark.parametrize(("fn", "phrase"), [
    (lambda a, b, r, c, o: tile_schedule(a, b, r, c, "v2" if o == "v1" else "v1"),
     "that is the other order"),
    (lambda a, b, r, c, o: [(i, j) for j in range(b // c) for i in range(a // r)] if o == "v1"
     else [(i, j) for i in range(a // r) for j in range(b // c)], "ragged last blocks"),
    (lambda *a: [(j, i) for i, j in tile_schedule(*a)], "the pairs are (j, i)"),
    (lambda a, b, r, c, o: [(i * r, j * c) for i, j in tile_schedule(a, b, r, c, o)],
     "first rows, not block indices"),
    (lambda *a: [(i + 1, j + 1) for i, j in tile_schedule(*a)], "count blocks from 0"),
    (lambda *a: sorted(tile_schedule(*a), key=lambda t: (t[1] * 7 + t[0]) % 5),
     "right tiles in the wrong order"),
    (lambda *a: 42, "return a list of (i, j) pairs"),
    (crashing, "your function raised ValueError"),
])
def test_tile_schedule_recognises_the_usual_mistakes(fn, phrase):
    assert_fails_with(tx.check_tile_schedule(fn), phrase)


def test_tile_schedule_cases_include_ragged_tails():
    assert any(n_q % B_r and n_k % B_c for n_q, n_k, B_r, B_c in tx.SCHEDULE_CASES)
    assert tx.check_tile_schedule(not_attempted).problems == [NOT_ATTEMPTED]


# ---- writes of O ---------------------------------------------------------------------------

def o_writes(N, B_r, B_c, order, *, ceil=True, init=False):
    T_r = -(-N // B_r) if ceil else N // B_r
    T_c = -(-N // B_c) if ceil else N // B_c
    return T_r * T_c + init if order == "v1" else T_r


def test_o_writes():
    p = tx.O_WRITES_PROBLEM
    assert (p["N"], p["B_r"], p["B_c"]) == tx.O_WRITES_CASES[0]
    fb = tx.check_o_writes(o_writes)
    assert fb.passed, text(fb)
    assert "v1, N = 1000, B_r = 64, B_c = 128: 128 block writes" in text(fb)
    assert "v2, N = 1000, B_r = 64, B_c = 128: 16 block writes" in text(fb)
    assert tx.check_o_writes(lambda *a: np.int64(o_writes(*a))).passed
    assert_fails_with(tx.check_o_writes(lambda N, r, c, o: o_writes(N, r, c, "v2")),
                      "FlashAttention-2's count")
    assert_fails_with(tx.check_o_writes(lambda N, r, c, o: o_writes(N, r, c, "v1")),
                      "v2, N = 1000", "that is Algorithm 1's count")
    assert_fails_with(tx.check_o_writes(lambda N, r, c, o: -(-N // c)), "inside the loop over j")
    assert_fails_with(tx.check_o_writes(lambda *a: o_writes(*a, init=a[3] == "v1")),
                      "initialisation writes O whole")
    assert_fails_with(tx.check_o_writes(lambda *a: o_writes(*a, ceil=False)), "ceil(N / B)")
    fb = tx.check_o_writes(lambda *a: o_writes(*a, ceil=a[3] == "v1"))
    assert_fails_with(fb, "ceil(N / B_r) query blocks")
    assert_fails_with(tx.check_o_writes(lambda *a: 7), "T_r = ceil")
    assert_fails_with(tx.check_o_writes(lambda *a: "many"), "return a number")
    assert tx.check_o_writes(not_attempted).problems == [NOT_ATTEMPTED]


# ---- block sizes and the cap ---------------------------------------------------------------

def square_block(M, d, *, tile=True, lm=True, blocks=4, ceil=False, paper=False):
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


def test_square_block():
    fb = tx.check_square_block(square_block)
    assert fb.passed, text(fb)
    assert "including M too small for B = 1" in text(fb)
    assert tx.check_square_block(lambda M, d: np.int64(square_block(M, d))).passed
    for B in (1, 7, 64):
        for d in (3, 16, 64):
            footprint = sram_footprint("v2", B, B, d)
            assert tx.step_elements(B, d) == sum(footprint.values())


@pytest.mark.parametrize(("fn", "phrase"), [
    (lambda M, d: square_block(M, d, tile=False), "you left out the score tile S_ij"),
    (lambda M, d: square_block(M, d, lm=False), "you left out l_i and m_i"),
    (lambda M, d: square_block(M, d, blocks=3), "you left out one B x d block"),
    (lambda M, d: square_block(M, d, paper=True), "that is Algorithm 1's B_c = ceil(M / 4d)"),
    (lambda M, d: square_block(M, d, ceil=True), "rounded up does not fit: round it down"),
    (lambda M, d: round((math.sqrt((4 * d + 2) ** 2 + 4 * M) - 4 * d - 2) / 2),
     "rounded to the nearest integer may not fit"),
    (lambda M, d: square_block(M, d) + (M == 50_000), "does not fit: its step holds"),
    (lambda M, d: max(square_block(M, d) - 1, 0), "fits too"),
    (lambda M, d: float(square_block(M, d)), "give a whole number of rows (an int)"),
    (lambda M, d: square_block(M, d) + 0.5, "give a whole number of rows"),
    (lambda M, d: square_block(M, d) if M >= 4 * d + 3 else -1, "return 0"),
    (lambda M, d: "big", "give a whole number"),
    (crashing, "your function raised"),
])
def test_square_block_recognises_the_usual_mistakes(fn, phrase):
    assert_fails_with(tx.check_square_block(fn), phrase)


def test_square_block_not_attempted():
    assert tx.check_square_block(not_attempted).problems == [NOT_ATTEMPTED]


def test_cap_reason():
    assert tx.check_cap_reason("a").passed and tx.check_cap_reason("(A)").passed
    assert_fails_with(tx.check_cap_reason("b"), "does not depend on B_r")
    assert_fails_with(tx.check_cap_reason("c"), "nothing requires B_r to divide d")
    assert_fails_with(tx.check_cap_reason("d"), "B_r x B_c score tile")
    assert_fails_with(tx.check_cap_reason("z"), "one of the letters")
    assert_fails_with(tx.check_cap_reason(None), "not attempted yet")
    assert tx.check_cap_reason(lambda: "a").passed
    assert_fails_with(tx.check_cap_reason(lambda: "b"), "does not depend on B_r")
    assert tx.check_cap_reason(not_attempted).problems == [NOT_ATTEMPTED]


# ---- Algorithm 0's count -------------------------------------------------------------------

def test_standard_count():
    N, d = ix.STANDARD_PROBLEM["N"], ix.STANDARD_PROBLEM["d"]
    assert ix.check_standard_count(4 * N * N + 4 * N * d).passed
    assert ix.check_standard_count(lambda N, d: 4 * N * N + 4 * N * d).passed
    assert_fails_with(ix.check_standard_count(2 * N * N + 4 * N * d), "four N^2 transfers")
    assert_fails_with(ix.check_standard_count(lambda N, d: 4 * N * d), "no N^2 term")
    assert_fails_with(ix.check_standard_count(3 * N * N + 4 * N * d), "one of the four N^2")
    assert_fails_with(ix.check_standard_count(2 * N * N + 3 * N * d), "the reads only")
    assert_fails_with(ix.check_standard_count(2 * (4 * N * N + 4 * N * d)), "bytes in fp16")
    assert_fails_with(ix.check_standard_count(12345), "go line by line")
    assert_fails_with(ix.check_standard_count("lots"), "give a number")
    assert_fails_with(ix.check_standard_count(crashing), "your function raised")
    assert_fails_with(ix.check_standard_count(None), "not attempted yet")
    assert ix.check_standard_count(not_attempted).problems == [NOT_ATTEMPTED]


# ---- io_count ------------------------------------------------------------------------------

def io_count(N, d, B_r, B_c, order, *, init=True, lm=True, ceil=True, reads_only=False):
    T_r = -(-N // B_r) if ceil else N // B_r
    T_c = -(-N // B_c) if ceil else N // B_c
    if order == "v1":
        reads = 2 * N * d + T_c * N * (2 * d + (2 if lm else 0))
        writes = T_c * N * (d + (2 if lm else 0)) + (N * (d + (2 if lm else 0)) if init else 0)
    else:
        reads = N * d + T_r * 2 * N * d
        writes = N * d + N
    return reads if reads_only else reads + writes


def test_io_count_accepts_the_right_formula():
    fb = ix.check_io_count(io_count)
    assert fb.passed, text(fb)


@pytest.mark.parametrize(("fn", "phrase"), [
    (lambda N, d, r, c, o: io_count(N, d, r, c, o, init=False), "initialised in HBM first"),
    (lambda N, d, r, c, o: io_count(N, d, r, c, o, lm=False, init=o == "v1"),
     "l and m move too"),
    (lambda N, d, r, c, o: io_count(N, d, r, c, o, ceil=False), "the last, shorter one counts"),
    (lambda N, d, r, c, o: io_count(N, d, r, c, "v2" if o == "v1" else "v1"), "the other order"),
    (lambda N, d, r, c, o: io_count(N, d, r, c, o, reads_only=True), "the reads only"),
    (lambda N, d, r, c, o: 2 * io_count(N, d, r, c, o), "bytes in fp16"),
    (lambda N, d, r, c, o: 7, "the counting memory moved"),
    (lambda N, d, r, c, o: "a lot", "return a number"),
    (learner_copy(io_model.io_count), "your function raised"),  # the chapter's: not an answer
    (crashing, "your function raised"),
])
def test_io_count_recognises_the_usual_mistakes(fn, phrase):
    assert_fails_with(ix.check_io_count(fn), phrase)


def test_io_count_v2_without_L():
    def no_L(N, d, r, c, o):
        return io_count(N, d, r, c, o) - (N if o == "v2" else 0)

    assert_fails_with(ix.check_io_count(no_L), "L is written too")
    assert ix.check_io_count(not_attempted).problems == [NOT_ATTEMPTED]


# ---- the crossover -------------------------------------------------------------------------

def test_crossover():
    N, d = ix.CROSSOVER_PROBLEM["N"], ix.CROSSOVER_PROBLEM["d"]
    M_star = crossover_M(N, d, "v2")
    assert ix.check_crossover(M_star).passed
    assert ix.check_crossover(M_star - 1).passed and ix.check_crossover(M_star + 100).passed
    assert ix.check_crossover(lambda N, d: crossover_M(N, d, "v2")).passed
    assert ix.check_crossover(lambda N, d: crossover_M(N, d, "v2") + 2 * d).passed  # same block
    assert_fails_with(ix.check_crossover(d * d), "more than standard attention")
    assert_fails_with(ix.check_crossover(8 * d * d), "fewer than standard attention")
    assert_fails_with(ix.check_crossover(lambda N, d: d * d), "N = 1024, d = 64: at M = 4096")
    assert_fails_with(ix.check_crossover(2 * M_star), "bytes in fp16")
    assert_fails_with(ix.check_crossover(lambda N, d: 4 * crossover_M(N, d, "v2")),
                      "bytes in fp32")
    # the threshold the chapter prints, Algorithm 1's, and the function it imports
    assert_fails_with(ix.check_crossover(crossover_M(N, d)), "Algorithm 1's threshold")
    assert_fails_with(ix.check_crossover(crossover_M), "Algorithm 1's threshold")
    assert_fails_with(ix.check_crossover(-3), "positive number")
    assert_fails_with(ix.check_crossover("big"), "positive number")
    assert_fails_with(ix.check_crossover(None), "not attempted yet")
    assert ix.check_crossover(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(ix.check_crossover(crashing), "your function raised")


# ---- split-KV merge ------------------------------------------------------------------------

def test_split_kv_merge():
    fb = ix.check_split_kv_merge(lambda a, b: tuple(merge_partials(a, b)))
    assert fb.passed, text(fb)
    assert "equals attention over the whole cache" in text(fb)

    def no_rescale(a, b):
        return np.maximum(a[0], b[0]), a[1] + b[1], a[2] + b[2]

    assert_fails_with(ix.check_split_kv_merge(no_rescale), "without rescaling")
    assert ix.check_split_kv_merge(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(ix.check_split_kv_merge(crashing), "your function raised")
