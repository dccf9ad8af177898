"""The memory the teaching functions talk to: HBM traffic goes through one small object.

The papers write their algorithms as memory traffic ("Load K_j, V_j from HBM to on-chip SRAM",
"Write O_i to HBM"), and so do the teaching functions
(:func:`flashlib.algorithms.standard_attention`,
:func:`flashlib.algorithms.flash1_forward`, :func:`flashlib.algorithms.flash2_forward`,
:func:`flashlib.algorithms.flash2_backward`): every HBM access is a call on their ``mem``
argument.

=====================================  ==========================================================
``mem.blocks(B, X, Y, ...)``           for each block of ``B`` rows: load ``X_i, Y_i, ...`` to
                                       SRAM; yields ``(i, X_i, Y_i, ...)``, ``i`` the first row
``mem.write(X, i, X_i)``               write a block back to HBM, rows ``i : i + len(X_i)``
``mem.full(name, shape, fill, dtype)`` "Initialize ... in HBM": allocate and write ``fill``
``mem.empty(name, shape, dtype)``      allocate an array in HBM (no traffic)
``mem.on_chip(A_i=..., B_i=...)``      arrays initialised on chip (FlashAttention-2's O_i, l_i)
``mem.put(name, X)``                   write a whole new array to HBM (Algorithm 0's S, P, O)
``mem.read(X)``                        read a whole array back (streamed through SRAM)
=====================================  ==========================================================

:data:`PLAIN`, the default, is plain numpy: a block is a slice, a write an assignment, nothing
is copied or counted, so the functions cost what they would cost without it.
:class:`CountingMemory` implements the same calls on "HBM" arrays that only it can read, so
that no access escapes it: it counts every element read and written per array, keeps an event
log (reads, writes, and the tile each nested pair of loops computes), and models an SRAM of
capacity ``M`` elements that raises :class:`SRAMCapacityError` when a step needs more.

What the SRAM model holds at a step: the blocks of every active loop (a loop's block leaves
SRAM when the loop moves on or ends), the arrays created with ``on_chip`` (until the loop
they were created in moves on), and ``score_tiles`` score tiles of ``B_r x B_c`` while a tile
is computed (1 for the forward pass: P~_ij overwrites S_ij; 2 for the backward: P_ij and
dP_ij, overwritten by dS_ij).  Per-row temporaries of a tile (m~_ij, l~_ij, the rescale
factors) are taken to live in registers and are not counted.  A loop over K, V, dK or dV
(by name) runs over key blocks, any other loop over query blocks; a key loop nested in a
query loop, or the reverse, computes the tile (query block, key block).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, Protocol

import numpy as np

__all__ = [
    "Memory",
    "PlainMemory",
    "PLAIN",
    "CountingMemory",
    "HBMArray",
    "Event",
    "SRAMCapacityError",
    "KEY_SIDE",
]

#: Arrays whose rows are keys: a loop over them runs over key blocks (j), any other over
#: query blocks (i).
KEY_SIDE = frozenset({"K", "V", "dK", "dV"})


class Memory(Protocol):
    """What a teaching function asks of its ``mem`` (see the module docstring)."""

    def blocks(self, B: int, *arrays: Any) -> Iterator[tuple[Any, ...]]: ...
    def write(self, X: Any, i: int, value: np.ndarray) -> None: ...
    def full(self, name: str, shape: tuple[int, ...], fill: float, dtype: Any) -> Any: ...
    def empty(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any: ...
    def on_chip(self, **arrays: np.ndarray) -> tuple[np.ndarray, ...]: ...
    def put(self, name: str, value: np.ndarray) -> Any: ...
    def read(self, X: Any) -> np.ndarray: ...


class PlainMemory:
    """Plain numpy: HBM is ordinary arrays, a block is a view, nothing is counted."""

    @staticmethod
    def blocks(B: int, *arrays: np.ndarray) -> Iterator[tuple[Any, ...]]:
        """For each block of ``B`` rows of ``arrays`` (same length): ``(i, X[i:i+B], ...)``."""
        for i in range(0, len(arrays[0]), B):
            yield (i, *[X[i : i + B] for X in arrays])

    @staticmethod
    def write(X: np.ndarray, i: int, value: np.ndarray) -> None:
        """``X[i : i + len(value)] = value``."""
        X[i : i + len(value)] = value

    @staticmethod
    def full(name: str, shape: tuple[int, ...], fill: float, dtype: Any) -> np.ndarray:
        return np.full(shape, fill, dtype)

    @staticmethod
    def empty(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.empty(shape, dtype)

    @staticmethod
    def on_chip(**arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(arrays.values())

    @staticmethod
    def put(name: str, value: np.ndarray) -> np.ndarray:
        return value

    @staticmethod
    def read(X: np.ndarray) -> np.ndarray:
        return X


#: The default memory of every teaching function.
PLAIN = PlainMemory()


class SRAMCapacityError(ValueError):
    """A step of the schedule needs more SRAM than the memory's capacity ``M``."""


