"""Checkers for the exercises of the HBM IO model chapter (book/io-model.md).

check_standard_count   Algorithm 0's HBM accesses for cross-attention:
                       ``count(N_q, N_k, d, d_v)`` or a number for the student's variant of
                       :data:`STANDARD_PROBLEM`
check_io_count         ``io_count(N, d, M, order) -> int`` against the counting memory
check_crossover        the M below which FlashAttention moves more than standard attention:
                       ``crossover(N, d)`` or a number for :data:`CROSSOVER_PROBLEM`
check_split_kv_combine ``combine(outs, lses) -> (O, L)``: Flash-Decoding's combine of split-KV
                       shares (each share's normalised output and logsumexp)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import (
    MERGES,
    Feedback,
    LearnerError,
    call_learner,
    checker,
    names,
    variants,
)
from flashlib.studies.io_model import block_sizes, crossover_M, io_count, traffic
from flashlib.studies.tiling import count_io

__all__ = [
    "STANDARD_PROBLEM",
    "CROSSOVER_PROBLEM",
    "CROSSOVER_CASES",
    "check_standard_count",
    "check_io_count",
    "check_crossover",
    "check_split_kv_combine",
    "COMBINE_CASES",
]

#: The shape of :func:`check_standard_count`'s question when the answer is a number, variant 0
#: (the book's): cross-attention, N_q queries over N_k keys, values of width d_v.
STANDARD_PROBLEM = {"N_q": 2000, "N_k": 1500, "d": 80, "d_v": 48}  # no count the page prints
#: Exercise 9.1's variants (flashlib.book.exercises.variants): the sizes of the number asked.
STANDARD_VARIANTS = variants.declare(
    "9.1", [STANDARD_PROBLEM] + [{"N_q": n_q, "N_k": n_k, "d": d, "d_v": d_v}
                                 for n_q, n_k in ((1000, 3000), (2500, 700), (1200, 1800),
                                                  (3000, 2000), (800, 2400))
                                 for d, d_v in ((64, 32), (96, 64), (128, 80))],
    lambda p: f"count(N_q, N_k, d, d_v), or its number at N_q = {p['N_q']}, "
              f"N_k = {p['N_k']}, d = {p['d']}, d_v = {p['d_v']}")
#: The shape of :func:`check_crossover`'s question.
CROSSOVER_PROBLEM = {"N": 1024, "d": 96}  # its threshold's block holds no number the page prints


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _standard_hint(got: float, N_q: int, N_k: int, d: int, d_v: int) -> str:
    """One line on what an Algorithm 0 count missed."""
    s, qd, kd, kv, ov = N_q * N_k, N_q * d, N_k * d, N_k * d_v, N_q * d_v
    right = 4 * s + qd + kd + kv + ov
    known = {
        2 * s + qd + kd + kv + ov: "S and P are each written and then read back: four "
                                   "N_q N_k transfers (S written, S read, P written, P read), "
                                   "you counted two",
        3 * s + qd + kd + kv + ov: "one of the four N_q N_k transfers is missing: S is "
                                   "written and read back, and so is P",
        qd + kd + kv + ov: "no N_q N_k term: S and P are N_q x N_k matrices that go to HBM "
                           "and back",
        4 * s + 2 * qd + 2 * kd: "V has d_v columns and so has O, not d: N_k d_v read, "
                                 "N_q d_v written",
        4 * s + 2 * kd + 2 * kv: "Q is N_q x d and O is N_q x d_v: they have N_q rows, not N_k",
        4 * N_q * N_q + 4 * qd: "that is self-attention's 4N^2 + 4Nd with N = N_q: here the "
                                "keys are N_k and V, O have d_v columns",
        4 * N_k * N_k + 4 * kd: "that is self-attention's 4N^2 + 4Nd with N = N_k: here the "
                                "queries are N_q and V, O have d_v columns",
        2 * s + qd + kd + kv: "those are the reads only; add the writes (S, P and O)",
        2 * s + ov: "those are the writes only; add the reads (Q, K, S, P and V)",
        2 * right: "that is bytes in fp16; count elements",
        4 * right: "that is bytes in fp32; count elements",
    }
    return known.get(got, "go line by line: 1. read Q (N_q d) and K (N_k d), write S "
                          "(N_q N_k); 2. read S, write P; 3. read P and V (N_k d_v), write O "
                          "(N_q d_v)")


@checker("Algorithm 0's HBM accesses",
         forbid=names("flashlib.studies.io_model.traffic", "flashlib.studies.io_model.io_count",
                      "flashlib.studies.tiling.count_io"))
def check_standard_count(fb: Feedback, answer: Any) -> None:
    """Check Algorithm 0's count of elements read plus written for cross-attention (N_q
    queries, N_k keys, head dimension d, values of width d_v): a function
    ``count(N_q, N_k, d, d_v)``, or a number for the student's variant of
    :data:`STANDARD_PROBLEM` (:data:`STANDARD_VARIANTS`)."""
    if answer is None:
        fb.fail("not attempted yet: replace None with your count")
        return
    p = variants.variant("9.1")
    mine = (p["N_q"], p["N_k"], p["d"], p["d_v"])
    cases = ([mine] if not callable(answer) else
             [mine, (1024, 1024, 64, 64), (4096, 512, 128, 64), (100, 37, 7, 5), (1, 1, 1, 1)])
    for N_q, N_k, d, d_v in cases:
        name = f"N_q = {N_q}, N_k = {N_k}, d = {d}, d_v = {d_v}"
        with fb.case(name):
            got = call_learner(answer, N_q, N_k, d, d_v)[0] if callable(answer) else answer
            if not _is_number(got):
                raise LearnerError(f"give a number, got {got!r}")
            want = traffic("standard", N_q, N_k, d, d_v=d_v).total
            if got == want:
                fb.ok(f"{name}: {want:,} elements")
            else:
                fb.fail(f"{name}: {got:,} is not right: "
                        f"{_standard_hint(got, N_q, N_k, d, d_v)}")
                return


def _io_variants(N: int, d: int, M: int, order: str) -> list[tuple[int, str]]:
    """Totals of the usual mistakes in ``io_count``, with what each one missed."""
    B_r, B_c = block_sizes(M, d, order)
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    right = traffic(order, N, N, d, B_r=B_r, B_c=B_c)
    other = "v2" if order == "v1" else "v1"
    out = [(traffic(other, N, N, d, B_r=B_r, B_c=B_c).total,
            f"that is the other order's count ({other}); {order} re-reads "
            + ("Q, O, l, m once per key block" if order == "v1" else
               "K and V once per query block")),
           (right.total_reads, "those are the reads only; add the writes"),
           (2 * right.total, "that is bytes in fp16; count elements")]
    if order == "v1":
        out += [(right.total - N * (d + 2), "O, l and m are initialised in HBM first: N (d + 2) "
                 "more writes"),
                (right.total - 2 * T_c * N - 2 * (T_c + 1) * N, "l and m move too: each is "
                 "read and written with O, N elements per key block"),
                (right.total - 2 * T_c * N - 2 * (T_c + 1) * N - N * d, "l and m move too, "
                 "and O, l, m are initialised in HBM")]
        if N % B_c:
            floor_c = N // B_c
            out.append((right.total - (T_c - floor_c) * N * (3 * d + 4),
                        "there are ceil(N / B_c) key blocks: the last, shorter one counts"))
    else:
        out += [(right.total - N, "L is written too: N more elements")]
        if N % B_r:
            out.append((right.total - (T_r - N // B_r) * 2 * N * d,
                        "there are ceil(N / B_r) query blocks: the last, shorter one counts"))
    return out


#: (N, d, M) of :func:`check_io_count`: exact multiples and ragged tails, small and large M.
IO_CASES = [(64, 8, 256), (100, 16, 1000), (100, 16, 100), (257, 4, 300), (50, 8, 400),
            (33, 16, 16 * 33)]


@functools.cache
def _counted_io(N: int, d: int, M: int, order: str) -> int:
    """count_io(N, d, M, order, rule="paper"), computed once per process: the counting memory
    runs the teaching functions element by element (seconds for all of IO_CASES), and a
    grader checks every student's answer against the same counts."""
    return count_io(N, d, M, order, rule="paper")


