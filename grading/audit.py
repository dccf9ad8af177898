"""The judge's audit of a student's cells: what the code may not do, decided from its text and
its compiled code, in the judge (never in the student's process, whose measurements and
watchers the student's code can reach).

    audit(cells, prelude, forbidden={"flashlib.fast.naive.naive_attention": None},
          answers=["attention"]) -> Audit(refusals=["line 3: builds ..."], flags=[...])

Each cell is parsed as IPython would (magics turned into calls) and compiled here, and its
abstract syntax tree and its code objects (recursively: functions, lambdas, classes,
comprehensions; the compiler folds ``"__co" + "de__"`` into one constant, so a name split in
two is seen too) are searched for:

- code objects: ``__code__``, ``co_code``, ``types.CodeType``, ``types.FunctionType``,
  ``__globals__``, ``__closure__``: a copy of a library function built from its code runs the
  library under another name, which the call-watcher in the student's process cannot see;
- the library's source: ``inspect.getsource``, a module's ``__file__``, a path into flashlib
  or site-packages, ``compile`` under a file name that is not a plain string of the student's
  (a wrapper compiled under a flashlib file name looks like the library's own code);
- writes into modules: ``sys.modules``, an attribute assigned or deleted on a module, on
  anything imported, or on an object of the chapter's (its checkers, Feedback), ``setattr``,
  ``__dict__``, ``vars(module)``;
- the grader's machinery: ``tracemalloc`` (its ``stop`` blinds the memory check), the
  checkers' measuring and watching functions (``measure_peak``, ``watching``, ...);
- grader detection: the host name, process ids, ``/proc/1``;
- (flagged, not refused) the library function the exercise asks the student to write,
  reached from the answer (the names in the checker call, followed through the student's own
  top-level definitions), unless the student defined a function of that name: a call of it
  is refused by the checker at run time, with its own message; the flag shows a path the
  checker's cases may not take.  A forbid rule that allows some calls (``forbid={name:
  rule}``) leaves that name to the checker alone.

A refusal fails the exercise (score 0) with its reason; a refusal found in an earlier
exercise's cells (which run before this one's, as in Jupyter) refuses this exercise too.
This is a deterrent made hard to get around, not a proof: code that builds every name at run
time from data the compiler cannot fold (``getattr(x, chr(95) * 2 + ...)``) passes the audit;
what the audit cannot see, the rest of the judge still guards (the verdict is the judge's;
the memory is measured from outside, where the machine allows a cgroup).
"""

from __future__ import annotations

import ast
import re
import types
from dataclasses import dataclass, field
from typing import Any

from grading.lint import _dotted  # a.b.c of an attribute chain, as the lint reads it

