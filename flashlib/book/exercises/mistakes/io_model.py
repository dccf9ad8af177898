"""The HBM IO model's declared mistakes (flashlib.book.exercises.io_model)."""

from __future__ import annotations

import functools

import numpy as np

from flashlib.book.exercises.io_model import (
    CROSSOVER_PROBLEM,
    STANDARD_PROBLEM,
    check_crossover,
    check_io_count,
    check_split_kv_combine,
    check_standard_count,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes, learner_copy
from flashlib.studies import io_model

# ---- 9.1 Algorithm 0's count -----------------------------------------------------------------

_Nq, _Nk, _d, _dv = (STANDARD_PROBLEM[k] for k in ("N_q", "N_k", "d", "d_v"))
_S, _QKVO = _Nq * _Nk, _Nq * _d + _Nk * _d + _Nk * _dv + _Nq * _dv


def no_s_term(N_q, N_k, d, d_v):
    return N_q * d + N_k * d + N_k * d_v + N_q * d_v


def self_attention(N_q, N_k, d, d_v):
    return 4 * N_q * N_q + 4 * N_q * d


def d_for_d_v(N_q, N_k, d, d_v):
    return 4 * N_q * N_k + 2 * N_q * d + 2 * N_k * d


declare_mistakes(
    check_standard_count,
    Mistake("two N_q N_k transfers", (2 * _S + _QKVO,), ("four N_q N_k transfers",)),
    Mistake("no N_q N_k term", (no_s_term,), ("no N_q N_k term",)),
    Mistake("three N_q N_k transfers", (3 * _S + _QKVO,), ("one of the four N_q N_k",)),
    Mistake("the page's 4N^2 + 4Nd", (self_attention,), ("self-attention's 4N^2 + 4Nd",)),
    Mistake("d for d_v", (d_for_d_v,), ("V has d_v columns",)),
    Mistake("the reads only", (2 * _S + _QKVO - _Nq * _dv,), ("the reads only",)),
    Mistake("bytes in fp16", (2 * (4 * _S + _QKVO),), ("bytes in fp16",)),
    Mistake("a guess", (12345,), ("go line by line",)),
    Mistake("words", ("lots",), ("give a number",)),
    Mistake("None", (None,), ("not attempted yet",)),
)


# ---- 9.2 the tiled algorithms' counts --------------------------------------------------------

def _io_count(N, d, B_r, B_c, order, *, init=True, lm=True, ceil=True, reads_only=False):
    T_r = -(-N // B_r) if ceil else N // B_r
    T_c = -(-N // B_c) if ceil else N // B_c
    if order == "v1":
        reads = 2 * N * d + T_c * N * (2 * d + (2 if lm else 0))
        writes = T_c * N * (d + (2 if lm else 0)) + (N * (d + (2 if lm else 0)) if init else 0)
    else:
        reads = N * d + T_r * 2 * N * d
        writes = N * d + N
    return reads if reads_only else reads + writes


def _count(**mistake):
    return functools.partial(_io_count, **mistake)


def no_lm(N, d, r, c, o):
    return _io_count(N, d, r, c, o, lm=False, init=o == "v1")


def the_other_order(N, d, r, c, o):
    return _io_count(N, d, r, c, "v2" if o == "v1" else "v1")


def fp16_bytes(N, d, r, c, o):
    return 2 * _io_count(N, d, r, c, o)


def seven(N, d, r, c, o):
    return 7


def words(N, d, r, c, o):
    return "a lot"


def no_L(N, d, r, c, o):
    return _io_count(N, d, r, c, o) - (N if o == "v2" else 0)


declare_mistakes(
    check_io_count,
    Mistake("O not initialised", (_count(init=False),), ("initialised in HBM first",)),
    Mistake("l and m not moved", (no_lm,), ("l and m move too",)),
    Mistake("floor(N / B)", (_count(ceil=False),), ("the last, shorter one counts",)),
    Mistake("the other order", (the_other_order,), ("the other order",)),
    Mistake("the reads only", (_count(reads_only=True),), ("the reads only",)),
    Mistake("bytes in fp16", (fp16_bytes,), ("bytes in fp16",)),
    Mistake("a number", (seven,), ("the counting memory moved",)),
    Mistake("words", (words,), ("return a number",)),
    # the chapter's own function (it counts by running a tiled loop): not an answer
    Mistake("the chapter's io_count", (io_model.io_count,), ("your function raised",)),
    Mistake("no L written", (no_L,), ("L is written too",)),
)


# ---- 9.3 the crossover -----------------------------------------------------------------------

_N, _d = CROSSOVER_PROBLEM["N"], CROSSOVER_PROBLEM["d"]
_M_STAR = io_model.crossover_M(_N, _d, "v2")
# a learner's copy: the library's own crossover_M is refused in this exercise
_crossover_M = learner_copy(io_model.crossover_M)


def d_squared(N, d):
    return d * d


def fp32_bytes(N, d):
    return 4 * _crossover_M(N, d, "v2")


declare_mistakes(
    check_crossover,
    Mistake("too small", (_d * _d,), ("more than standard attention",)),
    Mistake("too large", (8 * _d * _d,), ("fewer than standard attention",)),
    Mistake("d^2 as a function", (d_squared,), ("N = 1024, d = 64: at M = 4096",)),
    Mistake("bytes in fp16", (2 * _M_STAR,), ("bytes in fp16",)),
    Mistake("bytes in fp32", (fp32_bytes,), ("bytes in fp32",)),
    # the threshold the chapter prints, Algorithm 1's, and the function it imports
    Mistake("Algorithm 1's threshold", (io_model.crossover_M(_N, _d),),
            ("Algorithm 1's threshold",)),
    Mistake("the chapter's crossover_M", (io_model.crossover_M,), ("Algorithm 1's threshold",)),
    Mistake("negative", (-3,), ("positive number",)),
    Mistake("a word", ("big",), ("positive number",)),
    Mistake("None", (None,), ("not attempted yet",)),
)


# ---- 9.4 combining split-KV shares (Flash-Decoding) ------------------------------------------

def _weights(lses):
    m = lses.max(axis=0)
    ref = np.where(np.isneginf(m), 0.0, m)
    return np.exp(lses - ref), ref


def plain_mean(outs, lses):
    w, ref = _weights(lses)
    l = w.sum(axis=0)  # noqa: E741
    seen = np.isfinite(lses)
    O = (outs * seen[..., None]).sum(axis=0) / np.maximum(seen.sum(axis=0), 1)[:, None]
    return O, ref + np.log(np.where(l > 0, l, 1)) - np.where(l > 0, 0, np.inf)


def l_is_the_max(outs, lses):
    w, ref = _weights(lses)
    l = w.sum(axis=0)  # noqa: E741
    O = (w[..., None] * outs).sum(axis=0) / np.where(l > 0, l, 1)[:, None]
    return O, lses.max(axis=0)


def no_max_subtracted(outs, lses):
    w = np.exp(lses)  # overflows for L_s past 709
    l = w.sum(axis=0)  # noqa: E741
    return (w[..., None] * outs).sum(axis=0) / l[:, None], np.log(l)


def empty_gives_nan(outs, lses):
    m = lses.max(axis=0)  # -inf where no share saw a key: -inf - -inf is NaN
    w = np.exp(lses - m)
    l = w.sum(axis=0)  # noqa: E741
    return (w[..., None] * outs).sum(axis=0) / l[:, None], m + np.log(l)


declare_mistakes(
    check_split_kv_combine,
    Mistake("a plain mean of the shares", (plain_mean,), ("plain mean of the shares",)),
    Mistake("L the largest L_s", (l_is_the_max,), ("L is the largest L_s",)),
    Mistake("no maximum subtracted", (no_max_subtracted,), ("exp(L_s - L)",)),
    Mistake("NaN with no key at all", (empty_gives_nan,), ("saw no key",)),
)
