"""The precision chapter's numerics: float16, bfloat16 and float8 emulated on a CPU, rounding
where hardware does, the error budget, and FP8 as FlashAttention-3 does it.

numpy has float16 but no bfloat16 or float8; ``ml_dtypes`` (the JAX ecosystem's package)
adds them as numpy dtypes.  Every function here keeps its numbers in float64 arrays that hold
values of the chosen dtype ("carriers") and rounds explicitly, with :func:`round_to`, after
every operation that rounds on hardware.  Nothing is rounded implicitly: a bfloat16 matmul in
ml_dtypes returns float32, so a bfloat16 *accumulator* has to be emulated, one rounding per
addition (:func:`dot`, :func:`matmul`).

The model of a GPU kernel (the Precision chapter's): products of two half-precision numbers are
exact (they fit in float32); a **float32 accumulator** is a float32 matmul (what BLAS or a
tensor core does: the operands made float32, the sums rounded to float32 in the library's
order); a **narrower accumulator** rounds after each addition; the "registers" (``compute``:
``Q K^T``'s accumulator, ``exp``, the rescale factors, the division) are float32.

Where each quantity is kept is a :class:`Casts`: the dtype of the inputs, of ``S``, of ``P``
before the ``P V`` matmul, of the accumulator, of ``m`` and ``l``, and of the output ``O``.
:func:`standard_attention_with_casts` and :func:`flash2_forward_with_casts` compute attention
with those casts; :func:`error_budget` attributes the total error against float64 to each cast
point.  flash-attn's accuracy rule lives in :mod:`flashlib.core.accuracy` (numpy only).

FP8 as FlashAttention-3 does it (the end of this module): float8_e4m3fn has 3 fraction bits
and a largest value of 448, so a tensor is stored scaled, ``X ~ X_q * s``, one ``s`` for the
whole tensor (per-tensor scaling) or per block of rows (per-block scaling, FlashAttention-3's
"block quantization"); "incoherent processing" multiplies Q and K by the same random
orthogonal matrix (a Hadamard matrix with random signs), which leaves ``Q K^T`` unchanged and
spreads each outlier over every coordinate before the cast (Shah et al. 2024, Section 4.3,
Table 3).  :func:`fp8_attention` is FlashAttention-2's loop (:func:`flash2_forward_with_casts`)
on the quantised inputs; :func:`fp8_study` compares the four combinations.

Needs ``ml_dtypes`` (``pip install "flashlib[book]"`` or ``pip install ml_dtypes``); the rest
of flashlib does not.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from flashlib.core.checks import check_int, check_rng

try:
    import ml_dtypes
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "flashlib.studies.precision needs ml_dtypes for bfloat16 and float8: "
        'pip install ml_dtypes (or pip install "flashlib[book]"); the rest of flashlib needs '
        "numpy only"
    ) from exc


from flashlib.core.accuracy import ErrorStats, error_stats

__all__ = [
    "DTYPES",
    "NUMBER_LINE_DTYPES",
    "as_dtype",
    "round_to",
    "saturate_to",
    "NumberLine",
    "number_line",
    "spacing",
    "dot",
    "accumulate",
    "matmul",
    "Casts",
    "CAST_POINTS",
    "standard_attention_with_casts",
    "attention_with_casts",
    "carrier",
    "check_qkv",
    "flash2_forward_with_casts",
    "attention_magnitudes",
    "random_inputs",
    "BudgetRow",
    "error_budget",
    "SweepRow",
    "block_size_sweep",
    "length_sweep",
    "FP8",
    "hadamard",
    "random_hadamard",
    "quantize",
    "fp8_attention",
    "FP8Row",
    "fp8_study",
    "scores_unchanged",
]


#: The dtypes this module rounds to, widest first.
DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


#: The formats whose number lines the chapter compares.
NUMBER_LINE_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


_DTYPES = {name: np.dtype(getattr(ml_dtypes, name, None) or name) for name in DTYPES}


_F64 = np.dtype(np.float64)


_F32 = np.dtype(np.float32)


_F16 = np.dtype(np.float16)


def as_dtype(dtype: Any, name: str = "dtype") -> np.dtype:
    """One of :data:`DTYPES` as an ``np.dtype``, from a name, a type or a dtype; else a
    TypeError naming ``name``."""
    key = dtype if isinstance(dtype, str) else None
    if key is None and dtype is not None:  # np.dtype(None) would be float64
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = None
    if key not in _DTYPES:
        raise TypeError(f"{name} must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return _DTYPES[key]


def carrier(x: Any, name: str = "x") -> np.ndarray:
    """``x`` as a float64 array (exact for every dtype of :data:`DTYPES`)."""
    try:
        arr = np.asarray(x)
    except Exception as exc:
        raise TypeError(f"{name} must be an array of numbers, got {type(x).__name__}") from exc
    if arr.dtype.kind not in "fiu" and arr.dtype not in _DTYPES.values():
        raise TypeError(f"{name} must hold floating-point numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64)


def round_to(x: Any, dtype: Any) -> np.ndarray:
    """The nearest values of ``dtype`` to ``x`` (round to nearest, ties to even), as float64.

    What the cast to ``dtype`` gives, rounded once: what overflows gives inf, or NaN in
    ``float8_e4m3fn``, which has no inf (:func:`saturate_to` clips instead).
    x: any shape -> float64 array of that shape.
    """
    dt = as_dtype(dtype)
    arr = np.asarray(x) if isinstance(x, np.ndarray | np.generic) else None
    wide = arr is not None and (arr.dtype.kind in "iu" and arr.dtype.itemsize >= 8
                                or arr.dtype.kind == "f" and arr.dtype.itemsize > 8)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf/NaN is the answer
        if wide:  # int64 beyond 2**53, long double: more bits than float64 holds
            if dt == _F64:
                return arr.astype(np.float64)  # numpy's cast rounds these once
            # rounded to odd in float64 (keeps what the rounding to dt needs), then to dt
            return _round(_to_odd_float64(arr), dt)
        return _round(carrier(x), dt)


def _round(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """:func:`round_to` without the checks (float64 ``x``, a dtype of :data:`DTYPES`).

    numpy casts float64 to float32 and float16 in one rounding.  ml_dtypes casts float64 to
    bfloat16 and float8 through float32, rounding twice: 1 + 2**-8 + 2**-30 becomes the tie
    1 + 2**-8 in float32, then 1.0, where the nearest bfloat16 is 1 + 2**-7.  So x goes to
    float32 rounded *to odd* (toward zero, the last bit set when inexact), which keeps the
    information the second rounding needs: float32 has at least 2 more bits than these
    formats, in their subnormal range too, and then rounding to nearest is exact.  (A GPU that
    rounds a float32 register rounds that float32 value: ``round_to(round_to(x, "float32"),
    dtype)`` is that.)
    """
    if dt == _F64:
        return x
    if dt in (_F32, _F16):
        return x.astype(dt).astype(np.float64)
    return _to_odd_float32(x).astype(dt).astype(np.float64)


def _to_odd_float64(x: np.ndarray) -> np.ndarray:
    """int64/uint64 or long double ``x`` rounded to float64 toward zero, with the last bit set
    when inexact (round to odd), so that a second rounding to a format of at most 51 bits is
    the correct one.  Integers above 2**53 in magnitude are compared exactly as Python ints."""
    shape, x = np.shape(x), np.atleast_1d(x)
    near = x.astype(np.float64)  # nearest (inf beyond float64's range)
    if x.dtype.kind in "iu":
        inexact = np.zeros(x.shape, dtype=bool)
        above = np.zeros(x.shape, dtype=bool)
        for idx in zip(*np.nonzero(np.abs(near) >= 2.0**53), strict=True):
            exact, rounded = int(x[idx]), int(near[idx])
            inexact[idx], above[idx] = rounded != exact, abs(rounded) > abs(exact)
    else:
        back = near.astype(x.dtype)
        inexact = np.isfinite(x) & (back != x)
        above = np.abs(back) > np.abs(x)
    toward_zero = np.where(inexact & above, np.nextafter(near, 0.0), near)
    odd = (toward_zero.view(np.uint64) | inexact.astype(np.uint64)).view(np.float64)
    return odd.reshape(shape)


def _to_odd_float32(x: np.ndarray) -> np.ndarray:
    """float64 ``x`` rounded to float32 toward zero, with the last bit set when inexact."""
    near = x.astype(np.float32)  # nearest; inf beyond float32's range
    back = near.astype(np.float64)
    inexact = np.isfinite(x) & (back != x)
    toward_zero = np.where(inexact & (np.abs(back) > np.abs(x)),
                           np.nextafter(near, np.float32(0)), near)
    return (np.asarray(toward_zero).view(np.uint32) | inexact.astype(np.uint32)).view(np.float32)


def saturate_to(x: Any, dtype: Any) -> np.ndarray:
    """:func:`round_to` after clipping to the largest finite value of ``dtype``: 500 becomes
    448 in float8_e4m3fn (a plain cast gives NaN), inf becomes the largest value, NaN stays."""
    dt = as_dtype(dtype)
    top = float(ml_dtypes.finfo(dt).max)
    return round_to(np.clip(carrier(x), -top, top), dt)


class NumberLine(NamedTuple):
    """The facts of a floating-point format, from ``ml_dtypes.finfo``."""

    name: str
    bits: int  # storage size
    mantissa_bits: int  # stored fraction bits (precision is one more)
    eps: float  # spacing of the values just above 1: 2**-mantissa_bits
    max: float  # largest finite value
    smallest_normal: float  # below it, subnormals: fewer significant bits
    smallest_subnormal: float  # below half of it, everything rounds to 0

    @property
    def exponent_bits(self) -> int:
        """Bits of the exponent: the storage less the sign bit and the fraction bits."""
        return self.bits - 1 - self.mantissa_bits

    @property
    def precision(self) -> int:
        """Significant bits of a normal number: the stored fraction bits plus the implicit
        leading 1 (a normal number is 1.f x 2**e, and the 1 is not stored)."""
        return self.mantissa_bits + 1


def number_line(dtype: Any) -> NumberLine:
    """Machine epsilon, largest value, smallest normal (and subnormal) of ``dtype``."""
    dt = as_dtype(dtype)
    fi = ml_dtypes.finfo(dt)
    return NumberLine(dt.name, 8 * dt.itemsize, int(fi.nmant), float(fi.eps), float(fi.max),
                      float(fi.smallest_normal), float(fi.smallest_subnormal))


def spacing(x: Any, dtype: Any) -> np.ndarray:
    """The gap between ``|x|`` (rounded to ``dtype``) and the next larger value of ``dtype``:
    rounding to ``dtype`` near ``x`` errs by up to half of it.  float64 array shaped like x."""
    dt = as_dtype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.abs(carrier(x)).astype(dt)
        return np.abs(np.spacing(r).astype(np.float64))


def dot(x: Any, y: Any, acc: Any) -> float:
    """x . y with an accumulator of dtype ``acc``: each product exact, each addition rounded.

    x, y: (n,).  Teaching version (a Python loop); :func:`matmul` is the vectorised one.
    """
    total = 0.0
    for x_k, y_k in zip(x, y, strict=True):
        total = round_to(total + float(x_k) * float(y_k), acc)  # one rounding per addition
    return float(total)


def _check_axis(x: np.ndarray, axis: Any) -> int:
    check_int(axis, "axis")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for an array of {x.ndim} dimensions")
    return axis % x.ndim


def accumulate(terms: Any, acc: Any, *, axis: int = -1, start: Any = None) -> np.ndarray:
    """Sum ``terms`` along ``axis`` in an accumulator of dtype ``acc``, from ``start`` (0 by
    default), rounding after every addition, one term after another.

    terms: (..., n, ...) -> the sums, with ``axis`` kept as length 1 (as ``keepdims=True``).
    A float64 accumulator adds in float64 (np.sum).
    """
    dt = as_dtype(acc, "acc")
    t = carrier(terms, "terms")
    axis = _check_axis(t, axis)
    total = np.zeros(t.shape[:axis] + (1,) + t.shape[axis + 1:])
    if start is not None:
        total = total + round_to(start, dt)
    if dt == _F64:
        return total + t.sum(axis=axis, keepdims=True)
    t = np.moveaxis(t, axis, 0)[:, None]  # the terms one after another, each keeping axis
    total = np.moveaxis(total, axis, 0)
    with np.errstate(over="ignore", invalid="ignore"):
        for term in t:
            total = _round(total + term[0], dt)
    return np.moveaxis(total, 0, axis)


def matmul(A: Any, B: Any, acc: Any, *, start: Any = None) -> np.ndarray:
    """``start + A @ B`` with an accumulator of dtype ``acc`` (see the module docstring).

    A: (m, k), B: (k, n), start: broadcastable to (m, n) (0 by default) -> (m, n) float64
    holding values of ``acc``.  float64 and float32 accumulators are BLAS matmuls in that dtype
    (the operands made that dtype); a narrower one is emulated one addition at a time: k
    vectorised steps ``acc = round(acc + A[:, p] B[p, :])``, each product exact.
    """
    dt = as_dtype(acc, "acc")
    A, B = carrier(A, "A"), carrier(B, "B")
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"A and B must be (m, k) and (k, n) matrices, got {A.shape} and "
                         f"{B.shape}")
    base = 0.0 if start is None else round_to(start, dt)
    with np.errstate(over="ignore", invalid="ignore"):
        if dt == _F64:
            return base + A @ B
        if dt == _F32:
            A32, B32 = (np.ascontiguousarray(X, dtype=np.float32) for X in (A, B))
            prod = (A32 @ B32).astype(np.float64)
            return _round(base + prod, dt) if start is not None else prod
        out = np.broadcast_to(base, (A.shape[0], B.shape[1])).astype(np.float64)
        for p in range(A.shape[1]):  # k sequential additions, each rounded to acc
            out = _round(out + A[:, p, None] * B[None, p, :], dt)
        return out


@dataclasses.dataclass(frozen=True)
class Casts:
    """Where a kernel keeps each quantity: one dtype per cast point (names of :data:`DTYPES`).

    inputs: Q, K, V as loaded;  S: the scores, after ``scale * Q K^T``;  P: the probabilities
    before the ``P V`` matmul;  acc: the accumulator of ``P V``;  m, l: the running maximum and
    sum;  O: the output;  compute: the registers (``Q K^T``'s accumulator, ``exp``, the rescale
    factors ``exp(m_old - m_new)``, the division by ``l``).
    """

    inputs: str = "float64"
    S: str = "float64"
    P: str = "float64"
    acc: str = "float64"
    m: str = "float64"
    l: str = "float64"
    O: str = "float64"
    compute: str = "float64"

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            object.__setattr__(self, field.name, as_dtype(value, f"Casts.{field.name}").name)

    @classmethod
    def exact(cls) -> Casts:
        """Everything float64: the reference."""
        return cls()

    @classmethod
    def flash(cls, dtype: Any) -> Casts:
        """What FlashAttention-2 keeps: inputs, P and O in ``dtype``; S, m, l, the accumulator
        and the registers in float32."""
        d = as_dtype(dtype).name
        return cls(inputs=d, S="float32", P=d, acc="float32", m="float32", l="float32", O=d,
                   compute="float32")

    @classmethod
    def plain(cls, dtype: Any) -> Casts:
        """Standard attention as PyTorch runs it in ``dtype`` on a GPU, flash-attn's baseline:
        every matmul accumulates in float32 and stores its result (S, O) in ``dtype``; the
        softmax computes in float32 and stores P in ``dtype``."""
        d = as_dtype(dtype).name
        return cls(inputs=d, S=d, P=d, acc="float32", m="float32", l="float32", O=d,
                   compute="float32")

    @classmethod
    def everything(cls, dtype: Any) -> Casts:
        """Every quantity kept in ``dtype`` (accumulator, m and l included); registers float32."""
        d = as_dtype(dtype).name
        return cls(inputs=d, S=d, P=d, acc=d, m=d, l=d, O=d, compute="float32")

    def replace(self, **changes: Any) -> Casts:
        """A copy with some cast points changed, e.g. ``casts.replace(l="bfloat16")``."""
        return dataclasses.replace(self, **changes)


#: The cast points in the order the error budget adds them.
CAST_POINTS = tuple(f.name for f in dataclasses.fields(Casts))


def standard_attention_with_casts(Q: np.ndarray, K: np.ndarray, V: np.ndarray,
                                  c: Casts) -> np.ndarray:
    """Standard attention (Algorithm 0), rounding each quantity where ``c`` keeps it.

    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v), float64 holding c.O values.
    """
    Q, K, V = (round_to(X, c.inputs) for X in (Q, K, V))
    scale = 1 / math.sqrt(Q.shape[1])
    S = round_to(scale * matmul(Q, K.T, c.compute), c.S)  # (N_q, N_k)
    m = round_to(S.max(axis=1, keepdims=True), c.m)  # (N_q, 1): row maximum
    E = round_to(np.exp(S - m), c.compute)  # (N_q, N_k)
    l = accumulate(E, c.l, axis=1)  # (N_q, 1): row sum, one rounding per addition
    P = round_to(E / l, c.P)  # (N_q, N_k): what the P V matmul reads
    O = matmul(P, V, c.acc)  # (N_q, d_v), accumulated in c.acc
    return round_to(O, c.O)


def flash2_forward_with_casts(Q: np.ndarray, K: np.ndarray, V: np.ndarray, B_c: int,
                              c: Casts) -> np.ndarray:
    """FlashAttention-2's forward over key blocks of B_c, rounding where ``c`` keeps things.

    Query rows are independent (a B_r block gives the same numbers), so all rows go at once.
    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v), float64 holding c.O values.
    """
    Q, K, V = (round_to(X, c.inputs) for X in (Q, K, V))
    scale = 1 / math.sqrt(Q.shape[1])
    O = np.zeros((Q.shape[0], V.shape[1]))  # (N_q, d_v): the unnormalised accumulator
    l = np.zeros((Q.shape[0], 1))  # (N_q, 1): running sum
    m = np.full((Q.shape[0], 1), -np.inf)  # (N_q, 1): running maximum
    for j in range(0, K.shape[0], B_c):
        K_j, V_j = K[j : j + B_c], V[j : j + B_c]  # (B_c, d), (B_c, d_v)
        S_ij = round_to(scale * matmul(Q, K_j.T, c.compute), c.S)  # (N_q, B_c)
        m_new = round_to(np.maximum(m, S_ij.max(axis=1, keepdims=True)), c.m)
        P_ij = round_to(np.exp(S_ij - m_new), c.compute)  # (N_q, B_c): P~, unnormalised
        alpha = round_to(np.exp(m - m_new), c.compute)  # (N_q, 1): rescales the old sums
        l = accumulate(P_ij, c.l, axis=1, start=alpha * l)
        O = matmul(round_to(P_ij, c.P), V_j, c.acc, start=alpha * O)
        m = m_new
    return round_to(O / l, c.O)  # the one division, at the end


def check_qkv(Q: Any, K: Any, V: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    Q, K, V = (carrier(X, name) for X, name in ((Q, "Q"), (K, "K"), (V, "V")))
    if Q.ndim != 2 or K.ndim != 2 or V.ndim != 2:
        raise ValueError(f"Q, K, V must be 2-D (one head): (N_q, d), (N_k, d), (N_k, d_v); got "
                         f"{Q.shape}, {K.shape}, {V.shape}")
    if Q.shape[1] != K.shape[1] or K.shape[0] != V.shape[0]:
        raise ValueError(f"Q, K, V must be (N_q, d), (N_k, d), (N_k, d_v), got {Q.shape}, "
                         f"{K.shape}, {V.shape}")
    if 0 in Q.shape or K.shape[0] == 0 or V.shape[1] == 0:
        raise ValueError(f"Q, K, V must be non-empty, got {Q.shape}, {K.shape}, {V.shape}")
    if not all(np.all(np.isfinite(X)) for X in (Q, K, V)):
        raise ValueError("Q, K, V must be finite")
    return Q, K, V


def _check_casts(casts: Any) -> Casts:
    if not isinstance(casts, Casts):
        raise TypeError(f"casts must be a flashlib.studies.precision.Casts, got {casts!r}")
    return casts


def attention_with_casts(Q, K, V, casts: Casts, B_c: int | None) -> np.ndarray:
    """Standard (B_c None) or tiled attention with casts, overflow and NaN silent."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if B_c is None:
            return standard_attention_with_casts(Q, K, V, casts)
        return flash2_forward_with_casts(Q, K, V, B_c, casts)