@checker("io_count",
         forbid=names("flashlib.studies.io_model.io_count", "flashlib.studies.io_model.traffic",
                      "flashlib.studies.io_model.block_counts",
                      "flashlib.studies.tiling.count_io", "flashlib.studies.tiling.run_counted"))
def check_io_count(fb: Feedback, fn: Callable[[int, int, int, int, str], Any]) -> None:
    """Check ``io_count(N, d, B_r, B_c, order) -> int``, the elements read plus written by
    "v1" and "v2" with blocks of B_r query rows and B_c key rows (those of
    ``flashlib.studies.io_model.block_sizes(M, d, order)`` for each case), against a counting
    memory running the teaching functions."""
    for N, d, M in IO_CASES:
        for order in ("v1", "v2"):
            B_r, B_c = block_sizes(M, d, order)
            name = f"{order}, N = {N}, d = {d}, B_r = {B_r}, B_c = {B_c}"
            with fb.case(name):
                got, _ = call_learner(fn, N, d, B_r, B_c, order)
                if not _is_number(got):
                    raise LearnerError(f"return a number, got {got!r}")
                want = _counted_io(N, d, M, order)
                if got == want:
                    continue
                hint = next((h for v, h in _io_variants(N, d, M, order) if got == v),
                            f"the counting memory moved {want:,} elements")
                fb.fail(f"{name}: {got:,} is not right: {hint}")
                return
    fb.ok(f"equal to the counting memory for both orders on {len(IO_CASES)} (N, d, B_r, B_c)")


