"""The tiling chapter's experiments: the teaching functions run by a counting memory, and
their event log is what the tiling chapter counts, animates
(:mod:`flashlib.book.chapters.tiling`) and tests.

:func:`run_counted`      a teaching function run on a :class:`flashlib.core.hbm.CountingMemory`:
                         its output and the memory (counts per array, the log, the SRAM peak)
:func:`logged_tiles`     the tiles (i, j) in the order a loop order computes them
:func:`schedule_counts`  loads, stores, tiles, rescales and normalisations, from a log
:func:`count_io`         elements moved for (N, d, M, order), counted by a run
:func:`simulate_parallel_outer_loop`  workers sharing the outer loop: Algorithm 1's order
                         loses updates of O_i, l_i, m_i, FlashAttention-2's order cannot
:func:`exactness_table`  error against a float64 reference for given block shapes

Orders: "v1" (Algorithm 1, :func:`flashlib.algorithms.flash1_forward`), "v2" (FlashAttention-2,
:func:`flashlib.algorithms.flash2_forward`); :func:`run_counted` also takes "standard"
(Algorithm 0), "backward" (:func:`flashlib.algorithms.flash2_backward`) and "two_pass_backward"
(:func:`flashlib.algorithms.two_pass_backward`).

:func:`program_accesses`  the programs of a run (one per outer-loop block of each pass, as a
                         GPU launches them) and the blocks each reads and writes, from the log
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from flashlib.algorithms import (
    flash1_forward,
    flash2_backward,
    flash2_forward,
    standard_attention,
    two_pass_backward,
)
from flashlib.core.checks import check_int
from flashlib.core.hbm import CountingMemory, Event, HBMArray
from flashlib.studies.io_model import block_sizes

__all__ = [
    "check_order_name",
    "ORDERS",
    "CountedRun",
    "run_counted",
    "logged_tiles",
    "schedule_counts",
    "count_io",
    "ParallelRun",
    "simulate_parallel_outer_loop",
    "exactness_table",
    "Program",
    "program_accesses",
    "random_problem",
]


#: The two loop orders of the tiling chapter.
ORDERS = ("v1", "v2")


#: The backward schedules of the backward chapter.
BACKWARD = ("backward", "two_pass_backward")


#: Every order :func:`run_counted` runs.
COUNTED_ORDERS = ("standard", "v1", "v2", *BACKWARD)


#: The teaching functions' arrays whose rows are keys: a loop over their blocks runs over key
#: blocks (j), any other over query blocks (i).  The counting memory is told so
#: (``CountingMemory(key_side=KEY_SIDE)``); it hard-codes no name.
KEY_SIDE = frozenset({"K", "V", "dK", "dV"})


#: The arrays in the order the widget lists them.
ARRAY_ORDER = ("Q", "K", "V", "O", "l", "m", "L", "dO", "dQ", "D", "dK", "dV", "S", "P")


def check_order_name(order: object, allowed: Sequence[str]) -> str:
    if order not in allowed:
        raise ValueError(f"order must be one of {tuple(allowed)}, got {order!r}")
    return order  # type: ignore[return-value]


class CountedRun(NamedTuple):
    """A teaching function's result (arrays, or a tuple of them) and the memory it ran on."""

    output: Any
    mem: CountingMemory


def run_counted(order: str, Q: np.ndarray, K: np.ndarray, V: np.ndarray,
                B_r: int | None = None, B_c: int | None = None, *, M: int | None = None,
                dO: np.ndarray | None = None) -> CountedRun:
    """Run the teaching function of ``order`` on a counting memory with an SRAM of ``M``
    elements (None: unbounded); raises :class:`flashlib.core.hbm.SRAMCapacityError` when a step
    does not fit.

    order: "standard" (Algorithm 0; blocks ignored), "v1", "v2" (output O, and L for "v2"),
    or "backward" / "two_pass_backward" (dO required; O and L come from an uncounted
    :func:`flash2_forward`; output dQ, dK, dV).
    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v), dO: (N_q, d_v).
    """
    order = check_order_name(order, COUNTED_ORDERS)
    mem = CountingMemory(M, key_side=KEY_SIDE, score_tiles=2 if order in BACKWARD else 1)
    return _run_counted(order, Q, K, V, B_r, B_c, mem, dO)


