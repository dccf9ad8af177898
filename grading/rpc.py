"""The wire between the grader's judge and a student's sandboxed process (grading/grade.py).

The judge (grading/judge.py, trusted) runs the checker; the student's code runs in the
sandbox (grading/worker.py).  Each time the checker calls the student's function, the
call crosses this wire: the arguments go to the sandbox, the result comes back.  So the two
directions are not alike:

- judge -> sandbox: anything ``pickle`` can carry (arrays, a ``np.random.Generator``,
  dtypes, module-level functions by name).  The judge's other functions (a checker passing
  a lambda ``f`` to the student's ``fd_grad``) travel as *callbacks*: in the sandbox they
  are stand-ins that ask the judge to run them.
  Unpickling happens in the sandbox, whose code the student owns anyway.
- sandbox -> judge: never pickle, which would run code the student chose.  :func:`encode`
  writes plain data only: None, booleans, numbers, strings, bytes, lists, tuples, dicts,
  sets, numpy arrays and scalars of numeric dtypes (ml_dtypes' bfloat16 and float8 too),
  dtypes, flashlib's named tuples (``PartialAttention``), and exceptions as (type, message).
  Anything else (a function, an object) stays in the sandbox and is sent as a *handle*:
  the judge gets a :class:`Remote` whose calls cross the wire again.  :func:`decode` builds
  only these types, with limits on depth, count and bytes.

Messages are a JSON header and binary buffers (an array's bytes), framed by lengths:
``send``/``recv`` on a connected Unix socket.  Standard library and numpy only (the sandbox
imports it before anything of the student's).
"""

from __future__ import annotations

import builtins
import io
import json
import math
import pickle
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: The largest message either side accepts (an answer's arrays included).
MAX_MESSAGE = 256 * 2**20
MAX_DEPTH = 32
MAX_ITEMS = 1_000_000
_HEAD = struct.Struct("!II")  # JSON length, number of buffers
_LEN = struct.Struct("!Q")
#: dtype names decode accepts besides numpy's numeric ones (ml_dtypes' formats).
EXTRA_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                "float8_e5m2fnuz", "float8_e4m3b11fnuz")


class WireError(Exception):
    """A malformed or oversized message, or the other side went away."""


class Deadline(BaseException):
    """The exercise's time ran out while waiting for the sandbox (a BaseException, so that a
    checker's ``except Exception`` cannot swallow it)."""


class Gone(BaseException):
    """The sandbox closed the connection (the student's process ended) mid-exercise."""


# ---------------------------------------------------------------------------------------------
# Framing
# ---------------------------------------------------------------------------------------------

def send(sock: socket.socket, header: dict[str, Any], buffers: list[bytes] = ()) -> None:
    data = json.dumps(header, allow_nan=False).encode()
    parts = [_HEAD.pack(len(data), len(buffers)), data]
    for buffer in buffers:
        parts += [_LEN.pack(len(buffer)), buffer]
    if sum(map(len, parts)) < 2**20:
        sock.sendall(b"".join(parts))
    else:
        for part in parts:
            sock.sendall(part)


