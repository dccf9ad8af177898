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

**How the memory sees the loops: an AST pass.**  :meth:`LoopTracker.run` does not call the
function as it is: it reads the function's source, checks it, and compiles a copy (of it and
of the functions of its module, which it may call) in which each ``for`` statement's iterable
is handed to the memory first (``for i in mem.loop(range(0, N, B_r))``), each assignment tells
the memory the names it bound, and each iteration of a loop tells it the arrays the loop keeps
from before (those its body reads before it assigns them: O_i, l_i, m_i in FlashAttention-2's
inner loop).  The function's lines, and so its numbers, are the same bits.  Why this and not
the alternatives: explicit ``load(Q, i)`` / ``store(O, i, x)`` helpers would make the teaching
functions, which the chapters show, something other than plain numpy, and swapping the builtin
``range`` and reading the function's frames (as this module did before) cannot see what it
misses: a ``while`` loop or ``list(range(...))`` ran uncounted, and an on-chip array was
counted only if its name followed a convention.  The source says what the function does, so
what the memory cannot count is refused, by line, before or as it runs
(:class:`UncountableError`):

- a ``while`` loop; ``range(...)`` anywhere but as a ``for`` statement's (or a
  comprehension's) iterable (``list(range(...))``, a range in a variable, ``zip(range(...))``);
- an HBM block sliced in a loop over anything but a ``range`` (the memory knows which block a
  loop is on only from its range);
- a numpy array kept across the outermost loop (made before it, read in it: ``O = np.empty(...)``
  instead of ``np.empty_like(Q, ...)``, or a numpy input not placed with :meth:`inputs`): on
  chip for the whole run, which the SRAM model has no place for;
- two nested loops of one side with no loop of the other side between them (a tile needs a
  query block and a key block): the caller says which arrays' rows are keys (``key_side``).

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

import ast
import inspect
import textwrap
import types
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

__all__ = [
    "LoopTracker",
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


class UncountableError(TypeError):
    """The function does something the counting memory cannot count (a loop it cannot see, an
    on-chip array it cannot place); the message names the function, the line and the fix."""


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


# --- the AST pass: a counted copy of a function -------------------------------------------------


class _Site(NamedTuple):
    """A ``for`` statement or comprehension of a counted function: where it is, and the names
    its body reads before it assigns them (what it keeps from before each iteration)."""

    function: str
    line: int
    kept: frozenset[str]


_SITES: list[_Site] = []  # indexed by the number the counted code passes (mem.loop(it, k))
_COUNTED: dict[types.CodeType, types.CodeType | UncountableError] = {}

_MEM = "__flashlib_memory__"  # the name of the memory in a counted function's globals


def _uncountable(function: str, node: ast.AST, what: str) -> UncountableError:
    return UncountableError(f"{function}, line {getattr(node, 'lineno', '?')}: {what}")


def _read_first(body: list[ast.stmt]) -> frozenset[str]:
    """The names ``body`` reads before it assigns them (statement by statement; in an
    assignment the value before the targets), all branches taken."""
    first: dict[str, bool] = {}  # name -> read first?

    def loads(node: ast.AST) -> None:
        bound = {n.id for c in ast.walk(node) if isinstance(c, ast.comprehension)
                 for n in ast.walk(c.target) if isinstance(n, ast.Name)}
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id not in bound:
                first.setdefault(n.id, isinstance(n.ctx, ast.Load))

    def stmt(s: ast.stmt) -> None:
        if isinstance(s, (ast.Assign, ast.AnnAssign)):
            if s.value is not None:
                loads(s.value)
            for t in s.targets if isinstance(s, ast.Assign) else [s.target]:
                loads(t)
        elif isinstance(s, ast.AugAssign):
            loads(s.value)
            for n in ast.walk(s.target):
                if isinstance(n, ast.Name):
                    first.setdefault(n.id, True)  # x += y reads x
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            loads(s.iter)
            loads(s.target)
            for b in s.body + s.orelse:
                stmt(b)
        elif isinstance(s, (ast.If, ast.While)):
            loads(s.test)
            for b in s.body + s.orelse:
                stmt(b)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first.setdefault(s.name, False)
        else:
            loads(s)

    for s in body:
        stmt(s)
    return frozenset(name for name, read in first.items() if read)


def _call(method: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Attribute(value=ast.Name(id=_MEM, ctx=ast.Load()), attr=method,
                                       ctx=ast.Load()), args=list(args), keywords=[])


def _names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _names(elt)]
    return []