def _run_counted(order: str, Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_r: int | None,
                 B_c: int | None, mem: CountingMemory, dO: np.ndarray | None) -> CountedRun:
    """:func:`run_counted` on a given counting memory (a subclass may watch the run)."""
    if order in BACKWARD:
        if dO is None:
            raise ValueError(f"order={order!r} needs dO")
        O, L = flash2_forward(Q, K, V, B_r, B_c)
        args = mem.inputs(Q=Q, K=K, V=V, O=O, L=L, dO=dO)
        fn = flash2_backward if order == "backward" else two_pass_backward
        return CountedRun(mem.run(fn, *args, B_r, B_c), mem)
    q, k, v = mem.inputs(Q=Q, K=K, V=V)
    if order == "standard":
        return CountedRun(mem.run(standard_attention, q, k, v), mem)
    fn = flash1_forward if order == "v1" else flash2_forward
    return CountedRun(mem.run(fn, q, k, v, B_r, B_c), mem)


def random_problem(n_q: int, n_k: int, d: int, seed: int = 0, dtype: Any = np.float64
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype)
                 for shape in ((n_q, d), (n_k, d), (n_k, d)))  # type: ignore[return-value]


def _tiles(log: Iterable[Event]) -> list[tuple[int, int]]:
    return [(e.i, e.j) for e in log if e.op == "tile"]


def logged_tiles(n_q: int, n_k: int, B_r: int, B_c: int, order: str) -> list[tuple[int, int]]:
    """The tiles (query block i, key block j), 0-based, in the order the teaching function of
    ``order`` ("v1" or "v2") computes them: read from the event log of a run (d = 2)."""
    order = check_order_name(order, ORDERS)
    n_q, n_k = check_int(n_q, "n_q", minimum=1), check_int(n_k, "n_k", minimum=1)
    B_r, B_c = check_int(B_r, "B_r", minimum=1), check_int(B_c, "B_c", minimum=1)
    return _tiles(run_counted(order, *random_problem(n_q, n_k, 2), B_r, B_c).mem.log)


def schedule_counts(log: Iterable[Event]) -> dict[str, Any]:
    """Counts from an event log: ``tiles``; per array the block ``loads``, block ``stores``,
    whole-array ``inits`` (writes outside any loop) and elements ``read`` and ``written``;
    ``rescales`` (one per tile: the running O_i times diag(e^(m_i - m_new))) and
    ``normalisations`` (one per block store of O: O_i divided by diag(l_i) first).  The
    closed forms are :func:`flashlib.studies.io_model.block_counts` and
    :func:`~flashlib.studies.io_model.traffic`.
    """
    loads: dict[str, int] = {}
    stores: dict[str, int] = {}
    inits: dict[str, int] = {}
    read: dict[str, int] = {}
    written: dict[str, int] = {}
    tiles = 0
    for e in log:
        if e.op == "tile":
            tiles += 1
        elif e.op == "read":
            read[e.name] = read.get(e.name, 0) + e.elements
            if e.i is not None:
                loads[e.name] = loads.get(e.name, 0) + 1
        else:
            written[e.name] = written.get(e.name, 0) + e.elements
            target = stores if e.i is not None else inits
            target[e.name] = target.get(e.name, 0) + 1
    return {"tiles": tiles, "loads": loads, "stores": stores, "inits": inits, "read": read,
            "written": written, "rescales": tiles, "normalisations": stores.get("O", 0)}


def count_io(N: int, d: int, M: int | None, order: str, *, rule: str = "fit",
             seed: int = 0) -> int:
    """Elements moved (read + written) by a run of ``order`` on random N x d inputs, with the
    blocks :func:`flashlib.studies.io_model.block_sizes` derives from M under ``rule``, on an SRAM
    of M elements (unbounded for ``rule="paper"``, whose step may exceed M by a constant factor;
    ignored for "standard")."""
    order = check_order_name(order, COUNTED_ORDERS)
    Q, K, V = random_problem(N, N, d, seed, np.float32)
    if order == "standard":
        return run_counted("standard", Q, K, V).mem.traffic.total
    B_r, B_c = block_sizes(M, d, order, rule=rule)
    capacity = M if rule == "fit" else None
    dO = np.random.default_rng(seed + 1).standard_normal((N, d)).astype(np.float32)
    return run_counted(order, Q, K, V, B_r, B_c, M=capacity, dO=dO).mem.traffic.total


