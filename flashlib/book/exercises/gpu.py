"""Checkers for the exercises of the GPU chapter: pieces of the Triton forward kernel, then whole
kernels.

check_online_softmax_step  10.1 ``online_softmax_step(S_ij, V_j, m_i, l_i, acc, PRECISION)``:
                           the body of the loop over key tiles
check_key_end              10.2 ``key_end(i, B_r, N_K, CAUSAL)``: causal tile skipping
check_visible_keys         10.3 ``visible_keys(rows, cols, N_K, CAUSAL)``: the tile's mask
check_softmax_kernel       10.4 ``softmax_kernel(X, Y, stride_x, stride_y, n_cols, BLOCK)``:
                           a row-wise softmax, one program per row
check_attention_kernel     10.5 ``attention_kernel(Q, K, V, O, stride_q, stride_k, stride_v,
                           stride_o, N_Q, N_K, qk_scale, B_r, B_c, D)`` and its launch grid
                           ``grid(N_Q, B_r)``: a forward kernel from its signature
check_delta_kernel         10.6 ``delta_kernel(O, dO, Delta, stride, N_Q, B_r, D)``: the
                           backward's preprocessing kernel, D = rowsum(dO * O)
check_dkdv_kernel          10.7 ``dkdv_kernel(Q, K, V, dO, L, Delta, dK, dV, stride, N_Q, N_K,
                           qk_scale, scale, B_r, B_c, D)``: a program per key block
check_dq_kernel            10.8 ``dq_kernel(Q, K, V, dO, L, Delta, dQ, stride, ...)``: a program
                           per query block
check_stage_bounds         10.9 ``stage_bounds(i, B_r, B_c, N_K)``: where the two-stage causal
                           kernel's unmasked and masked stages split the keys
triton_stand_ins           stand-ins for ``triton`` and ``triton.language`` where triton cannot
                           run, so that the exercise cells still define their functions

A piece (10.1-10.3, 10.9) is checked twice: alone, in a four-line probe kernel that calls it
on chosen inputs (:mod:`flashlib.gpu.exercise_kernels`), which names the mistake; and inside
the library's own kernel (:func:`flashlib.gpu.kernels.kernel_with`: the forward kernel, or for
10.9 the two-stage causal kernel of :mod:`flashlib.gpu.staged_kernels`), against a float64
reference (or torch's SDPA) on ragged shapes.  A whole kernel (10.4-10.8; the backward's
against torch autograd) gets its arrays as views with padded rows inside NaN-filled buffers
(:func:`flashlib.gpu.watch.guarded`), so that a wrong stride or a missing mask shows; in
Triton's interpreter every load and store is watched
(:class:`flashlib.gpu.watch.MemoryWatch`) and an access outside the arrays is named in the
arrays' own indices.  Without a GPU everything runs in the interpreter (seconds); compiled on
a GPU, the cases that need tiles narrower than 16 are left out (``tl.dot`` needs 16).

Without torch or triton (or with triton imported before flashlib.gpu) a checker says so in
one line instead of running; it never raises because of the learner's code.

Over 500 lines (about 1,300): one checker per exercise, whose cases and diagnoses are code;
the mistakes each must catch are data, in mistakes/gpu.py.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlib.book.exercises import Feedback, LearnerError, NotAttempted, checker
from flashlib.book.exercises.grader_adapter import learner_side
from flashlib.core.constants import LOG2E

__all__ = ["TOLERANCE", "check_online_softmax_step", "check_key_end", "check_visible_keys",
           "check_softmax_kernel", "check_attention_kernel", "check_delta_kernel",
           "check_dkdv_kernel", "check_dq_kernel", "check_stage_bounds", "triton_stand_ins"]

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


def _cannot_run(fb: Feedback) -> bool:
    why = _gpu_unavailable()
    if why:
        fb.fail(f"this exercise runs a Triton kernel, which cannot run here: {why}")
    return bool(why)


def _interpreted() -> bool:
    from flashlib.gpu.kernels import interpreted

    return interpreted()


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


# ---- running the learner's code -------------------------------------------------------------

def _root(err: BaseException) -> BaseException:
    """The exception the learner's code raised, under Triton's InterpreterError wrappers."""
    while type(err).__name__ == "InterpreterError" and err.__cause__ is not None:
        err = err.__cause__
    return err


#: Triton's messages for common slips, in words.
_TRITON_HINTS = (
    ("Both operands must be same dtype", "tl.dot needs two blocks of one dtype: cast P_ij to "
     "V_j's dtype first, P_ij.to(V_j.dtype)"),
    ("arange's arguments must be of type tl.constexpr", "tl.arange(0, BLOCK) needs a "
     "constexpr size: declare the argument as BLOCK: tl.constexpr"),
    ("arange's range must be a power of 2", "tl.arange(0, n) needs a power of two: use the "
     "constexpr block size and mask the rest"),
    ("First input shape", "the inner sizes of tl.dot(a, b) differ: is a tl.trans missing "
     "(S_ij = tl.dot(Q_i, tl.trans(K_j)))?"),
    ("must have equal reduction dimensions", "the inner sizes of tl.dot(a, b) differ: is a "
     "tl.trans missing (S_ij = tl.dot(Q_i, tl.trans(K_j)))?"),
)


def _launching(run: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``run(*args, **kwargs)``, a launch of the learner's code: not attempted -> NotAttempted;
    any failure -> LearnerError saying what the learner's code raised, in words where Triton's
    are obscure."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NaN and inf are reported from the result
            return run(*args, **kwargs)
    except (NotAttempted, LearnerError):
        raise
    except Exception as err:  # any failure inside the kernel comes from the learner's code
        root = _root(err)
        text = f"{root}"
        if isinstance(root, NotImplementedError) or "NotImplementedError" in str(err):
            raise NotAttempted from err
        hint = next((words for phrase, words in _TRITON_HINTS if phrase in str(err)), None)
        lines = text.strip().splitlines()
        said = f"your function raised {type(root).__name__}: {lines[-1] if lines else ''}"[:300]
        raise LearnerError(said + (f" ({hint})" if hint else "")) from err


@learner_side
def _probe(name: str, *args: Any) -> Any:
    """The probe kernel ``name`` of :mod:`flashlib.gpu.exercise_kernels` run on the learner's
    piece (among ``args``), through :func:`_launching`.  In the grader it runs where the
    learner's function is (the kernel needs the function itself)."""
    from flashlib.gpu import exercise_kernels

    return _launching(getattr(exercise_kernels, name), *args)


def _inputs(n_q: int, n_k: int, d: int, dtype: str, seed: int, logit_scale: float = 1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, n_q, d)) * logit_scale
    k, v = rng.standard_normal((1, n_k, d)), rng.standard_normal((1, n_k, d))
    return tuple(x.astype(dtype) for x in (q, k, v))


@learner_side
def _run_forward(q, k, v, causal: bool, blocks: tuple[int, int], **helpers) -> np.ndarray:
    """The library's forward kernel with the learner's helpers, on numpy inputs (1, n, D).  In
    the grader it runs where the learner's functions are."""
    import torch

    from flashlib.gpu import require_kernels
    from flashlib.gpu import triton_attention as ta

    device = require_kernels().device
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in (q, k, v))
    o, _ = _launching(ta.forward, tq, tk, tv, causal=causal, scale=1 / math.sqrt(q.shape[-1]),
                      blocks=blocks, helpers=helpers)
    return o.cpu().numpy()


def _visible(n_q: int, n_k: int, causal: bool) -> np.ndarray:
    rows, cols = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    return (cols <= rows) if causal else np.ones((n_q, n_k), bool)


def _reference(q, k, v, causal: bool = False, scale: float | None = None) -> np.ndarray:
    """float64 attention, scale 1/sqrt(d) by default, top-left causal mask."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.swapaxes(-1, -2) * scale
    s = np.where(_visible(q.shape[-2], k.shape[-2], causal), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def _loop_model(q, k, v, causal: bool, blocks: tuple[int, int], variant: str) -> np.ndarray:
    """The kernel's tile loop in float64 with one typical mistake (``variant``): what a learner's
    code that makes it returns, to recognise it.  "phantom": the keys past n_k in the last
    tile count, with score 0 and value 0; "no_scale": scores not multiplied by the scale;
    "no_division": acc returned without the final division by l."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    B_r, B_c = blocks
    if variant == "phantom":
        pad = -n_k % B_c
        k, v = (np.concatenate([x, np.zeros((x.shape[0], pad, d))], axis=-2) for x in (k, v))
    exp = np.exp if variant == "exp_not_exp2" else np.exp2
    scale = 1.0 if variant == "no_scale" else LOG2E / math.sqrt(d)
    seen = _visible(n_q, k.shape[-2], causal)
    if variant != "phantom":
        seen = seen & (np.arange(k.shape[-2]) < n_k)
    if variant == "no_trans":  # tl.dot(Q_i, K_j): each (B_c, d) tile taken as (d, B_c)
        if d != B_c or n_k % B_c:
            return np.full(q.shape[:-1] + v.shape[-1:], np.nan)
        scores = np.concatenate([q @ k[:, j: j + B_c] for j in range(0, n_k, B_c)], axis=-1)
    else:
        scores = q @ k.swapaxes(-1, -2)
    s_all = np.where(seen, scores * scale, -np.inf)
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
        out[:, rows] = acc if variant == "no_division" else acc / l[..., None]
    return out