class _Counted(ast.NodeTransformer):
    """Rewrites one function's body for a counting memory (see the module docstring)."""

    def __init__(self, function: str) -> None:
        self.function = function
        self.loop_iters: set[int] = set()  # id() of the range(...) calls that are iterables

    def _site(self, node: ast.AST, kept: frozenset[str]) -> ast.Constant:
        _SITES.append(_Site(self.function, getattr(node, "lineno", 0), kept))
        return ast.Constant(len(_SITES) - 1)

    # nested functions, lambdas and classes are not part of this function's schedule
    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        return node

    def visit_While(self, node: ast.While) -> ast.AST:
        raise _uncountable(self.function, node, "a while loop, which the counting memory "
                           "cannot follow block by block: write it as `for i in range(start, "
                           "stop, step)`")

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if (isinstance(node.func, ast.Name) and node.func.id == "range"
                and id(node) not in self.loop_iters):
            raise _uncountable(self.function, node, "range(...) used other than as a for "
                               "loop's iterable (list(range(...)), a range kept in a variable, "
                               "zip(range(...), ...)): the counting memory sees a loop's blocks "
                               "only in `for i in range(start, stop, step)`")
        return self.generic_visit(node)

    def visit_For(self, node: ast.For) -> Any:
        self.loop_iters.add(id(node.iter))
        kept = _read_first(node.body)
        self.generic_visit(node)
        site = self._site(node, kept)
        node.iter = _call("loop", node.iter, site)
        keep = ast.Expr(_call("keep", site, ast.Call(func=ast.Name(id="locals", ctx=ast.Load()),
                                                     args=[], keywords=[])))
        node.body = [keep, *node.body]
        return node

    def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
        self.loop_iters.add(id(node.iter))
        self.generic_visit(node)
        node.iter = _call("loop", node.iter, self._site(node.iter, frozenset()))
        return node

    def _bound(self, node: ast.stmt, targets: list[ast.AST]) -> Any:
        names = list(dict.fromkeys(n for t in targets for n in _names(t)))
        if not names:
            return node
        bind = ast.Expr(_call("bind", ast.Dict(
            keys=[ast.Constant(n) for n in names],
            values=[ast.Name(id=n, ctx=ast.Load()) for n in names])))
        return [node, bind]

    def visit_Assign(self, node: ast.Assign) -> Any:
        self.generic_visit(node)
        return self._bound(node, node.targets)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
        self.generic_visit(node)
        return self._bound(node, [node.target] if node.value is not None else [])

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        self.generic_visit(node)
        return self._bound(node, [node.target])


def _counted_code(fn: types.FunctionType) -> types.CodeType:
    """The counted copy of ``fn``'s code (cached); raises :class:`UncountableError`."""
    code = fn.__code__
    if code not in _COUNTED:
        try:
            _COUNTED[code] = _compile_counted(fn)
        except UncountableError as e:
            _COUNTED[code] = e
    out = _COUNTED[code]
    if isinstance(out, UncountableError):
        raise out
    return out


def _compile_counted(fn: types.FunctionType) -> types.CodeType:
    name, code = fn.__qualname__, fn.__code__
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError) as e:
        raise UncountableError(f"{name}: the counting memory reads a function's source to see "
                               f"its loops, and cannot read this one's ({e})") from None
    func = tree.body[0] if tree.body else None
    if not isinstance(func, ast.FunctionDef) or func.name != code.co_name:
        raise UncountableError(f"{name}: the counting memory counts functions written with "
                               "def (not a lambda)")
    first = min([func.lineno] + [d.lineno for d in func.decorator_list])
    func.decorator_list = []
    ast.increment_lineno(func, code.co_firstlineno - first)
    _Counted(name).generic_visit(func)  # its body (nested functions are left as they are)
    body: list[ast.stmt] = [func]
    if code.co_freevars:  # rebuild the closure: the free names as locals of an outer function
        outer = ast.parse("def __counted_outer__(): pass").body[0]
        assert isinstance(outer, ast.FunctionDef)
        outer.body = [ast.Assign(targets=[ast.Name(id=v, ctx=ast.Store())],
                                 value=ast.Constant(None)) for v in code.co_freevars] + [func]
        body = [outer]
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    compiled = compile(module, code.co_filename, "exec")
    codes = [c for c in compiled.co_consts if isinstance(c, types.CodeType)]
    if code.co_freevars:
        codes = [c for c in codes[0].co_consts if isinstance(c, types.CodeType)]
    return next(c for c in codes if c.co_name == code.co_name)