#: Names (attributes, globals, or string constants, also when folded by the compiler) that
#: no exercise needs, and why each is refused.
NAMES = {
    "__code__": "reads or replaces a function's code object (__code__)",
    "co_code": "reads a code object's bytecode (co_code)",
    "co_consts": "reads a code object's constants (co_consts)",
    "CodeType": "builds a code object (types.CodeType)",
    "FunctionType": "builds a function from a code object (types.FunctionType)",
    "LambdaType": "builds a function from a code object (types.LambdaType)",
    "__globals__": "reaches a function's module namespace (__globals__)",
    "__closure__": "reaches a function's closure (__closure__)",
    "__builtins__": "reaches Python's builtins (__builtins__)",
    "__dict__": "reaches an object's or a module's namespace (__dict__)",
    "__setattr__": "sets attributes behind Python's back (__setattr__)",
    "__delattr__": "deletes attributes behind Python's back (__delattr__)",
    "getsource": "reads the library's source (inspect.getsource)",
    "getsourcelines": "reads the library's source (inspect.getsourcelines)",
    "getsourcefile": "finds the library's source (inspect.getsourcefile)",
    "getfile": "finds the library's files (inspect.getfile)",
    "findsource": "reads the library's source (inspect.findsource)",
    "get_source": "reads the library's source (a loader's get_source)",
    "__file__": "finds the library's files (__file__)",
    "__loader__": "reaches a module's loader (__loader__)",
    "__spec__": "reaches a module's import spec (__spec__)",
    "tracemalloc": "stops or reads the checkers' memory tracer (tracemalloc)",
    "measure_peak": "reaches the checkers' memory measurement (measure_peak)",
    "remote_peak": "reaches the checkers' memory measurement (remote_peak)",
    "record_peak": "reaches the checkers' memory measurement (record_peak)",
    "measuring": "reaches the checkers' memory measurement (measuring)",
    "watching": "reaches the checkers' call-watcher (watching)",
    "call_learner": "reaches the checkers' call-watcher (call_learner)",
    "forbidden_names": "reaches the checkers' call-watcher (forbidden_names)",
    "forbidding": "reaches the checkers' call-watcher (forbidding)",
    "library_call_problem": "reaches the checkers' call-watcher (library_call_problem)",
    "own_library_function": "reaches the checkers' call-watcher (own_library_function)",
    "library_codes": "reaches the checkers' call-watcher (library_codes)",
    "library_functions": "reaches the checkers' call-watcher (library_functions)",
    "_HANDLERS": "reaches the checkers' call-watcher (_HANDLERS)",
    "_RECORDERS": "reaches the checkers' call-watcher (_RECORDERS)",
    "_WATCHED": "reaches the checkers' call-watcher (_WATCHED)",
    "_FORBIDDEN": "reaches the checkers' call-watcher (_FORBIDDEN)",
    "__flashlib_watch__": "reaches the checkers' call-watcher (__flashlib_watch__)",
    "_remote_peaks": "reaches the checkers' memory measurement (_remote_peaks)",
    "learner_side": "reaches the GPU checkers' kernel launchers (learner_side)",
    "run_helper": "reaches the GPU checkers' kernel launchers (run_helper)",
    "grader_adapter": "reaches the grader's side of the checkers (grader_adapter)",
    "grading": "reaches the grader's own package (grading)",
    "gethostname": "looks for the grader (the host name)",
    "getfqdn": "looks for the grader (the host name)",
    "uname": "looks for the grader (uname)",
    "getpid": "looks for the grader (its process id)",
    "getppid": "looks for the grader (its parent's process id)",
    "getpgid": "looks for the grader (its process group)",
    "getsid": "looks for the grader (its session)",
    "reload": "reloads a module, making copies of the library's functions the call-watcher "
              "does not know (importlib.reload)",
    "__import__": "imports a module by a name given at run time (__import__)",
    "import_module": "imports a module by a name given at run time (importlib.import_module)",
    "mmap": "maps memory the checkers' memory tracer does not see (mmap)",
    "ctypes": "reaches memory and functions behind Python's back (ctypes)",
}
#: Names of :data:`NAMES` refused as names only, not as strings (words a message may hold).
PLAIN_WORDS = {"grading", "measuring", "watching", "uname", "forbidding"}
#: Dotted names refused wherever they are read.
DOTTED = {
    "sys.modules": "writes or reads the interpreter's module table (sys.modules)",
    "platform.node": "looks for the grader (the host name)",
    "os.environ": None,  # only flagged: see FLAGGED
}
#: Dotted names flagged (not refused): the instructor reads why.
FLAGGED = {
    "os.environ": "reads the environment (os.environ): a way to tell the grader from Jupyter",
    "os.getenv": "reads the environment (os.getenv): a way to tell the grader from Jupyter",
}
#: Strings refused in a constant: grader detection and paths into the library.
STRINGS = re.compile(r"/proc/(?:1|self|\d+)\b|/proc/\b|flashlib/|site-packages|/etc/hostname")
#: Modules whose attributes an answer never assigns.
MODULE_NAMES = re.compile(r"^(?:np|numpy|flashlib|os|sys|math|builtins|ml_dtypes|torch|"
                          r"triton|tl|types|inspect|importlib|tracemalloc|gc|functools)$")


@dataclass
class Audit:
    """What the audit found: refusals fail the exercise; flags are for the instructor."""

    refusals: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def refuse(self, where: str, why: str) -> None:
        text = f"{where}: {why}" if where else why
        if why not in (r.partition(": ")[2] or r for r in self.refusals):
            self.refusals.append(text)

    def flag(self, where: str, why: str) -> None:
        text = f"{where}: {why}" if where else why
        if why not in (f.partition(": ")[2] or f for f in self.flags):
            self.flags.append(text)


def _parse(source: str) -> ast.Module | None:
    from IPython.core.inputtransformer2 import TransformerManager

    from grading.worker import without_syntax_errors

    for text in (source, without_syntax_errors(source)[0]):
        try:
            return ast.parse(TransformerManager().transform_cell(text))
        except (SyntaxError, ValueError):
            continue
    return None


