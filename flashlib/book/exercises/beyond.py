"""Checkers for the exercises of the chapter "Beyond FlashAttention-1" (book/beyond.md).

check_split_kv         ``split_kv(q, K, V, n_splits)``: split-KV decoding, merged by logsumexp
check_grouped_query    ``gqa(q, k, v)``: grouped-query attention without copying K and V

Both refuse an answer that lets the library do the exercise (the page imports
``flash_attention`` and ``decode_attention``, which would pass): a ``forbid`` spec over
:data:`LIBRARY_ATTENTION` (:func:`flashlib.book.exercises.forbidding`, which also holds in
the grader's sandbox).
check_kv_grad          ``kv_grad(dk_rep, h_kv)``: the gradient of a K/V head shared by a group
check_paged_decode     ``paged_decode(q, K_cache, V_cache, table, N, n_splits)``: split-KV
                       decoding of one sequence over a paged KV cache, through its block table
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

import flashlib
from flashlib import algorithms, naive_attention
from flashlib.book.exercises import (
    ATTENTION,
    Feedback,
    call_learner,
    checker,
    forbidding,
    names,
    shape_problem,
    variants,
    warned,
)
from flashlib.book.exercises.memory import measure_peak
from flashlib.fast import decoding, paged

__all__ = ["check_split_kv", "check_grouped_query", "check_kv_grad", "check_paged_decode"]


#: The library's attention functions, by the name a learner would import them under: an
#: answer that calls them is refused (:func:`_refusing`).
LIBRARY_ATTENTION = {
    "flash_attention": flashlib.flash_attention,
    "naive_attention": flashlib.naive_attention,
    "standard_attention": algorithms.standard_attention,
    "grouped_query_attention": algorithms.grouped_query_attention,
    "split_kv_decode": algorithms.split_kv_decode,
    "decode_attention": decoding.decode_attention,
    "paged_kv_decode": algorithms.paged_kv_decode,
    "paged_decode_attention": paged.paged_decode_attention,
}
#: The library functions that split and merge for the learner (refused in 11.1 and 11.4).
MERGING = ("split_kv_decode", "decode_attention", "paged_kv_decode", "paged_decode_attention")


def _library_names(*short: str) -> list[str]:
    """The dotted names of the library functions :data:`LIBRARY_ATTENTION` calls ``short``."""
    return [f"{LIBRARY_ATTENTION[n].__module__}.{LIBRARY_ATTENTION[n].__name__}" for n in short]


def _refusing(why: Callable[[str, list], str | None]) -> dict[str, Callable[[list], str | None]]:
    """A ``forbid`` spec over every function of :data:`LIBRARY_ATTENTION`: a call is refused
    with ``why(its short name, the shapes of its arguments)`` unless that is None."""
    return {dotted: functools.partial(why, short)
            for short, dotted in zip(LIBRARY_ATTENTION, _library_names(*LIBRARY_ATTENTION),
                                     strict=True)}


def _split_kv_refusal(n_keys: int, splits: int, short: str, shapes: list) -> str | None:
    """Why a call of the library's ``short`` in split-KV decoding is refused: the ones that
    split and merge, always; the others on all ``n_keys`` keys at once."""
    if short in MERGING:
        return (f"you called {short}, which splits and merges for you: attend over each "
                "share yourself (flash_attention(..., return_lse=True) is allowed) and write "
                "the merge")
    k = shapes[1] if len(shapes) > 1 else None
    if splits > 1 and k is not None and len(k) >= 2 and k[-2] >= n_keys:
        return (f"you called {short} on all {n_keys} keys at once: each split attends over "
                f"its own share of {-(-n_keys // splits)} keys, and your code merges the "
                "shares")
    return None


def _gqa_refusal(short: str, shapes: list) -> str:
    return (f"you called {short}, which does grouped-query attention for you; the exercise "
            "asks for numpy: group the query heads with a reshape and let matmul broadcast k "
            "and v")


def _group_sum_reference(x: np.ndarray, h_kv: int, interleaved: bool = False) -> np.ndarray:
    *lead, h_q, n, c = x.shape
    g = h_q // h_kv
    shape = (*lead, g, h_kv, n, c) if interleaved else (*lead, h_kv, g, n, c)
    return x.reshape(shape).sum(axis=-4 if interleaved else -3)


_LAYOUTS = {"tile": "np.tile / torch's k.repeat (query head h used K/V head h % h_kv)",
            "repeat": "np.repeat / torch's k.repeat_interleave (query head h used K/V head "
                      "h // g)"}
#: Exercise 11.3's variants (flashlib.book.exercises.variants): how K was repeated for the
#: query heads, and the axis of the heads (-3: (..., h, n_k, d); -2: flash-attn's
#: (..., n_k, h, d)).  Variant 0 (the book's): tiled, heads on axis -3.
KV_GRAD_VARIANTS = variants.declare(
    "11.3", [{"layout": layout, "heads_axis": axis}
             for axis in (-3, -2) for layout in ("tile", "repeat")],
    lambda p: f"kv_grad(dk_rep, h_kv) for K repeated with {_LAYOUTS[p['layout']]}, the heads "
              f"on axis {p['heads_axis']}")


@checker("gradient of a shared K/V head")
def check_kv_grad(fb: Feedback, fn: Callable[[np.ndarray, int], np.ndarray]) -> None:
    """Check ``kv_grad(dk_rep, h_kv)``: the gradient of K repeated for each query head (h_q
    heads) as the gradient of the shared K (h_kv heads), for the student's variant
    (:data:`KV_GRAD_VARIANTS`: K repeated by tiling or by repeating each head, the heads on
    axis -3 or -2; the book's: tiled, axis -3)."""
    p = variants.variant("11.3")
    tiled, axis = p["layout"] == "tile", p["heads_axis"]
    rng = np.random.default_rng(0)
    cases = [("8 query heads, 2 K/V heads", (2,), 8, 2), ("multi-query: 6 heads, 1", (), 6, 1),
             ("12 query heads, 3 K/V heads", (1, 2), 12, 3), ("4 and 4: nothing shared", (), 4, 4)]

    def grouped(x: np.ndarray, interleaved: bool) -> np.ndarray:
        out = _group_sum_reference(np.moveaxis(x, axis, -3), h_kv, interleaved)
        return np.moveaxis(out, -3, axis)

    for name, lead, h_q, h_kv in cases:
        with fb.case(name):
            x = np.moveaxis(rng.standard_normal((*lead, h_q, 5, 3)), -3, axis)
            got, _ = call_learner(fn, x.copy(), h_kv)
            want = grouped(x, tiled)
            problem = shape_problem(got, want.shape)
            g = h_q // h_kv
            heads = np.moveaxis(x, axis, -3)
            if problem:
                fb.fail(f"{name}: {problem} (the heads are on axis {axis})")
            elif np.allclose(got, want, rtol=1e-12, atol=1e-12):
                fb.ok(f"{name}: correct")
            elif g > 1 and np.allclose(got, want / g, atol=1e-12):
                fb.fail(f"{name}: you averaged over the group: each query head adds its own "
                        "contribution to the shared K, so the gradients add up (sum, not mean)")
            elif 1 < h_kv < h_q and np.allclose(got, grouped(x, not tiled), atol=1e-12):
                fb.fail(f"{name}: you summed the wrong heads: K was repeated with "
                        f"{_LAYOUTS[p['layout']]}, so a group is "
                        + ("heads h, h + h_kv, h + 2 h_kv, ..." if tiled else
                           "g consecutive heads"))
            elif g > 1 and any(np.allclose(got, np.moveaxis(first, -3, axis), atol=1e-12)
                               for first in (heads[..., :h_kv, :, :],
                                             heads[..., ::g, :, :])):
                fb.fail(f"{name}: you kept one query head's gradient per group; add them all")
            else:
                fb.fail(f"{name}: max |error| = {np.max(np.abs(np.asarray(got) - want)):.2g}")


def _decode_problem(seed: int, n_q: int, n: int, d: int, d_v: int, logit: float = 1.0
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_q, d))
    k = rng.standard_normal((n, d))
    # the larger scores in the last keys, so that the splits' maxima differ
    k[n // 2:] *= 2.0
    q *= logit
    return q, k, rng.standard_normal((n, d_v))


@checker("split-KV decoding", forbid=names("flashlib.studies.beyond.split_kv_tree"))
def check_split_kv(fb: Feedback, fn: Callable[..., np.ndarray]) -> None:
    """Check ``split_kv(q, K, V, n_splits)`` -> attention of q (n_q, d) over K (N, d), V (N, d_v)
    computed on ``n_splits`` shares of the keys and merged with the logsumexps."""
    cases = [
        ("one query row, N = 1000 keys in 4 splits", 4, (0, 1, 1000, 16, 8, 1.0)),
        ("N = 1000 in 7 splits (the last one shorter)", 7, (1, 1, 1000, 16, 8, 1.0)),
        ("4 query rows, N = 37 in 37 splits of one key", 37, (2, 4, 37, 8, 3, 1.0)),
        ("one split: plain attention", 1, (3, 1, 50, 8, 8, 1.0)),
        ("scores near 2000 (exp(L_s) overflows)", 5, (4, 2, 300, 16, 8, 200.0)),
    ]
    for name, splits, args in cases:
        with fb.case(name):
            q, k, v = _decode_problem(*args)
            refusal = functools.partial(_split_kv_refusal, len(k), splits)
            with forbidding(_refusing(refusal)):
                got, warns = call_learner(fn, q.copy(), k.copy(), v.copy(), splits)
            want = naive_attention(q, k, v)
            problem = shape_problem(got, want.shape)
            if problem:
                fb.fail(f"{name}: {problem}")
                continue
            got = np.asarray(got, dtype=np.float64)
            size = -(-len(k) // splits)
            outs = [naive_attention(q, k[s:s + size], v[s:s + size])
                    for s in range(0, len(k), size)]
            if not np.isfinite(got).all():
                fb.fail(f"{name}: the result holds NaN or inf: weight each O_s by "
                        "exp(L_s - L), L the logsumexp of the L_s, never exp(L_s) alone")
            elif np.allclose(got, want, rtol=1e-9, atol=1e-12):
                if warns:
                    fb.fail(f"{name}: right answer, but {warned(warns[0])}")
                else:
                    fb.ok(f"{name}: equals attention over all the keys")
            elif splits > 1 and np.allclose(got, np.mean(outs, axis=0), atol=1e-9):
                fb.fail(f"{name}: you averaged the splits' outputs: a split whose keys score "
                        "higher must weigh more; weight O_s by exp(L_s - L)")
            elif splits > 1 and np.allclose(got, outs[-1], atol=1e-9):
                fb.fail(f"{name}: you returned the last split's output: merge all of them")
            else:
                fb.fail(f"{name}: max |error| = {np.max(np.abs(got - want)):.2g}: "
                        "O = sum_s exp(L_s - L) O_s with L = logsumexp over s of L_s")


def _gqa_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, interleaved: bool = False
                   ) -> np.ndarray:
    h_q, h_kv = q.shape[-3], k.shape[-3]
    heads = np.arange(h_q) % h_kv if interleaved else np.arange(h_q) // (h_q // h_kv)
    return naive_attention(q, np.take(k, heads, axis=-3), np.take(v, heads, axis=-3))


@checker("grouped-query attention", forbid=names(ATTENTION) | _refusing(_gqa_refusal))
def check_grouped_query(fb: Feedback, fn: Callable[..., np.ndarray]) -> None:
    """Check ``gqa(q, k, v)``: q (..., h_q, n_q, d), k (..., h_kv, n_k, d), v (..., h_kv, n_k,
    d_v) -> (..., h_q, n_q, d_v), query head h with K/V head h // (h_q // h_kv), and without a
    copy of K and V per query head."""
    rng = np.random.default_rng(0)
    cases = [
        ("8 query heads, 2 K/V heads", (2,), 8, 2, 5, 7, 4, 3),
        ("multi-query: 6 query heads, 1 K/V head", (), 6, 1, 3, 9, 8, 8),
        ("4 and 4 heads: ordinary multi-head attention", (1,), 4, 4, 6, 5, 4, 2),
        ("12 query heads, 3 K/V heads, one query row", (2,), 12, 3, 1, 11, 4, 4),
    ]
    for name, lead, h_q, h_kv, n_q, n_k, d, d_v in cases:
        with fb.case(name):
            q = rng.standard_normal((*lead, h_q, n_q, d))
            k = rng.standard_normal((*lead, h_kv, n_k, d))
            v = rng.standard_normal((*lead, h_kv, n_k, d_v))
            got, warns = call_learner(fn, q, k, v)
            want = _gqa_reference(q, k, v)
            problem = shape_problem(got, want.shape)
            if problem:
                fb.fail(f"{name}: {problem}")
            elif np.allclose(got, want, rtol=1e-9, atol=1e-12):
                fb.ok(f"{name}: correct")
            elif 1 < h_kv < h_q and np.allclose(got, _gqa_reference(q, k, v, True), atol=1e-9):
                fb.fail(f"{name}: query head h used K/V head h % h_kv (np.tile order); the "
                        "heads of a group are consecutive: K/V head h // (h_q // h_kv)")
            else:
                fb.fail(f"{name}: max |error| = {np.max(np.abs(np.asarray(got) - want)):.2g}")
    if fb.problems:
        return
    name = "16 query heads on 1 K/V head of 4096 keys: memory"
    with fb.case(name):
        q = rng.standard_normal((16, 2, 64))
        k, v = rng.standard_normal((1, 4096, 64)), rng.standard_normal((1, 4096, 64))
        (_, warns), peak = measure_peak(call_learner, fn, q, k, v)
        repeated = 16 * (k.nbytes + v.nbytes)
        if peak >= repeated / 2:
            fb.fail(f"{name}: your function allocated {peak / 2**20:.1f} MiB, as much as K and "
                    f"V repeated for every query head ({repeated / 2**20:.1f} MiB): reshape q "
                    "to (..., h_kv, g, n_q, d) so that matmul broadcasts k over the group")
        else:
            fb.ok(f"{name}: {peak / 2**20:.1f} MiB, no copy of K and V per query head")


def _paged_refusal(n_keys: int, runs: int, short: str, shapes: list) -> str | None:
    """Why a library call in paged decoding is refused: the ones that split and merge (or
    read the pages) for the learner, always; the others on all ``n_keys`` keys at once when
    the sequence has several runs of pages."""
    if short in MERGING:
        return (f"you called {short}, which reads the pages and merges for you: gather each "
                "run of pages through the table yourself and write the merge")
    k = shapes[1] if len(shapes) > 1 else None
    if runs > 1 and k is not None and len(k) >= 2 and k[-2] >= n_keys:
        return (f"you called {short} on all {n_keys} keys at once: each split attends over "
                "its own run of pages, and your code merges the runs")
    return None


def _paged_problem(seed: int, n_q: int, N: int, P: int, d: int, d_v: int, spare: int,
                   logit: float = 1.0) -> tuple[np.ndarray, ...]:
    """q, a pool of pages (every page different), and a table: the sequence's T pages in a
    shuffled order that is never the identity, then ``spare`` entries of padding (-1)."""
    rng = np.random.default_rng(seed)
    T = -(-N // P)
    n_pages = T + 3
    K_cache = rng.standard_normal((n_pages, P, d))
    K_cache[n_pages // 2:] *= 2.0  # some pages score higher: the runs' L_s differ
    V_cache = rng.standard_normal((n_pages, P, d_v))
    order = rng.permutation(n_pages)
    while np.array_equal(order[:T], np.arange(T)):
        order = rng.permutation(n_pages)
    table = np.concatenate([order[:T], np.full(spare, -1)])
    q = logit * rng.standard_normal((n_q, d))
    return q, K_cache, V_cache, table


def _keys(cache: np.ndarray, pages: np.ndarray, rows: int | None) -> np.ndarray:
    """The rows of ``pages`` of the pool, one after the other, the first ``rows`` of them."""
    return cache[pages].reshape(-1, cache.shape[-1])[:rows]


def _paged_mistake(got: np.ndarray, q: np.ndarray, K_cache: np.ndarray, V_cache: np.ndarray,
                   table: np.ndarray, N: int, per_split: int) -> str | None:
    """What a wrong ``got`` of paged decoding computed, when it is a usual mistake: pages read
    by logical block, the last page counted as full, the table's padding read, the runs
    averaged without their logsumexps."""
    P = K_cache.shape[1]
    T = -(-N // P)
    pages = table[:T]

    def over(ids: np.ndarray, rows: int | None) -> np.ndarray:
        K, V = (_keys(c, ids, None)[:rows] for c in (K_cache, V_cache))
        return naive_attention(q, K, V)

    def close(x: np.ndarray) -> bool:
        return bool(np.allclose(got, x, rtol=1e-9, atol=1e-12))

    runs = [over(pages[s:s + per_split], min(N, (s + per_split) * P) - s * P)
            for s in range(0, T, per_split)]
    if close(over(np.arange(T), N)):
        return ("you read page t of the pool for block t of the sequence: block t is page "
                "table[t]; read the pages through the table")
    if N % P and close(over(pages, None)):
        return (f"you counted the last page as full: it holds only N - (T - 1) P = "
                f"{N - (T - 1) * P} keys; the rest of its {P} rows are not the sequence's")
    if len(table) > T and close(over(table, None)):
        return (f"you read every entry of the table: those past the sequence's T = {T} pages "
                "are padding (-1), and numpy reads page -1 as the last page of the pool; use "
                "the first ceil(N / P) entries")
    if len(runs) > 1 and close(np.mean(runs, axis=0)):
        return ("you averaged the runs' outputs, without their logsumexps: a run whose keys "
                "score higher must weigh more; weight O_s by exp(L_s - L)")
    return None


@checker("paged split-KV decoding")
def check_paged_decode(fb: Feedback, fn: Callable[..., tuple[np.ndarray, np.ndarray]]) -> None:
    """Check ``paged_decode(q, K_cache, V_cache, table, N, n_splits) -> (O, L)``: q (n_q, d)
    over the N keys of one sequence, key j in row j % P of page table[j // P] of K_cache
    (n_pages, P, d) and V_cache (n_pages, P, d_v), the T = ceil(N / P) table entries cut into
    runs of ceil(T / n_splits) pages, each attended on its own and merged with the
    logsumexps; L (n_q,) the logsumexp of each query's N scaled scores (what a further merge
    needs: another cache's result, a shared prefix)."""
    cases = [
        ("N = 37 keys in pages of 8 (the last holds 5), 2 splits", 2, (0, 3, 37, 8, 16, 8, 2)),
        ("N = 64 in 8 full pages of 8, 3 splits", 3, (1, 1, 64, 8, 16, 8, 1)),
        ("N = 5 in one page of 16, 1 split", 1, (2, 1, 5, 16, 8, 8, 3)),
        ("pages of one key: N = 9, 4 splits", 4, (3, 2, 9, 1, 8, 4, 0)),
        ("scores near 2000 (exp(L_s) overflows), N = 100, pages of 16, 3 splits", 3,
         (4, 1, 100, 16, 16, 8, 1, 200.0)),
    ]
    for name, splits, args in cases:
        with fb.case(name):
            q, K_cache, V_cache, table = _paged_problem(*args)
            N, P = args[2], args[3]
            T = -(-N // P)
            per_split = -(-T // splits)
            runs = -(-T // per_split)
            refusal = functools.partial(_paged_refusal, N, runs)
            with forbidding(_refusing(refusal)):
                got, warns = call_learner(fn, q.copy(), K_cache.copy(), V_cache.copy(),
                                          table.copy(), N, splits)
            pages = table[:T]
            K_seq = _keys(K_cache, pages, N)
            want = naive_attention(q, K_seq, _keys(V_cache, pages, N))
            if not (isinstance(got, tuple) and len(got) == 2):
                fb.fail(f"{name}: return the pair (O, L): O (n_q, d_v) and L (n_q,), the "
                        "logsumexp of each query's N scores (the merge's L), which a "
                        "further merge needs; got " + type(got).__name__)
                continue
            got, got_L = got
            scores = (np.asarray(q, np.float64) @ K_seq.T) / np.sqrt(q.shape[1])
            want_L = np.logaddexp.reduce(scores, axis=1)
            problem = shape_problem(got, want.shape)
            if problem:
                fb.fail(f"{name}: {problem}")
                continue
            got = np.asarray(got, dtype=np.float64)
            if not np.isfinite(got).all():
                fb.fail(f"{name}: the result holds NaN or inf: weight each run's O_s by "
                        "exp(L_s - L), L the logsumexp of the L_s, never exp(L_s) alone")
            elif np.allclose(got, want, rtol=1e-9, atol=1e-12):
                if warns:
                    fb.fail(f"{name}: right answer, but {warned(warns[0])}")
                elif problem_L := shape_problem(got_L, want_L.shape):
                    fb.fail(f"{name}: O is right; L: {problem_L}")
                elif not np.allclose(np.asarray(got_L, np.float64), want_L, rtol=1e-9,
                                     atol=1e-9):
                    fb.fail(f"{name}: O is right, but L is off by up to "
                            f"{np.max(np.abs(np.asarray(got_L, np.float64) - want_L)):.2g}: "
                            "L = log sum_s exp(L_s), the logsumexp of the runs' L_s "
                            "(np.logaddexp.reduce), in natural log")
                else:
                    fb.ok(f"{name}: O equals attention over the sequence's keys, contiguous, "
                          "and L their logsumexp")
            elif (why := _paged_mistake(got, q, K_cache, V_cache, table, N, per_split)):
                fb.fail(f"{name}: {why}")
            else:
                fb.fail(f"{name}: max |error| = {np.max(np.abs(got - want)):.2g}: attend "
                        "over the first N rows of pages table[0], ..., table[T - 1], in runs "
                        "of ceil(T / n_splits) pages, merged by O = sum_s exp(L_s - L) O_s")
