"""What grading/grade.py flags in a student's exercise cells for the instructor to look at.

A flag is not a verdict: the grade is the checker's.  It points at code that has no business
in an exercise and that a cheat or an attack would need: patching a checker or numpy,
reaching into the interpreter (frames, the garbage collector, ctypes), signals and
processes (``os.kill``, ``os.fork``, ``setsid``), the grader's command line (``sys.argv``),
``/proc`` and other students' or the instructor's files, running code from strings, or
naming the library function the exercise asks the student to write.  grading/grade.py adds
what it saw happen (a process left running, a grading process killed) and the answers that
are identical to a classmate's or to the book's published solution.

    flags(cells, forbidden=("flashlib.fast.online.merge_partials",)) -> ["line 3: ...", ...]
"""

from __future__ import annotations

import ast
import hashlib
import io
import re
import tokenize

#: Modules whose import in an exercise cell is flagged, and why.
MODULES = {
    "ctypes": "calls C directly (ctypes)",
    "gc": "walks the interpreter's objects (gc)",
    "inspect": "inspects the interpreter's frames (inspect)",
    "signal": "handles or sends signals (signal)",
    "subprocess": "starts programs (subprocess)",
    "socket": "opens network sockets (socket)",
    "importlib": "imports modules by name (importlib)",
    "builtins": "changes Python's builtins",
    "pty": "opens a terminal (pty)",
    "mmap": "maps memory (mmap)",
    "fcntl": "manipulates file descriptors (fcntl)",
    "resource": "changes its resource limits (resource)",
    "shutil": "copies or deletes files (shutil)",
    "urllib": "reaches the network (urllib)",
    "requests": "reaches the network (requests)",
    "http": "reaches the network (http)",
}
#: The exercises' declared mistakes (not installed with flashlib, hidden in the sandbox).
MISTAKES = "flashlib.book.exercises.mistakes"
#: Calls flagged wherever they appear: ``module.attribute`` -> why.
CALLS = {
    "os.kill": "sends a signal to a process (os.kill)",
    "os.killpg": "sends a signal to a process group (os.killpg)",
    "os.fork": "forks processes (os.fork)",
    "os.forkpty": "forks processes (os.forkpty)",
    "os.setsid": "leaves its session (os.setsid): a daemon",
    "os.setpgid": "leaves its process group (os.setpgid)",
    "os._exit": "ends the process (os._exit)",
    "os.system": "runs a shell command (os.system)",
    "os.popen": "runs a shell command (os.popen)",
    "os.remove": "deletes files (os.remove)",
    "os.unlink": "deletes files (os.unlink)",
    "os.rmdir": "deletes folders (os.rmdir)",
    "os.rename": "renames files (os.rename)",
    "os.chmod": "changes file permissions (os.chmod)",
    "os.write": "writes to a raw file descriptor (os.write)",
    "os.dup2": "rewires file descriptors (os.dup2)",
    "os.getppid": "looks for its parent process (os.getppid)",
    "sys._getframe": "reads the interpreter's frames (sys._getframe)",
    "sys.setprofile": "installs a profiler (sys.setprofile)",
    "sys.settrace": "installs a tracer (sys.settrace)",
    "sys.exit": "exits the interpreter (sys.exit)",
    "threading.setprofile": "installs a profiler (threading.setprofile)",
}
#: Builtins flagged when called.
BUILTINS = {
    "exec": "runs code from a string (exec)",
    "eval": "runs code from a string (eval)",
    "compile": "compiles code from a string (compile)",
    "__import__": "imports modules by name (__import__)",
    "setattr": "sets attributes by name (setattr)",
    "delattr": "deletes attributes by name (delattr)",
    "globals": "reaches its global namespace (globals())",
}
#: Strings flagged when a cell contains them.
PATHS = re.compile(r"/proc\b|/dev/|/sys/|results\.(?:csv|json)|\.ipynb\b|\.\./|^/(?:work|home|"
                   r"root|etc|var|usr|tmp/grade)|^~|submissions|grading-report")
#: Names whose attributes an exercise has no reason to assign: modules and the checkers'.
PATCHABLE = re.compile(r"^(?:np|numpy|flashlib|os|sys|math|builtins|ml_dtypes|torch|triton|"
                       r"tl|exercises|Feedback|check_\w+|call_learner|LearnerError)$")


def _parse(source: str) -> ast.Module | None:
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except (SyntaxError, ValueError):
        return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """``{name in the cell: module}`` for ``import x as y`` and ``from x import y``."""
    aliases = {"np": "numpy"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _bindings(tree: ast.Module) -> dict[str, int]:
    """``{name: line}``: the names the cell itself binds at its top level (a ``def``, a
    class, an assignment, a loop variable, an import from anything but flashlib), at their
    first binding's line."""
    found: dict[str, int] = {}

    def bind(name: str, line: int) -> None:
        found[name] = min(line, found.get(name, line))

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bind(node.name, node.lineno)
                continue  # its body binds nothing at the top level
            if isinstance(node, ast.ImportFrom) and not (node.module or "").startswith(
                    "flashlib"):
                for alias in node.names:
                    bind(alias.asname or alias.name, node.lineno)
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AnnAssign | ast.For | ast.AsyncFor):
                targets = [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        bind(name.id, node.lineno)
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []) or []:
                visit(handler.body)

    visit(tree.body)
    return found