def _getattr_constant(node: ast.AST) -> bool:
    """Whether ``node`` is ``getattr(x, "name")`` (or with a default) with a constant name."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))


def _code_like(text: str) -> bool:
    """Whether a string constant reads as Python statements (not a word or a sentence)."""
    if not any(c in text for c in "=(.\n") or len(text) > 100_000:
        return False
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _codes(code: types.CodeType):
    """``code`` and every code object inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _strings(code: types.CodeType) -> set[str]:
    found: set[str] = set()
    for c in _codes(code):
        for const in c.co_consts:
            if isinstance(const, str):
                found.add(const)
            elif isinstance(const, tuple | frozenset):
                found |= {x for x in const if isinstance(x, str)}
    return found


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names the code (and what it holds) reads or writes."""
    found: set[str] = set()
    for c in _codes(code):
        found |= set(c.co_names)
    return found


class _Cell:
    """One cell parsed and compiled: its tree, code, imports and top-level bindings."""

    def __init__(self, source: str, label: str):
        self.label = label
        self.tree = _parse(source)
        self.code = None
        if self.tree is not None:
            try:
                self.code = compile(self.tree, "<cell>", "exec")
            except (SyntaxError, ValueError):
                self.code = None


def _imports(cells: list[_Cell]) -> dict[str, str]:
    """``{name: what it names}`` for every import of the cells."""
    found: dict[str, str] = {}
    for cell in cells:
        for node in ast.walk(cell.tree) if cell.tree else ():
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found[alias.asname or alias.name.split(".")[0]] = alias.name
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    found[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"
    return found


def _top_level(cells: list[_Cell]) -> dict[str, list[tuple[ast.stmt, str]]]:
    """``{name: [(statement, cell label)]}``: the statements of the cells' top level (and
    of their blocks: if, for, with, try) that bind each name."""
    found: dict[str, list[tuple[ast.stmt, str]]] = {}

    def bind(name: str, node: ast.stmt, label: str) -> None:
        found.setdefault(name, []).append((node, label))

    def visit(statements: list[ast.stmt], label: str) -> None:
        for node in statements:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bind(node.name, node, label)
                continue
            if isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    bind(alias.asname or alias.name.split(".")[0], node, label)
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
                targets = [node.target]
            elif isinstance(node, ast.With | ast.AsyncWith):
                targets = [i.optional_vars for i in node.items if i.optional_vars]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store):
                        bind(name.id, node, label)
            for part in ("body", "orelse", "finalbody"):
                visit(getattr(node, part, []) or [], label)
            for handler in getattr(node, "handlers", []) or []:
                visit(handler.body, label)

    for cell in cells:
        if cell.tree is not None:
            visit(cell.tree.body, cell.label)
    return found


def _aliases(bound: dict[str, list[tuple[ast.stmt, str]]], imported: dict[str, str]) -> set[str]:
    """The names bound to a module or an imported object (or an attribute of one) by a plain
    assignment, ``x = module`` or ``y = x.sub``, followed through chains of them."""
    found: set[str] = set()
    while True:
        more = {name for name, statements in bound.items() if name not in found and any(
            isinstance(s, ast.Assign) and isinstance(s.value, ast.Name | ast.Attribute)
            and (root := _root(s.value)) is not None
            and (root in imported or root in found or MODULE_NAMES.match(root))
            for s, _ in statements)}
        if not more:
            return found
        found |= more


def _statement_names(node: ast.stmt) -> set[str]:
    """The names a top-level statement reads (its code, compiled on its own)."""
    module = ast.Module(body=[node], type_ignores=[])
    try:
        code = compile(module, "<statement>", "exec")
    except (SyntaxError, ValueError):
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return _names(code) | {s for s in _strings(code) if s.isidentifier()}


def _writes(cell: _Cell, imported: dict[str, str], own: set[str], audit: Audit) -> None:
    """Refuse attribute writes on modules, imported objects and the chapter's objects."""

    class Visitor(ast.NodeVisitor):
        def __init__(self) -> None:
            self.locals: list[set[str]] = []

        def _function(self, node: Any) -> None:
            args = node.args
            names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
            names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
            body = node.body if isinstance(node.body, list) else [node.body]
            for statement in body:
                for sub in ast.walk(statement):
                    if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                        names.add(sub.id)
            self.locals.append(names)
            self.generic_visit(node)
            self.locals.pop()

        visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

        def _foreign(self, root: str | None) -> bool:
            if root is None:
                return False
            if root in imported or MODULE_NAMES.match(root):
                return True
            if any(root in scope for scope in self.locals):
                return False
            return root not in own  # an object of the chapter's: its checkers, Feedback

        def _target(self, target: ast.AST, line: int) -> None:
            if isinstance(target, ast.Tuple | ast.List):
                for element in target.elts:
                    self._target(element, line)
            elif isinstance(target, ast.Attribute | ast.Subscript):
                root = _root(target)
                dotted = _dotted(target) if isinstance(target, ast.Attribute) else None
                if self._foreign(root):
                    what = dotted or f"an entry of {root}"
                    audit.refuse(f"{cell.label}, line {line}",
                                 f"changes `{what}`, which is not its own (a module, the "
                                 "library or the chapter's)")

        def visit_Assign(self, node: ast.Assign) -> None:
            for target in node.targets:
                self._target(target, node.lineno)
            self.generic_visit(node)

        def visit_AugAssign(self, node: ast.AugAssign) -> None:
            self._target(node.target, node.lineno)
            self.generic_visit(node)

        visit_AnnAssign = visit_AugAssign

        def visit_Delete(self, node: ast.Delete) -> None:
            for target in node.targets:
                self._target(target, node.lineno)
            self.generic_visit(node)

        def visit_Call(self, node: ast.Call) -> None:
            name = _dotted(node.func)
            line = node.lineno
            if name in ("setattr", "delattr", "object.__setattr__") and node.args:
                root = _root(node.args[0])
                if root is None or self._foreign(root):
                    audit.refuse(f"{cell.label}, line {line}",
                                 f"sets attributes of an object not its own ({name})")
            if name == "vars" and node.args and self._foreign(_root(node.args[0])):
                audit.refuse(f"{cell.label}, line {line}", "reaches a module's namespace (vars)")
            if name in ("compile", "builtins.compile"):
                filename = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "filename"), None)
                plain = isinstance(filename, ast.Constant) and isinstance(
                    filename.value, str) and not re.search(r"flashlib|\.py\b|site-packages",
                                                           filename.value)
                if filename is not None and not plain:
                    audit.refuse(f"{cell.label}, line {line}",
                                 "compiles code under a file name not its own (compile), "
                                 "which makes it look like the library's")
            self.generic_visit(node)

    if cell.tree is not None:
        Visitor().visit(cell.tree)