def _error(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)))


def _unwritten_row(out: np.ndarray) -> int | None:
    """The first row of ``out`` (filled with NaN before the launch) that no program stored
    into, or None."""
    never = np.isnan(out).all(axis=1)
    return int(np.argmax(never)) if never.any() else None


def _close(got, want, dtype: str = "float32") -> bool:
    scale = max(1.0, float(np.max(np.abs(want))))
    return bool(np.all(np.isfinite(got))) and _error(got, want) <= TOLERANCE[dtype] * scale


def _fail(fb: Feedback, said: set[str], label: str, problem: str) -> None:
    """fb.fail("label: problem"), or "label: the same mistake" when ``problem`` was said."""
    fb.fail(f"{label}: {problem}" if problem not in said else f"{label}: the same mistake")
    said.add(problem)


def _label(n_q, n_k, d, causal, dtype, blocks) -> str:
    return (f"n_q={n_q}, n_k={n_k}, d={d}{', causal' if causal else ''}, {dtype}, "
            f"B_r x B_c = {blocks[0]} x {blocks[1]}")


# ---- 10.1 the inner loop -------------------------------------------------------------------

_STEP_HINTS = {
    "old_m": "you returned the old m_i: return m_new, the new running maximum (the next tile "
             "rescales l_i and acc by exp2(m_i - m_new) from it)",
    "tile_max_only": "m_new forgot the earlier tiles: m_new = tl.maximum(m_i, tl.max(S_ij, 1))",
    "max_axis0": "tl.max(S_ij, 0) is each key's maximum over the rows: a row's maximum is "
                 "tl.max(S_ij, 1)",
    "exp": "the scores are in base 2 (the scale was multiplied by log2(e) once, qk_scale): use "
           "tl.exp2, not tl.exp",
    "exp_in_P": "P_ij uses tl.exp: the scores are in base 2, so P_ij = tl.exp2(S_ij - "
                "m_new[:, None]), like alpha",
    "exp_in_alpha": "alpha uses tl.exp: the scores are in base 2, so alpha = tl.exp2(m_i - "
                    "m_new), like P_ij",
    "no_l_rescale": "l_i was not rescaled when the maximum grew: l_i = alpha * l_i + "
                    "tl.sum(P_ij, 1), with alpha = tl.exp2(m_i - m_new)",
    "no_acc_rescale": "acc was not rescaled when the maximum grew: acc = alpha[:, None] * acc "
                      "+ tl.dot(P_ij, V_j), with alpha = tl.exp2(m_i - m_new)",
    "alpha_inverted": "alpha is tl.exp2(m_i - m_new), at most 1 (the old terms shrink), not "
                      "tl.exp2(m_new - m_i)",
    "p_old_m": "P_ij must subtract the new maximum: P_ij = tl.exp2(S_ij - m_new[:, None])",
    "sum_axis0": "tl.sum(P_ij, 0) sums each key over the rows: a row's sum is tl.sum(P_ij, 1)",
    "normalised": "keep acc unnormalised: the kernel divides by l_i once, after the loop",
}


def _step_models(S, V, m, l, acc) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The reference step ("right") and the step with each typical mistake, in float64."""
    S, V, m, l, acc = (np.asarray(x, np.float64) for x in (S, V, m, l, acc))
    out = {}
    with np.errstate(all="ignore"):
        for name in ("right", "tile_max_only", "max_axis0", "exp", "exp_in_P", "exp_in_alpha",
                     "no_l_rescale",
                     "no_acc_rescale", "alpha_inverted", "p_old_m", "sum_axis0", "normalised",
                     "old_m"):
            exp = np.exp if name in ("exp", "exp_in_P") else np.exp2
            exp_alpha = np.exp if name in ("exp", "exp_in_alpha") else np.exp2
            m_new = (S.max(axis=1) if name == "tile_max_only" else
                     np.maximum(m, S.max(axis=0)) if name == "max_axis0" else
                     np.maximum(m, S.max(axis=1)))
            P = exp(S - (m if name == "p_old_m" else m_new)[:, None])
            alpha = exp_alpha(m_new - m) if name == "alpha_inverted" else exp_alpha(m - m_new)
            l_new = (l if name == "no_l_rescale" else alpha * l) + (
                P.sum(axis=0) if name == "sum_axis0" else P.sum(axis=1))
            acc_new = (acc if name == "no_acc_rescale" else alpha[:, None] * acc) + P @ V
            if name == "normalised":
                acc_new = acc_new / l_new[:, None]
            out[name] = (m if name == "old_m" else m_new, l_new, acc_new)
    return out


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal up to float32 rounding, infinities and NaN in the same places."""
    want = np.asarray(want, np.float64)
    got = np.asarray(got, np.float64)
    if got.shape != want.shape:
        return False
    finite = np.isfinite(want)
    special = (np.isnan(want) & np.isnan(got)) | (np.isinf(want) & (got == want))
    scale = max(1.0, float(np.max(np.abs(np.where(finite, want, 0)))))
    with np.errstate(all="ignore"):
        close = finite & (np.abs(got - want) <= 2e-5 * scale)
    return bool(np.all(special | close))