def _read(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Deadline
            sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except TimeoutError:
            raise Deadline from None
        except OSError as err:
            raise Gone(str(err)) from None
        finally:
            if deadline is not None:
                sock.settimeout(None)
        if not chunk:
            raise Gone("the connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket, deadline: float | None = None) -> tuple[dict[str, Any], list[bytes]]:
    """One message: ``(header, buffers)``; :class:`Deadline` past ``deadline`` (monotonic
    seconds), :class:`Gone` when the other side closed, :class:`WireError` when malformed."""
    size, count = _HEAD.unpack(_read(sock, _HEAD.size, deadline))
    if size > MAX_MESSAGE or count > MAX_ITEMS:
        raise WireError(f"message too large ({size} bytes of header, {count} buffers)")
    try:
        header = json.loads(_read(sock, size, deadline))
    except ValueError as err:
        raise WireError(f"malformed header: {err}") from None
    if not isinstance(header, dict):
        raise WireError("malformed header: not an object")
    buffers, total = [], size
    for _ in range(count):
        (n,) = _LEN.unpack(_read(sock, _LEN.size, deadline))
        total += n
        if total > MAX_MESSAGE:
            raise WireError(f"message larger than {MAX_MESSAGE} bytes")
        buffers.append(_read(sock, n, deadline))
    return header, buffers


# ---------------------------------------------------------------------------------------------
# sandbox -> judge: plain data only
# ---------------------------------------------------------------------------------------------

def _dtype_name(dtype: np.dtype) -> str | None:
    if dtype.kind in "biufc" and dtype.names is None and dtype.subdtype is None:
        return dtype.name if dtype.name in EXTRA_DTYPES else dtype.str
    if dtype.kind in "US":
        return dtype.str
    if dtype.name in EXTRA_DTYPES:
        return dtype.name
    return None


def _dtype(name: Any) -> np.dtype:
    if not isinstance(name, str):
        raise WireError("malformed dtype")
    if name in EXTRA_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise WireError(f"unknown dtype {name!r}") from None
    if dtype.kind not in "biufcUS" or dtype.names is not None or dtype.subdtype is not None:
        raise WireError(f"dtype {name!r} not allowed")
    return dtype


class Encoder:
    """Turns a value into a JSON tree plus buffers; what it cannot send as data it keeps in
    ``handles`` (``handle(obj) -> id``) and sends as a reference."""

    def __init__(self, handle: Callable[[Any], int] | None = None):
        self.buffers: list[bytes] = []
        self.handle = handle

    def buffer(self, data: bytes) -> int:
        self.buffers.append(data)
        return len(self.buffers) - 1

    def __call__(self, obj: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            return self.ref(obj)
        if obj is None or isinstance(obj, bool | str):
            return obj
        if isinstance(obj, int) and type(obj) in (int, bool):
            return obj if abs(obj) < 2**53 else {"t": "int", "v": str(obj)}
        if type(obj) is float:
            return obj if math.isfinite(obj) else {"t": "float", "v": repr(obj)}
        if type(obj) is complex:
            return {"t": "complex", "v": [repr(obj.real), repr(obj.imag)]}
        if type(obj) in (bytes, bytearray):
            return {"t": "bytes", "b": self.buffer(bytes(obj))}
        if isinstance(obj, np.ndarray):
            name = _dtype_name(obj.dtype)
            if name is None:
                return self.ref(obj)
            data = np.ascontiguousarray(obj)
            return {"t": "array", "dtype": name, "shape": list(obj.shape),
                    "b": self.buffer(data.tobytes()), "cls": type(obj).__name__}
        if isinstance(obj, np.generic):
            name = _dtype_name(obj.dtype)
            if name is None:
                return self.ref(obj)
            return {"t": "scalar", "dtype": name, "b": self.buffer(np.asarray(obj).tobytes())}
        if isinstance(obj, np.dtype):
            name = _dtype_name(obj)
            return {"t": "dtype", "v": name} if name else self.ref(obj)
        if isinstance(obj, type) and issubclass(obj, np.generic):
            name = _dtype_name(np.dtype(obj))
            return {"t": "sctype", "v": name} if name else self.ref(obj)
        if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
            cls = type(obj)
            if cls.__module__.startswith("flashlib."):
                return {"t": "named", "cls": f"{cls.__module__}:{cls.__qualname__}",
                        "v": [self(v, depth + 1) for v in obj]}
        if type(obj) in (list, tuple, set, frozenset):
            if len(obj) > MAX_ITEMS:
                return self.ref(obj)
            items = sorted(obj, key=repr) if type(obj) in (set, frozenset) else obj
            return {"t": type(obj).__name__, "v": [self(v, depth + 1) for v in items]}
        if type(obj) is dict:
            if len(obj) > MAX_ITEMS:
                return self.ref(obj)
            return {"t": "dict", "k": [self(k, depth + 1) for k in obj],
                    "v": [self(v, depth + 1) for v in obj.values()]}
        if isinstance(obj, BaseException):
            return exception_tree(obj)
        return self.ref(obj)

    def ref(self, obj: Any) -> Any:
        kind = type(obj)
        info = {"t": "ref", "type": kind.__name__, "module": getattr(kind, "__module__", ""),
                "callable": callable(obj), "repr": _short_repr(obj)}
        if self.handle is None:
            return info | {"id": None}
        return info | {"id": self.handle(obj)}


def _short_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 - a student's __repr__ may raise
        text = f"<{type(obj).__name__} object>"
    return text if len(text) <= 200 else text[:197] + "..."


def exception_tree(err: BaseException) -> dict[str, Any]:
    """An exception as plain data: its type's name and module, its message, and the line of
    the student's code that raised it (for the report)."""
    kind = type(err)
    try:
        message = str(err)
    except Exception:  # noqa: BLE001
        message = "<unprintable message>"
    return {"t": "exc", "type": kind.__name__, "module": kind.__module__,
            "msg": message[:4000], "base": _builtin_base(kind)}


def _builtin_base(kind: type) -> str:
    """The nearest builtin exception class of ``kind`` (what the judge raises if it cannot
    name the class itself)."""
    for base in kind.__mro__:
        if base.__module__ == "builtins" and issubclass(base, BaseException):
            return base.__name__
    return "Exception"


def encode(obj: Any, handle: Callable[[Any], int] | None = None) -> tuple[Any, list[bytes]]:
    encoder = Encoder(handle)
    return encoder(obj), encoder.buffers


class Remote:
    """A handle on an object that stays in the sandbox.  ``__learner_remote__`` marks it for
    flashlib's checkers (flashlib.book.exercises.grader_adapter.is_remote)."""

    __learner_remote__ = True

    def __init__(self, ref: int | None, caller: Any, info: dict[str, Any]):
        self._ref, self._caller, self._info = ref, caller, info

    def run_helper(self, module: str, qualname: str, args: tuple, kwargs: dict) -> Any:
        """Run a checker's helper (flashlib.book.exercises.grader_adapter.learner_side) in the
        sandbox, where this object is."""
        return self._caller.helper(module, qualname, args, kwargs)

    def __repr__(self) -> str:
        return self._info.get("repr") or f"<{self._info.get('type')} object>"


class RemoteCallable(Remote):
    """A function (or any callable) of the sandbox: calling it calls it there."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._caller is None or self._ref is None:
            raise TypeError(f"'{self._info.get('type')}' object cannot be called here")
        return self._caller.call(self, args, kwargs)


def _remote_class(name: str, is_callable: bool) -> type:
    """A class named like the sandbox's type, so that feedback ("got <class 'Foo'>") reads
    as it does in the notebook."""
    safe = name if name.isidentifier() else "Remote"
    return type(safe, (RemoteCallable if is_callable else Remote,), {"__module__": "sandbox"})


def exception_from_tree(tree: dict[str, Any]) -> BaseException:
    """The exception :func:`exception_tree` described, as the judge raises it: the builtin
    class of that name (``ZeroDivisionError``), flashlib's ``LearnerError`` and
    ``NotAttempted``, or a new class of the same name derived from its builtin base."""
    name, module = str(tree.get("type", "Exception")), str(tree.get("module", ""))
    message = str(tree.get("msg", ""))
    if module.startswith("flashlib.book.exercises.") and name in ("LearnerError",
                                                                  "NotAttempted"):
        from flashlib.book.exercises import grader_adapter

        return getattr(grader_adapter, name)(message)
    cls = getattr(builtins, name, None) if module == "builtins" else None
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        base = getattr(builtins, str(tree.get("base", "Exception")), Exception)
        if not (isinstance(base, type) and issubclass(base, Exception)):
            base = Exception  # SystemExit, KeyboardInterrupt: reported, never obeyed
        cls = type(name if name.isidentifier() else "Error", (base,),
                   {"__module__": module or "sandbox"})
    elif not issubclass(cls, Exception):
        cls = type(name, (Exception,), {"__module__": "builtins"})
    try:
        return cls(message)
    except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs five arguments
        return type(name, (Exception,), {"__module__": module})(message)


class Decoder:
    def __init__(self, buffers: list[bytes], caller: Any = None):
        self.buffers, self.caller, self.count = buffers, caller, 0

    def buffer(self, index: Any) -> bytes:
        if not isinstance(index, int) or not 0 <= index < len(self.buffers):
            raise WireError("malformed buffer reference")
        return self.buffers[index]

    def __call__(self, tree: Any, depth: int = 0) -> Any:
        self.count += 1
        if depth > MAX_DEPTH + 1 or self.count > MAX_ITEMS:
            raise WireError("value too deep or too large")
        if tree is None or isinstance(tree, bool | int | float | str):
            return tree
        if isinstance(tree, list):
            raise WireError("malformed value")
        if not isinstance(tree, dict):
            raise WireError("malformed value")
        kind = tree.get("t")
        if kind == "int":
            return int(str(tree["v"]))
        if kind == "float":
            return float(str(tree["v"]))
        if kind == "complex":
            real, imag = tree["v"]
            return complex(float(real), float(imag))
        if kind == "bytes":
            return self.buffer(tree["b"])
        if kind == "array":
            dtype = _dtype(tree["dtype"])
            shape = tuple(int(s) for s in tree["shape"])
            data = self.buffer(tree["b"])
            if math.prod(shape) * dtype.itemsize != len(data):
                raise WireError("array size does not match its shape")
            return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        if kind == "scalar":
            dtype = _dtype(tree["dtype"])
            data = self.buffer(tree["b"])
            if len(data) != dtype.itemsize:
                raise WireError("scalar size does not match its dtype")
            return np.frombuffer(data, dtype=dtype)[0]
        if kind == "dtype":
            return _dtype(tree["v"])
        if kind == "sctype":
            return _dtype(tree["v"]).type
        if kind in ("list", "tuple", "set", "frozenset"):
            items = [self(v, depth + 1) for v in tree["v"]]
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](
                items)
        if kind == "dict":
            keys = [self(k, depth + 1) for k in tree["k"]]
            values = [self(v, depth + 1) for v in tree["v"]]
            try:
                return dict(zip(keys, values, strict=True))
            except TypeError:
                raise WireError("unhashable dict key") from None
        if kind == "named":
            return self.named(tree, depth)
        if kind == "exc":
            return exception_from_tree(tree)
        if kind == "ref":
            info = {k: tree.get(k) for k in ("type", "module", "callable", "repr")}
            info = {k: (str(v)[:200] if k != "callable" else bool(v)) for k, v in info.items()}
            ref = tree.get("id")
            return _remote_class(info["type"], info["callable"])(
                ref if isinstance(ref, int) else None, self.caller, info)
        raise WireError(f"unknown value kind {kind!r}")

    def named(self, tree: dict[str, Any], depth: int) -> Any:
        import importlib

        module_name, _, qualname = str(tree.get("cls", "")).partition(":")
        if not module_name.startswith("flashlib.") or not qualname.isidentifier():
            raise WireError("named tuple outside flashlib")
        cls = getattr(importlib.import_module(module_name), qualname, None)
        if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
            raise WireError(f"{tree['cls']} is not a named tuple")
        values = [self(v, depth + 1) for v in tree["v"]]
        if len(values) != len(cls._fields):
            raise WireError(f"{tree['cls']} takes {len(cls._fields)} fields")
        return cls(*values)


def decode(tree: Any, buffers: list[bytes], caller: Any = None) -> Any:
    return Decoder(buffers, caller)(tree)


# ---------------------------------------------------------------------------------------------
# judge -> sandbox: pickle, with the judge's functions as callbacks
# ---------------------------------------------------------------------------------------------

class JudgePickler(pickle.Pickler):
    """Pickles the checker's arguments for the sandbox: a :class:`Remote` becomes its handle,
    a function of the judge's becomes a callback id (kept in ``callbacks``)."""

    def __init__(self, file: io.BytesIO, callbacks: list[Callable[..., Any]]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.callbacks = callbacks

    def persistent_id(self, obj: Any) -> Any:
        import types

        if isinstance(obj, Remote):
            return ("ref", obj._ref)
        if isinstance(obj, types.FunctionType) and not _importable(obj):
            self.callbacks.append(obj)
            return ("callback", len(self.callbacks) - 1)
        return None


def _importable(fn: Any) -> bool:
    """Whether pickle can send ``fn`` by its name (a module-level function)."""
    import sys

    obj = sys.modules.get(fn.__module__)
    for part in fn.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is fn


def dumps(obj: Any, callbacks: list[Callable[..., Any]]) -> bytes:
    buffer = io.BytesIO()
    JudgePickler(buffer, callbacks).dump(obj)
    return buffer.getvalue()


class SandboxUnpickler(pickle.Unpickler):
    """The sandbox's side of :class:`JudgePickler`: handles back to the objects, callback ids
    to callables that ask the judge."""

    def __init__(self, file: io.BytesIO, objects: dict[int, Any],
                 callback: Callable[[int], Callable[..., Any]]):
        super().__init__(file)
        self.objects, self.callback = objects, callback

    def persistent_load(self, pid: Any) -> Any:
        kind, ident = pid
        if kind == "ref":
            return self.objects[ident]
        if kind == "callback":
            return self.callback(ident)
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def loads(data: bytes, objects: dict[int, Any], callback: Callable[[int], Any]) -> Any:
    return SandboxUnpickler(io.BytesIO(data), objects, callback).load()