def audit(cells: list[str], prelude: list[tuple[str, list[str]]] | None = None,
          forbidden: dict[str, Any] | list[str] | None = None,
          answers: list[str] | None = None) -> Audit:
    """The audit of one exercise's ``cells``, run after the earlier exercises' ``prelude``
    (``[(number, cells)]``, as the judge runs them), for an exercise whose checker forbids
    ``forbidden`` (dotted names, with rules or None) and is called with ``answers`` (the names
    the checker call passes)."""
    result = Audit()
    parsed = [_Cell(source, f"Exercise {number}'s cell")
              for number, sources in (prelude or []) for source in sources]
    parsed += [_Cell(source, "your cell") for source in cells]
    imported = _imports(parsed)
    bound = _top_level(parsed)
    own = {name for name, statements in bound.items()
           if any(not isinstance(s, ast.Import | ast.ImportFrom) for s, _ in statements)}
    own -= _aliases(bound, imported)  # `x = some_module`: x is the module, not the student's
    queue = list(parsed)
    while queue:
        cell = queue.pop(0)
        if cell.tree is None:
            continue
        lines = {}
        for node in ast.walk(cell.tree):
            line = getattr(node, "lineno", None)
            if isinstance(node, ast.Attribute) or _getattr_constant(node):
                if isinstance(node, ast.Attribute):
                    lines.setdefault(node.attr, line)
                    dotted = _dotted(node)
                else:  # getattr(sys, "modules") reads sys.modules
                    base = _dotted(node.args[0])
                    dotted = f"{base}.{node.args[1].value}" if base else None
                if dotted is not None:
                    head, _, rest = dotted.partition(".")
                    full = f"{imported.get(head, head)}.{rest}" if rest else dotted
                    for name in {dotted, full}:
                        if DOTTED.get(name):
                            result.refuse(f"{cell.label}, line {line}", DOTTED[name])
                        if name in FLAGGED:
                            result.flag(f"{cell.label}, line {line}", FLAGGED[name])
            elif isinstance(node, ast.Name):
                lines.setdefault(node.id, line)
                full = imported.get(node.id, "")
                if full in DOTTED and DOTTED[full]:
                    result.refuse(f"{cell.label}, line {line}", DOTTED[full])
            elif isinstance(node, ast.alias):
                lines.setdefault(node.name.split(".")[0], line)
                for part in node.name.split("."):
                    lines.setdefault(part, line)
                if node.name in DOTTED and DOTTED[node.name]:
                    result.refuse(f"{cell.label}, line {line}", DOTTED[node.name])
            elif isinstance(node, ast.ImportFrom) and node.module:
                for part in node.module.split("."):
                    lines.setdefault(part, line)
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in DOTTED and DOTTED[
                            f"{node.module}.{alias.name}"]:
                        result.refuse(f"{cell.label}, line {line}",
                                      DOTTED[f"{node.module}.{alias.name}"])
        names: set[str] = set()
        strings: set[str] = set()
        if cell.code is not None:
            names, strings = _names(cell.code), _strings(cell.code)
        for node in ast.walk(cell.tree):  # imports bind names the bytecode keeps in co_names
            if isinstance(node, ast.Import | ast.ImportFrom):
                names |= {part for a in node.names for part in a.name.split(".")}
                names |= set((getattr(node, "module", None) or "").split("."))
        texts = {s for s in strings if s.isidentifier() and s not in PLAIN_WORDS}
        # code held in a string (for exec, eval, compile) is audited as a cell of its own
        queue += [_Cell(text, f"{cell.label} (code in a string)") for text in sorted(strings)
                  if _code_like(text)]
        for name in sorted(names | texts):
            if name in NAMES:
                line = lines.get(name)
                result.refuse(f"{cell.label}" + (f", line {line}" if line else ""), NAMES[name])
        for text in sorted(strings):
            if STRINGS.search(text):
                result.refuse(cell.label, f"names the path {text.strip()[:60]!r}: the library's "
                                          "files or the grader's processes")
            elif any(name in text for name in ("__code__", "__globals__", "sys.modules")):
                result.refuse(cell.label, f"builds the name {text.strip()[:60]!r} at run time")
        _writes(cell, imported, own, result)
    _reached(parsed, bound, forbidden, answers, result)
    return result