#: (N, d) of :func:`check_crossover` when the answer is a function.
CROSSOVER_CASES = [(1024, 64), (4096, 128), (512, 16)]


@checker("the crossover M",
         forbid=names("flashlib.studies.io_model.crossover_M"))
def check_crossover(fb: Feedback, answer: Any) -> None:
    """Check the M (elements) below which FlashAttention-2's order, with the paper's blocks
    given to its outer loop (``block_sizes(M, d, "v2")``), moves more than standard attention:
    a function ``crossover(N, d)`` (checked on :data:`CROSSOVER_CASES`) or a number for
    :data:`CROSSOVER_PROBLEM`.  Any M in the block size on either side of the threshold is
    accepted (the counts change only when ceil(M / 4d) does).  The chapter prints Algorithm
    1's threshold; this one is FlashAttention-2's."""
    if answer is None:
        fb.fail("not attempted yet: replace None with your M")
        return
    cases = CROSSOVER_CASES if callable(answer) else [tuple(CROSSOVER_PROBLEM.values())]
    for N, d in cases:
        name = f"N = {N}, d = {d}"
        with fb.case(name):
            got = call_learner(answer, N, d)[0] if callable(answer) else answer
            if not _is_number(got) or not math.isfinite(float(got)) or got <= 0:
                raise LearnerError(f"give M as a positive number of elements, got {got!r}")
            M_star = crossover_M(N, d, "v2")
            std = io_count(N, d, None, "standard")
            if M_star - 4 * d <= got < M_star + 4 * d:
                fb.ok(f"{name}: M = {got:g}; the threshold is M = {M_star:,} elements (about "
                      f"{M_star / d**2:.1f} d^2); below it FlashAttention-2's order moves "
                      f"more than the {std:,} of standard attention")
                continue
            flash = io_count(N, d, int(min(max(got, d), N * d)), "v2")
            verdict = "more" if flash > std else "fewer"
            hint = ": compare io_count(N, d, M, \"v2\") at several M"
            v1_star = crossover_M(N, d, "v1")
            if v1_star is not None and v1_star - 4 * d <= got < v1_star + 4 * d:
                hint = (": that is Algorithm 1's threshold (order \"v1\"); FlashAttention-2's "
                        "order reads Q once and re-reads only K and V, so it pays off sooner")
            for factor, unit in ((2, "fp16"), (4, "fp32")):
                if M_star - 4 * d <= got / factor < M_star + 4 * d:
                    hint = f": that is bytes in {unit}; M counts elements"
            fb.fail(f"{name}: at M = {got:g} FlashAttention-2's order moves {flash:,} "
                    f"elements, {verdict} than standard attention's {std:,}{hint}")
            return


#: Library functions that combine split-KV shares (refused in :func:`check_split_kv_combine`).
COMBINES = ("flashlib.fast.decoding.decode_attention",
            "flashlib.fast.paged.paged_decode_attention",
            "flashlib.algorithms.split_kv_decode", "flashlib.algorithms.paged_kv_decode")