def _deferred(tree: ast.Module) -> set[int]:
    """The ids of the nodes that run only when a function of the cell is called (its body,
    not its defaults or decorators): by then the cell's own top-level names are bound."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for statement in node.body:
                found |= {id(n) for n in ast.walk(statement)}
        elif isinstance(node, ast.Lambda):
            found |= {id(n) for n in ast.walk(node.body)}
    return found


def _own(node: ast.Name, own: dict[str, int], deferred: set[int]) -> bool:
    """Whether a name the exercise forbids is, where it is read, the student's own: the cell
    binds it (not by importing it from flashlib), and it is read after that or only when a
    function of the cell runs.  A student's own ``attention_flops`` shares the library's
    name and is no cheat; reading the library's before defining one's own is flagged."""
    line = own.get(node.id)
    if line is None:
        return False
    return id(node) in deferred or node.lineno > line


def flags(cells: list[str], forbidden: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The flags of one exercise's cells (``"line N: why"``, the cell's line; without
    duplicates).  ``forbidden``: the dotted names of the library functions the exercise
    asks the student to write."""
    found: list[str] = []

    def flag(line: int | None, why: str) -> None:
        text = f"line {line}: {why}" if line else why
        if text not in found and why not in (f.partition(": ")[2] for f in found):
            found.append(text)

    short = {name.rpartition(".")[2]: name for name in forbidden}
    for source in cells:
        tree = _parse(source)
        if tree is None:
            for number, line in enumerate(source.splitlines(), 1):
                for name in (*MODULES, *(c.split(".")[1] for c in CALLS)):
                    if re.search(rf"\b{re.escape(name)}\b", line) and re.search(
                            r"\bimport\b|\(", line):
                        flag(number, f"mentions {name} (the cell does not parse)")
            continue
        aliases = _module_aliases(tree)
        own, deferred = _bindings(tree), _deferred(tree)
        for node in ast.walk(tree):
            line = getattr(node, "lineno", None)
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""])
                for name in names:
                    root = name.split(".")[0]
                    if root in MODULES:
                        flag(line, f"imports {name}: {MODULES[root]}")
                    if name.startswith(MISTAKES):
                        flag(line, f"imports {name}: the checkers' declared mistakes, most "
                                   "of them a right answer with one change")
                if isinstance(node, ast.ImportFrom):
                    for alias in node.names:
                        if alias.name in short:
                            flag(line, f"imports flashlib's `{alias.name}`, which this exercise "
                                       "asks students to write")
            elif isinstance(node, ast.Call):
                dotted = _dotted(node.func)
                if dotted is not None:
                    head, _, rest = dotted.partition(".")
                    full = f"{aliases.get(head, head)}.{rest}" if rest else aliases.get(
                        head, head)
                    if full in CALLS:
                        flag(line, CALLS[full])
                    elif dotted in BUILTINS:
                        flag(line, BUILTINS[dotted])
                    if dotted in ("setattr", "delattr") and node.args:
                        target = _dotted(node.args[0])
                        if target and PATCHABLE.match(target.split(".")[0]):
                            flag(line, f"patches `{target}` ({dotted})")
            elif isinstance(node, ast.Attribute):
                dotted = _dotted(node)
                if dotted in ("sys.argv", "sys.modules", "sys.stdout.fileno"):
                    flag(line, f"reads {dotted}")
                if node.attr in short and isinstance(node.ctx, ast.Load):
                    flag(line, f"uses flashlib's `{node.attr}`, which this exercise asks "
                               "students to write")
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id in short and not _own(node, own, deferred):
                    flag(line, f"uses flashlib's `{node.id}`, which this exercise asks "
                               "students to write")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                match = PATHS.search(node.value.strip())
                if match:
                    flag(line, f"names the path or file {node.value.strip()[:60]!r}")
                if node.value.strip() in short:
                    flag(line, f"names flashlib's `{node.value.strip()}` in a string, which "
                               "this exercise asks students to write")
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
                targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [
                    node.target]
                for target in targets:
                    dotted = _dotted(target) if isinstance(target, ast.Attribute) else None
                    if dotted and PATCHABLE.match(dotted.split(".")[0]):
                        flag(line, f"patches `{dotted}`")
    return found


def fingerprint(cells: list[str]) -> str:
    """A hash of the cells' code without comments, blank lines and spacing: the same answer
    typed again has the same fingerprint."""
    tokens = []
    for source in cells:
        try:
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                                    tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                    tokens.append(tok.string)
        except (tokenize.TokenError, SyntaxError, IndentationError):
            tokens.append(" ".join(source.split()))
    return hashlib.sha256("\x00".join(tokens).encode()).hexdigest()[:16]
