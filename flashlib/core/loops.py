"""Running a function with its loops observed: an AST pass.

:meth:`LoopTracker.run` does not call the function as it is: it reads the function's source,
checks it, and compiles a copy (of it and of the functions of its module, which it may call)
in which each ``for`` statement's iterable is handed to the tracker first
(``for i in tracker.loop(range(0, N, B_r), site)``), each assignment tells the tracker the
names it bound, and each iteration of a loop tells it the values the loop keeps from before
(the names its body reads before it assigns them: O_i, l_i, m_i in FlashAttention-2's inner
loop).  The function's lines, and so its numbers, are the same bits.  A
:class:`flashlib.core.hbm.CountingMemory` is such a tracker; so is a study's
``ProgramOrder``, which visits the outermost loop's blocks in a random order.

Why an AST pass, and not the alternatives: explicit ``load(Q, i)`` / ``store(O, i, x)``
helpers would make the teaching functions, which the chapters show, something other than
plain numpy; swapping the builtin ``range`` and reading the function's frames (as the
counting memory did before) cannot see what it misses: a ``while`` loop or
``list(range(...))`` ran uncounted, and an on-chip array was counted only if its name followed
a convention.  The source says what the function does, so what cannot be followed is refused,
by line, before it runs (:class:`UncountableError`): a ``while`` loop; ``range(...)``
anywhere but as a ``for`` statement's (or a comprehension's) iterable (``list(range(...))``, a
range in a variable, ``zip(range(...))``).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

__all__ = ["LoopTracker", "Loop", "UncountableError"]


class UncountableError(TypeError):
    """The function does something the counting memory cannot count (a loop it cannot see, an
    on-chip array it cannot place); the message names the function, the line and the fix."""




# --- the AST pass: a counted copy of a function -------------------------------------------------


class _Site(NamedTuple):
    """A ``for`` statement or comprehension of a counted function: where it is, and the names
    its body reads before it assigns them (what it keeps from before each iteration)."""

    function: str
    line: int
    kept: frozenset[str]


_SITES: list[_Site] = []  # indexed by the number the counted code passes (mem.loop(it, k))
_COUNTED: dict[types.CodeType, types.CodeType | UncountableError] = {}

_MEM = "__flashlib_memory__"  # the tracker's name in a counted function's globals


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


class Loop:
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
        self.blocks: list[Any] = []  # a counting memory's HBM blocks
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
        self._loops: list[Loop] = []  # the running range loops, outermost first
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

    def _enter(self, loop: Loop, outermost: bool) -> None:
        """A loop starts (before its first iteration)."""

    def _begin_iteration(self, loop: Loop) -> None:
        """An iteration starts (``loop.value`` set)."""

    def _end_iteration(self, loop: Loop) -> None:
        """An iteration ends (the loop moves on, or ends)."""

    def _keeps(self, loop: Loop, kept: dict[str, Any]) -> None:
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
        loop = Loop(r, site)
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