def attention_magnitudes(Q: Any, K: Any, V: Any) -> dict[str, tuple[float, float]]:
    """Where the values of S, P, l and O fall (float64 standard attention): for each, the
    smallest non-zero and the largest absolute value.  Q: (N_q, d), K: (N_k, d), V: (N_k, d_v).
    """
    Q, K, V = check_qkv(Q, K, V)
    S = (Q @ K.T) / math.sqrt(Q.shape[1])
    E = np.exp(S - S.max(axis=1, keepdims=True))
    l = E.sum(axis=1, keepdims=True)
    P = E / l
    O = P @ V

    def span(x: np.ndarray) -> tuple[float, float]:
        a = np.abs(x[x != 0])
        return (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)

    return {"S": span(S), "P": span(P), "l": span(l), "O": span(O)}


def random_inputs(n: int, d: int, rng: np.random.Generator, *, n_k: int | None = None,
                  d_v: int | None = None, scale: float = 1.0, outlier: float = 0.0,
                  rate: float = 0.001) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q: (n, d), K: (n_k, d), V: (n_k, d_v), float64: standard normal entries times
    ``scale``, plus, in a fraction ``rate`` of the entries, an extra normal term of standard
    deviation ``outlier`` (outlier features, as in FlashAttention-3's FP8 experiment)."""
    check_rng(rng)
    n, d = check_int(n, "n", minimum=1), check_int(d, "d", minimum=1)
    n_k = n if n_k is None else check_int(n_k, "n_k", minimum=1)
    d_v = d if d_v is None else check_int(d_v, "d_v", minimum=1)
    for name, value in (("scale", scale), ("outlier", outlier)):
        if not (isinstance(value, (int, float, np.floating)) and np.isfinite(value)
                and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not (isinstance(rate, (int, float, np.floating)) and 0 <= rate <= 1):
        raise ValueError(f"rate must be a number in [0, 1], got {rate!r}")
    out = []
    for shape in ((n, d), (n_k, d), (n_k, d_v)):
        x = scale * rng.standard_normal(shape)
        if outlier:
            x = x + outlier * rng.standard_normal(shape) * (rng.random(shape) < rate)
        out.append(x)
    return out[0], out[1], out[2]


class BudgetRow(NamedTuple):
    """One cast point of :func:`error_budget`: its dtype, the error of standard and tiled
    attention with this point alone rounded (everything else float64), and with every point
    up to this one rounded (the last row is the total)."""

    point: str
    dtype: str
    standard_alone: ErrorStats
    tiled_alone: ErrorStats
    standard_cumulative: ErrorStats
    tiled_cumulative: ErrorStats


def error_budget(Q: Any, K: Any, V: Any, casts: Casts, *, B_c: int = 64,
                 points: Sequence[str] = CAST_POINTS) -> list[BudgetRow]:
    """Attribute the error of ``casts`` against float64 to its cast points.

    The reference is float64 standard attention of Q, K, V as given (float64 data, before the
    input cast).  For each point (in ``points`` order; float64 points skipped): the error with
    that point alone in its dtype, and with it and every earlier one.  Standard and tiled
    (FlashAttention-2, key blocks of B_c) attention both.
    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v).
    """
    Q, K, V = check_qkv(Q, K, V)
    casts = _check_casts(casts)
    B_c = check_int(B_c, "B_c", minimum=1)
    for point in points:
        if point not in CAST_POINTS:
            raise ValueError(f"points must be cast points of Casts ({', '.join(CAST_POINTS)}),"
                             f" got {point!r}")
    ref = attention_with_casts(Q, K, V, Casts.exact(), None)
    rows, so_far = [], Casts.exact()
    for point in points:
        dtype = getattr(casts, point)
        if dtype == "float64":
            continue
        alone = Casts.exact().replace(**{point: dtype})
        so_far = so_far.replace(**{point: dtype})
        rows.append(BudgetRow(
            point, dtype,
            error_stats(attention_with_casts(Q, K, V, alone, None), ref),
            error_stats(attention_with_casts(Q, K, V, alone, B_c), ref),
            error_stats(attention_with_casts(Q, K, V, so_far, None), ref),
            error_stats(attention_with_casts(Q, K, V, so_far, B_c), ref),
        ))
    return rows


class SweepRow(NamedTuple):
    """One point of a sweep: the parameter's value, the errors against float64 (standard and
    tiled attention with the same casts, and plain attention in the input dtype) and max|O| of
    the reference (errors scale with it: rounding O alone errs by up to half an ulp of it)."""

    value: int
    standard: ErrorStats
    tiled: ErrorStats
    plain: ErrorStats
    out_max: float


def block_size_sweep(Q: Any, K: Any, V: Any, casts: Casts,
                     blocks: Iterable[int]) -> list[SweepRow]:
    """Error of tiled attention against float64 for each key block size B_c (the reference:
    float64 attention of the inputs rounded to ``casts.inputs``, flash-attn's convention).
    Standard and plain attention do not depend on B_c: the same numbers on every row.
    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v)."""
    Q, K, V = check_qkv(Q, K, V)
    casts = _check_casts(casts)
    blocks = [check_int(b, "blocks", minimum=1) for b in blocks]
    Qr, Kr, Vr = (round_to(X, casts.inputs) for X in (Q, K, V))
    ref = attention_with_casts(Qr, Kr, Vr, Casts.exact(), None)
    standard = error_stats(attention_with_casts(Qr, Kr, Vr, casts, None), ref)
    plain = error_stats(attention_with_casts(Qr, Kr, Vr, Casts.plain(casts.inputs), None), ref)
    out_max = float(np.max(np.abs(ref)))
    return [SweepRow(b, standard, error_stats(attention_with_casts(Qr, Kr, Vr, casts, b), ref),
                     plain, out_max) for b in blocks]


def length_sweep(casts: Casts, ns: Iterable[int], *, d: int = 64, B_c: int = 64,
                 seed: int = 0, scale: float = 1.0) -> list[SweepRow]:
    """Error against float64 for each sequence length n (N_q = N_k = n; inputs from
    :func:`random_inputs` with ``np.random.default_rng(seed)``, rounded to ``casts.inputs``;
    the reference is float64 attention of the rounded inputs)."""
    casts = _check_casts(casts)
    rows = []
    for n in ns:
        n = check_int(n, "ns", minimum=1)
        Q, K, V = random_inputs(n, d, np.random.default_rng(seed), scale=scale)
        Qr, Kr, Vr = (round_to(X, casts.inputs) for X in (Q, K, V))
        ref = attention_with_casts(Qr, Kr, Vr, Casts.exact(), None)
        rows.append(SweepRow(
            n,
            error_stats(attention_with_casts(Qr, Kr, Vr, casts, None), ref),
            error_stats(attention_with_casts(Qr, Kr, Vr, casts, B_c), ref),
            error_stats(attention_with_casts(Qr, Kr, Vr, Casts.plain(casts.inputs), None), ref),
            float(np.max(np.abs(ref))),
        ))
    return rows


# --- FP8 as FlashAttention-3 does it ---------------------------------------------------------


#: The FP8 format of FlashAttention-3's forward pass.
FP8 = "float8_e4m3fn"


def hadamard(d: int) -> np.ndarray:
    """The d x d Sylvester Hadamard matrix (entries +-1, ``H H^T = d I``); d a power of 2."""
    d = check_int(d, "d", minimum=1)
    if d & (d - 1):
        raise ValueError(f"d must be a power of 2 for a Hadamard matrix, got {d}")
    H = np.ones((1, 1))
    while H.shape[0] < d:
        H = np.block([[H, H], [H, -H]])
    return H


def random_hadamard(d: int, rng: np.random.Generator) -> np.ndarray:
    """M = diag(signs) H / sqrt(d): orthogonal (M M^T = I), random signs from ``rng``.

    Q M (K M)^T = Q M M^T K^T = Q K^T: the scores are unchanged.  (d, d), float64.
    """
    H = hadamard(d)
    signs = check_rng(rng).choice([-1.0, 1.0], size=d)
    return signs[:, None] * H / math.sqrt(d)


def quantize(X: Any, dtype: Any = FP8, block: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Scaled cast: ``X ~ X_q * s``, X_q holding values of ``dtype`` (saturated, never NaN).

    s = max|X| / max(dtype) for the whole tensor (``block=None``) or for each block of
    ``block`` rows.  X: (n, d) -> X_q: (n, d) float64, s: (n, 1) float64 (each row its
    block's scale; an all-zero block gets s = 1).
    """
    X = carrier(X, "X")
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D (n, d) array, got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X must be finite")
    top = number_line(as_dtype(dtype)).max
    n = X.shape[0]
    size = n if block is None else check_int(block, "block", minimum=1)
    s = np.ones((n, 1))
    for i in range(0, n, size):
        amax = float(np.max(np.abs(X[i : i + size]), initial=0.0))
        s[i : i + size] = amax / top if amax > 0 else 1.0
    return saturate_to(X / s, dtype), s


def fp8_attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray, *, block_scaling: bool,
                  M: np.ndarray | None = None, B_r: int = 64, B_c: int = 64) -> np.ndarray:
    """FlashAttention-3's FP8 forward, emulated: rotate, quantise, then FlashAttention-2's loop.

    M: the rotation (e.g. :func:`random_hadamard`) or None.  block_scaling: one scale per B_r
    rows of Q and per B_c rows of K and V (else one per tensor).
    Q: (N_q, d), K: (N_k, d), V: (N_k, d_v) -> O: (N_q, d_v), float64 (kept in float32).
    """
    if M is not None:
        Q, K = Q @ M, K @ M  # same scores, outliers spread over every coordinate
    Q_q, s_Q = quantize(Q, FP8, B_r if block_scaling else None)
    K_q, s_K = quantize(K, FP8, B_c if block_scaling else None)
    V_q, s_V = quantize(V, FP8, B_c if block_scaling else None)
    # the kernel multiplies S_ij by s_Q s_K and O by s_V; here the inputs are dequantised
    c = Casts(inputs="float32", S="float32", P=FP8, acc="float32", m="float32",
              l="float32", O="float32", compute="float32")
    return attention_with_casts(Q_q * s_Q, K_q * s_K, V_q * s_V, c, B_c)


class FP8Row(NamedTuple):
    """One variant of :func:`fp8_study` and its error against float64."""

    label: str
    block_scaling: bool
    rotation: bool
    error: ErrorStats


def fp8_study(n: int = 1024, d: int = 128, *, seed: int = 0, outlier: float = 10.0,
              rate: float = 0.001, B: int = 64) -> list[FP8Row]:
    """FP8 attention's error against float64 with and without per-block scaling and the
    Hadamard rotation, on inputs with outlier features
    (:func:`~flashlib.studies.precision.random_inputs` with ``outlier`` and ``rate``), plus
    FlashAttention-2 in float16 and bfloat16 for scale.

    n x d inputs from ``np.random.default_rng(seed)`` (the same rng then draws the rotation's
    signs); blocks of B rows (B_r = B_c = B).  Returns one :class:`FP8Row` per variant, the
    baseline (per-tensor, no rotation) first.
    """
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    d = check_int(d, "d", minimum=1)
    Q, K, V = check_qkv(*random_inputs(n, d, rng, outlier=outlier, rate=rate))
    B = check_int(B, "B", minimum=1)
    M = random_hadamard(d, rng)
    ref = attention_with_casts(Q, K, V, Casts.exact(), None)
    rows = []
    for label, block, rotate in (("per-tensor", False, False), ("per-block", True, False),
                                 ("per-tensor + rotation", False, True),
                                 ("per-block + rotation", True, True)):
        O = fp8_attention(Q, K, V, block_scaling=block, M=M if rotate else None, B_r=B, B_c=B)
        rows.append(FP8Row(label, block, rotate, error_stats(O, ref)))
    for dt in ("float16", "bfloat16"):
        O = attention_with_casts(Q, K, V, Casts.flash(dt), B)
        rows.append(FP8Row(f"FlashAttention-2, {dt}", False, False, error_stats(O, ref)))
    return rows


def scores_unchanged(Q: Any, K: Any, M: Any) -> float:
    """max |Q K^T - (Q M)(K M)^T|: 0 up to float64 rounding for an orthogonal M."""
    Q, K, M = carrier(Q, "Q"), carrier(K, "K"), carrier(M, "M")
    return float(np.max(np.abs(Q @ K.T - (Q @ M) @ (K @ M).T), initial=0.0))