def _step_states(seed: int = 0) -> list[tuple[str, tuple[np.ndarray, ...]]]:
    """Tiles and states for the probe: 16 x 16 tiles (compiled tl.dot needs 16), D = 16."""
    rng = np.random.default_rng(seed)
    B, D = 16, 16
    V = rng.standard_normal((B, D)).astype(np.float32)
    diagonal = np.where(np.arange(B)[None, :] <= np.arange(B)[:, None],
                        rng.standard_normal((B, B)) * 2, -np.inf).astype(np.float32)
    first = ("the first tile of a diagonal block (m_i = -inf, l_i = 0, acc = 0)",
             (diagonal, V, np.full(B, -np.inf, np.float32), np.zeros(B, np.float32),
              np.zeros((B, D), np.float32)))
    grows = rng.standard_normal((B, B)).astype(np.float32) + 3
    grows[: B // 2] -= 6  # half the rows keep their maximum, half find a larger one
    second = ("a later tile, some rows finding a larger maximum",
              (grows, V, np.full(B, 1.5, np.float32),
               rng.uniform(1, 4, B).astype(np.float32),
               rng.standard_normal((B, D)).astype(np.float32)))
    return [first, second]


@checker("the inner loop: one tile of the online softmax")
def check_online_softmax_step(fb: Feedback, step: Callable[..., Any]) -> None:
    """Check ``online_softmax_step(S_ij, V_j, m_i, l_i, acc, PRECISION) -> (m_i, l_i, acc)``:
    alone on a first and a later tile (scores in base 2, -inf where hidden), then as the body
    of the library kernel's loop on ragged shapes, causal, float16 and huge scores."""
    if _cannot_run(fb):
        return
    for name, (S, V, m, l, acc) in _step_states():
        with fb.case(name) as case:
            got = _probe("step_once", S, V, m, l, acc, step)
            models = _step_models(S, V, m, l, acc)
            if all(_same(g, w) for g, w in zip(got, models["right"], strict=True)):
                fb.ok(f"{name}: m_i, l_i and acc right")
                continue
            case.failed = True
            match = next((hint for variant, hint in _STEP_HINTS.items()
                          if all(_same(g, w) for g, w in zip(got, models[variant],
                                                             strict=True))), None)
            wrong = [what for what, g, w in zip(("m_i", "l_i", "acc"), got, models["right"],
                                                strict=True) if not _same(g, w)]
            fb.fail(f"{name}: {', '.join(wrong)} wrong"
                    + (f": {match}" if match else ": compare with the algorithm box's step 3"))
    if fb.problems:
        return
    cases = [  # n_q, n_k, d, causal, dtype, blocks, logit scale
        (32, 64, 16, False, "float32", (16, 16), 1.0),
        (45, 70, 32, False, "float32", (16, 32), 1.0),
        (50, 50, 16, True, "float32", (16, 16), 1.0),
        (40, 40, 32, False, "float16", (16, 16), 1.0),
        (20, 48, 16, False, "float32", (16, 16), 30.0),
    ]
    for seed, (n_q, n_k, d, causal, dtype, blocks, logit) in enumerate(cases):
        label = "in the kernel, " + _label(n_q, n_k, d, causal, dtype, blocks) + (
            f", scores up to about {logit * 4:.0f}" if logit > 1 else "")
        with fb.case(label):
            q, k, v = _inputs(n_q, n_k, d, dtype, seed, logit)
            got = _run_forward(q, k, v, causal, blocks, online_softmax_step=step)
            want = _reference(q, k, v, causal)
            if _close(got, want, dtype):
                fb.ok(f"{label}: correct")
            elif not np.all(np.isfinite(got)):
                fb.fail(f"{label}: the output holds NaN or inf: subtract the running maximum "
                        "before exp2 (P_ij = tl.exp2(S_ij - m_new[:, None])), and divide "
                        "nothing inside the loop")
            else:
                fb.fail(f"{label}: max error {_error(got, want):.3g}"
                        + (": cast P_ij to V_j's dtype for tl.dot, and keep l_i, acc in "
                           "float32" if dtype == "float16" else ""))


# ---- 10.2 causal tile skipping -----------------------------------------------------------

def _key_end_diagnosis(ends: list[int], want: list[int], n_k: int, B_r: int,
                       causal: bool) -> str | None:
    """What is wrong with the loop ends ``ends`` (one per program) against ``want``."""
    if ends == want:
        return None
    p = next(p for p, (e, w) in enumerate(zip(ends, want, strict=True)) if e != w)
    i, got = p * B_r, ends[p]
    said = f"key_end({i}, {B_r}, N_K={n_k}, CAUSAL={causal}) returned {got}, expected {want[p]}"
    if not causal:
        return f"{said}: without a mask every row sees every key, return N_K"
    if got == i + B_r - 1:
        return (f"{said}: one key short. range(0, end, B_c) stops before end, so end = "
                "i + B_r - 1 never visits key i + B_r - 1, which the block's last row sees "
                "(with tiles of one key, B_c = 1, that key is a tile of its own): return "
                "i + B_r, one past the block's last row")
    if got == i:
        return (f"{said}: rows i + 1 .. i + B_r - 1 see keys up to themselves, so stop at "
                "i + B_r (not before)")
    if got > n_k:
        return f"{said}: never past N_K (there are no keys there): tl.minimum(N_K, i + B_r)"
    if got == n_k:
        return (f"{said}: correct, but the tiles after the block's last row hold no key any "
                "of its rows sees: stop at tl.minimum(N_K, i + B_r)")
    return said


@checker("causal tile skipping")
def check_key_end(fb: Feedback, key_end: Callable[..., Any]) -> None:
    """Check ``key_end(i, B_r, N_K, CAUSAL)``, where the loop over key tiles stops (exclusive)
    for the query block starting at row ``i``: exactly the tiles the block's rows see, for
    tiles of any width, one key included; and the kernel's output stays exact."""
    if _cannot_run(fb):
        return
    from flashlib.gpu.grid import tiles_per_program

    probes = [(70, 70, 16, True), (50, 50, 32, True), (40, 70, 16, True), (70, 40, 32, True),
              (50, 50, 16, False), (70, 40, 32, False)]
    said: set[str] = set()
    for n_q, n_k, B_r, causal in probes:
        name = f"where the loops stop: n_q={n_q}, n_k={n_k}, B_r={B_r}" + (
            ", causal" if causal else "")
        with fb.case(name):
            ends = _probe("key_ends", n_q, n_k, B_r, causal, key_end)
            want = [min(n_k, i + B_r) if causal else n_k for i in range(0, n_q, B_r)]
            problem = _key_end_diagnosis([int(e) for e in ends], want, n_k, B_r, causal)
            if problem:
                _fail(fb, said, name, problem)
            else:
                fb.ok(f"{name}: right for every program")
    cases = [
        (70, 70, 16, True, (16, 16)),
        (40, 70, 16, True, (16, 32)),
        (70, 40, 16, True, (32, 16)),
        (50, 50, 16, False, (16, 16)),
    ]
    if _interpreted():  # tiles narrower than 16: the interpreter's tl.dot takes them
        cases += [(20, 20, 16, True, (4, 1)), (20, 20, 16, True, (1, 16))]
    for seed, (n_q, n_k, d, causal, blocks) in enumerate(cases):
        label = "in the kernel, " + _label(n_q, n_k, d, causal, "float32", blocks)
        with fb.case(label, "(key_end must be a @triton.jit function; use tl.minimum)"):
            q, k, v = _inputs(n_q, n_k, d, "float32", seed)
            got = _run_forward(q, k, v, causal, blocks, key_end=key_end)
            if _close(got, _reference(q, k, v, causal)):
                need = tiles_per_program(n_q, n_k, *blocks, causal)
                fb.ok(f"{label}: correct, {sum(need)} key tiles visited of "
                      f"{len(need) * -(-n_k // blocks[1])}")
            elif not np.all(np.isfinite(got)):
                fb.fail(f"{label}: the output holds NaN: a row of a program saw no key at all "
                        "(l_i = 0), its loop stopped too early")
            else:
                fb.fail(f"{label}: wrong output, max error "
                        f"{_error(got, _reference(q, k, v, causal)):.3g}")


# ---- 10.3 the boundary mask ----------------------------------------------------------------

def _mask_diagnosis(got: np.ndarray, rows: np.ndarray, cols: np.ndarray, n_k: int,
                    causal: bool) -> str | None:
    """What is wrong with a tile's mask ``got`` (B_r, B_c), in words; None when right."""
    r, c = rows[:, None], cols[None, :]
    causal_part = (c <= r) if causal else np.ones_like(c <= r)
    want = (c < n_k) & causal_part
    if got.shape != want.shape:
        fix = (": it depends on the keys only; build a tile's mask from rows[:, None] and "
               "cols[None, :]" if got.ndim < 2 else "")
        return f"the mask has shape {got.shape}, expected {want.shape} (rows x keys){fix}"
    c = np.broadcast_to(c, want.shape)
    if np.array_equal(got, want):
        return None
    if np.array_equal(got, (c <= n_k) & causal_part):
        return (f"key N_K = {n_k} is counted: cols <= N_K lets in one key past the end (the "
                f"keys are 0 .. N_K - 1 = {n_k - 1}): use cols < N_K")
    if (got & (c >= n_k)).any() and np.array_equal(got & (c < n_k), want):
        return (f"keys past N_K = {n_k} (the rest of the last tile, loaded as zeros) count as "
                "keys with score 0: require cols < N_K")
    if causal and np.array_equal(got, want & (c != r)):
        return "a row must see its own key: j <= i, not j < i"
    if causal and np.array_equal(got, (c < n_k) & (c >= r)):
        return "the causal mask is reversed: row i sees keys j <= i (cols <= rows)"
    if causal and np.array_equal(got, c < n_k):
        return "the causal mask is missing: row i sees keys j <= i only"
    if not causal and np.array_equal(got, want & (c <= r)):
        return "without CAUSAL every row sees every key: apply the causal part only if CAUSAL"
    missing, extra = int((want & ~got).sum()), int((got & ~want).sum())
    return f"{missing} visible scores hidden, {extra} hidden ones visible"


@checker("the boundary mask")
def check_visible_keys(fb: Feedback, visible: Callable[..., Any]) -> None:
    """Check ``visible_keys(rows, cols, N_K, CAUSAL)``, the (B_r, B_c) mask of the scores that
    are real keys the row may see: alone on chosen tiles (the last, ragged one; a diagonal
    one; n_q > n_k), then in the kernel on n that are multiples of the tile and ragged ones."""
    if _cannot_run(fb):
        return
    tiles = [  # i, j, B_r, B_c, n_k, causal
        (0, 32, 16, 16, 45, False), (32, 32, 16, 16, 45, True), (16, 16, 16, 16, 64, True),
        (48, 32, 16, 16, 40, True), (0, 0, 16, 32, 20, False)]
    said: set[str] = set()
    for i, j, B_r, B_c, n_k, causal in tiles:
        name = (f"the tile of rows {i}..{i + B_r - 1}, keys {j}..{j + B_c - 1}, N_K={n_k}"
                + (", causal" if causal else ""))
        with fb.case(name):
            got = _probe("visible_block", i, j, B_r, B_c, n_k, causal, visible)
            problem = _mask_diagnosis(got, np.arange(i, i + B_r), np.arange(j, j + B_c), n_k,
                                      causal)
            if problem:
                _fail(fb, said, name, problem)
            else:
                fb.ok(f"{name}: right")
    cases = [
        (64, 64, 16, False, (16, 16)),
        (45, 45, 16, True, (16, 16)),
        (45, 45, 16, False, (16, 16)),
        (30, 70, 16, False, (16, 32)),
        (60, 35, 16, True, (32, 16)),
    ]
    exact_on_multiple, ragged_wrong = False, False
    for seed, (n_q, n_k, d, causal, blocks) in enumerate(cases):
        label = "in the kernel, " + _label(n_q, n_k, d, causal, "float32", blocks)
        with fb.case(label):
            q, k, v = _inputs(n_q, n_k, d, "float32", seed)
            got = _run_forward(q, k, v, causal, blocks, visible_keys=visible)
            want = _reference(q, k, v, causal)
            if _close(got, want):
                fb.ok(f"{label}: correct")
                exact_on_multiple |= n_k % blocks[1] == 0
            else:
                ragged_wrong |= n_k % blocks[1] != 0 and not causal
                fb.fail(f"{label}: " + (
                    "the output holds NaN: some row sees no key at all" if not np.all(
                        np.isfinite(got)) else f"max error {_error(got, want):.3g}"))
    if exact_on_multiple and ragged_wrong:
        fb.fail("right when n_k is a multiple of B_c, wrong otherwise: the last tile runs past "
                "the keys, and only the mask knows")


# ---- whole kernels: views in guarded buffers, every access watched ---------------------------

def _launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)``, or a LearnerError when ``kernel`` is no kernel (a
    plain function is called once, so that an unfinished one reads as not attempted and a
    crash is named)."""
    if not hasattr(kernel, "__getitem__"):
        fix = "not a Triton kernel: put @triton.jit on the line before its def"
        try:
            kernel(*args, *kwargs.values())  # the constexprs, in the order given
        except NotImplementedError:
            raise NotAttempted from None
        except Exception as err:
            raise LearnerError(f"your function raised {type(err).__name__}: {err}"[:200]
                               + f"; and it is {fix}") from err
        raise LearnerError(f"this is {fix}")
    kernel[grid](*args, **kwargs)


def _watched(arrays: dict[str, Any]):
    """A MemoryWatch over these (view, buffer) pairs in the interpreter, else a null context."""
    import contextlib

    if not _interpreted():
        return contextlib.nullcontext(None)
    from flashlib.gpu.watch import MemoryWatch

    return MemoryWatch(arrays)


class _Seen:
    """What a :class:`flashlib.gpu.watch.MemoryWatch` saw, as plain data (it crosses from the
    learner's side in the grader): the accesses outside the arrays, and the rows of each array
    each program loaded or stored."""

    def __init__(self, outside: list, rows: dict):
        from flashlib.gpu.watch import Access

        self.outside = [Access(tuple(p), kind, array, None if index is None else tuple(index))
                        for p, kind, array, index in outside]
        self._rows = rows

    def rows(self, kind: str, array: str, program: tuple[int, int, int]) -> list[int]:
        return list(self._rows.get(f"{kind} {array} {program[0]}", []))


def _guard(x: np.ndarray, rows: int, cols: int, device: str) -> tuple[Any, Any]:
    """(view, buffer): a matrix as :func:`flashlib.gpu.watch.guarded` makes it, a vector as
    the first n entries of a NaN-filled buffer ``rows`` longer."""
    import torch

    from flashlib.gpu.watch import guarded

    if np.ndim(x) != 1:
        return guarded(x, rows=rows, cols=cols, device=device)
    x = np.ascontiguousarray(x)
    buffer = torch.full((len(x) + rows,), float("nan"), dtype=torch.from_numpy(x[:0]).dtype,
                        device=device)
    view = buffer[: len(x)]
    view.copy_(torch.from_numpy(x))
    return view, buffer


def _touched_rows(watch: Any, kind: str, name: str, program: tuple) -> list[int]:
    """The rows of a matrix (entries of a vector) ``program`` loaded or stored."""
    return sorted({ix[-2] if len(ix) > 1 else ix[0]
                   for ix in watch.touched(kind, name, program)})


@learner_side
def _watched_launch(kernel: Any, grid: Any, arrays: list, scalars: tuple, constexprs: dict,
                    one_stride: bool = False) -> tuple[list, Any]:
    """Launch the learner's ``kernel`` on ``grid`` with ``arrays`` ((name, numpy array, padding
    rows, padding columns), each a view with padded rows inside a NaN-filled buffer,
    :func:`flashlib.gpu.watch.guarded`), then their row strides, ``scalars`` and
    ``constexprs``, every access watched in the interpreter.  A 1-D array (a vector) is passed
    without a stride; ``one_stride``: the matrices share one row stride, passed once.
    Returns (the arrays as they are after the launch, what the watch saw or None when
    compiled).  In the grader it runs where the learner's kernel is."""
    from flashlib.gpu import require_kernels

    device = require_kernels().device
    views = {name: _guard(x, rows, cols, device) for name, x, rows, cols in arrays}
    strides = [view.stride(0) for view, _ in views.values() if view.dim() == 2]
    if one_stride:
        assert len(set(strides)) == 1, strides  # the checker's arrays: one width, one padding
        strides = strides[:1]
    args = [view for view, _ in views.values()] + strides
    with _watched(views) as watch:
        _launching(_launch, kernel, tuple(grid), *args, *scalars, **constexprs)
    after = [view.cpu().numpy() for view, _ in views.values()]
    if watch is None:
        return after, None
    programs = watch.programs()
    rows = {f"{kind} {name} {p[0]}": _touched_rows(watch, kind, name, p)
            for kind in ("load", "store") for name in views for p in programs}
    outside = [(list(a.program), a.kind, a.array, None if a.index is None else list(a.index))
               for a in watch.outside[:20]]
    return after, (outside, rows)