def _shares(n_q: int, N: int, d: int, splits: int, spread: float, empty: tuple[int, ...],
            seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split-KV shares of ``n_q`` decoding queries over N keys: each share's normalised output
    O_s (splits, n_q, d) and logsumexp L_s (splits, n_q) (-inf, O_s = 0 for the shares in
    ``empty``, which see no key), and the whole cache's O and L (float64)."""
    rng = np.random.default_rng(seed)
    s = spread * rng.standard_normal((n_q, N))
    V = rng.standard_normal((N, d))
    size = -(-N // splits)
    visible = np.ones(N, dtype=bool)
    outs, lses = np.zeros((splits, n_q, d)), np.full((splits, n_q), -np.inf)
    for t in range(splits):
        j0, j1 = t * size, min((t + 1) * size, N)
        if t in empty:
            visible[j0:j1] = False
            continue
        m = s[:, j0:j1].max(axis=1, keepdims=True)
        p = np.exp(s[:, j0:j1] - m)
        outs[t] = (p / p.sum(axis=1, keepdims=True)) @ V[j0:j1]
        lses[t] = m[:, 0] + np.log(p.sum(axis=1))
    if visible.any():
        m = s[:, visible].max(axis=1, keepdims=True)
        p = np.exp(s[:, visible] - m)
        o = (p / p.sum(axis=1, keepdims=True)) @ V[visible]
        lse = m[:, 0] + np.log(p.sum(axis=1))
    else:
        o, lse = np.zeros((n_q, d)), np.full(n_q, -np.inf)
    return outs, lses, o, lse


#: (label, n_q, N, d, splits, score spread, shares that see no key) of
#: :func:`check_split_kv_combine`.
COMBINE_CASES = [
    ("4 shares", 2, 1000, 16, 4, 2.0, ()),
    ("7 ragged shares", 3, 997, 8, 7, 1.0, ()),
    ("one share", 2, 50, 4, 1, 1.0, ()),
    ("large scores (L_s near 1000)", 2, 400, 8, 4, 300.0, ()),
    ("a share that sees no key (L_s = -inf)", 2, 400, 8, 4, 1.0, (2,)),
    ("no share sees a key", 1, 40, 4, 2, 1.0, (0, 1)),
]


def _combine_problem(got: Any, outs: np.ndarray, lses: np.ndarray, o: np.ndarray,
                     lse: np.ndarray, caught: list[str]) -> str | None:
    """What is wrong with a learner's (O, L) (None if right)."""
    try:
        got_o, got_l = (np.asarray(x, dtype=np.float64) for x in got)
    except (TypeError, ValueError):
        return f"return the pair (O, L), got {type(got).__name__}"
    if got_o.shape != o.shape or got_l.shape != lse.shape:
        return f"O and L have shapes {got_o.shape}, {got_l.shape}; expected {o.shape}, {lse.shape}"
    if not (np.isfinite(got_o).all() and np.array_equal(np.isneginf(got_l), np.isneginf(lse))
            and not np.isnan(got_l).any()):
        if np.isneginf(lses).any():
            return ("NaN or inf where a share saw no key: its L_s is -inf and its weight "
                    "exp(L_s - L) must be 0 (and with no share at all, O = 0, L = -inf)")
        return ("NaN or inf (" + ("; ".join(caught) or "exp overflowed") + "): weigh the "
                "shares by exp(L_s - L) with L = max_s L_s + log sum_s exp(L_s - max_s L_s)")
    finite = np.isfinite(lse)
    if not np.allclose(got_l[finite], lse[finite], rtol=1e-12, atol=1e-12):
        if np.allclose(got_l, lses.max(axis=0)):
            return "L is the largest L_s; it is their logsumexp: max + log sum_s exp(L_s - max)"
        return (f"L off by up to {float(np.max(np.abs(got_l[finite] - lse[finite]))):.3g}: "
                "L = log sum_s exp(L_s)")
    if not np.allclose(got_o, o, rtol=1e-10, atol=1e-12):
        with np.errstate(all="ignore"):
            seen = np.isfinite(lses)
            mean = (outs * seen[..., None]).sum(axis=0) / np.maximum(seen.sum(axis=0), 1)[
                :, None]
        if np.allclose(got_o, mean):
            return ("O is the plain mean of the shares' outputs; weigh each by exp(L_s - L), "
                    "the share of the softmax mass its keys hold")
        return f"O off by up to {float(np.max(np.abs(got_o - o))):.3g}: O = sum_s exp(L_s - L) O_s"
    if caught:
        return "right values, but " + "; ".join(caught)
    return None


@checker("combining split-KV shares", forbid=names(MERGES, COMBINES))
def check_split_kv_combine(fb: Feedback, fn: Callable[[Any, Any], Any]) -> None:
    """Check ``combine(outs, lses) -> (O, L)``: Flash-Decoding's combine of the split-KV
    shares of decoding queries, each share's normalised output O_s (S, n_q, d_v) and
    logsumexp L_s (S, n_q), into attention over the whole cache (:data:`COMBINE_CASES`)."""
    for seed, (label, n_q, N, d, splits, spread, empty) in enumerate(COMBINE_CASES):
        outs, lses, o, lse = _shares(n_q, N, d, splits, spread, empty, seed)
        name = (f"{label}: {n_q} quer{'ies' if n_q > 1 else 'y'}, {N} keys in {splits} "
                f"share{'s' if splits > 1 else ''}")
        with fb.case(name):
            got, caught = call_learner(fn, outs.copy(), lses.copy())
            problem = _combine_problem(got, outs, lses, o, lse, caught)
            if problem:
                fb.fail(f"{name}: {problem}")
            else:
                fb.ok(f"{name}: equals attention over the whole cache")