class _RoundsMemory(CountingMemory):
    """Workers sharing one HBM, in rounds: in each round every worker runs the teaching
    function on one block of its outer loop (the outermost loop visits only that block).
    ``concurrent``: all of a round's loads see HBM as it was when the round began and its
    writes land when it ends, in worker order (programs running at the same time); otherwise
    each worker sees the writes of those before it (one after the other).  The arrays a run
    allocates are allocated once and shared, as a host allocates (and initialises) them
    before the launch."""

    def __init__(self, concurrent: bool) -> None:
        super().__init__(key_side=KEY_SIDE)
        self.concurrent = concurrent
        self.shared: list[HBMArray] = []  # the allocations, in the order a run makes them
        self.outer_block = 0
        self.worker = 0
        self._allocations = 0
        self._snapshot: dict[int, np.ndarray] = {}
        self._pending: list[tuple[int, HBMArray, int, int, np.ndarray]] = []

    def _start(self) -> None:
        super()._start()
        self._allocations = 0

    def _allocate(self, data: np.ndarray, written: bool) -> HBMArray:
        k, self._allocations = self._allocations, self._allocations + 1
        if k < len(self.shared):  # allocated by an earlier run: the same array
            return self.shared[k]
        self.shared.append(super()._allocate(data, written))
        return self.shared[-1]

    def _order(self, r: range, outermost: bool) -> Iterable[int]:
        if outermost:  # this worker's one block of the outer loop in this round
            start = r.start + self.outer_block * r.step
            return [start] if start < r.stop else []
        return r

    def _source(self, root: HBMArray) -> np.ndarray:
        if self.concurrent and id(root) in self._snapshot:
            return self._snapshot[id(root)]
        return super()._source(root)

    def _write(self, root: HBMArray, start: int, stop: int, value: np.ndarray) -> None:
        if not self.concurrent:
            return super()._write(root, start, stop, value)
        self._pending.append((self.worker, root, start, stop, np.array(value)))

    def begin_round(self) -> None:
        self._snapshot = {id(X): X.data.copy() for X in self.shared}

    def end_round(self) -> int:
        """Apply the round's writes in worker order; return the lost updates: writes to a
        block that another worker of the round also wrote (only the last one survives)."""
        writers: dict[tuple[str, int], set[int]] = {}
        for worker, X, start, stop, value in self._pending:
            super()._write(X, start, stop, value)
            writers.setdefault((X.name, start), set()).add(worker)
        self._pending = []
        return sum(len(w) - 1 for w in writers.values())


class ParallelRun(NamedTuple):
    """The output of workers sharing the outer loop, the updates they lost (writes of a block
    of O, l, m that another worker overwrote in the same round) and the rounds they took."""

    O: np.ndarray
    lost_updates: int
    rounds: int


