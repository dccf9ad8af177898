"""Threads for the fast paths: how many workers, and independent work items run on them.

numpy releases the GIL inside matmul and inside ufunc loops over more than a few hundred
elements, so independent work items (FlashAttention-2's parallelism over query blocks in the
forward, over heads or key blocks in the backward) run on several cores from a plain pool of
threads; only the few Python statements between numpy calls take turns.

How many: the BLAS thread limit that threadpoolctl reports, so that a harness that pins BLAS
(``threadpool_limits(1)``, ``OMP_NUM_THREADS=1``, ``OPENBLAS_NUM_THREADS=1``) pins flashlib as
well, as ``torch.set_num_threads(1)`` pins torch.  While the workers run, BLAS is held at one
thread, so that workers x BLAS threads never oversubscribe the cores.

threadpoolctl is optional: without it (a numpy-only install, Pyodide) flashlib cannot read or
hold the BLAS limit, and runs on one thread.  Platforms without threads (Pyodide, WASI) run on
one thread too.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["MIN_PARALLEL_WORK", "MIN_THREAD_TILE", "worker_count", "workers_for", "run_items"]

State = TypeVar("State")
Item = TypeVar("Item")

#: Problems with fewer multiply-adds than this run on one thread: handing items to a pool
#: costs tens of microseconds, more than a small problem gains from a second core.
MIN_PARALLEL_WORK = 1 << 22

#: Each numpy call of a worker must cover at least this many tile elements for threads to pay:
#: smaller calls spend too much of their time in the Python statements around them, which
#: take turns on the GIL.  Measured here (2 cores, n = 2048 to 4096, default tiles): a worker's
#: tile of 1 head (8192 elements) ran 0.9 times as fast on 2 threads as on one, 2 heads 1.3
#: times, 4 heads 1.5 times, 8 heads 1.8 times.
MIN_THREAD_TILE = 1 << 14

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _find_blas() -> Any:
    """threadpoolctl's controller of the BLAS libraries loaded now (numpy's among them), or
    None without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    try:
        return ThreadpoolController().select(user_api="blas")
    except Exception:  # an exotic platform threadpoolctl cannot inspect: no threads
        return None


# Found once, when flashlib is imported (numpy's BLAS is loaded by then): looking for the
# libraries takes milliseconds and allocates, which a first call should not pay or show in a
# memory measurement.
_BLAS = _find_blas()


def _blas_controller() -> Any:
    """The controller of numpy's BLAS (None without threadpoolctl)."""
    return _BLAS


def worker_count() -> int:
    """Threads the fast paths may use: the BLAS thread limit threadpoolctl reports (the
    smallest, if several BLAS libraries are loaded), at most the CPU count; 1 without
    threadpoolctl, without a BLAS it can see, or on a platform without threads."""
    if sys.platform in ("emscripten", "wasi"):
        return 1
    controller = _blas_controller()
    if controller is None:
        return 1
    counts = [c.num_threads for c in controller.lib_controllers]
    counts = [c for c in counts if isinstance(c, int) and c > 0]
    if not counts:
        return 1
    return max(1, min(min(counts), os.cpu_count() or 1))


def workers_for(work: float, items: int, workers: int | None = None,
                tile: float = float("inf")) -> int:
    """The worker count for ``items`` independent items totalling ``work`` multiply-adds, whose
    numpy calls cover ``tile`` elements each: ``workers`` (default :func:`worker_count`), at
    most one per item, and 1 below :data:`MIN_PARALLEL_WORK` or :data:`MIN_THREAD_TILE`."""
    if work < MIN_PARALLEL_WORK or tile < MIN_THREAD_TILE:
        return 1
    return max(1, min(worker_count() if workers is None else workers, items))


@contextlib.contextmanager
def _blas_single_thread() -> Iterator[None]:
    """Hold the BLAS libraries at one thread (restored on exit), when threadpoolctl is here."""
    controller = _blas_controller()
    if controller is None or not controller.lib_controllers:
        yield
        return
    with controller.limit(limits=1, user_api="blas"):
        yield


def _executor(threads: int) -> ThreadPoolExecutor:
    """The module's pool, with room for at least ``threads`` threads (created once, grown when
    a larger count is asked for)."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < threads:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="flashlib")
            _pool_size = threads
        return _pool


def run_items(
    work: Callable[[State, Item], None],
    items: Sequence[Item],
    workers: int,
    setup: Callable[[], State],
) -> None:
    """Call ``work(state, item)`` for every item, on ``workers`` threads (the caller's among
    them), each taking the next item when it is free; ``state = setup()`` once per thread (its
    buffers).  The items must be independent (write disjoint outputs).  With one worker this is
    a plain loop.  numpy's error state and other context variables of the caller hold in every
    worker; the first exception raised is re-raised here once every worker has stopped."""
    workers = max(1, min(workers, len(items)))
    if workers == 1:
        state = setup()
        for item in items:
            work(state, item)
        return
    queue = iter(items)
    lock = threading.Lock()
    failed = threading.Event()

    def drain() -> None:
        state = setup()
        while not failed.is_set():
            with lock:
                item = next(queue, _DONE)
            if item is _DONE:
                return
            try:
                work(state, item)  # type: ignore[arg-type]
            except BaseException:
                failed.set()
                raise

    with _blas_single_thread():
        pool = _executor(workers - 1)
        # numpy's errstate lives in a context variable: each worker runs in a copy of ours
        futures = [pool.submit(contextvars.copy_context().run, drain)
                   for _ in range(workers - 1)]
        error: BaseException | None = None
        try:
            drain()
        except BaseException as exc:
            error = exc
        for future in futures:
            exc = future.exception()
            if error is None and exc is not None:
                error = exc
    if error is not None:
        raise error


_DONE = object()
