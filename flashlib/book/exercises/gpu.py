"""Checkers for the exercises of the GPU chapter: pieces of the Triton forward kernel.

Each piece is a ``@triton.jit`` function the checker plugs into
:func:`flashlib.gpu.exercise_kernels.exercise_forward_kernel` (the chapter's kernel, cut into
pieces) and runs, in Triton's interpreter without a GPU, on small ragged cases, against a
float64 reference.

check_online_softmax_step  ``step(S_ij, V_j, m_i, l_i, acc) -> (m_i, l_i, acc)``: the inner loop
check_key_end              ``key_end(i, B_r, N_K, CAUSAL)``: causal tile skipping
check_visible_keys         ``visible(rows, cols, N_K, CAUSAL)``: the boundary (and causal) mask
triton_stand_ins           stand-ins for ``triton`` and ``triton.language`` where triton cannot
                           run, so that the exercise cells still define their functions

Without torch or triton (or with triton imported before flashlib.gpu) a checker says so in
one line instead of running; it never raises because of the learner's code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import Feedback, LearnerError, NotAttempted, checker, learner_side
from flashlib.core.constants import LOG2E

__all__ = ["TOLERANCE", "check_online_softmax_step", "check_key_end", "check_visible_keys",
           "triton_stand_ins"]

#: Largest accepted error against the float64 reference, per input dtype, relative to
#: max(1, max|o|): float32 is exact up to a few roundings, float16 inputs and P rounded to
#: float16 cost a few of float16's eps (9.8e-4).
TOLERANCE = {"float32": 1e-5, "float16": 4e-3}


def _gpu_unavailable() -> str | None:
    """Why the kernels cannot run here (plain words), or None."""
    try:
        from flashlib.gpu import GPUUnavailable, require_kernels
    except ImportError as err:  # pragma: no cover - flashlib.gpu itself needs only the stdlib
        return f"flashlib.gpu cannot be imported: {err}"
    try:
        require_kernels()
    except GPUUnavailable as err:
        return str(err)
    return None


class _StandIn:
    """Any attribute is another stand-in; calling one returns its first argument (so that
    ``@triton.jit`` leaves a function as it is) or a stand-in."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> _StandIn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _StandIn(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if args else self

    def __repr__(self) -> str:
        return f"<stand-in for {self._name}: triton cannot run here>"


def triton_stand_ins() -> tuple[Any, Any]:
    """(triton, triton.language) stand-ins for a machine where the Triton kernels cannot run:
    ``@triton.jit`` leaves the function as it is and ``tl.constexpr`` is a placeholder, so
    the exercise cells run, and each checker then says why it cannot check."""
    return _StandIn("triton"), _StandIn("triton.language")


def _root(err: BaseException) -> BaseException:
    """The exception the learner's code raised, under Triton's InterpreterError wrappers."""
    while type(err).__name__ == "InterpreterError" and err.__cause__ is not None:
        err = err.__cause__
    return err


@learner_side
def _run(q, k, v, causal: bool, blocks: tuple[int, int], **pieces) -> tuple[np.ndarray, ...]:
    """Run the exercise kernel with the learner's pieces; the learner's failures become
    NotAttempted / LearnerError.  In the grader it runs where the learner's function is (the
    kernel needs the function itself)."""
    from flashlib.gpu.exercise_kernels import run_exercise_kernel

    try:
        with np.errstate(all="ignore"):  # NaN and inf are reported from the result
            return run_exercise_kernel(q, k, v, causal=causal, blocks=blocks, **pieces)
    except Exception as err:  # any failure inside the kernel comes from the learner's piece
        root = _root(err)
        if isinstance(root, NotImplementedError) or "NotImplementedError" in str(err):
            raise NotAttempted from err
        lines = str(root).strip().splitlines()
        raise LearnerError(f"your function raised {type(root).__name__}: "
                           f"{lines[-1] if lines else ''}"[:400]) from err