class HBMArray:
    """An array in a :class:`CountingMemory`'s HBM: its data is reached only through the
    memory's calls (``np.asarray(x)`` reads it without counting, for the caller afterwards).

    ``x[a:b]`` is the row range as another HBMArray of the same name (no traffic): split-KV
    hands each program its share of K and V this way.
    """

    __slots__ = ("name", "data")

    def __init__(self, name: str, data: np.ndarray) -> None:
        self.name = name
        self.data = data

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, rows: slice) -> HBMArray:
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError(f"an HBM array is read through its memory; x[a:b] selects rows only, "
                            f"got x[{rows!r}]")
        return HBMArray(self.name, self.data[rows])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = self.data if dtype is None else self.data.astype(dtype, copy=False)
        return data.copy() if copy and data is self.data else data

    def __repr__(self) -> str:
        return f"HBMArray({self.name!r}, shape={self.shape}, dtype={self.dtype})"


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
    """An active ``blocks`` loop: its side ("q" or "kv"), block size, current block, and what it
    holds in SRAM (its loaded blocks, and the on-chip arrays created in its body)."""

    __slots__ = ("side", "B", "index", "rows", "loaded", "on_chip")

    def __init__(self, side: str, B: int) -> None:
        self.side, self.B = side, B
        self.index: int | None = None
        self.rows = 0
        self.loaded: list[tuple[str, int]] = []  # (name, elements) of the current blocks
        self.on_chip: list[tuple[str, int]] = []

    def elements(self) -> int:
        return sum(e for _, e in self.loaded) + sum(e for _, e in self.on_chip)


