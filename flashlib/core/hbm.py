"""The memory model: HBM arrays that count what the teaching functions move.

The teaching functions (:mod:`flashlib.algorithms`) are plain numpy, and on numpy arrays that
is all they are.  They write the papers' memory traffic as numpy: "load Q_i from HBM to SRAM"
is ``Q_i = Q[i : i + B_r]``, "write O_i to HBM" is ``O[i : i + B_r] = ...``.  A
:class:`CountingMemory` runs the same function on its own arrays, :class:`HBMArray`, on which
those lines are the traffic:

    mem = CountingMemory(M=4096)
    Q, K, V = mem.inputs(Q=q, K=k, V=v)
    O = mem.run(flash1_forward, Q, K, V, B_r, B_c)  # O comes back as a numpy array
    mem.reads["Q"], mem.writes["O"], mem.log, mem.peak_sram

=================================  ==============================================================
on HBM arrays                      means
=================================  ==============================================================
``Q_i = Q[i : i + B_r]``           the block's rows (no traffic yet); the first time numpy uses
                                   them they are loaded into SRAM: counted once, and copied
                                   (HBM changes after the load are not seen)
``O[i : i + B_r] = O_i``           write the block to HBM (counted)
``dQ[i : i + B_r] += x``           read the block, add, write it back
``np.empty_like(Q, shape=...)``    allocate in HBM, where Q lives (no traffic); ``zeros_like``,
                                   ``full_like`` (and ``np.zeros(..., like=Q)``, ...) also write
                                   the fill: "initialise O = 0 in HBM"
``np.asarray(x, like=Q)``          write a whole new array to HBM (Algorithm 0's S and P)
``np.zeros_like(K_j)``             like a block: an array on chip (nothing is read)
``Q @ K.T``, ``np.exp(S)``, ...    numpy on a whole HBM array reads all of it (once)
=================================  ==============================================================

An array allocated in HBM is named after the variable of the teaching function that holds it
("O", "l", "D"); the inputs are named by :meth:`CountingMemory.inputs`.  Reads and writes are
counted per array, and each is logged (:class:`Event`).

The loops.  :meth:`LoopTracker.run` calls the function with its ``range`` reporting to the
memory: which loops run, which iteration each is in, and (for a subclass) in which order the
outermost loop visits its blocks, as the programs of a GPU launch.  Nothing else of the
function changes.

The SRAM model (capacity ``M`` elements; :class:`SRAMCapacityError` when a step needs more)
holds, at each step: the blocks loaded in the loop iterations still running (a block belongs
to the iteration it was sliced in, and leaves SRAM when that iteration ends); the arrays the
function keeps per block (a variable named like one block, ``O_i`` or ``dK_j``, that is not a
load: FlashAttention-2's O_i, l_i, m_i, the backward's dK_j, dV_j), from the iteration of the
innermost query-block (``_i``) or key-block (``_j``) loop in which they were made until that
iteration ends; and ``score_tiles`` score tiles of ``B_r x B_c`` while a tile is computed (1
for the forward pass: P~_ij overwrites S_ij; 2 for the backward: P_ij and dP_ij, overwritten
by dS_ij).  Per-row temporaries of a tile (m~_ij, l~_ij, the rescale factors) are taken to
live in registers and are not counted.  A loop whose first block is of K, V, dK or dV runs
over key blocks, any other over query blocks; an iteration of a loop nested in a loop of the
other side, with no loop inside it, computes the tile (query block, key block), logged with
what SRAM holds then.
"""

from __future__ import annotations

import builtins
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

__all__ = [
    "LoopTracker",
    "CountingMemory",
    "HBMArray",
    "Event",
    "SRAMCapacityError",
    "KEY_SIDE",
]

#: Arrays whose rows are keys: a loop over them runs over key blocks (j), any other over
#: query blocks (i).
KEY_SIDE = frozenset({"K", "V", "dK", "dV"})

#: The suffix of a variable that holds one block's array, and the side of its loop.
_BLOCK_SUFFIX = {"_i": "q", "_j": "kv"}