def _inputs(n_q: int, n_k: int, d: int, dtype: str, seed: int, logit_scale: float = 1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, n_q, d)) * logit_scale
    k, v = rng.standard_normal((1, n_k, d)), rng.standard_normal((1, n_k, d))
    return tuple(x.astype(dtype) for x in (q, k, v))


def _visible(n_q: int, n_k: int, causal: bool) -> np.ndarray:
    rows, cols = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    return (cols <= rows) if causal else np.ones((n_q, n_k), bool)


def _reference(q, k, v, causal: bool) -> np.ndarray:
    """float64 attention, scale 1/sqrt(d), top-left causal mask."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    s = np.where(_visible(q.shape[-2], k.shape[-2], causal), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def _loop_model(q, k, v, causal: bool, blocks: tuple[int, int], variant: str) -> np.ndarray:
    """The kernel's tile loop in float64 with one typical mistake (``variant``): what a learner's
    step that makes it returns, to recognise it."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    B_r, B_c = blocks
    exp = np.exp if variant == "exp_not_exp2" else np.exp2
    s_all = np.where(_visible(n_q, n_k, causal),
                     q @ k.swapaxes(-1, -2) * (LOG2E / math.sqrt(q.shape[-1])), -np.inf)
    out = np.empty_like(q[..., : v.shape[-1]])
    for i in range(0, n_q, B_r):
        rows = slice(i, min(i + B_r, n_q))
        m = np.full(s_all[:, rows].shape[:2], -np.inf)
        l, acc = np.zeros_like(m), np.zeros((*m.shape, v.shape[-1]))
        for j in range(0, min(n_k, i + B_r) if causal else n_k, B_c):
            s = s_all[:, rows, j: j + B_c]
            m_new = np.maximum(m, s.max(axis=-1))
            p = exp(s - m_new[..., None])
            alpha = exp(m - m_new)
            l = (l if variant == "no_l_rescale" else alpha * l) + p.sum(axis=-1)
            acc = (acc if variant == "no_acc_rescale" else alpha[..., None] * acc) + (
                p @ v[:, j: j + B_c])
            m = m_new
        out[:, rows] = acc / l[..., None]
    return out


def _error(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)))


def _close(got, want, dtype: str) -> bool:
    scale = max(1.0, float(np.max(np.abs(want))))
    return bool(np.all(np.isfinite(got))) and _error(got, want) <= TOLERANCE[dtype] * scale


def _label(n_q, n_k, d, causal, dtype, blocks) -> str:
    return (f"n_q={n_q}, n_k={n_k}, d={d}{', causal' if causal else ''}, {dtype}, "
            f"B_r x B_c = {blocks[0]} x {blocks[1]}")


