"""Where a kernel reads and writes, watched in Triton's interpreter: every load and store of every
program, checked against the arrays the kernel was given.

On a GPU a kernel that reads past the end of an array gets whatever lies there (or crashes the
context); in the interpreter it reads this process's memory.  The chapter's checkers, and the
tests, pass each array as a view into a larger buffer (:func:`guarded`: the rows and columns
around it hold NaN, so a stray read shows in the result even compiled), and in the interpreter
they watch the kernel run (:class:`MemoryWatch`): which program touched which element of which
array, and every access outside the arrays, named in the arrays' own indices
(``Q[45, 3]``: row 45 of a 45-row array, one past its end).

    q, q_buffer = guarded(np_q, rows=8, cols=16)      # a torch view, and the buffer around it
    with MemoryWatch({"Q": (q, q_buffer), ...}) as watch:
        kernel[grid](q, ...)
    watch.outside      # [Access(program=(2, 0, 0), kind="load", array="Q", index=(45, 3)), ...]
    watch.rows("store", "O", program=(1, 0, 0))        # the rows of O program 1 wrote

Interpreter only (:func:`watching_possible`); compiled kernels cannot be watched.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Access", "MemoryWatch", "guarded", "watching_possible"]


def watching_possible() -> bool:
    """Whether kernels run in Triton's interpreter here (only then can they be watched)."""
    from flashlib.gpu.kernels import interpreted

    return interpreted()


def guarded(x: np.ndarray, *, rows: int = 8, cols: int = 8, fill: float = float("nan"),
            device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A copy of the 2-D or 3-D array ``x`` as a torch view into a buffer with ``rows`` extra
    rows and ``cols`` extra columns around it (after it, in every matrix of the stack), all
    ``fill``: the view's row stride is its width + ``cols``.  Returns (view, buffer)."""
    x = np.asarray(x)
    if x.ndim not in (2, 3):
        raise ValueError(f"x: expected a 2-D or 3-D array, got shape {x.shape}")
    *lead, n, d = x.shape
    buffer = torch.full((*lead, n + rows, d + cols), fill, dtype=torch.from_numpy(x[:0]).dtype,
                        device=device)
    view = buffer[..., :n, :d]
    view.copy_(torch.from_numpy(np.ascontiguousarray(x)))
    return view, buffer


@dataclass(frozen=True)
class Access:
    """One access outside the arrays: the program (its program_id on the three axes), "load"
    or "store", the array whose buffer holds the address (None: no array's) and the index in
    that array's own strides (which may lie past its shape: ``(45, 3)`` in a 45-row array)."""

    program: tuple[int, int, int]
    kind: str
    array: str | None
    index: tuple[int, ...] | None


class _Array:
    def __init__(self, name: str, view: torch.Tensor, buffer: torch.Tensor):
        self.name, self.view = name, view
        self.item = view.element_size()
        self.base = view.data_ptr()
        self.start = buffer.data_ptr()
        self.stop = self.start + buffer.numel() * buffer.element_size()
        self.strides = np.array(view.stride(), dtype=np.int64)
        self.shape = np.array(view.shape, dtype=np.int64)
        self.order = np.argsort(-self.strides, kind="stable")

    def index(self, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(indices (k, ndim), inside (k,)): each address in the view's strides, and whether it
        is an element of the view."""
        offset = (addresses.astype(np.int64) - self.base) // self.item
        idx = np.zeros((len(addresses), len(self.shape)), dtype=np.int64)
        for axis in self.order:
            idx[:, axis] = np.floor_divide(offset, self.strides[axis])
            offset = offset - idx[:, axis] * self.strides[axis]
        inside = (offset == 0) & np.all((idx >= 0) & (idx < self.shape), axis=1)
        return idx, inside


class MemoryWatch:
    """Watch every load and store of the kernels launched inside ``with`` (the interpreter's
    only): ``arrays`` maps a name to (view, buffer) or to a tensor (its own buffer)."""

    def __init__(self, arrays: dict[str, Any]):
        self.arrays = [_Array(name, *(a if isinstance(a, tuple) else (a, a)))
                       for name, a in arrays.items()]
        self.outside: list[Access] = []
        self._touched: dict[tuple, set] = defaultdict(set)
        self._saved: tuple | None = None

    def __enter__(self) -> MemoryWatch:
        if not watching_possible():
            raise RuntimeError("MemoryWatch: the kernels are compiled here, not interpreted")
        from triton.runtime import interpreter

        builder = interpreter.interpreter_builder
        load, store = builder.create_masked_load, builder.create_masked_store
        self._saved = (builder, load, store)

        def watched_load(ptrs, mask, *args, **kwargs):
            self._record(builder, "load", ptrs.data, mask.data)
            return load(ptrs, mask, *args, **kwargs)

        def watched_store(ptrs, value, mask, *args, **kwargs):
            self._record(builder, "store", ptrs.data, mask.data)
            return store(ptrs, value, mask, *args, **kwargs)

        builder.create_masked_load, builder.create_masked_store = watched_load, watched_store
        return self

    def __exit__(self, *exc: Any) -> None:
        builder, load, store = self._saved
        builder.create_masked_load, builder.create_masked_store = load, store

    def _record(self, builder: Any, kind: str, ptrs: np.ndarray, mask: np.ndarray) -> None:
        program = tuple(int(p) for p in builder.grid_idx)
        addresses = np.broadcast_to(ptrs, np.broadcast_shapes(ptrs.shape, mask.shape))
        active = addresses[np.broadcast_to(mask, addresses.shape)].ravel()
        left = active
        for array in self.arrays:
            here = (left >= array.start) & (left < array.stop)
            if not here.any():
                continue
            idx, inside = array.index(left[here])
            self._touched[kind, array.name, program].update(
                tuple(int(i) for i in row) for row in idx[inside])
            for bad in np.unique(idx[~inside], axis=0)[:4]:
                self.outside.append(Access(program, kind, array.name, tuple(int(i) for i in bad)))
            left = left[~here]
        if len(left):
            self.outside.append(Access(program, kind, None, None))

    def touched(self, kind: str, array: str, program: tuple[int, int, int]) -> set[tuple]:
        """The indices of ``array`` that ``program`` accessed (``kind``: "load" or "store")."""
        return self._touched.get((kind, array, tuple(program)), set())

    def rows(self, kind: str, array: str, program: tuple[int, int, int]) -> list[int]:
        """The sorted rows (second-to-last index) of ``array`` that ``program`` accessed."""
        return sorted({index[-2] for index in self.touched(kind, array, program)})

    def programs(self) -> list[tuple[int, int, int]]:
        """Every program that loaded or stored anything, in order."""
        return sorted({key[2] for key in self._touched} | {a.program for a in self.outside})