class SRAMCapacityError(ValueError):
    """A step of the schedule needs more SRAM than the memory's capacity ``M``."""


class Event(NamedTuple):
    """One entry of a :class:`CountingMemory`'s log.

    op:       "read" or "write" (HBM traffic), or "tile" (a B_r x B_c tile computed on chip)
    name:     the array ("Q", "O", "l", ...), or "S" for a tile
    i:        block index of the rows moved (query block of a tile); None for a whole array
    j:        key block index of a tile; None otherwise
    rows:     rows moved (query rows of a tile)
    elements: elements moved, or the tile's size
    sram:     elements resident in SRAM after the event
    held:     for a tile, what SRAM holds while it is computed: (name, block index) pairs,
              ("S", None) last; empty for reads and writes
    """

    op: str
    name: str
    i: int | None
    j: int | None
    rows: int
    elements: int
    sram: int
    held: tuple[tuple[str, int | None], ...] = ()


class _Loop:
    """A running loop: its range, the teaching function's frame it runs in, its side ("q" or
    "kv", from its first block), its current iteration (value, block index, rows), the blocks
    sliced in that iteration, the block arrays that were already bound when the iteration
    began (so not made in it), whether a loop ran inside it, and whether it computed its
    tile yet."""

    __slots__ = ("range", "frame", "side", "value", "index", "rows", "blocks", "stale",
                 "nested", "tiled")

    def __init__(self, r: range, frame: Any) -> None:
        self.range, self.frame = r, frame
        self.side: str | None = None
        self.value: int | None = None
        self.index: int | None = None
        self.rows = 0
        self.blocks: list[HBMArray] = []
        self.stale: list[Any] = []
        self.nested = False
        self.tiled = False


class LoopTracker:
    """Runs a teaching function with its loops observed: ``run(fn, *args)`` calls ``fn`` with
    the builtin ``range`` replaced, for ``fn`` and the functions of its module that it calls,
    by one that tells this object when each loop starts, moves on and ends.  A subclass may
    change the order in which the outermost loop visits its values (:meth:`_order`): the
    programs of a GPU launch run in any order.  On its own it changes nothing else."""

    def __init__(self) -> None:
        self._loops: list[_Loop] = []
        self._codes: set[types.CodeType] = set()
        self._running = False

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with its loops observed."""
        observed = self._observe(fn)
        self._loops, self._running = [], True
        try:
            self._start()
            out = observed(*args, **kwargs)
            self._finish()
        finally:
            self._loops, self._running = [], False
        return self._result(out)

    # --- hooks ----------------------------------------------------------------------------

    def _order(self, r: range, outermost: bool) -> Iterable[int]:
        """The values a loop visits: all of them, in order."""
        return r

    def _start(self) -> None:
        """Before the function runs."""

    def _finish(self) -> None:
        """After it returned."""

    def _result(self, out: Any) -> Any:
        return out

    def _enter(self, loop: _Loop, outermost: bool) -> None:
        """A loop starts (before its first iteration)."""

    def _begin_iteration(self, loop: _Loop) -> None:
        """An iteration starts (``loop.value`` set)."""

    def _end_iteration(self, loop: _Loop) -> None:
        """An iteration ends (the loop moves on, or ends)."""

    # --- the observed range ---------------------------------------------------------------

    def _observe(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` and the functions of its module, sharing one copy of its globals in which
        ``range`` is :meth:`_range`."""
        namespace = dict(fn.__globals__)
        namespace["range"] = self._range
        for name, obj in list(namespace.items()):
            if isinstance(obj, types.FunctionType) and obj.__globals__ is fn.__globals__:
                namespace[name] = _rebind(obj, namespace)
        observed = _rebind(fn, namespace)  # fn itself may be local, not in its module
        self._codes = {f.__code__ for f in namespace.values()
                       if isinstance(f, types.FunctionType) and f.__globals__ is namespace}
        self._codes.add(observed.__code__)
        return observed

    def _range(self, *args: int) -> Iterator[int]:
        return self._iterate(builtins.range(*args))

    def _iterate(self, r: range) -> Iterator[int]:
        if not self._running:  # a stray call after the run: a plain range
            yield from r
            return
        loop = _Loop(r, self._home(sys._getframe(1)))
        outermost = not self._loops
        if not outermost:
            self._loops[-1].nested = True
        self._enter(loop, outermost)
        self._loops.append(loop)
        try:
            for value in self._order(r, outermost):
                if loop.value is not None:
                    self._end_iteration(loop)
                loop.value, loop.index = value, (value - r.start) // r.step
                loop.rows = min(r.step, r.stop - value)
                loop.blocks, loop.nested, loop.tiled = [], False, False
                self._begin_iteration(loop)
                yield value
            if loop.value is not None:
                self._end_iteration(loop)
        finally:  # ended, or left early (an error, a break: no more is logged then)
            if self._loops and self._loops[-1] is loop:
                self._loops.pop()

    def _home(self, frame: Any) -> Any:
        """The frame of the observed function that ``frame`` runs in (a comprehension or a
        generator expression runs in a frame of its own)."""
        f = frame
        while f is not None and f.f_code not in self._codes:
            f = f.f_back
        return frame if f is None else f