@checker("the inner loop: one tile of the online softmax")
def check_online_softmax_step(fb: Feedback, step: Callable[..., Any]) -> None:
    """Check ``step(S_ij, V_j, m_i, l_i, acc) -> (m_i, l_i, acc)`` in the Triton kernel: scores
    in base 2 (use ``tl.exp2``), several key tiles per row, ragged n, causal, float16, huge
    scores."""
    why = _gpu_unavailable()
    if why:
        fb.fail(f"this exercise runs a Triton kernel, which cannot run here: {why}")
        return
    cases = [  # n_q, n_k, d, causal, dtype, blocks, logit scale
        (32, 64, 16, False, "float32", (16, 16), 1.0),
        (45, 70, 32, False, "float32", (16, 32), 1.0),
        (50, 50, 16, True, "float32", (16, 16), 1.0),
        (40, 40, 32, False, "float16", (16, 16), 1.0),
        (20, 48, 16, False, "float32", (16, 16), 30.0),
    ]
    hints = {
        "no_acc_rescale": "acc was not rescaled when the maximum grew: acc = alpha[:, None] * "
                          "acc + P_ij @ V_j, with alpha = exp2(m_i - m_new)",
        "no_l_rescale": "l_i was not rescaled when the maximum grew: l_i = alpha * l_i + "
                        "rowsum(P_ij)",
        "exp_not_exp2": "the scores are in base 2 (the scale was multiplied by log2(e)): use "
                        "tl.exp2, not tl.exp",
    }
    for seed, (n_q, n_k, d, causal, dtype, blocks, logit) in enumerate(cases):
        label = _label(n_q, n_k, d, causal, dtype, blocks) + (
            f", scores up to about {logit * 4:.0f}" if logit > 1 else "")
        with fb.case(label, "(P_ij must be cast to V_j's dtype for tl.dot: P_ij.to(V_j.dtype))"
                     if dtype == "float16" else ""):
            q, k, v = _inputs(n_q, n_k, d, dtype, seed, logit)
            got, _ = _run(q, k, v, causal, blocks, step_fn=step)
            want = _reference(q, k, v, causal)
            if _close(got, want, dtype):
                fb.ok(f"{label}: correct")
                continue
            if not np.all(np.isfinite(got)):
                fb.fail(f"{label}: the output holds NaN or inf: subtract the running maximum "
                        "before exp2 (P_ij = exp2(S_ij - m_new[:, None])), and divide nothing "
                        "inside the loop")
                continue
            match = next((hint for variant, hint in hints.items()
                          if _close(got, _loop_model(q, k, v, causal, blocks, variant), dtype)),
                         None)
            fb.fail(f"{label}: max error {_error(got, want):.3g}"
                    + (f": {match}" if match else "; compare with flash2_forward's inner loop"))


@checker("causal tile skipping")
def check_key_end(fb: Feedback, key_end: Callable[..., Any]) -> None:
    """Check ``key_end(i, B_r, N_K, CAUSAL)``, where the loop over key blocks stops for the query
    block starting at row ``i``: the output must stay exact, and each program may visit no more
    key tiles than it needs."""
    why = _gpu_unavailable()
    if why:
        fb.fail(f"this exercise runs a Triton kernel, which cannot run here: {why}")
        return
    from flashlib.gpu.grid import tiles_per_program

    cases = [
        (70, 70, 16, True, "float32", (16, 16)),
        (50, 50, 16, True, "float32", (32, 16)),
        (40, 70, 16, True, "float32", (16, 32)),
        (70, 40, 16, True, "float32", (32, 16)),
        (50, 50, 16, False, "float32", (16, 16)),
    ]
    for seed, (n_q, n_k, d, causal, dtype, blocks) in enumerate(cases):
        label = _label(n_q, n_k, d, causal, dtype, blocks)
        with fb.case(label, "(key_end must be a @triton.jit function; use tl.minimum)"):
            q, k, v = _inputs(n_q, n_k, d, dtype, seed)
            got, visits = _run(q, k, v, causal, blocks, key_end_fn=key_end)
            need = np.array(tiles_per_program(n_q, n_k, *blocks, causal))
            worst = int(np.argmax(np.abs(visits[0] - need)))
            if not _close(got, _reference(q, k, v, causal), dtype):
                fb.fail(f"{label}: wrong output: program {worst} (rows {worst * blocks[0]}.."
                        f"{min(n_q, (worst + 1) * blocks[0]) - 1}) visited {visits[0, worst]} "
                        f"key tiles but needs {need[worst]}"
                        + (": without a mask every row sees every key, return N_K"
                           if not causal else ": its last row sees keys up to itself, so "
                           "stop at i + B_r (not before), and not past N_K"))
            elif (visits[0] > need).any():
                fb.fail(f"{label}: correct, but program {worst} visits {visits[0, worst]} key "
                        f"tiles where {need[worst]} suffice: "
                        + ("stop at min(N_K, i + B_r): no key after the block's last row is "
                           "visible" if causal else "there are no keys past N_K"))
            else:
                fb.ok(f"{label}: correct, {int(visits[0].sum())} key tiles visited of "
                      f"{len(need) * -(-n_k // blocks[1])}")