def simulate_parallel_outer_loop(order: str, Q: np.ndarray, K: np.ndarray, V: np.ndarray,
                                 B_r: int, B_c: int, *, workers: int = 2,
                                 concurrent: bool = True) -> ParallelRun:
    """Parallelise the outer loop of ``order`` across ``workers``, each running the teaching
    function itself on its own outer blocks (worker w takes blocks w, w + workers, ...): one
    run of the function per block, whose outermost loop visits only that block, all runs on
    one shared HBM.

    "v1" (outer loop over K/V blocks): every worker updates every O_i, l_i, m_i, so with
    ``concurrent`` workers (a round's reads all see HBM as it was before the round's writes)
    the last writer's update wins and the others are lost: a wrong O.  Run one after the other
    (``concurrent=False``) it is right again.  "v2" (outer loop over query blocks): each
    worker owns its rows of O and L; any interleaving gives the sequential result exactly.
    """
    order = check_order_name(order, ORDERS)
    workers = check_int(workers, "workers", minimum=1)
    mem = _RoundsMemory(bool(concurrent))
    q, k, v = mem.inputs(Q=Q, K=K, V=V)
    n_outer = -(-len(K) // B_c) if order == "v1" else -(-len(Q) // B_r)
    rounds = -(-n_outer // workers)
    lost = 0
    fn = flash1_forward if order == "v1" else flash2_forward
    for r in range(rounds):
        mem.begin_round()
        for w in range(min(workers, n_outer - r * workers)):
            mem.worker, mem.outer_block = w, r * workers + w
            mem.run(fn, q, k, v, B_r, B_c)
        lost += mem.end_round()
    O = next(X for X in mem.shared if X.name == "O")
    return ParallelRun(np.array(O.data), lost, rounds)


def exactness_table(n_q: int, n_k: int, d: int, blocks: Iterable[tuple[int, int]], *,
                    dtype: Any = np.float32, seed: int = 0) -> list[dict[str, Any]]:
    """For each (B_r, B_c) in ``blocks``: the largest error of ``flash1_forward``,
    ``flash2_forward`` and ``standard_attention`` in ``dtype`` against standard attention in
    float64, on the same random inputs (Q, K, V: (n_q, d), (n_k, d), (n_k, d))."""
    Q, K, V = random_problem(n_q, n_k, d, seed)
    ref = standard_attention(Q, K, V)
    q, k, v = (x.astype(dtype) for x in (Q, K, V))
    standard = float(np.max(np.abs(standard_attention(q, k, v) - ref)))
    rows = []
    for B_r, B_c in blocks:
        rows.append({"B_r": B_r, "B_c": B_c,
                     "v1": float(np.max(np.abs(flash1_forward(q, k, v, B_r, B_c) - ref))),
                     "v2": float(np.max(np.abs(flash2_forward(q, k, v, B_r, B_c)[0] - ref))),
                     "standard": standard})
    return rows


class Program(NamedTuple):
    """One program of a run: one block of the outer loop of one pass, what a GPU launches as
    one thread block.  ``stage``: which pass (0 for the first outermost loop of the teaching
    function, ...; -1 for HBM initialised before any loop, as a host does before the launch);
    ``side``: "q" (a query block's program) or "kv" (a key block's); ``block``: its outer
    block index (None for stage -1); ``reads`` / ``writes``: per array, the block indices
    it reads / writes as sorted [start, stop) runs (a whole-array initialisation is block
    None, written as [[-1, 0]])."""

    stage: int
    side: str | None
    block: int | None
    reads: dict[str, list[list[int]]]
    writes: dict[str, list[list[int]]]


class _ProgramMemory(CountingMemory):
    """A counting memory that tags each log entry with its program: (stage, side, block) of the
    outermost loop running when it happened (stage counts the outermost loops); (-1, None,
    None) outside any loop."""

    def __init__(self) -> None:
        super().__init__(key_side=KEY_SIDE, score_tiles=2)
        self.stage = -1
        self.tags: list[tuple[int, str | None, int | None]] = []

    def _enter(self, loop: Any, outermost: bool) -> None:
        super()._enter(loop, outermost)  # what happened before the loop keeps its tag
        if outermost:
            self.stage += 1

    def _append(self, event: Event) -> None:
        super()._append(event)
        outer = self._loops[0] if self._loops else None
        self.tags.append((-1, None, None) if outer is None
                         else (self.stage, outer.side, outer.index))


def _runs(indices: Iterable[int]) -> list[list[int]]:
    """Sorted distinct block indices as [start, stop) runs: {0, 1, 2, 5} -> [[0, 3], [5, 6]]."""
    out: list[list[int]] = []
    for k in sorted(set(indices)):
        if out and out[-1][1] == k:
            out[-1][1] = k + 1
        else:
            out.append([k, k + 1])
    return out


def program_accesses(order: str, n_q: int, n_k: int, B_r: int, B_c: int) -> dict[str, Any]:
    """The programs of a run of ``order`` and the blocks each reads and writes, read from the
    event log of its teaching function on a counting memory (d = d_v = 1: which blocks move
    does not depend on the head dimension).

    order: "backward" (:func:`flashlib.algorithms.flash2_backward`), "two_pass_backward"
    (:func:`flashlib.algorithms.two_pass_backward`), or a forward order "v1" / "v2".
    Returns a JSON-able dict: n_q, n_k, B_r, B_c, T_r, T_c, order;
    ``programs``: one :class:`Program` (as a dict) per program, in launch order;
    ``stages``: per stage, its side, how many programs it launches, the arrays they write,
    and what each program moves, in words: ``reads`` / ``writes`` map an array to "own" (the
    program's own block), "all" (every block), "some" (several blocks, not all) or "init"
    (the whole array, before any loop);
    ``writers``: per array written inside a loop, how many programs write each of its blocks;
    ``shared``: the arrays some block of which more than one program writes (on a GPU those
    programs run at the same time, so their updates need atomic adds, or they are lost).
    """
    order = check_order_name(order, (*ORDERS, *BACKWARD))
    n_q, n_k = check_int(n_q, "n_q", minimum=1), check_int(n_k, "n_k", minimum=1)
    B_r, B_c = check_int(B_r, "B_r", minimum=1), check_int(B_c, "B_c", minimum=1)
    Q, K, V = random_problem(n_q, n_k, 1)
    dO = np.random.default_rng(1).standard_normal((n_q, 1))
    mem = _ProgramMemory()
    if order not in BACKWARD:
        mem.score_tiles = 1
    _run_counted(order, Q, K, V, B_r, B_c, mem, dO)
    accesses: dict[tuple[int, str | None, int | None], dict[str, dict[str, list[int]]]] = {}
    for e, tag in zip(mem.log, mem.tags, strict=True):
        if e.op == "tile":
            continue
        entry = accesses.setdefault(tag, {"read": {}, "write": {}})
        entry[e.op].setdefault(e.name, []).append(-1 if e.i is None else e.i)
    programs = [Program(stage, side, block,
                        {a: _runs(b) for a, b in ops["read"].items()},
                        {a: _runs(b) for a, b in ops["write"].items()})
                for (stage, side, block), ops in accesses.items()]
    T_r, T_c = -(-n_q // B_r), -(-n_k // B_c)
    writers: dict[str, list[int]] = {}
    for p in programs:
        if p.stage < 0:
            continue
        for name, runs in p.writes.items():
            count = writers.setdefault(name, [0] * (T_c if name in KEY_SIDE else T_r))
            for start, stop in runs:
                for b in range(start, stop):
                    count[b] += 1
    stages = []
    for stage in sorted({p.stage for p in programs}):
        members = [p for p in programs if p.stage == stage]
        stages.append({"stage": stage, "side": members[0].side, "programs": len(members),
                       "writes": sorted({a for p in members for a in p.writes},
                                        key=_array_rank),
                       "reads_by_program": _extent(members, "reads", T_r, T_c),
                       "writes_by_program": _extent(members, "writes", T_r, T_c)})
    return {"order": order, "n_q": n_q, "n_k": n_k, "B_r": B_r, "B_c": B_c, "T_r": T_r,
            "T_c": T_c, "programs": [p._asdict() for p in programs], "stages": stages,
            "writers": writers,
            "shared": sorted((a for a, c in writers.items() if max(c, default=0) > 1),
                             key=_array_rank)}


def _extent(members: list[Program], op: str, T_r: int, T_c: int) -> dict[str, str]:
    """Per array touched by a stage's programs: "own" when each touches its own block only,
    "all" when each touches every block, "init" for a whole-array write before the loops,
    else "some"."""
    out: dict[str, str] = {}
    names = sorted({a for p in members for a in getattr(p, op)}, key=_array_rank)
    for name in names:
        T = T_c if name in KEY_SIDE else T_r
        runs = [getattr(p, op).get(name) for p in members]
        if all(r == [[-1, 0]] for r in runs):
            out[name] = "init"
        elif all(r == [[p.block, p.block + 1]] for r, p in zip(runs, members, strict=True)):
            out[name] = "own"
        elif all(r == [[0, T]] for r in runs):
            out[name] = "all"
        else:
            out[name] = "some"
    return out


def _array_rank(name: str) -> int:
    return ARRAY_ORDER.index(name) if name in ARRAY_ORDER else len(ARRAY_ORDER)