def _rebind(fn: types.FunctionType, namespace: dict[str, Any]) -> types.FunctionType:
    new = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


class HBMArray(NDArrayOperatorsMixin):
    """An array in a :class:`CountingMemory`'s HBM, or a range of its rows (a block).

    ``X[a:b]`` is the rows a to b, another HBMArray (no traffic); any other use by numpy
    (arithmetic, ``np.exp``, ``X.T``, ``X[:, None]``, ``np.asarray``) loads them into SRAM
    first, once per block.  ``X[a:b] = value`` writes rows to HBM.  Shapes, ``len`` and
    ``dtype`` are free.  Loads and writes happen only inside :meth:`CountingMemory.run`.
    """

    __slots__ = ("mem", "root", "start", "stop", "block", "value", "_data", "_name", "home",
                 "__weakref__")

    def __init__(self, mem: CountingMemory, data: np.ndarray | None, name: str | None, *,
                 root: HBMArray | None = None, start: int = 0, stop: int | None = None,
                 block: int | None = None, home: Any = None) -> None:
        self.mem = mem
        self.root = self if root is None else root
        self._data = data
        self._name = name
        self.home = home  # the frame to find the name in, for an allocation
        self.start = start
        self.stop = len(data) if stop is None and data is not None and data.ndim else stop
        self.block = block
        self.value: np.ndarray | None = None  # the SRAM copy, once loaded

    # --- what is free: names, shapes, the rows in HBM --------------------------------------

    @property
    def name(self) -> str:
        root = self.root
        if root._name is None:
            self.mem._resolve(root)
        return root._name or "?"

    @property
    def data(self) -> np.ndarray:
        """The rows in HBM, without counting (for the memory and for checks)."""
        data = self.root._data
        assert data is not None
        return data if self.root is self else data[self.start : self.stop]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.root._data.dtype  # type: ignore[union-attr]

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        rows = "" if self.root is self else f"[{self.start}:{self.stop}]"
        return f"HBMArray({self.name!r}{rows}, shape={self.shape}, dtype={self.dtype})"

    # --- slicing, loading and storing ------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice) and key.step in (None, 1):
            return self.mem._slice(self, key)
        return self._load()[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        if not (isinstance(key, slice) and key.step in (None, 1)):
            raise TypeError(f"write whole rows of an HBM array, X[a:b] = value; got "
                            f"{self.name}[{key!r}] = ...")
        self.mem.store(self, key, value)

    def _load(self) -> np.ndarray:
        if self.value is None:
            self.mem.load(self)
        return self.value  # type: ignore[return-value]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self._load()
        return value if dtype is None else value.astype(dtype, copy=False)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any
                        ) -> Any:
        out = kwargs.pop("out", None)
        if out is not None and not any(isinstance(o, HBMArray) for o in out):
            kwargs["out"] = out  # x += block, x a plain array: in place as usual
        # block += x: a new array (Python rebinds it; X[a:b] += x then writes it back)
        return getattr(ufunc, method)(*_loaded(inputs), **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return self.mem._function(self, func, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._load(), name)  # X.T, X.sum(...), X.max(...)


def _rows(X: HBMArray, key: slice) -> tuple[int, int]:
    """The rows of X's array that ``X[key]`` covers (``key`` a slice of X's rows)."""
    start, stop, _ = key.indices(len(X))
    return X.start + start, X.start + max(start, stop)


def _block(key: slice) -> int | None:
    """The block index of ``X[i : i + B]``, i // B; None for ``X[:]``."""
    if key.stop is None:
        return None
    first = key.start or 0
    return first // (key.stop - first) if key.stop > first else None


def _loaded(x: Any) -> Any:
    """``x`` with every HBMArray in it (in lists and tuples too) loaded."""
    if isinstance(x, HBMArray):
        return x._load()
    if isinstance(x, (list, tuple)):
        return type(x)(_loaded(y) for y in x)
    if isinstance(x, dict):
        return {k: _loaded(v) for k, v in x.items()}
    return x


#: Allocations: "like" functions (the prototype first) and creation functions (dispatched
#: through ``like=``); those that write a fill are counted as a write.
_LIKE = {np.empty_like: False, np.zeros_like: True, np.ones_like: True, np.full_like: True}
_CREATE = {np.empty: False, np.zeros: True, np.ones: True, np.full: True, np.asarray: True,
           np.array: True, np.asanyarray: True}


class CountingMemory(LoopTracker):
    """HBM arrays whose every element read and written is counted, and an SRAM of ``M``
    elements (None: unbounded) that raises :class:`SRAMCapacityError` when a step needs more.

    Place the inputs in HBM with :meth:`inputs`, run a teaching function with :meth:`run`
    (its outputs come back as numpy arrays, read without counting):

        mem = CountingMemory(M=4096)
        Q, K, V = mem.inputs(Q=q, K=k, V=v)
        O = mem.run(flash1_forward, Q, K, V, B_r, B_c)
        mem.reads["Q"], mem.writes["O"], mem.log, mem.peak_sram

    score_tiles: how many B_r x B_c tiles a tile step holds (1 forward, 2 backward).
    """

    def __init__(self, M: int | None = None, *, score_tiles: int = 1) -> None:
        super().__init__()
        self.capacity = M
        self.score_tiles = score_tiles
        self.reads: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.log: list[Event] = []
        self.peak_sram = 0
        self._tile: tuple[int, int] | None = None  # (rows, cols) of the tile being computed
        self._unnamed: list[tuple[HBMArray, bool]] = []  # allocations not yet named

    # --- HBM ---------------------------------------------------------------------------------

    def inputs(self, **arrays: np.ndarray) -> tuple[HBMArray, ...]:
        """Place ``arrays`` in HBM, before the algorithm runs (no traffic is counted)."""
        return tuple(HBMArray(self, np.array(x), name) for name, x in arrays.items())

    def _result(self, out: Any) -> Any:
        """The function's outputs as numpy arrays (copies, not counted)."""
        if isinstance(out, tuple):
            return tuple(self._result(x) for x in out)
        return np.array(out.data) if isinstance(out, HBMArray) else out

    def _slice(self, X: HBMArray, key: slice) -> HBMArray:
        """``X[a:b]``: the rows, in HBM, of the loop iteration running (no traffic)."""
        start, stop = _rows(X, key)
        view = HBMArray(self, None, None, root=X.root, start=start, stop=stop,
                        block=_block(key))
        if self._loops:
            loop = self._loops[-1]
            loop.blocks.append(view)
            if loop.side is None:
                loop.side = "kv" if view.name in KEY_SIDE else "q"
        return view

    def load(self, X: HBMArray) -> None:
        """Load the rows of X into SRAM, ``X.value``: a copy (HBM changes after the load are
        not seen), counted, and held until the loop iteration that sliced X ends."""
        self._check_running(f"reading {X.name}")
        self._name_allocations()
        X.value = value = self._source(X.root)[X.start : X.stop].copy()
        self._traffic("read", X.name, X.block, len(value) if value.ndim else 1, value.size)
        what = X.name if X.block is None else f"block {X.block} of {X.name}"
        self._check_capacity(f"loading {what}")

    def store(self, X: HBMArray, key: slice, value: Any) -> None:
        """``X[key] = value``: write rows of X to HBM, counted (after the tile being computed,
        which is logged first)."""
        self._check_running(f"writing {X.name}")
        start, stop = _rows(X, key)
        value = np.asarray(_loaded(value))
        self._name_allocations()
        self._tile_before_store()
        elements = X.root.data[start:stop].size
        self._write(X.root, start, stop, value)
        self._traffic("write", X.name, _block(key), stop - start, elements)

    def _write(self, root: HBMArray, start: int, stop: int, value: np.ndarray) -> None:
        """Write rows of an array in HBM (a subclass may delay it)."""
        root._data[start:stop] = value  # type: ignore[index]

    def _source(self, root: HBMArray) -> np.ndarray:
        """The data a load reads (a subclass may read a snapshot)."""
        return root._data  # type: ignore[return-value]

    def _function(self, X: HBMArray, func: Any, args: Any, kwargs: Any) -> Any:
        """A numpy function called on HBM arrays: an allocation "like" one (in HBM when it is
        an array in HBM, on chip when it is a block), else the function on their loads."""
        caller = sys._getframe(2)  # the code that called func (through X.__array_function__)
        if func in _LIKE and args and args[0] is X:
            plain = func(np.empty(X.shape, X.dtype), *args[1:], **kwargs)
            return self._allocate(plain, _LIKE[func], caller) if X.root is X else plain
        if func in _CREATE and not any(a is X for a in args):  # dispatched by like=X
            plain = np.array(func(*_loaded(args), **_loaded(kwargs)))
            return self._allocate(plain, _CREATE[func], caller) if X.root is X else plain
        return func(*_loaded(args), **_loaded(kwargs))

    def _allocate(self, data: np.ndarray, written: bool, caller: Any) -> HBMArray:
        """A new array in HBM, named once the function has bound it to a variable; ``written``:
        its content is written to HBM (a fill, or a whole new array)."""
        self._check_running("allocating in HBM")
        X = HBMArray(self, data, None, home=self._home(caller))
        self._unnamed.append((X, written))
        return X

    def _resolve(self, root: HBMArray) -> None:
        """Name ``root`` after the variable of its function's frame that holds it."""
        frame = root.home
        if frame is None:
            return
        for name, value in frame.f_locals.items():
            if value is root:
                root._name, root.home = name, None
                return
        raise TypeError(f"an array allocated in HBM is named after the variable that holds "
                        f"it: bind it to one in {frame.f_code.co_name}, line "
                        f"{frame.f_lineno} (X = np.empty_like(...), then use X)")

    def _name_allocations(self) -> None:
        """Name the arrays allocated since the last event, and log the writes of those that
        were written (their names are known only now: the statement that bound them ended)."""
        pending, self._unnamed = self._unnamed, []
        for X, written in pending:
            self._resolve(X)
            if written:
                self._traffic("write", X.name, None, len(X.data) if X.ndim else 1, X.size)

    # --- loops, tiles and SRAM -----------------------------------------------------------------

    def _start(self) -> None:
        self._tile, self._unnamed = None, []

    def _finish(self) -> None:
        self._name_allocations()

    def _enter(self, loop: _Loop, outermost: bool) -> None:
        self._name_allocations()

    def _begin_iteration(self, loop: _Loop) -> None:
        self._name_allocations()
        loop.stale = [x for _, x in self._block_arrays(loop.frame)]

    def _end_iteration(self, loop: _Loop) -> None:
        self._name_allocations()
        if not loop.tiled:
            self._compute_tile(loop)
        self._tile = None
        loop.blocks = []

    def _tile_before_store(self) -> None:
        """A write in an iteration that computes a tile comes after the tile."""
        if self._loops and not self._loops[-1].tiled:
            self._compute_tile(self._loops[-1])

    def _compute_tile(self, loop: _Loop) -> None:
        """If ``loop``'s iteration computes a tile (no loop ran inside it, it loaded a block,
        and it runs inside a loop of the other side), log the tile with what SRAM holds."""
        outer = next((lp for lp in reversed(self._loops) if lp.side not in (None, loop.side)),
                     None)
        if loop.nested or outer is None or loop.side is None or not any(
                v.value is not None for v in loop.blocks):
            return
        loop.tiled = True
        q, kv = (loop, outer) if loop.side == "q" else (outer, loop)
        self._tile = (q.rows, kv.rows)
        sram = self._check_capacity(f"computing tile (i={q.index}, j={kv.index})")
        held = tuple((name, b) for name, b, _ in self.resident())
        self._append(Event("tile", "S", q.index, kv.index, q.rows, q.rows * kv.rows, sram,
                           held))

    def _block_arrays(self, frame: Any) -> list[tuple[str, np.ndarray]]:
        """The variables of ``frame`` that hold one block's array on chip: named ``X_i`` or
        ``X_j``, numpy arrays (loads are HBMArrays)."""
        if frame is None:
            return []
        return [(name, x) for name, x in frame.f_locals.items()
                if name[-2:] in _BLOCK_SUFFIX and isinstance(x, np.ndarray)]

    def _on_chip(self) -> list[tuple[_Loop, list[tuple[str, np.ndarray]]]]:
        """Per running loop, the block arrays it holds: those of its frame whose suffix is its
        side, when it is the innermost loop of that side in that frame, made since its
        iteration began."""
        out = []
        for k, loop in enumerate(self._loops):
            if loop.side is None or any(lp.frame is loop.frame and lp.side == loop.side
                                        for lp in self._loops[k + 1:]):
                out.append((loop, []))
                continue
            mine = [(name, x) for name, x in self._block_arrays(loop.frame)
                    if _BLOCK_SUFFIX[name[-2:]] == loop.side
                    and not any(x is s for s in loop.stale)]
            out.append((loop, mine))
        return out

    def resident(self) -> list[tuple[str, int | None, int]]:
        """What SRAM holds now: ``(name, block index, elements)``, loop by loop (outermost
        first): its loaded blocks, then its block arrays (by variable name); the score
        tile(s) last (name "S", block None)."""
        out = []
        for loop, arrays in self._on_chip():
            out += [(v.name, v.block, v.size) for v in loop.blocks if v.value is not None]
            out += [(name, loop.index, x.size) for name, x in arrays]
        if self._tile:
            out.append(("S", None, self.score_tiles * self._tile[0] * self._tile[1]))
        return out

    def sram_elements(self) -> int:
        """Elements resident in SRAM now."""
        return sum(e for _, _, e in self.resident())

    def _check_capacity(self, step: str) -> int:
        resident = self.resident()
        sram = sum(e for _, _, e in resident)
        self.peak_sram = max(self.peak_sram, sram)
        if self.capacity is not None and sram > self.capacity:
            held = ", ".join(f"{name}{'' if b is None else f'[{b}]'}: {e}"
                             for name, b, e in resident)
            raise SRAMCapacityError(
                f"{step} needs {sram} elements of SRAM, more than M = {self.capacity} "
                f"({held})")
        return sram

    def _traffic(self, op: str, name: str, i: int | None, rows: int, elements: int) -> None:
        (self.reads if op == "read" else self.writes)[name] += elements
        self._append(Event(op, name, i, None, rows, elements, self.sram_elements()))

    def _append(self, event: Event) -> None:
        self.log.append(event)

    def _check_running(self, what: str) -> None:
        if not self._running:
            raise TypeError(f"{what}: an HBM array is read and written inside "
                            f"CountingMemory.run(fn, ...), which observes the loops")

    # --- totals ---------------------------------------------------------------------------------

    @property
    def total_reads(self) -> int:
        return sum(self.reads.values())

    @property
    def total_writes(self) -> int:
        return sum(self.writes.values())

    @property
    def total(self) -> int:
        """Elements read plus elements written."""
        return self.total_reads + self.total_writes