def _reached(parsed: list[_Cell], bound: dict[str, list[tuple[ast.stmt, str]]],
             forbidden: dict[str, Any] | list[str] | None, answers: list[str] | None,
             result: Audit) -> None:
    """Flag the forbidden library functions (without a rule) that the answer reaches: a call of
    one is refused by the checker when it runs; the flag shows the instructor a path the
    checker's cases may not take (a branch on the input, a helper)."""
    spec = dict.fromkeys(forbidden) if isinstance(forbidden, list) else dict(forbidden or {})
    short = {name.rpartition(".")[2]: name for name, rule in spec.items() if rule is None}
    if not short or not answers:
        return
    seen: set[str] = set()
    todo = [a for a in answers if a.isidentifier()]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        statements = bound.get(name, [])
        own_def = any(isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                                 | ast.Assign | ast.AnnAssign) for s, _ in statements)
        if name in short and not own_def:
            where = statements[0][1] if statements else "your answer"
            result.flag(where, f"the answer reaches flashlib's `{name}`, which this exercise "
                                 "asks you to write")
            continue
        for statement, _ in statements:
            if isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith(
                    "flashlib"):
                for alias in statement.names:
                    if (alias.asname or alias.name) == name and alias.name in short:
                        result.flag(_label_of(statement, bound),
                                      f"the answer reaches flashlib's `{alias.name}` (as "
                                      f"`{name}`), which this exercise asks you to write")
                continue
            for used in _statement_names(statement):
                if used in short and used not in bound:
                    result.flag(_label_of(statement, bound),
                                  f"the answer reaches flashlib's `{used}`, which this "
                                  "exercise asks you to write")
                elif used not in seen:
                    todo.append(used)


def _label_of(statement: ast.stmt, bound: dict[str, list[tuple[ast.stmt, str]]]) -> str:
    for statements in bound.values():
        for s, label in statements:
            if s is statement:
                return f"{label}, line {statement.lineno}"
    return "your answer"
