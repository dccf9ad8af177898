"""The memory model: HBM arrays that count what the teaching functions move.

The teaching functions (:mod:`flashlib.algorithms`) are plain numpy, and on numpy arrays that
is all they are.  They write the papers' memory traffic as numpy: "load Q_i from HBM to SRAM"
is ``Q_i = Q[i : i + B_r]``, "write O_i to HBM" is ``O[i : i + B_r] = ...``.  A
:class:`CountingMemory` runs the same function on its own arrays, :class:`HBMArray`, on which
those lines are the traffic:

    mem = CountingMemory(M=4096, key_side={"K", "V"})
    Q, K, V = mem.inputs(Q=q, K=k, V=v)
    O = mem.run(flash1_forward, Q, K, V, B_r, B_c)  # O comes back as a numpy array
    mem.traffic.reads["Q"], mem.traffic.total, mem.log, mem.peak_sram

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
``len(Q)``, ``Q.shape``,           free: shapes and dtypes are not data
``np.shape(Q)``, ``np.size(Q)``
=================================  ==============================================================

An array allocated in HBM is named after the variable of the teaching function that holds it
("O", "l", "D"); the inputs are named by :meth:`CountingMemory.inputs`.  Reads and writes are
counted per array, logged (:class:`Event`) and summed up as a :class:`Traffic`, the type the
closed forms of :func:`flashlib.studies.io_model.traffic` return too.

**How the memory sees the loops**: :mod:`flashlib.core.loops` runs a counted copy of the
function (an AST pass: see why there), whose loops report their blocks, whose assignments name
what they bind, and whose iterations say which arrays they keep from before.  What the memory
cannot count is refused by line (:class:`UncountableError`): a ``while`` loop, ``range(...)``
other than as a loop's iterable, an HBM block sliced in a loop over anything but a range, a
numpy array kept across the outermost loop (made before it, read in it: on chip for the whole
run, which the SRAM model has no place for), and two nested loops of one side with no loop of
the other side between them (a tile needs a query block and a key block).

The conventions are the caller's: ``key_side`` names the arrays whose rows are keys (a loop
whose first block is of one of them runs over key blocks, any other over query blocks); the
memory reads no variable name for anything else.

The SRAM model (capacity ``M`` elements; :class:`SRAMCapacityError` when a step needs more)
holds, at each step: the blocks loaded in the loop iterations still running (a block belongs
to the iteration it was sliced in, and leaves SRAM when that iteration ends); the arrays a loop
keeps on chip from its enclosing iteration (numpy arrays, whatever their names: FlashAttention-2's
O_i, l_i, m_i, kept by the key loop for the query block; the backward's dK_j, dV_j), held until
that enclosing iteration ends; and ``score_tiles`` score tiles of ``B_r x B_c`` while a tile
is computed (1 for the forward pass: P~_ij overwrites S_ij; 2 for the backward: P_ij and dP_ij,
overwritten by dS_ij).  Arrays made and used inside one iteration of the innermost loop (S_ij
aside, the per-row temporaries m~_ij, l~_ij, the rescale factors) are taken to live in
registers and are not counted.  An iteration of a loop nested in a loop of the other side, with
no loop inside it, computes the tile (query block, key block), logged with what SRAM holds then.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from flashlib.core.loops import Loop, LoopTracker, UncountableError

__all__ = [
    "CountingMemory",
    "HBMArray",
    "Event",
    "Traffic",
    "SRAMCapacityError",
    "UncountableError",
]


class Traffic(NamedTuple):
    """Elements read from and written to HBM, per array (the teaching functions' names): what a
    :class:`CountingMemory` counted (:attr:`CountingMemory.traffic`), or what a closed form
    says it will (:func:`flashlib.studies.io_model.traffic`)."""

    reads: dict[str, int]
    writes: dict[str, int]

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


# --- HBM --------------------------------------------------------------------------------------


class HBMArray(NDArrayOperatorsMixin):
    """An array in a :class:`CountingMemory`'s HBM, or a range of its rows (a block).

    ``X[a:b]`` is the rows a to b, another HBMArray (no traffic); any other use by numpy
    (arithmetic, ``np.exp``, ``X.T``, ``X[:, None]``, ``np.asarray``) loads them into SRAM
    first, once per block.  ``X[a:b] = value`` writes rows to HBM.  Shapes, ``len``, ``dtype``,
    ``np.shape`` and ``np.size`` are free.  Loads and writes happen only inside
    :meth:`CountingMemory.run`.
    """

    __slots__ = ("mem", "root", "start", "stop", "block", "value", "_data", "_name",
                 "__weakref__")

    def __init__(self, mem: CountingMemory, data: np.ndarray | None, name: str | None, *,
                 root: HBMArray | None = None, start: int = 0, stop: int | None = None,
                 block: int | None = None) -> None:
        self.mem = mem
        self.root = self if root is None else root
        self._data = data
        self._name = name
        self.start = start
        self.stop = len(data) if stop is None and data is not None and data.ndim else stop
        self.block = block
        self.value: np.ndarray | None = None  # the SRAM copy, once loaded

    # --- what is free: names, shapes, the rows in HBM --------------------------------------

    @property
    def name(self) -> str:
        if self.root._name is None:
            raise UncountableError(
                "an array allocated in HBM is named after the variable that holds it: bind it "
                "to one first (X = np.empty_like(...), then use X)")
        return self.root._name

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
        name = self.root._name or "(unnamed)"
        return f"HBMArray({name!r}{rows}, shape={self.shape}, dtype={self.dtype})"

    # --- slicing, loading and storing ------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice) and key.step in (None, 1):
            return self.mem._slice(self, key)
        return self._load()[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        if not (isinstance(key, slice) and key.step in (None, 1)):
            raise TypeError(f"write whole rows of an HBM array, X[a:b] = value; got "
                            f"{self.root._name}[{key!r}] = ...")
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


def _shell(x: Any) -> Any:
    """An HBMArray's shape and dtype without its data (no memory, nothing read)."""
    if isinstance(x, HBMArray):
        return np.broadcast_to(np.zeros((), x.dtype), x.shape)
    return x


def _on_chip(value: Any) -> int:
    """Elements of the numpy arrays in ``value`` (an array, or a tuple or list of them)."""
    if type(value) is np.ndarray:
        return value.size
    if isinstance(value, (tuple, list)):
        return sum(_on_chip(v) for v in value)
    return 0


#: Allocations: "like" functions (the prototype first) and creation functions (dispatched
#: through ``like=``); those that write a fill are counted as a write.
_LIKE = {np.empty_like: False, np.zeros_like: True, np.ones_like: True, np.full_like: True}
_CREATE = {np.empty: False, np.zeros: True, np.ones: True, np.full: True, np.asarray: True,
           np.array: True, np.asanyarray: True}
#: Functions of shapes and dtypes only: free, nothing is read.
_FREE = {np.shape, np.size, np.ndim, np.result_type}


class CountingMemory(LoopTracker):
    """HBM arrays whose every element read and written is counted, and an SRAM of ``M``
    elements (None: unbounded) that raises :class:`SRAMCapacityError` when a step needs more.

    Place the inputs in HBM with :meth:`inputs`, run a teaching function with :meth:`run`
    (its outputs come back as numpy arrays, read without counting):

        mem = CountingMemory(M=4096, key_side={"K", "V"})
        Q, K, V = mem.inputs(Q=q, K=k, V=v)
        O = mem.run(flash1_forward, Q, K, V, B_r, B_c)
        mem.traffic.reads["Q"], mem.traffic.total, mem.log, mem.peak_sram

    key_side: the names of the arrays whose rows are keys (the caller's convention; the
    teaching functions': K, V, dK, dV): a loop whose first block is of one of them runs over
    key blocks, any other over query blocks.
    score_tiles: how many B_r x B_c tiles a tile step holds (1 forward, 2 backward).
    """

    def __init__(self, M: int | None = None, *, key_side: Collection[str] = (),
                 score_tiles: int = 1) -> None:
        super().__init__()
        if isinstance(key_side, str):
            raise TypeError(f"key_side: expected a collection of array names, got {key_side!r}")
        self.capacity = M
        self.key_side = frozenset(key_side)
        self.score_tiles = score_tiles
        self._reads: Counter[str] = Counter()
        self._writes: Counter[str] = Counter()
        self.log: list[Event] = []
        self.peak_sram = 0
        self._tile: tuple[int, int] | None = None  # (rows, cols) of the tile being computed
        self._unnamed: list[tuple[HBMArray, bool]] = []  # allocations not yet named

    @property
    def traffic(self) -> Traffic:
        """Elements read and written so far, per array."""
        return Traffic(dict(self._reads), dict(self._writes))

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
        if self._generic and self._generic[-1][1] == len(self._loops):
            site = self._generic[-1][0]
            raise UncountableError(
                f"{site.function}, line {site.line}: a block of {X.name} sliced in a loop "
                "over something else than range(...): the counting memory knows which block a "
                "loop is on only in `for i in range(start, stop, step)`")
        if self._loops:
            loop = self._loops[-1]
            loop.blocks.append(view)
            if loop.side is None:
                loop.side = "kv" if view.name in self.key_side else "q"
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
        """A numpy function called on HBM arrays: free (a shape), an allocation "like" one (in
        HBM when it is an array in HBM, on chip when it is a block), else the function on
        their loads."""
        if func in _FREE:
            return func(*(_shell(a) for a in args), **kwargs)
        if func in _LIKE and args and args[0] is X:
            plain = func(np.empty(X.shape, X.dtype), *args[1:], **kwargs)
            return self._allocate(plain, _LIKE[func]) if X.root is X else plain
        if func in _CREATE and not any(a is X for a in args):  # dispatched by like=X
            plain = np.array(func(*_loaded(args), **_loaded(kwargs)))
            return self._allocate(plain, _CREATE[func]) if X.root is X else plain
        return func(*_loaded(args), **_loaded(kwargs))

    def _allocate(self, data: np.ndarray, written: bool) -> HBMArray:
        """A new array in HBM, named once the function binds it to a variable (:meth:`bind`);
        ``written``: its content is written to HBM (a fill, or a whole new array)."""
        self._check_running("allocating in HBM")
        X = HBMArray(self, data, None)
        self._unnamed.append((X, written))
        return X

    def _bound(self, names: dict[str, Any]) -> None:
        """Name the arrays just allocated that the statement bound, and log the writes of
        those that were written (their names are known only now)."""
        if not self._unnamed:
            return
        for name, value in names.items():
            for x in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(x, HBMArray) and x.root is x and x._name is None:
                    x._name = name
        named = [(X, w) for X, w in self._unnamed if X._name is not None]
        self._unnamed = [(X, w) for X, w in self._unnamed if X._name is None]
        for X, written in named:
            if written:
                self._traffic("write", X.name, None, len(X.data) if X.ndim else 1, X.size)

    def _name_allocations(self) -> None:
        """Before any other event: every array allocated so far must have its name."""
        if self._unnamed:
            raise UncountableError(
                "an array allocated in HBM is named after the variable that holds it: bind it "
                "to one (X = np.empty_like(...)), then use X")

    # --- loops, tiles and SRAM -----------------------------------------------------------------

    def _start(self) -> None:
        self._tile, self._unnamed = None, []

    def _finish(self) -> None:
        self._name_allocations()

    def _enter(self, loop: Loop, outermost: bool) -> None:
        self._name_allocations()

    def _begin_iteration(self, loop: Loop) -> None:
        self._name_allocations()

    def _keeps(self, loop: Loop, kept: dict[str, Any]) -> None:
        """The numpy arrays ``loop`` keeps from before its iteration are on chip for the
        iteration of the loop around it, until that iteration ends."""
        arrays = {name: _on_chip(x) for name, x in kept.items() if _on_chip(x)}
        if not arrays:
            return
        owner = self._loops[-2] if len(self._loops) > 1 else None
        if owner is None:
            site = loop.site
            raise UncountableError(
                f"{site.function}, line {site.line}: {', '.join(arrays)} "
                f"{'is a numpy array' if len(arrays) == 1 else 'are numpy arrays'} made before "
                "the outermost loop and used in it: on chip for the whole run, which the SRAM "
                "model has no place for.  Place an input in HBM (mem.inputs), allocate an "
                "output in HBM like one (np.empty_like(Q, shape=...)), or make the array inside "
                "the loop, for one block")
        owner.arrays.update(arrays)

    def _end_iteration(self, loop: Loop) -> None:
        self._name_allocations()
        if not loop.tiled:
            self._compute_tile(loop)
        self._tile = None
        loop.blocks = []

    def _tile_before_store(self) -> None:
        """A write in an iteration that computes a tile comes after the tile."""
        if self._loops and not self._loops[-1].tiled:
            self._compute_tile(self._loops[-1])

    def _compute_tile(self, loop: Loop) -> None:
        """If ``loop``'s iteration computes a tile (no loop ran inside it, it loaded a block,
        and it runs inside a loop of the other side), log the tile with what SRAM holds."""
        if loop.nested or loop.side is None or not any(
                v.value is not None for v in loop.blocks):
            return
        outer = next((lp for lp in reversed(self._loops) if lp.side not in (None, loop.side)),
                     None)
        if outer is None:
            same = next((lp for lp in self._loops if lp is not loop and lp.side == loop.side),
                        None)
            if same is not None:
                side = "key" if loop.side == "kv" else "query"
                raise UncountableError(
                    f"{loop.site.function}, line {loop.site.line}: this loop and the loop at "
                    f"line {same.site.line} both run over {side} blocks, so no tile (a query "
                    "block and a key block) is computed: name the arrays whose rows are keys, "
                    f"CountingMemory(key_side=...) (now {sorted(self.key_side)})")
            return
        loop.tiled = True
        q, kv = (loop, outer) if loop.side == "q" else (outer, loop)
        self._tile = (q.rows, kv.rows)
        sram = self._check_capacity(f"computing tile (i={q.index}, j={kv.index})")
        held = tuple((name, b) for name, b, _ in self.resident())
        self._append(Event("tile", "S", q.index, kv.index, q.rows, q.rows * kv.rows, sram,
                           held))

    def resident(self) -> list[tuple[str, int | None, int]]:
        """What SRAM holds now: ``(name, block index, elements)``, loop by loop (outermost
        first): its loaded blocks, then the arrays kept on chip for its iteration (by variable
        name); the score tile(s) last (name "S", block None)."""
        out = []
        for loop in self._loops:
            out += [(v.name, v.block, v.size) for v in loop.blocks if v.value is not None]
            out += [(name, loop.index, size) for name, size in loop.arrays.items()]
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
        (self._reads if op == "read" else self._writes)[name] += elements
        self._append(Event(op, name, i, None, rows, elements, self.sram_elements()))

    def _append(self, event: Event) -> None:
        self.log.append(event)

    def _check_running(self, what: str) -> None:
        if not self._running:
            raise TypeError(f"{what}: an HBM array is read and written inside "
                            f"CountingMemory.run(fn, ...), which observes the loops")
