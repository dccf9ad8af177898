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
from flashlib.book.exercises.mistakes import io_model as _io_model_mistakes
from flashlib.book.exercises.mistakes import tiling as _tiling_mistakes
from flashlib.book.exercises.mistakes.tiling import _tiled_state
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
_LEARNER_STATE = learner_copy(_tiled_state)

# ---- the tiled state (m, l, acc) -----------------------------------------------------------

def make_state(**mistake):
    """A learner's tiled_state, with one of the usual mistakes by keyword: the declared
    mistakes' mutant (flashlib/book/exercises/mistakes/tiling.py), as a learner's copy."""
    return functools.partial(_LEARNER_STATE, **mistake)


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

square_block = learner_copy(_tiling_mistakes._square_block)  # the declared mutant


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

io_count = learner_copy(_io_model_mistakes._io_count)  # the declared mutant


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