class CountingMemory:
    """HBM arrays whose every element read and written is counted, and an SRAM of ``M``
    elements (None: unbounded) that raises :class:`SRAMCapacityError` when a step needs more.

    Place the inputs in HBM with :meth:`inputs`, pass the memory to a teaching function, read
    the result with ``np.asarray``:

        mem = CountingMemory(M=4096)
        Q, K, V = mem.inputs(Q=q, K=k, V=v)
        O = np.asarray(flash1_forward(Q, K, V, B_r, B_c, mem))
        mem.reads["Q"], mem.writes["O"], mem.log, mem.peak_sram

    score_tiles: how many B_r x B_c tiles a tile step holds (1 forward, 2 backward).
    """

    def __init__(self, M: int | None = None, *, score_tiles: int = 1) -> None:
        self.capacity = M
        self.score_tiles = score_tiles
        self.reads: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.log: list[Event] = []
        self.peak_sram = 0
        self._loops: list[_Loop] = []
        self._tile: tuple[int, int] | None = None  # (rows, cols) of the tile being computed

    # --- HBM ---------------------------------------------------------------------------------

    def inputs(self, **arrays: np.ndarray) -> tuple[HBMArray, ...]:
        """Place ``arrays`` in HBM, before the algorithm runs (no traffic is counted)."""
        return tuple(HBMArray(name, np.array(x)) for name, x in arrays.items())

    def empty(self, name: str, shape: tuple[int, ...], dtype: Any) -> HBMArray:
        return HBMArray(name, np.zeros(shape, dtype))

    def full(self, name: str, shape: tuple[int, ...], fill: float, dtype: Any) -> HBMArray:
        X = HBMArray(name, np.full(shape, fill, dtype))
        self._traffic("write", name, None, len(X.data) if X.ndim else 1, X.size)
        return X

    def put(self, name: str, value: np.ndarray) -> HBMArray:
        X = HBMArray(name, np.array(value))
        self._traffic("write", name, None, len(X.data) if X.ndim else 1, X.size)
        return X

    def read(self, X: HBMArray) -> np.ndarray:
        self._check_array(X)
        self._traffic("read", X.name, None, len(X.data) if X.ndim else 1, X.size)
        return X.data.copy()

    def write(self, X: HBMArray, i: int, value: np.ndarray) -> None:
        self._check_array(X)
        value = np.asarray(value)
        stop = i + len(value)
        if not 0 <= i < stop <= len(X.data):
            raise ValueError(f"write to {X.name}[{i}:{stop}] is outside its {len(X.data)} rows")
        X.data[i:stop] = value
        self._traffic("write", X.name, self._block_index(X.name, i), len(value), value.size)

    def blocks(self, B: int, *arrays: HBMArray) -> Iterator[tuple[Any, ...]]:
        """Load each block of ``B`` rows of ``arrays`` into SRAM (copies: HBM changes after the
        load are not seen); the previous blocks of this loop leave SRAM first."""
        for X in arrays:
            self._check_array(X)
        n = len(arrays[0].data)
        if any(len(X.data) != n for X in arrays):
            raise ValueError(f"blocks of arrays of different lengths: "
                             f"{[(X.name, len(X.data)) for X in arrays]}")
        starts = self._starts(n, B, outermost=not self._loops)
        loop = _Loop("kv" if arrays[0].name in KEY_SIDE else "q", B)
        self._loops.append(loop)
        try:
            for start in starts:
                loop.loaded, loop.on_chip = [], []  # the previous blocks leave SRAM
                loop.index, loop.rows = start // B, min(B, n - start)
                loaded = []
                for X in arrays:
                    block = self._source(X)[start : start + B].copy()
                    loop.loaded.append((X.name, block.size))
                    self._traffic("read", X.name, loop.index, len(block), block.size)
                    loaded.append(block)
                self._compute_tile()
                yield (start, *loaded)
                self._tile = None
        finally:
            self._loops.remove(loop)

    def on_chip(self, **arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        """Arrays initialised on chip, resident until the loop they are created in moves on."""
        if self._loops:
            self._loops[-1].on_chip += [(name, np.asarray(x).size) for name, x in arrays.items()]
            self._check_capacity(f"initialising {', '.join(arrays)} on chip")
        return tuple(arrays.values())

    # --- SRAM and the log ----------------------------------------------------------------------

    def sram_elements(self) -> int:
        """Elements resident in SRAM now."""
        tile = self.score_tiles * self._tile[0] * self._tile[1] if self._tile else 0
        return sum(loop.elements() for loop in self._loops) + tile

    def resident(self) -> list[tuple[str, int | None, int]]:
        """What SRAM holds now: ``(name, block index, elements)``, loaded blocks first, the
        score tile(s) last (name "S", block None)."""
        out = []
        for loop in self._loops:
            out += [(name, loop.index, e) for name, e in loop.loaded]
            out += [(name, loop.index, e) for name, e in loop.on_chip]
        if self._tile:
            out.append(("S", None, self.score_tiles * self._tile[0] * self._tile[1]))
        return out

    def _compute_tile(self) -> None:
        """After a nested loop loaded its blocks: the tile (query block, key block) of the two
        innermost loops of different sides is computed on chip."""
        inner = self._loops[-1]
        outer = next((lp for lp in reversed(self._loops[:-1]) if lp.side != inner.side), None)
        if outer is None:
            self._check_capacity(f"loading block {inner.index}")
            return
        q, kv = (inner, outer) if inner.side == "q" else (outer, inner)
        self._tile = (q.rows, kv.rows)
        sram = self._check_capacity(f"computing tile (i={q.index}, j={kv.index})")
        held = tuple((name, b) for name, b, _ in self.resident())
        self.log.append(Event("tile", "S", q.index, kv.index, q.rows, q.rows * kv.rows, sram,
                              held))

    def _check_capacity(self, step: str) -> int:
        sram = self.sram_elements()
        self.peak_sram = max(self.peak_sram, sram)
        if self.capacity is not None and sram > self.capacity:
            held = ", ".join(f"{name}{'' if b is None else f'[{b}]'}: {e}"
                             for name, b, e in self.resident())
            raise SRAMCapacityError(
                f"{step} needs {sram} elements of SRAM, more than M = {self.capacity} "
                f"({held})")
        return sram

    def _traffic(self, op: str, name: str, i: int | None, rows: int, elements: int) -> None:
        (self.reads if op == "read" else self.writes)[name] += elements
        self.log.append(Event(op, name, i, None, rows, elements, self.sram_elements()))

    def _block_index(self, name: str, start: int) -> int | None:
        side = "kv" if name in KEY_SIDE else "q"
        loop = next((lp for lp in reversed(self._loops) if lp.side == side), None)
        return None if loop is None else start // loop.B

    def _starts(self, n: int, B: int, outermost: bool) -> Iterable[int]:
        """The first rows of the blocks a loop visits (all of them; a subclass may restrict
        the outermost loop, as a GPU grid hands each program its blocks)."""
        return range(0, n, B)

    def _source(self, X: HBMArray) -> np.ndarray:
        """The data a load reads (a subclass may read a snapshot)."""
        return X.data

    def _check_array(self, X: object) -> None:
        if not isinstance(X, HBMArray):
            raise TypeError(f"CountingMemory counts HBMArrays (from mem.inputs, mem.empty, "
                            f"mem.full or mem.put), got {type(X).__name__}")

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
