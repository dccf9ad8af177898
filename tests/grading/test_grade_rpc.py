"""grading/rpc.py: what crosses from a student's sandboxed process to the judge is plain
data only (never a pickle), arrays keep their dtype and shape, other objects stay behind as
handles, and malformed or oversized messages are refused."""

from __future__ import annotations

import pickle
import socket

import ml_dtypes
import numpy as np
import pytest

from flashlib.fast.online import PartialAttention
from grading import rpc


def round_trip(value, handle=None):
    tree, buffers = rpc.encode(value, handle)
    return rpc.decode(tree, buffers)


@pytest.mark.parametrize("value", [
    None, True, 3, -2**70, 1.5, float("inf"), complex(1, -2), "text", b"bytes",
    [1, (2, 3), {"a": [4.0]}], {1, 2}, frozenset({"x"}),
    np.float32(1.25), np.int8(-3), np.bool_(True),
])
def test_plain_values_round_trip(value):
    got = round_trip(value)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64, np.bool_,
                                   np.complex128, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
def test_arrays_keep_dtype_shape_and_values(dtype):
    x = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
    got = round_trip(x[:, ::2])  # not contiguous
    assert got.dtype == x.dtype and got.shape == (2, 2, 4)
    assert np.array_equal(got.astype(np.complex128), x[:, ::2].astype(np.complex128))
    assert got.flags.writeable


def test_nan_and_named_tuples_and_dtypes():
    got = round_trip((np.array([np.nan, -np.inf]), float("nan"), np.dtype("float16"),
                      np.float16))
    assert np.isnan(got[0][0]) and got[0][1] == -np.inf and np.isnan(got[1])
    assert got[2] == np.dtype("float16") and got[3] is np.float16
    p = PartialAttention(np.zeros(2), np.ones(2), np.zeros((2, 3)))
    back = round_trip(p)
    assert type(back) is PartialAttention and np.array_equal(back.acc, p.acc)


def test_objects_stay_behind_as_handles():
    kept = []

    def handle(obj):
        kept.append(obj)
        return len(kept) - 1

    class Secret:
        def __reduce__(self):  # what a pickle would run on the judge's side
            raise AssertionError("never pickled")

    def f(x):
        return x

    tree, buffers = rpc.encode({"fn": f, "obj": Secret(), "arr": np.zeros(2, dtype=object)},
                               handle)
    got = rpc.decode(tree, buffers)
    assert callable(got["fn"]) and isinstance(got["fn"], rpc.Remote)
    assert not callable(got["obj"]) and type(got["obj"]).__name__ == "Secret"
    assert kept[:2] == [f, kept[1]] and isinstance(kept[1], Secret)
    assert isinstance(got["arr"], rpc.Remote)  # an object array is not data


def test_exceptions_cross_as_type_and_message():
    err = rpc.decode(*rpc.encode(ZeroDivisionError("division by zero")))
    assert type(err) is ZeroDivisionError and str(err) == "division by zero"

    class Custom(ValueError):
        pass

    custom = rpc.decode(*rpc.encode(Custom("bad")))
    assert type(custom).__name__ == "Custom" and isinstance(custom, ValueError)
    exiting = rpc.decode(*rpc.encode(SystemExit(3)))  # reported, never obeyed
    assert isinstance(exiting, Exception) and type(exiting).__name__ == "SystemExit"


@pytest.mark.parametrize("tree", [
    {"t": "pickle", "v": pickle.dumps(1).hex()},
    {"t": "array", "dtype": "O", "shape": [1], "b": 0},
    {"t": "array", "dtype": "<f8", "shape": [3], "b": 0},  # 3 elements, 8 bytes
    {"t": "named", "cls": "os:system", "v": ["echo"]},
    {"t": "named", "cls": "flashlib.fast.online:np", "v": []},
    {"t": "bytes", "b": 7},
    [1, 2],
])
def test_malformed_values_are_refused(tree):
    with pytest.raises(rpc.WireError):
        rpc.decode(tree, [b"\x00" * 8])


def test_deep_values_are_refused():
    tree = None
    for _ in range(200):
        tree = {"t": "list", "v": [tree]}
    with pytest.raises(rpc.WireError):
        rpc.decode(tree, [])


def test_framing_sizes_and_deadlines():
    a, b = socket.socketpair()
    with a, b:
        rpc.send(a, {"x": 1}, [b"abc", b""])
        assert rpc.recv(b) == ({"x": 1}, [b"abc", b""])
        a.sendall(rpc._HEAD.pack(rpc.MAX_MESSAGE + 1, 0))
        with pytest.raises(rpc.WireError):
            rpc.recv(b)
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(rpc.Deadline):
            rpc.recv(b, deadline=0.0)
        a.close()
        with pytest.raises(rpc.Gone):
            rpc.recv(b)


def test_the_judges_functions_travel_as_callbacks():
    """A module-level function goes by name; a lambda the checker passes becomes a callback
    the sandbox calls back through."""
    callbacks = []
    data = rpc.dumps((np.exp, lambda x: x + 1, rpc.Remote(5, None, {})), callbacks)
    assert len(callbacks) == 1 and callbacks[0](1) == 2
    objects = {5: "the student's object"}
    made = []
    got = rpc.loads(data, objects, lambda ident: made.append(ident) or f"callback {ident}")
    assert got == (np.exp, "callback 0", "the student's object") and made == [0]
