"""The checkers of the tiling and IO-model chapters (flashlib.book.exercises.tiling and
.io_model) accept a right answer and survive a crashing or unattempted one; the common wrong
ones, each with the line that says what went wrong, are declared in
flashlib/book/exercises/mistakes/tiling.py and io_model.py
(tests/book/exercises/test_declared_mistakes.py)."""

from __future__ import annotations

import functools
import math
import re

import numpy as np

from flashlib.book.exercises import NOT_ATTEMPTED
from flashlib.book.exercises import io_model as ix
from flashlib.book.exercises import tiling as tx
from flashlib.fast.online import merge_partials
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


def test_tiled_state_m_start_0_shows_only_on_very_negative_scores():
    """m_i = 0 is right on every case with a positive row maximum: the checker's case of
    scores near -800 is what catches it (a declared mistake), and only that case."""
    fb = tx.check_tiled_state(make_state(m_start=0.0))
    assert len(fb.problems) == 1 and "every score near -800" in fb.problems[0]
    Q, K, V = tx._problem(20, 30, 8, 8, "negative")
    S = Q @ K.T / math.sqrt(8)
    assert S.max() < -780 and np.all(np.exp(S) == 0)  # exp alone underflows


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


def test_tile_schedule_survives_a_crash():
    assert_fails_with(tx.check_tile_schedule(crashing), "your function raised ValueError")


def test_tile_schedule_cases_include_ragged_tails():
    assert any(n_q % B_r and n_k % B_c for n_q, n_k, B_r, B_c in tx.SCHEDULE_CASES)
    assert tx.check_tile_schedule(not_attempted).problems == [NOT_ATTEMPTED]


# ---- writes of O ---------------------------------------------------------------------------

def o_writes(N, B_r, B_c, order, *, ceil=True, init=False):
    T_r = -(-N // B_r) if ceil else N // B_r
    T_c = -(-N // B_c) if ceil else N // B_c
    return T_r * T_c + init if order == "v1" else T_r


def test_o_writes():
    p = tx.O_WRITES_PROBLEM  # the book's variant: asked first, then the other cases
    assert (p["N"], p["B_r"], p["B_c"]) == (1500, 64, 128)
    fb = tx.check_o_writes(o_writes)
    assert fb.passed, text(fb)
    assert fb.passes[0] == "v1, N = 1500, B_r = 64, B_c = 128: 288 block writes of O"
    assert "v2, N = 1500, B_r = 64, B_c = 128: 24 block writes" in text(fb)
    assert "v1, N = 1000, B_r = 64, B_c = 128: 128 block writes" in text(fb)
    assert tx.check_o_writes(lambda *a: np.int64(o_writes(*a))).passed
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


def test_square_block_survives_a_crash():
    assert_fails_with(tx.check_square_block(crashing), "your function raised")


def test_square_block_not_attempted():
    assert tx.check_square_block(not_attempted).problems == [NOT_ATTEMPTED]


def test_cap_reason():
    assert tx.check_cap_reason("c").passed and tx.check_cap_reason("(C)").passed
    assert tx.check_cap_reason(lambda: "c").passed
    assert tx.check_cap_reason(not_attempted).problems == [NOT_ATTEMPTED]


# ---- Algorithm 0's count -------------------------------------------------------------------

def test_standard_count():
    N_q, N_k, d, d_v = ix.STANDARD_PROBLEM.values()
    assert ix.check_standard_count(4 * N_q * N_k + (N_q + N_k) * (d + d_v)).passed
    assert ix.check_standard_count(
        lambda N_q, N_k, d, d_v: 4 * N_q * N_k + (N_q + N_k) * (d + d_v)).passed
    # self-attention's count, the page's 4N^2 + 4Nd, is not cross-attention's
    assert not ix.check_standard_count(lambda N_q, N_k, d, d_v: 4 * N_q**2 + 4 * N_q * d).passed
    assert_fails_with(ix.check_standard_count(crashing), "your function raised")
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


def test_io_count_survives_a_crash():
    assert_fails_with(ix.check_io_count(crashing), "your function raised")
    assert ix.check_io_count(not_attempted).problems == [NOT_ATTEMPTED]


# ---- the crossover -------------------------------------------------------------------------

def test_crossover():
    N, d = ix.CROSSOVER_PROBLEM["N"], ix.CROSSOVER_PROBLEM["d"]
    M_star = crossover_M(N, d, "v2")
    assert ix.check_crossover(M_star).passed
    assert ix.check_crossover(M_star - 1).passed and ix.check_crossover(M_star + 100).passed
    assert ix.check_crossover(lambda N, d: crossover_M(N, d, "v2")).passed
    assert ix.check_crossover(lambda N, d: crossover_M(N, d, "v2") + 2 * d).passed  # same block
    assert ix.check_crossover(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(ix.check_crossover(crashing), "your function raised")


# ---- split-KV merge ------------------------------------------------------------------------

def test_split_kv_combine():
    def combine(outs, lses):  # through the library's merge of (m, l, acc) states
        parts = [(lse, np.where(np.isneginf(lse), 0.0, 1.0), o * np.where(
            np.isneginf(lse), 0.0, 1.0)[:, None]) for o, lse in zip(outs, lses, strict=True)]
        m, l, acc = functools.reduce(lambda a, b: tuple(merge_partials(a, b)), parts)
        seen = l > 0
        out = np.divide(acc, l[:, None], out=np.zeros_like(acc), where=seen[:, None])
        return out, np.where(seen, m + np.log(np.where(seen, l, 1.0)), -np.inf)

    fb = ix.check_split_kv_combine(combine)
    assert fb.passed, text(fb)
    assert "equals attention over the whole cache" in text(fb)
    assert ix.check_split_kv_combine(not_attempted).problems == [NOT_ATTEMPTED]
    assert_fails_with(ix.check_split_kv_combine(crashing), "your function raised")
    assert_fails_with(ix.check_split_kv_combine(lambda o, lse: (o, lse)), "shapes")