@checker("the boundary mask")
def check_visible_keys(fb: Feedback, visible: Callable[..., Any]) -> None:
    """Check ``visible(rows, cols, N_K, CAUSAL)``, the (B_r, B_c) mask of the scores that are
    real keys the row may see, on n that are multiples of the tile and on ragged ones."""
    why = _gpu_unavailable()
    if why:
        fb.fail(f"this exercise runs a Triton kernel, which cannot run here: {why}")
        return
    cases = [
        (64, 64, 16, False, "float32", (16, 16)),
        (45, 45, 16, True, "float32", (16, 16)),
        (45, 45, 16, False, "float32", (16, 16)),
        (30, 70, 16, False, "float32", (16, 32)),
        (60, 35, 16, True, "float32", (32, 16)),
    ]
    exact_on_multiple, phantom = False, False
    for seed, (n_q, n_k, d, causal, dtype, blocks) in enumerate(cases):
        label = _label(n_q, n_k, d, causal, dtype, blocks)
        with fb.case(label):
            q, k, v = _inputs(n_q, n_k, d, dtype, seed)
            got, _ = _run(q, k, v, causal, blocks, visible_fn=visible)
            want = _reference(q, k, v, causal)
            if _close(got, want, dtype):
                fb.ok(f"{label}: correct")
                exact_on_multiple |= n_k % blocks[1] == 0
            elif _close(got, _mask_model(q, k, v, causal, blocks, "phantom"), dtype):
                phantom = True
                fb.fail(f"{label}: keys past N_K = {n_k} (the rest of the last tile, loaded as "
                        "zeros) were counted as keys with score 0: require cols < N_K")
            elif causal and _close(got, _mask_model(q, k, v, causal, blocks, "no_causal"),
                                   dtype):
                fb.fail(f"{label}: the causal mask is missing: row i sees keys j <= i only")
            elif causal and not np.all(np.isfinite(got[:, 0])):
                fb.fail(f"{label}: row 0 sees no key: row i must see key j = i itself (j <= i,"
                        " not j < i)")
            else:
                fb.fail(f"{label}: max error {_error(got, want):.3g}")
    if exact_on_multiple and phantom:
        fb.fail("right when n_k is a multiple of B_c, wrong otherwise: the last tile runs past "
                "the keys, and only the mask knows")


def _mask_model(q, k, v, causal: bool, blocks: tuple[int, int], mistake: str) -> np.ndarray:
    """What the kernel computes with a mistaken ``visible``: ``"phantom"`` (no ``cols < N_K``:
    the rest of the last tile loads as zero keys and values, score 0, and counts) or
    ``"no_causal"`` (no causal mask: each row sees every key of the tiles its block visits)."""
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    B_r, B_c = blocks
    pad = -n_k % B_c
    k0, v0 = (np.concatenate([np.asarray(x, np.float64),
                              np.zeros((x.shape[0], pad, x.shape[-1]))], axis=-2) for x in (k, v))
    out = np.empty(q.shape[:-1] + (v.shape[-1],))
    for i in range(0, n_q, B_r):
        rows = np.arange(i, min(i + B_r, n_q))
        end = -(-(min(n_k, i + B_r) if causal else n_k) // B_c) * B_c  # the tiles visited
        cols = np.arange(end)
        seen = np.ones((len(rows), end), bool)
        if mistake != "phantom":
            seen &= cols[None, :] < n_k
        if causal and mistake != "no_causal":
            seen &= cols[None, :] <= rows[:, None]
        s = np.asarray(q[:, rows], np.float64) @ k0[:, :end].swapaxes(-1, -2) / math.sqrt(d)
        s = np.where(seen, s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out[:, rows] = (p / p.sum(axis=-1, keepdims=True)) @ v0[:, :end]
    return out