def _seen(result: Any) -> _Seen | None:
    return None if result is None else _Seen(*result)


def _outside_problem(watch: Any, shapes: dict[str, tuple[int, ...]], masks: dict[str, str],
                     own_row_mask: bool = False, stride: str | None = None) -> str | None:
    """The first access outside the arrays, in words.  ``masks``: per array, the mask that
    keeps its accesses inside.  ``own_row_mask``: a row-wise kernel (program r, row r), where
    columns past the row's end in program r's own row mean a missing column mask.
    ``stride``: the name of the one row stride all matrices share (else one per array)."""
    if watch is None or not watch.outside:
        return None
    bad = watch.outside[0]
    p = bad.program[0]
    who = f"the program with program_id {p}"
    verb = "read" if bad.kind == "load" else "wrote"
    fix = "mask the load" if bad.kind == "load" else "mask the store"
    if bad.array is None:
        return (f"{who} {verb} memory outside every array it was given: check the pointer "
                "arithmetic (base + row * stride + column)")
    if len(shapes[bad.array]) == 1:
        n, r = shapes[bad.array][0], bad.index[0]
        return (f"{who} {verb} {bad.array}[{r}], but {bad.array} has entries 0 .. {n - 1}: "
                f"{fix} ({masks[bad.array]})")
    n, width = shapes[bad.array]
    r, c = bad.index[-2], bad.index[-1]
    where = f"{bad.array}[{r}, {c}]"
    if own_row_mask and r == p and c >= width:
        return (f"{who} {verb} {where}, past the end of its row of {width}: {fix} "
                f"({masks[bad.array]})")
    if 0 <= r < n and c >= width or own_row_mask and r != p:
        stride = stride or f"stride_{bad.array.lower()}"
        return (f"{who} {verb} {where}: the rows of {bad.array} are {stride} elements apart, "
                f"not {width} (the checker passes arrays whose rows are padded): row r "
                f"starts at {bad.array} + r * {stride}")
    if r >= n or r < 0:
        return f"{who} {verb} {where}, but {bad.array} has rows 0 .. {n - 1}: {fix} " \
               f"({masks[bad.array]})"
    return f"{who} {verb} {where}, outside the array"


def _program_rows(watch: Any, kind: str, array: str, programs: int) -> dict[int, list[int]]:
    return {p: watch.rows(kind, array, (p, 0, 0)) for p in range(programs)}


# ---- 10.4 a row-wise softmax kernel ------------------------------------------------------