def _counted_function(fn: types.FunctionType, namespace: dict[str, Any]) -> types.FunctionType:
    """``fn`` compiled for counting, with ``namespace`` as its globals."""
    try:
        code = _counted_code(fn)
    except UncountableError:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            _counted_code(fn)  # raises, saying why, if the run calls it
        return refuse  # type: ignore[return-value]
    closure = None
    if fn.__closure__:
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__, strict=True))
        closure = tuple(cells[v] for v in code.co_freevars)
    new = types.FunctionType(code, namespace, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


# --- loops ----------------------------------------------------------------------------------


class _Loop:
    """A running ``for ... in range(...)`` loop: its range and site, its side ("q" or "kv",
    from its first block; set by a counting memory), its current iteration (value, block
    index, rows), the blocks sliced in that iteration, the arrays kept on chip for it by the
    loops inside it (name -> elements), whether a loop ran inside it, and whether it computed
    its tile yet."""

    __slots__ = ("range", "site", "side", "value", "index", "rows", "blocks", "arrays",
                 "nested", "tiled")

    def __init__(self, r: range, site: _Site) -> None:
        self.range, self.site = r, site
        self.side: str | None = None
        self.value: int | None = None
        self.index: int | None = None
        self.rows = 0
        self.blocks: list[HBMArray] = []
        self.arrays: dict[str, int] = {}
        self.nested = False
        self.tiled = False


class LoopTracker:
    """Runs a function with its loops observed: ``run(fn, *args)`` calls a counted copy of
    ``fn`` (and of the functions of its module, which it may call) whose ``for`` loops report
    to this object when each starts, moves on and ends (see the module docstring).  A subclass
    may change the order in which the outermost loop visits its values (:meth:`_order`): the
    programs of a GPU launch run in any order.  On its own it changes nothing else."""

    def __init__(self) -> None:
        self._loops: list[_Loop] = []  # the running range loops, outermost first
        self._generic: list[tuple[_Site, int]] = []  # other loops running: (site, depth)
        self._running = False

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with its loops observed."""
        if not isinstance(fn, types.FunctionType):
            raise UncountableError(f"fn: expected a Python function, got {fn!r}")
        namespace = dict(fn.__globals__)
        namespace[_MEM] = self
        for name, obj in list(namespace.items()):
            if isinstance(obj, types.FunctionType) and obj.__globals__ is fn.__globals__:
                namespace[name] = _counted_function(obj, namespace)
        counted = _counted_function(fn, namespace)  # fn itself may be local, not in its module
        _counted_code(fn)  # refused: say why now
        self._loops, self._generic, self._running = [], [], True
        try:
            self._start()
            out = counted(*args, **kwargs)
            self._finish()
        finally:
            self._loops, self._generic, self._running = [], [], False
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

    def _keeps(self, loop: _Loop, kept: dict[str, Any]) -> None:
        """An iteration of ``loop`` began, holding ``kept``: the values of the names its body
        reads before it assigns them."""

    def _bound(self, names: dict[str, Any]) -> None:
        """A statement bound these names."""

    # --- what the counted code calls --------------------------------------------------------

    def loop(self, iterable: Any, site: int) -> Iterable[Any]:
        """The iterable of a ``for`` statement or comprehension (site: its number)."""
        if not self._running:  # a stray call after the run: the iterable as it is
            return iterable
        if isinstance(iterable, range):
            return self._iterate(iterable, _SITES[site])
        return self._other(iterable, _SITES[site])

    def keep(self, site: int, local_vars: dict[str, Any]) -> None:
        """The first statement of each iteration: the loop's locals, of which it keeps those
        its body reads before it assigns them."""
        if not (self._running and self._loops and self._loops[-1].site is _SITES[site]):
            return  # a loop over something else, or a stray call
        kept = _SITES[site].kept
        self._keeps(self._loops[-1], {k: v for k, v in local_vars.items() if k in kept})

    def bind(self, names: dict[str, Any]) -> None:
        """After each assignment: the names it bound and their values."""
        if self._running:
            self._bound(names)

    def _iterate(self, r: range, site: _Site) -> Iterator[int]:
        loop = _Loop(r, site)
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
                loop.blocks, loop.arrays, loop.nested, loop.tiled = [], {}, False, False
                self._begin_iteration(loop)
                yield value
            if loop.value is not None:
                self._end_iteration(loop)
        finally:  # ended, or left early (an error, a break: no more is logged then)
            if self._loops and self._loops[-1] is loop:
                self._loops.pop()

    def _other(self, iterable: Any, site: _Site) -> Iterator[Any]:
        """A loop over something else than a range: observed only so that a block sliced
        directly in it is refused (:meth:`CountingMemory._slice`)."""
        entry = (site, len(self._loops))
        self._generic.append(entry)
        try:
            yield from iterable
        finally:
            for k in range(len(self._generic) - 1, -1, -1):
                if self._generic[k] is entry:
                    del self._generic[k]
                    break


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

    def _enter(self, loop: _Loop, outermost: bool) -> None:
        self._name_allocations()

    def _begin_iteration(self, loop: _Loop) -> None:
        self._name_allocations()

    def _keeps(self, loop: _Loop, kept: dict[str, Any]) -> None:
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
