"""The fast paths' performance machinery keeps the numerics exact: threads (the threaded result
equals the single-threaded one bit for bit, or to rounding where the backward splits key
blocks), the worker count (the BLAS limit threadpoolctl reports; 1 without threadpoolctl or
threads), and large logits (up to 30x the usual scale, where the clamp and the moved maxima
take over) against the float64 reference."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from flashlib import flash_attention, flash_attention_backward
from flashlib.core import threads as _threads
from flashlib.fast.forward import STALE_LIMIT
from flashlib.fast.tiles import exp_floor as _exp_floor
from flashlib.studies.ladder import RUNGS, THREADS_RUNG, rung10_threads
from tests.helpers import (
    error_floor,
    logits,
    make_mask,
    make_qkv,
    max_err,
    plain_attention,
    plain_attention_backward,
    reference_attention,
    torch_grads,
)

threadpoolctl = pytest.importorskip("threadpoolctl")

# lead, n_q, n_k, d, d_v, block_q, block_k, causal, mask kind
SHAPES = {
    "heads": ((6,), 70, 90, 8, 8, 16, 16, False, None),
    "batch_heads_causal": ((2, 3), 64, 64, 8, 4, 8, 16, True, None),
    "bottom_right_nq_gt_nk": ((3,), 50, 30, 8, 8, 8, 8, "bottom_right", None),
    "one_head": ((), 100, 80, 16, 16, 16, 8, False, None),
    "one_head_causal": ((), 100, 100, 16, 16, 16, 8, True, None),
    "mask_empty_rows": ((4,), 40, 50, 8, 8, 8, 8, False, "random"),
    "padding_causal": ((2, 3), 33, 41, 8, 8, 8, 8, True, "batch_padding"),
}


@pytest.fixture
def threaded(monkeypatch):
    """Every call threaded: 3 workers (more than this machine may have cores, which is fine
    for correctness), whatever the problem size."""
    monkeypatch.setattr(_threads, "MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr(_threads, "MIN_THREAD_TILE", 0)
    monkeypatch.setattr(_threads, "worker_count", lambda: 3)


def _problem(case, dtype, rng, logit_scale=1.0):
    lead, n_q, n_k, d, d_v, bq, bk, causal, mask_kind = SHAPES[case]
    q, k, v = make_qkv(rng, lead, n_q, n_k, d, d_v, dtype=np.float64)
    q = (q * logit_scale).astype(dtype)
    k, v = k.astype(dtype), v.astype(dtype)
    do = rng.standard_normal((*lead, n_q, d_v)).astype(dtype)
    kw = dict(causal=causal, mask=make_mask(rng, mask_kind, lead, n_q, n_k), block_q=bq,
              block_k=bk)
    return q, k, v, do, kw


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("case", SHAPES)
def test_threaded_forward_equals_single_threaded_bit_for_bit(case, dtype, rng, monkeypatch):
    q, k, v, _, kw = _problem(case, dtype, rng)
    one = flash_attention(q, k, v, return_lse=True, **kw)
    monkeypatch.setattr(_threads, "MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr(_threads, "MIN_THREAD_TILE", 0)
    monkeypatch.setattr(_threads, "worker_count", lambda: 3)
    many = flash_attention(q, k, v, return_lse=True, **kw)
    for a, b in zip(one, many, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("case", SHAPES)
def test_threaded_backward_equals_single_threaded(case, dtype, rng, monkeypatch):
    """Bit for bit when the threads split the heads; to rounding when there are fewer heads
    than threads and they split the key blocks (each part sums its own dQ)."""
    q, k, v, do, kw = _problem(case, dtype, rng)
    o, lse = flash_attention(q, k, v, return_lse=True, **kw)
    one = flash_attention_backward(q, k, v, o, lse, do, **kw)
    monkeypatch.setattr(_threads, "MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr(_threads, "MIN_THREAD_TILE", 0)
    monkeypatch.setattr(_threads, "worker_count", lambda: 3)
    many = flash_attention_backward(q, k, v, o, lse, do, **kw)
    heads = int(np.prod(q.shape[:-2]))
    for name, a, b in zip(("dq", "dk", "dv"), one, many, strict=True):
        if heads >= 3 or name != "dq":  # 3 workers
            np.testing.assert_array_equal(a, b, name)
        else:  # dQ summed over 2 or 3 parts of the key blocks: another rounding
            eps = float(np.finfo(a.dtype).eps)
            scale = max(1.0, float(np.max(np.abs(a.astype(np.float64)))))
            assert max_err(a, b) <= 64 * eps * scale, name


def test_threads_split_the_work(threaded, rng):
    """The items really run on several threads (each calls setup once).  A forward item is a
    group of up to GROUP_TILES query blocks: 1024 rows in 32-row blocks are 4 items."""
    calls = []
    real = _threads.run_items

    def spying(work, items, workers, setup):
        def counted():
            calls.append(1)
            return setup()
        return real(work, items, workers, counted)

    q, k, v = (rng.standard_normal((4, 1024, 16)) for _ in range(3))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_threads, "run_items", spying)
        flash_attention(q, k, v, block_q=32, block_k=32)
        assert len(calls) == 3
        o, lse = flash_attention(q, k, v, return_lse=True)
        flash_attention_backward(q, k, v, o, lse, o)
        assert len(calls) > 4


def test_worker_count_follows_the_blas_limit():
    cores = __import__("os").cpu_count() or 1
    with threadpoolctl.threadpool_limits(1):
        assert _threads.worker_count() == 1
    with threadpoolctl.threadpool_limits(2):
        assert _threads.worker_count() == min(2, cores)
    with threadpoolctl.threadpool_limits(1):  # and the workers follow it
        assert _threads.workers_for(1e12, 100) == 1


def test_without_threadpoolctl_or_threads_one_worker(monkeypatch):
    monkeypatch.setattr(_threads, "_BLAS", None)  # as if threadpoolctl were not installed
    assert _threads.worker_count() == 1
    monkeypatch.undo()
    monkeypatch.setattr(sys, "platform", "emscripten")  # Pyodide: no threads
    assert _threads.worker_count() == 1


def test_small_problems_and_small_tiles_stay_on_one_thread(monkeypatch):
    monkeypatch.setattr(_threads, "worker_count", lambda: 8)
    assert _threads.workers_for(_threads.MIN_PARALLEL_WORK - 1, 100) == 1
    assert _threads.workers_for(_threads.MIN_PARALLEL_WORK, 100) == 8
    assert _threads.workers_for(_threads.MIN_PARALLEL_WORK, 3) == 3
    big = _threads.MIN_PARALLEL_WORK
    assert _threads.workers_for(big, 100, tile=_threads.MIN_THREAD_TILE - 1) == 1
    assert _threads.workers_for(big, 100, tile=_threads.MIN_THREAD_TILE) == 8


def test_small_tiles_of_one_head_are_not_threaded(monkeypatch):
    """One head's group of small tiles is too small for threads to pay (the GIL): one worker,
    not several.  A group of default tiles (GROUP_TILES query blocks of a head) is large
    enough, as are 8 heads."""
    calls = []
    real = _threads.run_items

    def spying(work, items, workers, setup):
        calls.append(workers)
        return real(work, items, workers, setup)

    monkeypatch.setattr(_threads, "worker_count", lambda: 2)
    monkeypatch.setattr(_threads, "run_items", spying)
    q = np.random.default_rng(0).standard_normal((1, 2048, 64))
    o, lse = flash_attention(q, q, q, return_lse=True, block_q=32, block_k=32)
    flash_attention_backward(q, q, q, o, lse, o, block_q=32, block_k=32)
    flash_attention(q, q, q)  # 2 groups of GROUP_TILES default query blocks
    q8 = np.random.default_rng(0).standard_normal((8, 1024, 64))
    flash_attention(q8, q8, q8, block_q=32, block_k=32)
    assert calls == [1, 1, 2, 2]


def test_blas_is_held_at_one_thread_inside_the_workers_and_restored():
    """BLAS runs on one thread inside the workers; the caller's limit is what worker_count
    reads meanwhile (tests/core/test_threads.py: several calls at once)."""
    seen = []
    libs = _threads._blas_controller().lib_controllers

    def work(state, item):
        seen.append((min(lib.num_threads for lib in libs), _threads.worker_count()))

    with threadpoolctl.threadpool_limits(2):
        before = _threads.worker_count()
        _threads.run_items(work, list(range(6)), 2, lambda: None)
        assert _threads.worker_count() == before
    assert seen == [(1, before)] * 6


def test_run_items_reraises_a_worker_error_and_keeps_numpy_errstate():
    def work(state, item):
        if item == 3:
            raise KeyError("item 3")
        np.exp(np.float32(1000))  # overflow: silent under the caller's errstate, else an error

    with np.errstate(over="ignore"), pytest.raises(KeyError, match="item 3"):
        _threads.run_items(work, list(range(8)), 3, lambda: None)
    with np.errstate(over="ignore"):
        _threads.run_items(lambda s, i: np.exp(np.float32(1000)), list(range(8)), 3,
                           lambda: None)


def test_threads_rung_equals_the_library(rng):
    q, k, v = (rng.standard_normal((3, 200, 8)).astype(np.float32) for _ in range(3))
    for causal in (False, True):
        want = flash_attention(q, k, v, causal=causal)
        np.testing.assert_array_equal(rung10_threads(q, k, v, causal=causal, workers=2), want)
        np.testing.assert_array_equal(rung10_threads(q, k, v, causal=causal), want)
    assert THREADS_RUNG[1] is rung10_threads
    with pytest.raises(ValueError, match="workers"):
        rung10_threads(q, k, v, workers=0)


# ---- large logits: the clamp at 2**-63 and the moved maxima keep the results exact ----------

SCALES = [1.0, 3.0, 10.0, 30.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("logit_scale", SCALES)
def test_large_logits_forward_against_float64(logit_scale, causal, dtype, rng):
    """q * 30 gives scores of standard deviation about 30: most of S - m_i lies far below
    float32 exp2's normal range.  flash stays within twice plain attention's error (the
    logits' own rounding dominates at that scale), as do the ladder's last rungs."""
    q, k, v = (rng.standard_normal((3, 160, 32)) for _ in range(3))
    q = q * logit_scale
    s = logits(q, k)
    gap = (s.max(axis=-1, keepdims=True) - s) * np.log2(np.e)  # -(S - max), base 2
    below = np.mean(gap > -float(_exp_floor(np.dtype(np.float32), np.exp2)))
    assert below > {1.0: -1, 3.0: -1, 10.0: 0.03, 30.0: 0.5}[logit_scale]  # reaches the floor
    ref, ref_lse = reference_attention(q, k, v, causal=causal)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    o, lse = flash_attention(q, k, v, causal=causal, block_q=32, block_k=16, return_lse=True)
    if dtype == np.float64:
        tol = 1e-13 * max(1.0, float(np.max(np.abs(s))))
        assert max_err(o, ref) <= tol and max_err(lse, ref_lse) <= tol
    else:
        plain = max_err(plain_attention(q, k, v, causal=causal), ref)
        assert max_err(o, ref) <= max(2 * plain, error_floor(dtype, ref, np.abs(s).max()))
    for label, fn in RUNGS[-3:]:
        got = fn(q, k, v, causal=causal, block_q=32, block_k=16)
        assert max_err(got, o) <= 4 * float(np.finfo(dtype).eps) * max(
            1.0, float(np.abs(s).max())), label


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("logit_scale", SCALES)
def test_large_logits_backward_against_float64(logit_scale, causal, rng):
    q, k, v, do = (rng.standard_normal((2, 96, 16)) for _ in range(4))
    q = q * logit_scale
    want = torch_grads(q, k, v, do, causal=causal)[1:]
    s_max = float(np.abs(logits(q, k)).max())
    o, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    got = flash_attention_backward(q, k, v, o, lse, do, causal=causal, block_q=32, block_k=16)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert max_err(g, w) <= 1e-12 * max(1.0, s_max) * max(1.0, np.abs(w).max()), name
    q32, k32, v32, do32 = (x.astype(np.float32) for x in (q, k, v, do))
    o32, lse32 = flash_attention(q32, k32, v32, causal=causal, return_lse=True)
    got32 = flash_attention_backward(q32, k32, v32, o32, lse32, do32, causal=causal)
    plain = plain_attention_backward(q32, k32, v32, do32, causal=causal)
    for name, g, pl, w in zip(("dq", "dk", "dv"), got32, plain, want, strict=True):
        bound = max(2 * max_err(pl, w), error_floor(np.float32, w, s_max))
        assert max_err(g, w) <= bound, name


def test_keys_no_query_sees_keep_exactly_zero_gradients_at_large_logits():
    """The backward flushes what it clamps: a key whose every P is below 2**-63 gets dK = dV
    = 0 exactly, not 2**-63 times something."""
    q = np.array([[30.0, 0.0], [0.0, 30.0]], np.float32)
    k = np.array([[30.0, 0.0], [0.0, 30.0], [-30.0, -30.0]], np.float32)
    v = np.ones((3, 2), np.float32)
    o, lse = flash_attention(q, k, v, scale=1.0, return_lse=True)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, np.ones((2, 2), np.float32),
                                          scale=1.0)
    assert np.all(dv[2] == 0) and np.all(dk[2] == 0)


def test_the_stale_limit_path_moves_the_maximum_without_redoing_tiles(rng, monkeypatch):
    """Growing scores make some row sums exceed STALE_LIMIT while staying finite: the fast step
    moves m_i up (no exact step, which is where a tile's row maximum is taken; the first tile
    takes its maximum on S^T in the first step)."""
    import flashlib.fast.row_group as flash

    n = 256
    q = rng.standard_normal((1, 32, 8))
    k = rng.standard_normal((1, n, 8)) * np.linspace(0.5, 6.0, n)[:, None]
    v = rng.standard_normal((1, n, 8))
    s2 = logits(q, k) * np.log2(np.e)
    assert (s2[..., 32:].max() - s2[..., :32].max()) > np.log2(STALE_LIMIT)
    exact_steps = []
    real = flash.row_max
    monkeypatch.setattr(flash, "row_max", lambda s, t: exact_steps.append(1) or real(s, t))
    o = flash_attention(q, k, v, block_q=32, block_k=32)
    assert len(exact_steps) == 0  # the first tile takes the first step, no tile is redone
    ref, _ = reference_attention(q, k, v)
    assert max_err(o, ref) <= 1e-13 * float(np.abs(s2).max())


def test_bounded_scores_skip_the_running_maximum(rng, monkeypatch):
    """Scores within +-63 (base 2, by the Cauchy-Schwarz bound) take the unshifted path, no
    running maximum: the ordinary case.  30x logits do not; neither do values so large that
    n_k 2**63 max|v| would come near overflow.  Both paths agree to rounding."""
    import flashlib.fast.forward as forward

    decisions = []
    real = forward.unshifted_ok
    monkeypatch.setattr(forward, "unshifted_ok",
                        lambda *a: decisions.append(real(*a)) or decisions[-1])
    q, k, v = (rng.standard_normal((2, 300, 64)).astype(np.float32) for _ in range(3))
    o = flash_attention(q, k, v, causal=True)
    flash_attention(q * 30, k, v)
    assert decisions == [True, False]
    monkeypatch.setattr(forward, "unshifted_ok", lambda *a: False)
    shifted = flash_attention(q, k, v, causal=True)
    assert max_err(o, shifted) <= 1e-6
    assert real(63.0, 4096, 1.0, np.dtype(np.float32))
    assert not real(63.5, 4096, 1.0, np.dtype(np.float32))
    assert not real(10.0, 4096, 1e36, np.dtype(np.float32))  # acc could overflow
    assert real(500.0, 4096, 1.0, np.dtype(np.float64))