def _softmax_reference(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _softmax_padded_with_zeros(x: np.ndarray, block: int) -> np.ndarray:
    """What a kernel computes when the padding of a row loads as 0 (``other=0.0``, or no
    ``other``) and is not masked out: softmax over the row and block - n zeros."""
    x = np.asarray(x, np.float64)
    padded = np.concatenate([x, np.zeros((x.shape[0], block - x.shape[1]))], axis=1)
    return _softmax_reference(padded)[:, : x.shape[1]]


@checker("a row-wise softmax kernel")
def check_softmax_kernel(fb: Feedback, kernel: Any) -> None:
    """Check ``softmax_kernel(X, Y, stride_x, stride_y, n_cols, BLOCK)`` launched on the grid
    ``(n_rows,)``: program r writes row r of Y = softmax(X) (rows of X and Y ``stride_x`` and
    ``stride_y`` elements apart, BLOCK the power of two >= n_cols), on widths that are and are
    not powers of two, one column, and scores in the thousands."""
    if _cannot_run(fb):
        return
    import triton

    cases = [  # rows, columns, scale of the values
        (4, 16, 1.0), (5, 10, 1.0), (3, 37, 1.0), (3, 1, 1.0), (4, 20, 1000.0)]
    said: set[str] = set()
    for seed, (n_rows, n_cols, scale) in enumerate(cases):
        block = triton.next_power_of_2(n_cols)
        name = f"{n_rows} rows of {n_cols}" + (f", values up to about {3 * scale:.0f}"
                                               if scale > 1 else "") + f" (BLOCK={block})"
        with fb.case(name):
            x_np = (np.random.default_rng(seed).standard_normal((n_rows, n_cols)) * scale
                    ).astype(np.float32)
            (_, y), seen = _watched_launch(
                kernel, (n_rows,), [("X", x_np, 2, block + 3),
                                    ("Y", np.full((n_rows, n_cols), np.nan, np.float32), 2,
                                     block + 5)],
                (n_cols,), {"BLOCK": block})
            watch = _seen(seen)
            problem = _outside_problem(
                watch, {"X": (n_rows, n_cols), "Y": (n_rows, n_cols)},
                {"X": "mask=cols < n_cols", "Y": "mask=cols < n_cols"}, own_row_mask=True)
            if problem is None and watch is not None:
                problem = _softmax_rows_problem(watch, n_rows)
            got = y
            want = _softmax_reference(x_np)
            if problem:
                _fail(fb, said, name, problem)
            elif (r := _unwritten_row(got)) is not None:
                fb.fail(f"{name}: row {r} of Y was never written: program r writes row r "
                        "(tl.store(Y + r * stride_y + cols, ...))")
            elif _close(got, want):
                fb.ok(f"{name}: correct")
            elif block > n_cols and _close(got, _softmax_padded_with_zeros(x_np, block)):
                _fail(fb, said, name, f"the {block - n_cols} padding entries of a row counted, "
                      "each adding exp(0 - max) to the sum: load with other=-float('inf') (exp "
                      "of -inf is 0), not 0")
            elif not np.all(np.isfinite(got)):
                fb.fail(f"{name}: the output holds NaN or inf: subtract the row's maximum "
                        "before exponentiating (x - tl.max(x, 0))")
            elif not np.allclose(got.sum(axis=1), 1, atol=1e-4):
                fb.fail(f"{name}: row 0 sums to {got.sum(axis=1)[0]:.3g}, not 1: divide the "
                        "exponentials by their sum")
            else:
                fb.fail(f"{name}: max error {_error(got, want):.3g}")


def _softmax_rows_problem(watch: Any, n_rows: int) -> str | None:
    """Program r must read row r of X and write row r of Y, and nothing else."""
    for kind, array in (("load", "X"), ("store", "Y")):
        for p, rows in _program_rows(watch, kind, array, n_rows).items():
            if rows and rows != [p]:
                verb = "read" if kind == "load" else "wrote"
                hint = ("r = tl.program_id(0): each program its own row" if rows == [0]
                        else f"row r starts at {array} + r * stride_{array.lower()}")
                said = f"row {rows[0]}" if len(rows) == 1 else f"rows {rows[0]}..{rows[-1]}"
                return (f"the program with program_id {p} {verb} {said} of {array}, not row "
                        f"{p}: {hint}")
    return None


# ---- 10.5 a forward kernel from its signature --------------------------------------------

def _grid_problem(grid: Any, n_q: int, B_r: int) -> str | None:
    """What is wrong with the learner's launch grid for n_q rows in blocks of B_r."""
    if not isinstance(grid, tuple) or not grid or not all(
            isinstance(g, int) and not isinstance(g, bool) for g in grid):
        return f"grid(N_Q, B_r) must return a tuple of ints, such as (3,), got {grid!r}"
    need = -(-n_q // B_r)
    if len(grid) > 1 and any(g != 1 for g in grid[1:]):
        return (f"grid(N_Q={n_q}, B_r={B_r}) = {grid}: one axis is enough here (one program "
                "per query block)")
    if grid[0] == n_q // B_r and need != n_q // B_r:
        covered = (f"cover rows 0..{grid[0] * B_r - 1} only" if grid[0] else "cover no row")
        return (f"grid(N_Q={n_q}, B_r={B_r}) = {grid}: N_Q // B_r = {grid[0]} programs "
                f"{covered}; the last, partial block needs a program too: "
                f"triton.cdiv(N_Q, B_r) = {need}")
    if grid[0] == n_q and need != n_q:
        return (f"grid(N_Q={n_q}, B_r={B_r}) = {grid}: one program per row, but each program "
                f"takes a block of B_r rows: triton.cdiv(N_Q, B_r) = {need} programs")
    if grid[0] != need:
        return f"grid(N_Q={n_q}, B_r={B_r}) = {grid}, expected ({need},): one program per block"
    return None


_FORWARD_HINTS = {
    "phantom": "the keys past N_K (the rest of the last tile, loaded as zeros) counted as keys "
               "with score 0: set their scores to -inf, tl.where(cols[None, :] < N_K, S_ij, "
               "float('-inf'))",
    "exp_not_exp2": "qk_scale includes log2(e): the scores are in base 2, use tl.exp2",
    "no_scale": "multiply the scores by qk_scale (log2(e) / sqrt(D))",
    "no_trans": "S_ij = tl.dot(Q_i, tl.trans(K_j)): K_j is (B_c, D), its transpose (D, B_c)",
    "no_acc_rescale": "acc was not rescaled when the maximum grew: acc = alpha[:, None] * acc "
                      "+ tl.dot(P_ij, V_j), alpha = tl.exp2(m_i - m_new)",
    "no_l_rescale": "l_i was not rescaled when the maximum grew: l_i = alpha * l_i + "
                    "tl.sum(P_ij, 1)",
    "no_division": "divide acc by l_i once, after the loop, before the store",
}


def _one_program_per_block(N_Q: int, B_r: int) -> tuple[int]:
    """The launch grid of Exercise 10.5: one program per block of B_r query rows."""
    return (-(-N_Q // B_r),)


@checker("a FlashAttention forward kernel")
def check_attention_kernel(fb: Feedback, kernel: Any,
                           grid: Callable[[int, int], Any] | None = None) -> None:
    """Check ``attention_kernel(Q, K, V, O, stride_q, stride_k, stride_v, stride_o, N_Q, N_K,
    qk_scale, B_r, B_c, D)`` launched on ``grid(N_Q, B_r)``: O = softmax(Q K^T / sqrt(D)) V,
    one program per block of B_r query rows, for arrays whose rows are padded (rows further
    apart than D), ragged N_Q and N_K, N_Q = 1, and large scores; every access inside the
    arrays."""
    if _cannot_run(fb):
        return
    from flashlib.book.exercises import call_learner

    if grid is None:
        fb.fail("grid: pass your launch grid too, check_attention_kernel(attention_kernel, "
                "grid); the kernel is checked below on the grid (cdiv(N_Q, B_r),)")
        grid = _one_program_per_block

    cases = [  # n_q, n_k, D, blocks, logit scale
        (32, 32, 16, (16, 16), 1.0),
        (45, 70, 16, (16, 32), 1.0),
        (70, 45, 32, (32, 16), 1.0),
        (1, 20, 16, (16, 16), 1.0),
        (40, 48, 16, (16, 16), 30.0),
    ]
    said: set[str] = set()
    for seed, (n_q, n_k, D, blocks, logit) in enumerate(cases):
        B_r, B_c = blocks
        name = (f"N_Q={n_q}, N_K={n_k}, D={D}, B_r x B_c = {B_r} x {B_c}"
                + (", large scores" if logit > 1 else ""))
        with fb.case(name) as case:
            launch, warns = call_learner(grid, n_q, B_r)
            problem = _grid_problem(launch, n_q, B_r)
            if problem:
                _fail(fb, said, name, problem)
                continue
            q_np, k_np, v_np = (x[0] for x in _inputs(n_q, n_k, D, "float32", seed, logit))
            (*_, o), seen = _watched_launch(
                kernel, launch, [("Q", q_np, B_c, 8), ("K", k_np, B_c, 8), ("V", v_np, B_c, 8),
                                 ("O", np.full((n_q, D), np.nan, np.float32), B_r, 4)],
                (n_q, n_k, LOG2E / math.sqrt(D)), {"B_r": B_r, "B_c": B_c, "D": D})
            watch = _seen(seen)
            shapes = {"Q": (n_q, D), "K": (n_k, D), "V": (n_k, D), "O": (n_q, D)}
            problem = _outside_problem(watch, shapes, {
                "Q": "rows < N_Q", "K": "cols < N_K", "V": "cols < N_K", "O": "rows < N_Q"})
            if problem is None and watch is not None:
                problem = _forward_rows_problem(watch, launch[0], n_q, B_r)
            got = o
            want = _reference(q_np, k_np, v_np)
            if problem:
                _fail(fb, said, name, problem)
            elif (r := _unwritten_row(got)) is not None:
                fb.fail(f"{name}: row {r} of O was never written: program p stores rows "
                        "p * B_r .. p * B_r + B_r - 1 (tl.store with mask=rows < N_Q)")
            elif _close(got, want):
                fb.ok(f"{name}: correct")
            else:
                case.failed = True
                match = next((hint for variant, hint in _FORWARD_HINTS.items() if _close(
                    got, _loop_model(q_np[None], k_np[None], v_np[None], False, blocks,
                                     variant)[0])), None)
                if match is None and not np.all(np.isfinite(got)):
                    match = ("subtract the running maximum before tl.exp2, and start m_i at "
                             "-inf, l_i and acc at 0")
                if match is None and not _interpreted() and _error(got, want) < 1e-2 * max(
                        1.0, float(np.abs(want).max())):
                    match = ("on a GPU, tl.dot multiplies float32 blocks in TF32 unless told "
                             "otherwise: pass input_precision=\"ieee\"")
                if match:
                    _fail(fb, said, name, match)
                else:
                    fb.fail(f"{name}: max error {_error(got, want):.3g}")


def _forward_rows_problem(watch: Any, programs: int, n_q: int, B_r: int,
                          arrays: tuple = (("load", "Q"), ("store", "O")),
                          names: tuple[str, str] = ("rows", "B_r"),
                          unread_ok: bool = False) -> str | None:
    """Program p must load rows p * B_r .. of Q and store the same rows of O (``arrays``:
    other (kind, array) pairs, whose blocks are ``names``, e.g. ("cols", "B_c");
    ``unread_ok``: an array a program never loads is left to the values to diagnose)."""
    rows_name, block = names
    for kind, array in arrays:
        for p, rows in _program_rows(watch, kind, array, programs).items():
            want = list(range(p * B_r, min(n_q, (p + 1) * B_r)))
            if rows != want and not (unread_ok and kind == "load" and not rows):
                verb = "read" if kind == "load" else "wrote"
                said = (f"the program with program_id {p} {verb} rows "
                        f"{f'{rows[0]}..{rows[-1]}' if rows else 'none'} of {array}, expected "
                        f"{want[0]}..{want[-1]}")
                if rows and rows[0] == p and p > 0:
                    return f"{said}: a program's first row is program_id * {block}"
                return (f"{said}: {rows_name} = tl.program_id(0) * {block} + "
                        f"tl.arange(0, {block})")
    return None


# ---- 10.6-10.8 the backward's kernels ----------------------------------------------------

def _backward_inputs(n_q: int, n_k: int, D: int, seed: int) -> tuple[np.ndarray, ...]:
    """q (n_q, D), k, v (n_k, D), do (n_q, D), float32."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n, D)).astype(np.float32) for n in (n_q, n_k, n_k, n_q))


def _autograd(q, k, v, do) -> dict[str, np.ndarray]:
    """Attention's forward and gradients by torch autograd in float64, scale 1/sqrt(D): o, L
    (the logsumexp of each row's scores in base 2: m_i + log2(l_i) of the base-2 scores),
    Delta = rowsum(dO * O), and dQ, dK, dV of sum(do * o)."""
    import torch

    qq, kk, vv = (torch.from_numpy(np.asarray(x, np.float64)).requires_grad_()
                  for x in (q, k, v))
    s = qq @ kk.T / math.sqrt(q.shape[-1])
    o = torch.softmax(s, -1) @ vv
    dO = torch.from_numpy(np.asarray(do, np.float64))
    o.backward(dO)
    return {"o": o.detach().numpy(), "L": torch.logsumexp(s, -1).detach().numpy() * LOG2E,
            "Delta": (dO * o.detach()).sum(-1).numpy(),
            "dQ": qq.grad.numpy(), "dK": kk.grad.numpy(), "dV": vv.grad.numpy()}


def _backward_model(q, k, v, do, blocks: tuple[int, int], variant: str) -> dict[str, np.ndarray]:
    """dQ, dK, dV in float64, computed as the kernels compute them with one typical mistake
    (``variant``), to recognise it: "no_D" dS = P * dP; "scale_twice" the scale applied
    twice; "no_scale" never; "log2e" qk_scale in its place; "exp" P = exp(S - L) of base-2
    scores; "last_block" the loop's accumulator overwritten, not added to: only the last
    block's share."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ k.T * scale * LOG2E  # base 2
    m = s.max(axis=1, keepdims=True)
    L = m + np.log2(np.exp2(s - m).sum(axis=1, keepdims=True))
    p = np.exp(s - L) if variant == "exp" else np.exp2(s - L)
    o = np.exp2(s - L) @ v
    dp = do @ v.T
    ds = p * dp if variant == "no_D" else p * (dp - (do * o).sum(axis=1, keepdims=True))
    factor = {"scale_twice": scale * scale, "no_scale": 1.0, "log2e": scale * LOG2E}.get(
        variant, scale)
    B_r, B_c = blocks
    i = (q.shape[0] - 1) // B_r * B_r if variant == "last_block" else 0  # the last block
    j = (k.shape[0] - 1) // B_c * B_c if variant == "last_block" else 0
    return {"dQ": factor * ds[:, j:] @ k[j:], "dK": factor * ds[i:].T @ q[i:],
            "dV": p[i:].T @ do[i:]}


_BACKWARD_HINTS = {
    "no_D": "D_i is missing: dS_ij = P_ij * (dP_ij - D_i[:, None]), D_i = rowsum(dO_i * O_i) "
            "(the softmax's Jacobian has two terms)",
    "scale_twice": "the scale is applied twice: S = scale * Q K^T brings one factor scale "
                   "into dK and dQ; multiply by it once, at the store",
    "no_scale": "multiply by scale once, at the store: S = scale * Q K^T, so dK_j = scale * "
                "dS^T Q and dQ_i = scale * dS K",
    "log2e": "the factor is scale, not qk_scale: log2(e) belongs to the base-2 exponent only",
    "exp": "the scores and L are in base 2 (qk_scale includes log2(e)): P_ij = "
           "tl.exp2(S_ij - L_i[:, None])",
}


def _match_backward(got: dict[str, np.ndarray], q, k, v, do, blocks, last_block: str
                    ) -> str | None:
    """The hint of the first typical mistake whose model gives what the kernel returned."""
    hints = {**_BACKWARD_HINTS, "last_block": last_block}
    for variant, hint in hints.items():
        model = _backward_model(q, k, v, do, blocks, variant)
        if all(_close(g, model[name]) for name, g in got.items()):
            return hint
    return None


def _backward_case_name(n_q: int, n_k: int, D: int, blocks: tuple[int, int]) -> str:
    return f"N_Q={n_q}, N_K={n_k}, D={D}, B_r x B_c = {blocks[0]} x {blocks[1]}"


#: The backward kernels' cases: n_q, n_k, D, (B_r, B_c): square; ragged both ways; more
#: queries than keys; one query row; one key.
_BACKWARD_CASES = [(32, 32, 16, (16, 16)), (45, 70, 16, (16, 16)), (70, 45, 32, (32, 16)),
                   (1, 20, 16, (16, 16)), (40, 1, 16, (16, 16))]
_VECTOR_MASK = "mask=rows < N_Q"


def _delta_model(o, do, B_r: int, variant: str) -> np.ndarray:
    o, do = np.asarray(o, np.float64), np.asarray(do, np.float64)
    if variant == "dO_twice":
        return (do * do).sum(axis=1)
    if variant == "O_twice":
        return (o * o).sum(axis=1)
    if variant == "column_sum":  # tl.sum(x, 0) of each (B_r, D) block, stored as its rows
        out = np.full(len(o), np.nan)
        for i in range(0, len(o), B_r):
            sums = (do[i: i + B_r] * o[i: i + B_r]).sum(axis=0)
            n = min(B_r, len(o) - i, len(sums))
            out[i: i + n] = sums[:n]
        return out
    return (do * o).sum(axis=1)


_DELTA_HINTS = {
    "dO_twice": "D_i = rowsum(dO_i * O_i), but your kernel computed rowsum(dO_i * dO_i): it "
                "loads dO twice; load O_i from O",
    "O_twice": "D_i = rowsum(dO_i * O_i), but your kernel computed rowsum(O_i * O_i): it loads "
               "O twice; load dO_i from dO",
    "column_sum": "tl.sum(x, 0) sums each column over the block's rows: a row's sum is "
                  "tl.sum(dO_i * O_i, 1)",
}


def _backward_with_delta(q, k, v, o, L, do, Delta) -> tuple[np.ndarray, ...]:
    """dQ, dK, dV by the library's dK/dV and dQ kernels reading ``Delta`` (the values the
    learner's kernel stored: data, so this runs on the checker's side)."""
    import torch

    from flashlib.gpu import require_kernels
    from flashlib.gpu import staged_kernels as sk

    device = require_kernels().device
    t = [torch.from_numpy(np.ascontiguousarray(x, np.float32))[None].to(device)
         for x in (q, k, v, o, np.asarray(L) / LOG2E, do, Delta)]
    grads = sk.backward(*t[:6], causal=False, scale=1 / math.sqrt(q.shape[-1]), D_rows=t[6])
    return tuple(g[0].cpu().numpy() for g in grads)


@checker("the backward's preprocessing kernel (D)")
def check_delta_kernel(fb: Feedback, kernel: Any) -> None:
    """Check ``delta_kernel(O, dO, Delta, stride, N_Q, B_r, D)`` launched on the grid
    ``(cdiv(N_Q, B_r),)``: program p writes Delta[i] = sum(dO[i] * O[i]) for its block of
    B_r rows (O, dO: (N_Q, D) float32, rows ``stride`` elements apart; Delta: (N_Q,)
    float32), on ragged N_Q and one row; then the library's dK/dV and dQ kernels read it,
    against torch autograd."""
    if _cannot_run(fb):
        return
    cases = [(32, 16, 16), (45, 16, 16), (1, 32, 16), (70, 32, 32)]  # N_Q, D, B_r
    said: set[str] = set()
    for seed, (n_q, D, B_r) in enumerate(cases):
        name = f"N_Q={n_q}, D={D}, B_r={B_r}"
        with fb.case(name) as case:
            q, k, v, do = _backward_inputs(n_q, 20, D, seed)
            ref = _autograd(q, k, v, do)
            o = ref["o"].astype(np.float32)
            (*_, got), seen = _watched_launch(
                kernel, (-(-n_q // B_r),),
                [("O", o, B_r, 8), ("dO", do, B_r, 8),
                 ("Delta", np.full(n_q, np.nan, np.float32), B_r, 0)],
                (n_q,), {"B_r": B_r, "D": D}, one_stride=True)
            watch = _seen(seen)
            problem = _outside_problem(
                watch, {"O": (n_q, D), "dO": (n_q, D), "Delta": (n_q,)},
                {"O": "rows < N_Q", "dO": "rows < N_Q", "Delta": _VECTOR_MASK},
                stride="stride")
            if problem is None and watch is not None:
                problem = _forward_rows_problem(watch, -(-n_q // B_r), n_q, B_r,
                                                (("load", "O"), ("store", "Delta")),
                                                unread_ok=True)
            want = _delta_model(o, do, B_r, "right")
            if problem:
                _fail(fb, said, name, problem)
            elif np.isnan(got).any():
                r = int(np.argmax(np.isnan(got)))
                fb.fail(f"{name}: Delta[{r}] was never written: program p stores its B_r "
                        "entries, p * B_r .. p * B_r + B_r - 1 (mask=rows < N_Q)")
            elif _close(got, want):
                fb.ok(f"{name}: correct")
            else:
                case.failed = True
                match = next((hint for variant, hint in _DELTA_HINTS.items()
                              if _close(got, _delta_model(o, do, B_r, variant))), None)
                _fail(fb, said, name, match or f"max error {_error(got, want):.3g}")
    if fb.problems:
        return
    n_q, n_k, D = 45, 70, 16
    label = f"in the backward, N_Q={n_q}, N_K={n_k}, D={D}: dQ, dK, dV against torch autograd"
    with fb.case(label):
        q, k, v, do = _backward_inputs(n_q, n_k, D, 7)
        ref = _autograd(q, k, v, do)
        o = ref["o"].astype(np.float32)
        (*_, Delta), _ = _watched_launch(
            kernel, (-(-n_q // 16),), [("O", o, 16, 8), ("dO", do, 16, 8),
                                       ("Delta", np.full(n_q, np.nan, np.float32), 16, 0)],
            (n_q,), {"B_r": 16, "D": D}, one_stride=True)
        grads = _backward_with_delta(q, k, v, o, ref["L"], do, Delta)
        errors = [_error(g, ref[n]) for g, n in zip(grads, ("dQ", "dK", "dV"), strict=True)]
        if all(_close(g, ref[n]) for g, n in zip(grads, ("dQ", "dK", "dV"), strict=True)):
            fb.ok(f"{label}: equal, max error {max(errors):.2g}")
        else:
            fb.fail(f"{label}: max errors {', '.join(f'{e:.3g}' for e in errors)}")


def _backward_launch(kernel: Any, which: str, n_q: int, n_k: int, D: int,
                     blocks: tuple[int, int], seed: int):
    """Launch the learner's dK/dV (``which`` "dkdv") or dQ kernel on one case; returns (what
    it wrote {name: array}, what the watch saw, the inputs, torch autograd's results)."""
    B_r, B_c = blocks
    q, k, v, do = _backward_inputs(n_q, n_k, D, seed)
    ref = _autograd(q, k, v, do)
    nan = np.full((n_k if which == "dkdv" else n_q, D), np.nan, np.float32)
    outs = [("dK", nan, B_c, 8), ("dV", nan.copy(), B_c, 8)] if which == "dkdv" else [
        ("dQ", nan, B_r, 8)]
    programs = -(-(n_k if which == "dkdv" else n_q) // (B_c if which == "dkdv" else B_r))
    arrays = [("Q", q, B_r, 8), ("K", k, B_c, 8), ("V", v, B_c, 8), ("dO", do, B_r, 8),
              ("L", ref["L"].astype(np.float32), B_r, 0),
              ("Delta", ref["Delta"].astype(np.float32), B_r, 0), *outs]
    after, seen = _watched_launch(
        kernel, (programs,), arrays, (n_q, n_k, LOG2E / math.sqrt(D), 1 / math.sqrt(D)),
        {"B_r": B_r, "B_c": B_c, "D": D}, one_stride=True)
    written = {name: a for (name, *_), a in zip(arrays, after, strict=True)
               if name in ("dK", "dV", "dQ")}
    return written, _seen(seen), (q, k, v, do), ref, programs


def _check_backward_kernel(fb: Feedback, kernel: Any, which: str) -> None:
    """The body of :func:`check_dkdv_kernel` (``which`` "dkdv") and :func:`check_dq_kernel`."""
    if _cannot_run(fb):
        return
    said: set[str] = set()
    if which == "dkdv":
        last = ("dK_j and dV_j hold only the last query block's share: accumulate over the "
                "loop (dK_j += ..., dV_j += ...) and store once, after it")
        own = (("load", "K"), ("load", "V"), ("store", "dK"), ("store", "dV"))
        names = ("cols", "B_c")
    else:
        last = ("dQ_i holds only the last key block's share: it was overwritten, not added "
                "to; accumulate dQ_i += ... over the key blocks and store once, after the loop")
        own = (("load", "Q"), ("load", "dO"), ("store", "dQ"))
        names = ("rows", "B_r")
    for seed, (n_q, n_k, D, blocks) in enumerate(_BACKWARD_CASES):
        name = _backward_case_name(n_q, n_k, D, blocks)
        with fb.case(name) as case:
            got, watch, inputs, ref, programs = _backward_launch(kernel, which, n_q, n_k, D,
                                                                 blocks, seed)
            n = n_k if which == "dkdv" else n_q
            shapes = {"Q": (n_q, D), "K": (n_k, D), "V": (n_k, D), "dO": (n_q, D),
                      "L": (n_q,), "Delta": (n_q,), "dK": (n_k, D), "dV": (n_k, D),
                      "dQ": (n_q, D)}
            masks = {"Q": "rows < N_Q", "dO": "rows < N_Q", "L": _VECTOR_MASK,
                     "Delta": _VECTOR_MASK, "K": "cols < N_K", "V": "cols < N_K",
                     "dK": "cols < N_K", "dV": "cols < N_K", "dQ": "rows < N_Q"}
            problem = _outside_problem(watch, shapes, masks, stride="stride")
            if problem is None and watch is not None:
                problem = _forward_rows_problem(watch, programs, n,
                                                blocks[1] if which == "dkdv" else blocks[0],
                                                own, names, unread_ok=True)
            if problem:
                _fail(fb, said, name, problem)
                continue
            unwritten = next(((w, r) for w, a in got.items()
                              if (r := _unwritten_row(a)) is not None), None)
            if unwritten:
                w, r = unwritten
                fb.fail(f"{name}: row {r} of {w} was never written: program p stores its "
                        f"block of rows ({names[0]} = tl.program_id(0) * {names[1]} + ...)")
            elif all(_close(g, ref[w]) for w, g in got.items()):
                fb.ok(f"{name}: {' and '.join(got)} equal torch autograd's")
            else:
                case.failed = True
                match = _match_backward(got, *inputs, blocks, last)
                if match is None and not np.all([np.isfinite(g).all() for g in got.values()]):
                    match = "the output holds NaN or inf"
                wrong = [w for w, g in got.items() if not _close(g, ref[w])]
                errors = ", ".join(f"{w} {_error(got[w], ref[w]):.3g}" for w in wrong)
                _fail(fb, said, name, match or f"max error {errors}")


@checker("the backward's dK/dV kernel")
def check_dkdv_kernel(fb: Feedback, kernel: Any) -> None:
    """Check ``dkdv_kernel(Q, K, V, dO, L, Delta, dK, dV, stride, N_Q, N_K, qk_scale, scale,
    B_r, B_c, D)`` launched on the grid ``(cdiv(N_K, B_c),)``: program p writes its block of
    B_c rows of dK and dV, looping over the query blocks (Q, dO (N_Q, D), K, V, dK, dV
    (N_K, D) float32, rows ``stride`` elements apart; L, Delta (N_Q,): the logsumexp in base
    2 and rowsum(dO * O)), against torch autograd on ragged shapes, every access watched."""
    _check_backward_kernel(fb, kernel, "dkdv")


@checker("the backward's dQ kernel")
def check_dq_kernel(fb: Feedback, kernel: Any) -> None:
    """Check ``dq_kernel(Q, K, V, dO, L, Delta, dQ, stride, N_Q, N_K, qk_scale, scale, B_r,
    B_c, D)`` launched on the grid ``(cdiv(N_Q, B_r),)``: program p writes its block of B_r
    rows of dQ, looping over the key blocks, against torch autograd on ragged shapes, every
    access watched."""
    _check_backward_kernel(fb, kernel, "dq")


# ---- 10.9 the causal forward in two stages -----------------------------------------------

def _stage_diagnosis(bounds: list[tuple[int, int]], n_k: int, B_r: int, B_c: int) -> str | None:
    """What is wrong with each program's (split, end), in words; None when right."""
    whole = n_k // B_c * B_c
    for p, (split, end) in enumerate(bounds):
        i = p * B_r
        want = (min(i, whole), min(i + B_r, n_k))
        if (split, end) == want:
            continue
        said = (f"stage_bounds({i}, {B_r}, {B_c}, N_K={n_k}) returned ({split}, {end}), "
                f"expected {want}")
        if split > want[0] and split > i:
            return (f"{said}: the unmasked stage runs into the diagonal: keys {i} .. "
                    f"{min(i + B_r, n_k) - 1} are hidden from some rows of the block (row {i} "
                    f"sees only key {i} of them), so they need the mask: the unmasked stage "
                    "stops at i")
        if split > want[0]:
            return (f"{said}: the key block cut by N_K (keys {whole} .. {n_k - 1}) is in the "
                    "unmasked stage, where nothing stops at N_K: it belongs to the masked "
                    "stage, split = tl.minimum(i, N_K // B_c * B_c)")
        if end < want[1]:
            return (f"{said}: the masked stage stops at {end}, so the diagonal blocks (keys "
                    f"i .. i + B_r - 1 = {i} .. {i + B_r - 1}) are skipped, though row r sees "
                    "its keys up to r: end = tl.minimum(i + B_r, N_K)")
        if end > n_k:
            return (f"{said}: never past N_K (there are no keys there): end = "
                    "tl.minimum(i + B_r, N_K)")
        if end > want[1]:
            return (f"{said}: correct, but the blocks after the block's last row hold no key "
                    "any of its rows sees: end = tl.minimum(i + B_r, N_K)")
        return (f"{said}: correct, but the blocks wholly below the diagonal pay for a mask "
                "they do not need: the unmasked stage runs up to i")
    return None


@learner_side
def _run_causal(q, k, v, blocks: tuple[int, int], stage_bounds: Any) -> np.ndarray:
    """The library's two-stage causal kernel with the learner's stage_bounds, on (1, n, d)
    numpy inputs, K and V inside NaN-filled buffers (a stage that runs past N_K unmasked
    reads NaN).  In the grader it runs where the learner's function is."""
    import torch

    from flashlib.gpu import require_kernels
    from flashlib.gpu import staged_kernels as sk
    from flashlib.gpu.watch import guarded

    device = require_kernels().device
    tq = torch.from_numpy(np.ascontiguousarray(q)).to(device)
    (tk, _), (tv, _) = (guarded(x, rows=128, cols=0, device=device) for x in (k, v))
    o, _ = _launching(sk.causal_forward, tq, tk, tv, 1 / math.sqrt(q.shape[-1]),
                      blocks=blocks, stage_bounds_fn=stage_bounds)
    return o.cpu().numpy()


def _sdpa_causal(q, k, v) -> np.ndarray:
    """torch's scaled_dot_product_attention, causal (top-left), in float64."""
    import torch

    t = [torch.from_numpy(np.asarray(x, np.float64)) for x in (q, k, v)]
    return torch.nn.functional.scaled_dot_product_attention(*t, is_causal=True).numpy()


@checker("the causal forward in two stages")
def check_stage_bounds(fb: Feedback, stage_bounds: Callable[..., Any]) -> None:
    """Check ``stage_bounds(i, B_r, B_c, N_K) -> (split, end)``, where the two-stage causal
    kernel's stages split the keys of the query block starting at row ``i``: stage 1 (no mask)
    over the key blocks [0, split), stage 2 (masked) over [split, end); alone for every
    program of ragged shapes, then in the kernel against torch's SDPA."""
    if _cannot_run(fb):
        return
    probes = [(64, 64, 32, 16), (70, 45, 32, 16), (40, 70, 16, 16), (50, 21, 32, 16)]
    said: set[str] = set()
    for n_q, n_k, B_r, B_c in probes:
        name = f"the stages of each program: n_q={n_q}, n_k={n_k}, B_r={B_r}, B_c={B_c}"
        with fb.case(name):
            bounds = _probe("stage_bounds_of", n_q, n_k, B_r, B_c, stage_bounds)
            problem = _stage_diagnosis([(int(a), int(b)) for a, b in bounds], n_k, B_r, B_c)
            if problem:
                _fail(fb, said, name, problem)
            else:
                fb.ok(f"{name}: right for every program")
    cases = [(37, 37, 16, (32, 16)), (50, 21, 24, (32, 16)), (5, 40, 16, (16, 16)),
             (64, 64, 32, (32, 16))]
    for seed, (n_q, n_k, d, blocks) in enumerate(cases):
        label = "in the kernel, " + _label(n_q, n_k, d, True, "float32", blocks)
        with fb.case(label, "(stage_bounds must be a @triton.jit function; use tl.minimum)"):
            q, k, v = (x[0] for x in _inputs(n_q, n_k, d, "float32", seed))
            got = _run_causal(q[None], k[None], v[None], blocks, stage_bounds)[0]
            want = _sdpa_causal(q, k, v)
            if _close(got, want):
                fb.ok(f"{label}: equal to torch's SDPA (is_causal=True)")
            elif not np.all(np.isfinite(got)):
                fb.fail(f"{label}: the output holds NaN: a stage read keys past N_K unmasked, "
                        "or a row saw no key")
            else:
                fb.fail(f"{label}: max error {_error(got, want):.3g} against torch's SDPA")
