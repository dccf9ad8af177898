"""Checkers for the Introduction's exercises (book/intro.md).

Each checker runs the learner's function on several cases, never raises because of the
learner's code, and returns a :class:`flashlib.book.exercises.Feedback` naming what went wrong.

check_attention_flops      ``flops(n_q, n_k, d, d_v)`` of the two matrix products of attention
check_attention_shapes     ``shapes(q_shape, k_shape, v_shape)`` of S, P, O and lse
check_reference_attention  ``attention(q, k, v)`` = softmax(q k^T / sqrt(d)) v in numpy
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import Feedback, call_learner, checker
from flashlib.naive import naive_attention
from flashlib.stable_softmax import softmax

__all__ = ["check_attention_flops", "check_attention_shapes", "check_reference_attention"]


@checker("FLOPs of attention")
def check_attention_flops(fb: Feedback, fn: Callable[[int, int, int, int], int]) -> None:
    """Check ``flops(n_q, n_k, d, d_v)``: FLOPs of ``S = q k^T`` and ``O = P v`` (2 per FMA)."""
    cases = [(1, 1, 1, 1), (4, 4, 2, 2), (1024, 1024, 64, 64), (100, 300, 64, 32), (7, 5, 3, 11)]
    for n_q, n_k, d, d_v in cases:
        label = f"n_q={n_q}, n_k={n_k}, d={d}, d_v={d_v}"
        with fb.case(label):
            got, _ = call_learner(fn, n_q, n_k, d, d_v)
            qk, pv = 2 * n_q * n_k * d, 2 * n_q * n_k * d_v
            want = qk + pv
            if not isinstance(got, int | float | np.integer | np.floating) or got != got:
                fb.fail(f"{label}: expected a number, got {got!r}")
            elif got == want:
                fb.ok(f"{label}: {want:,} FLOPs")
            elif got == want // 2:
                fb.fail(f"{label}: {got:,} counts multiply-adds; a multiply-add is 2 FLOPs")
            elif got == qk:
                fb.fail(f"{label}: {got:,} is only S = q k^T; add O = P v (2 n_q n_k d_v)")
            elif got == 4 * n_q * n_k * d and d != d_v:
                fb.fail(f"{label}: {got:,} uses d for both products; P v has inner size n_k "
                        f"and output width d_v = {d_v}")
            elif got == 2 * n_q * n_q * (d + d_v) and n_q != n_k:
                fb.fail(f"{label}: {got:,} assumes n_k = n_q; S is (n_q, n_k)")
            else:
                fb.fail(f"{label}: got {got:,}, expected {want:,} = 2 n_q n_k d + 2 n_q n_k d_v")


def _shape(x: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(s) for s in x)
    except (TypeError, ValueError):
        return None


@checker("shapes of S, P, O and lse")
def check_attention_shapes(fb: Feedback, fn: Callable[..., dict[str, tuple[int, ...]]]) -> None:
    """Check ``shapes(q_shape, k_shape, v_shape)`` -> ``{"S", "P", "O", "lse"}`` shapes."""
    cases = [((2, 8, 1000, 64), (2, 8, 1000, 64), (2, 8, 1000, 64)),
             ((5, 16), (7, 16), (7, 3)),
             ((4, 1, 6, 8), (4, 1, 9, 8), (4, 1, 9, 2))]
    for q, k, v in cases:
        label = f"q {q}, k {k}, v {v}"
        with fb.case(label):
            got, _ = call_learner(fn, q, k, v)
            if not isinstance(got, dict):
                fb.fail(f"{label}: expected a dict with keys 'S', 'P', 'O', 'lse', got {got!r}")
                continue
            lead, n_q, n_k, d_v = q[:-2], q[-2], k[-2], v[-1]
            want = {"S": (*lead, n_q, n_k), "P": (*lead, n_q, n_k), "O": (*lead, n_q, d_v),
                    "lse": (*lead, n_q)}
            wrong = []
            for key, shape in want.items():
                have = _shape(got.get(key)) if key in got else None
                if have == shape:
                    continue
                if key not in got:
                    wrong.append(f"{key} is missing")
                elif key in "SP" and have == (*lead, n_k, n_q) and n_q != n_k:
                    wrong.append(f"{key} {have}: rows are queries, columns keys -> {shape}")
                elif key == "O" and have == (*lead, n_q, q[-1]) and q[-1] != d_v:
                    wrong.append(f"O {have}: O has v's width d_v = {d_v}, not d")
                elif key == "lse" and have == (*lead, n_q, 1):
                    wrong.append(f"lse {have}: one number per query row, no trailing 1")
                elif have is not None and have[-len(shape) + len(lead):] == shape[len(lead):]:
                    wrong.append(f"{key} {have}: keep the leading (batch, heads) dims {lead}")
                else:
                    wrong.append(f"{key}: got {got.get(key)!r}, expected {shape}")
            if wrong:
                fb.fail(f"{label}: " + "; ".join(wrong))
            else:
                fb.ok(f"{label}: S, P {want['S']}, O {want['O']}, lse {want['lse']}")


@checker("reference attention")
def check_reference_attention(
    fb: Feedback, fn: Callable[[np.ndarray, np.ndarray, np.ndarray], Any]
) -> None:
    """Check ``attention(q, k, v)`` = ``softmax(q k^T / sqrt(d)) v`` against flashlib."""
    rng = np.random.default_rng(0)
    for dtype, shape_q, n_k, d_v, spread in [
        (np.float64, (2, 5, 4), 7, 3, 1.0),
        (np.float64, (3, 6), 6, 6, 1.0),
        (np.float32, (2, 8, 16), 8, 16, 1.0),
        (np.float32, (4, 8), 4, 2, 100.0),  # large scores: exp overflows without the max
    ]:
        q = (spread * rng.standard_normal(shape_q)).astype(dtype)
        k = rng.standard_normal((*shape_q[:-2], n_k, shape_q[-1])).astype(dtype)
        v = rng.standard_normal((*shape_q[:-2], n_k, d_v)).astype(dtype)
        label = f"q {q.shape} {np.dtype(dtype)}, k {k.shape}, v {v.shape}" + (
            f", scores up to ~{spread:g}" if spread > 1 else "")
        with fb.case(label):
            got, caught = call_learner(fn, q, k, v)
            got = np.asarray(got)
            want = naive_attention(q, k, v)
            tol = 1e-5 if dtype == np.float32 else 1e-10
            if got.shape != want.shape:
                fb.fail(f"{label}: output shape {got.shape}, expected {want.shape}")
            elif not np.all(np.isfinite(got)):
                fb.fail(f"{label}: NaN/inf in the output ({'; '.join(caught) or 'exp overflow'})"
                        ": subtract each row's maximum before np.exp")
            elif np.allclose(got, want, atol=tol, rtol=tol):
                if got.dtype != want.dtype:
                    fb.fail(f"{label}: right values but dtype {got.dtype}, expected {want.dtype}; "
                            "np.sqrt(d) is a float64 scalar: use q.dtype.type(np.sqrt(d))")
                elif caught:
                    fb.fail(f"{label}: right values, but numpy warned: {'; '.join(caught)}")
                else:
                    fb.ok(f"{label}: matches flashlib.naive_attention")
            elif np.allclose(got, naive_attention(q, k, v, scale=1.0), atol=tol, rtol=tol):
                fb.fail(f"{label}: you forgot the scale 1/sqrt(d)")
            elif np.allclose(got, naive_attention(q, k, v, scale=1 / q.shape[-1]), atol=tol,
                             rtol=tol):
                fb.fail(f"{label}: you scaled by 1/d; the scale is 1/sqrt(d)")
            else:
                s = (q @ np.swapaxes(k, -1, -2)).astype(np.float64) / np.sqrt(q.shape[-1])
                wrong_axis = softmax(s, axis=-2) @ v
                if np.allclose(got, wrong_axis, atol=1e-4, rtol=1e-4):
                    fb.fail(f"{label}: the softmax runs over the wrong axis; normalise each row "
                            "(over the keys, axis=-1)")
                else:
                    err_max = float(np.max(np.abs(got.astype(np.float64) - want)))
                    fb.fail(f"{label}: max |difference| {err_max:.3g} from naive_attention")
