"""Threads from several Python threads at once (flashlib.core.threads): the process's BLAS
settings are left as they were found, the worker count a call reads does not depend on what
other calls hold, and the pool never refuses work because another call grew it.

threadpoolctl lets one Python thread at a time change OpenBLAS's process-wide limit (the first
that does, while it lives).  The tests hand that control back first, as in a fresh process
whose first flashlib calls come from worker threads: then a call's thread can take it."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from flashlib import flash_attention, flash_attention_backward
from flashlib.core import threads as _threads

threadpoolctl = pytest.importorskip("threadpoolctl")
TWO_CORES = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores")


def _blas_limit() -> int:
    return min(c.num_threads for c in _threads._blas_controller().lib_controllers)


def _free_control():
    """Hand threadpoolctl's control of OpenBLAS's limit to the next thread that sets it."""
    for lib in _threads._blas_controller().lib_controllers:
        clear = getattr(type(lib), "clear_controlling_thread", None)
        if clear is not None:
            clear(force=True)


@pytest.fixture
def blas2():
    """BLAS at 2 threads, control of the limit free, and both put back afterwards."""
    with threadpoolctl.threadpool_limits(2):
        _free_control()
        yield
        _free_control()


def _run(*targets):
    """Start every target in its own thread, join them, re-raise the first error."""
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


def _no_oversubscription(seen):
    """seen: (thread, BLAS limit) per item of one call: a call whose items ran on several
    threads ran each with BLAS at one thread."""
    return len({t for t, _ in seen}) == 1 or {b for _, b in seen} == {1}


@TWO_CORES
def test_overlapping_holds_restore_the_blas_limit_forced_interleaving(blas2):
    """Call A holds BLAS at one thread; call B starts while A holds it; A ends and its thread
    ends; then B ends.  Saving and restoring per call left the limit at 1 for good (B saved
    the 1 that A had set, and restored it once A's thread no longer controlled BLAS)."""
    a_inside, b_inside, a_gone = threading.Event(), threading.Event(), threading.Event()
    seen_a, seen_b, counts = [], [], []

    def work_a(state, item):
        seen_a.append((threading.get_ident(), _blas_limit()))
        a_inside.set()
        assert b_inside.wait(20)

    def work_b(state, item):
        seen_b.append((threading.get_ident(), _blas_limit()))
        b_inside.set()
        assert a_gone.wait(20)

    def call_a():
        _threads.run_items(work_a, [0, 1], 2, lambda: None)

    def call_b():
        assert a_inside.wait(20)
        counts.append(_threads.worker_count())  # the caller's 2, not the 1 A holds BLAS at
        _threads.run_items(work_b, [0, 1], 2, lambda: None)

    thread_a = threading.Thread(target=call_a)
    thread_a.start()

    def end_a():
        thread_a.join(20)
        a_gone.set()

    _run(call_b, end_a)
    assert not thread_a.is_alive()
    assert _blas_limit() == 2 and _threads.worker_count() == 2
    assert counts == [2]
    assert _no_oversubscription(seen_a) and _no_oversubscription(seen_b)


@TWO_CORES
def test_concurrent_calls_leave_blas_as_found_and_results_bitwise_equal(blas2, monkeypatch):
    """Real concurrent calls (forward and backward, few heads: the backward splits key blocks
    over the workers) from 4 Python threads: every result equals the lone call's bit for bit,
    and BLAS is back at the caller's limit afterwards."""
    monkeypatch.setattr(_threads, "MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr(_threads, "MIN_THREAD_TILE", 0)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 96, 8)).astype(np.float32) for _ in range(3))
    do = rng.standard_normal((1, 96, 8)).astype(np.float32)
    kw = dict(block_q=16, block_k=16, causal=True)
    o, lse = flash_attention(q, k, v, return_lse=True, **kw)
    want = flash_attention_backward(q, k, v, o, lse, do, **kw)
    mismatches = []
    _free_control()  # the lone calls above took it

    def caller():
        for _ in range(25):
            o2, lse2 = flash_attention(q, k, v, return_lse=True, **kw)
            got = flash_attention_backward(q, k, v, o, lse, do, **kw)
            if not (np.array_equal(o2, o) and np.array_equal(lse2, lse) and all(
                    np.array_equal(a, b) for a, b in zip(got, want, strict=True))):
                mismatches.append(1)

    _run(*[caller] * 4)
    assert _blas_limit() == 2
    assert not mismatches, f"{len(mismatches)} of 100 calls differed from the lone call"


@TWO_CORES
def test_backward_split_ignores_the_limit_another_call_holds(blas2, monkeypatch):
    """Forced: a backward runs while another call holds BLAS at one thread; its split over key
    blocks (and so its bits) is the one it makes alone."""
    monkeypatch.setattr(_threads, "MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr(_threads, "MIN_THREAD_TILE", 0)
    rng = np.random.default_rng(1)
    q, k, v, do = (rng.standard_normal((1, 80, 8)) for _ in range(4))
    kw = dict(block_q=8, block_k=8)
    o, lse = flash_attention(q, k, v, return_lse=True, **kw)
    alone = flash_attention_backward(q, k, v, o, lse, do, **kw)
    holding, release = threading.Event(), threading.Event()
    got, limits = [], []

    def holder():
        def work(state, item):
            limits.append(_blas_limit())
            holding.set()
            assert release.wait(20)
        _threads.run_items(work, [0, 1], 2, lambda: None)

    def backward():
        assert holding.wait(20)
        try:
            got.append(flash_attention_backward(q, k, v, o, lse, do, **kw))
        finally:
            release.set()

    _free_control()  # the lone calls above took it
    _run(holder, backward)
    assert 1 in limits  # the holder really held BLAS at one thread
    for a, b in zip(alone, got[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert _blas_limit() == 2


def test_a_grown_pool_still_takes_work_from_a_caller_of_the_old_one():
    """Two calls with different worker counts: the second grows the pool while the first still
    uses the old one, which must not have been shut down."""
    old = _threads._executor(1)
    _threads._executor(_threads._pool_size + 2)
    assert old.submit(lambda: 7).result(timeout=20) == 7


def test_per_thread_limits_are_set_and_restored_in_each_worker(monkeypatch):
    """Where the BLAS has a per-thread limit, each worker sets its own to 1 and restores it;
    nothing process-wide is touched."""
    local = threading.local()
    calls = []

    def set_local(n):
        previous = getattr(local, "n", 2)
        local.n = n
        calls.append((threading.get_ident(), n))
        return previous

    monkeypatch.setattr(_threads, "_LOCAL", (set_local,))
    seen = []
    _threads.run_items(lambda s, i: seen.append(getattr(local, "n", 2)), list(range(6)), 2,
                       lambda: None)
    assert seen == [1] * 6
    assert getattr(local, "n", 2) == 2  # the caller's thread is back to its limit
    by_thread = {}
    for t, n in calls:
        by_thread.setdefault(t, []).append(n)
    assert all(ns == [1, 2] for ns in by_thread.values()) and len(by_thread) == 2
