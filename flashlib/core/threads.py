"""Threads for the fast paths: how many workers, and independent work items run on them.

numpy releases the GIL inside matmul and inside ufunc loops over more than a few hundred
elements, so independent work items (FlashAttention-2's parallelism over query blocks in the
forward, over heads or key blocks in the backward) run on several cores from a plain pool of
threads; only the few Python statements between numpy calls take turns.

How many: the BLAS thread limit that threadpoolctl reports, so that a harness that pins BLAS
(``threadpool_limits(1)``, ``OMP_NUM_THREADS=1``, ``OPENBLAS_NUM_THREADS=1``) pins flashlib as
well, as ``torch.set_num_threads(1)`` pins torch.  While the workers run, BLAS runs on one
thread inside each of them, so that workers x BLAS threads never oversubscribe the cores.

Several Python threads may call flashlib at once; each call leaves the process's BLAS settings
as it found them, and its result does not depend on what the other calls do:

- where the BLAS has a limit per thread (MKL's ``MKL_Set_Num_Threads_Local``, an OpenBLAS built
  on OpenMP), each worker sets its own thread's limit to 1 and restores it when it stops: nothing
  that another thread sees changes;
- otherwise the limit is process-wide, and one call at a time holds it at 1 (saving the
  limits it found, restoring them when it ends); a call that starts meanwhile runs its items
  on its own thread, since BLAS is already at one thread, and reads the limits saved by the
  holder, not the 1 it set.  A hold the BLAS does not honour (threadpoolctl lets only one
  Python thread at a time change OpenBLAS's process-wide limit) also runs the items on the
  caller's thread.  numpy's usual OpenBLAS (its own threads) takes this path.

How a problem is cut into work items depends only on the worker count (the caller's BLAS
limit), never on how many threads then run them, so the result is the same either way.

threadpoolctl is optional: without it (a numpy-only install, Pyodide) flashlib cannot read or
hold the BLAS limit, and runs on one thread.  Platforms without threads (Pyodide, WASI) run on
one thread too.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
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


def _local_setter(lib: Any) -> Callable[[int], int] | None:
    """``set(n) -> previous``: the library's limit for the calling thread only, or None when
    it has only a process-wide one (OpenBLAS with its own threads: even its
    ``openblas_set_num_threads_local`` sets the process's limit; BLIS; an unknown library)."""
    api, layer = getattr(lib, "internal_api", None), getattr(lib, "threading_layer", None)
    if api == "openblas" and layer == "openmp":  # omp_set_num_threads: this thread's limit
        def set_openmp(n: int) -> int:
            previous = lib.get_num_threads()
            lib.set_num_threads(n)
            return previous
        return set_openmp
    if api == "mkl":
        try:  # returns the previous limit of this thread (0: it followed the process's)
            fn = lib.dynlib["MKL_Set_Num_Threads_Local"]  # a fresh function object
        except (AttributeError, TypeError):
            return None
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        return fn
    return None


def _local_setters(controller: Any) -> tuple[Callable[[int], int], ...] | None:
    """A per-thread setter for every BLAS library loaded, or None if some library has none."""
    if controller is None or not controller.lib_controllers:
        return None
    setters = tuple(_local_setter(lib) for lib in controller.lib_controllers)
    return None if any(s is None for s in setters) else setters


# Found once, when flashlib is imported (numpy's BLAS is loaded by then): looking for the
# libraries takes milliseconds and allocates, which a first call should not pay or show in a
# memory measurement.
_BLAS = _find_blas()
_LOCAL = _local_setters(_BLAS)

# The process-wide hold (for a BLAS without per-thread limits): the limits found when the
# current hold began, None while no call holds BLAS.
_held: list[int] | None = None
_hold_lock = threading.Lock()


def _blas_controller() -> Any:
    """The controller of numpy's BLAS (None without threadpoolctl)."""
    return _BLAS


def worker_count() -> int:
    """Threads the fast paths may use: the BLAS thread limit threadpoolctl reports (the
    smallest, if several BLAS libraries are loaded), at most the CPU count; 1 without
    threadpoolctl, without a BLAS it can see, or on a platform without threads.

    The limit is the caller's: while another call holds a process-wide BLAS at one thread,
    the limits it found are read, not its 1.
    """
    if sys.platform in ("emscripten", "wasi"):
        return 1
    controller = _blas_controller()
    if controller is None:
        return 1
    with _hold_lock:
        counts = list(_held) if _held is not None else [
            c.num_threads for c in controller.lib_controllers]
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
def _single_thread_here() -> Iterator[None]:
    """This thread's BLAS limit at 1, then back to what it was (per-thread limits only)."""
    previous = [set_local(1) for set_local in _LOCAL]
    try:
        yield
    finally:
        for set_local, n in zip(_LOCAL, previous, strict=True):
            set_local(n)


@contextlib.contextmanager
def _process_hold() -> Iterator[bool]:
    """Hold a process-wide BLAS at one thread for the duration, if no other call holds it and
    the BLAS honours the hold; yields whether this call may run threads (False: run the items
    on the caller's thread, BLAS is not at one thread for this call to rely on)."""
    global _held
    controller = _blas_controller()
    if controller is None or not controller.lib_controllers:
        yield True  # no BLAS to hold (tests, exotic platforms): threads as asked
        return
    libs = controller.lib_controllers
    with _hold_lock:
        if _held is not None:
            mine = False  # another call holds BLAS at one thread
        else:
            found = [lib.num_threads for lib in libs]
            for lib in libs:
                lib.set_num_threads(1)
            mine = all(lib.num_threads == 1 for lib in libs)
            if mine:
                _held = found
            else:  # the BLAS ignored us (another Python thread controls it): undo, no threads
                for lib, n in zip(libs, found, strict=True):
                    lib.set_num_threads(n)
    try:
        yield mine
    finally:
        if mine:
            with _hold_lock:
                for lib, n in zip(libs, _held, strict=True):
                    if lib.num_threads == 1:  # unless someone else has set it meanwhile
                        lib.set_num_threads(n)
                _held = None


def _executor(threads: int) -> ThreadPoolExecutor:
    """The module's pool, with room for at least ``threads`` threads (created once, replaced
    by a larger one when a larger count is asked for).  A replaced pool is not shut down: a
    call that took it before keeps submitting to it; its threads end when it is collected."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < threads:
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
    buffers).  The items must be independent (write disjoint outputs), so that the result does
    not depend on which thread runs which item, nor on how many threads run them.  With one
    worker this is a plain loop.  numpy's error state and other context variables of the caller
    hold in every worker; the first exception raised is re-raised here once every worker has
    stopped.  BLAS runs on one thread inside the workers, and the process's BLAS settings are
    as they were when this returns (see the module docstring)."""
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

    if _LOCAL is not None:
        def drain_here() -> None:
            with _single_thread_here():
                drain()
        _run_threads(drain_here, workers)
        return
    with _process_hold() as threads_ok:
        _run_threads(drain, workers if threads_ok else 1)


def _run_threads(drain: Callable[[], None], workers: int) -> None:
    """``drain`` on the caller's thread and ``workers - 1`` pool threads; the first error of
    any of them is raised once all have stopped."""
    if workers == 1:
        drain()
        return
    pool = _executor(workers - 1)
    # numpy's errstate lives in a context variable: each worker runs in a copy of ours
    futures = [pool.submit(contextvars.copy_context().run, drain) for _ in range(workers - 1)]
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
