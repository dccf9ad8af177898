"""The backward chapter's experiments: the derivation checked, the gradients checked, the
determinism question, what the forward saves, what recomputing costs, and the base-2 trap.

The derivation (``loss = sum(dO * O)`` with ``O = P V``, ``P = softmax(S)``, ``S = scale Q K^T``):
``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - D)``, ``dQ = scale dS K``,
``dK = scale dS^T Q``, with ``D = rowsum(dP * P) = rowsum(dO * O)``.

:func:`delta_from_P`        D from its definition (:func:`flashlib.algorithms.delta_from_O`
                            is what kernels compute; :func:`flashlib.algorithms.recompute_P`
                            rebuilds P from the saved logsumexp)
:func:`softmax_vjp`         dS by the softmax's Jacobian, row by row (an independent reference)
:func:`identity_table`      both identities checked numerically, in float64 and float32
:func:`central_difference`  the gradient of a scalar function by central differences
:func:`fd_step_sweep`       central and forward differences against the step h (the V shape)
:func:`gradient_ladder`     finite differences, autograd (optional), naive and tiled backward,
                            with causal and padding masks: the errors as a table
:class:`ProgramOrder`, :func:`ulp_distance`, :func:`determinism_table`   dQ accumulated in
                            shuffled program orders (what atomic adds do): bits and ulps
:func:`saved_bytes`, :func:`saved_table`     what is saved for backward, standard vs flash
:func:`backward_flops`, :func:`count_matmul_flops`   the recompute's cost, modelled and counted
:func:`lse_base2`, :func:`p_from_lse`, :func:`base2_trap`   the base-2 logsumexp and the factor
                            that the wrong base puts on P
:func:`flash1_backward_traffic`, :func:`backward_traffic_table`   FlashAttention-1's backward
                            (Algorithm 4) against FlashAttention-2's and the two-pass one:
                            HBM traffic derived and counted, dQ's share

Needs numpy only.  torch autograd, where the ladder uses it, is passed in as a function
(:mod:`flashlib.book.autograd` provides one, and says so in words when torch is missing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from flashlib.algorithms import (
    delta_from_O,
    flash1_backward,
    flash2_backward,
    flash2_forward,
    recompute_P,
    safe_softmax,
    two_pass_backward,
)
from flashlib.core.checks import check_float_dtype, check_int
from flashlib.core.constants import LN2, LOG2E, compute_dtype
from flashlib.core.hbm import CountingMemory
from flashlib.core.loops import LoopTracker
from flashlib.fast.backward import flash_attention_backward
from flashlib.fast.forward import flash_attention
from flashlib.fast.naive import naive_attention, naive_attention_backward
from flashlib.studies.io_model import Traffic, traffic
from flashlib.studies.tiling import KEY_SIDE

__all__ = [
    "delta_from_P",
    "softmax_vjp",
    "identity_table",
    "central_difference",
    "FD_STEP",
    "fd_step_sweep",
    "attention_loss",
    "fd_attention_grads",
    "LadderCase",
    "LADDER_CASES",
    "gradient_ladder",
    "ProgramOrder",
    "ulp_distance",
    "determinism_table",
    "saved_bytes",
    "saved_table",
    "backward_flops",
    "count_matmul_flops",
    "lse_base2",
    "p_from_lse",
    "base2_trap",
    "flash1_backward_traffic",
    "backward_traffic_table",
]


def _problem(n_q: int, n_k: int, d: int, d_v: int | None = None, seed: int = 0,
             lead: tuple[int, ...] = ()) -> tuple[np.ndarray, ...]:
    """Random float64 Q (n_q, d), K (n_k, d), V (n_k, d_v), dO (n_q, d_v), batch dims first."""
    d_v = d if d_v is None else d_v
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((*lead, *shape))
                 for shape in ((n_q, d), (n_k, d), (n_k, d_v), (n_q, d_v)))


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """max|got - ref| / max(max|ref|, tiny), in float64 (0.0 for empty arrays)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if ref.size == 0:
        return 0.0
    return float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-300))


def delta_from_P(P: np.ndarray, dP: np.ndarray) -> np.ndarray:
    """D_i = rowsum(dP_i * P_i), the definition: P, dP: (..., n_q, n_k) -> D: (..., n_q)."""
    return np.sum(dP * P, axis=-1)


def softmax_vjp(P: np.ndarray, dP: np.ndarray) -> np.ndarray:
    """dS = J^T dP row by row with the softmax's Jacobian J = diag(p) - p p^T (symmetric):
    an independent reference for ``P * (dP - D)``.  P, dP: (n_q, n_k) -> dS: (n_q, n_k).
    Forms one (n_k, n_k) Jacobian per row: for checks on small problems only."""
    dS = np.empty_like(P)
    for r, (p, dp) in enumerate(zip(P, dP, strict=True)):
        dS[r] = (np.diag(p) - np.outer(p, p)) @ dp
    return dS


def identity_table(n_q: int = 37, n_k: int = 29, d: int = 16, B_r: int = 16, B_c: int = 8,
                   seed: int = 0) -> list[dict[str, Any]]:
    """Both identities on one random problem, in float64 and float32 (errors are relative to
    the quantity's largest entry):

    ``D_two_ways``      rowsum(dP * P) against rowsum(dO * O), both in the dtype
    ``D_vs_float64``    rowsum(dO * O) in the dtype against the float64 rowsum(dP * P)
    ``P_recomputed``    P rebuilt from L tile by tile against softmax(S) in float64
    ``row_sums``        the largest |rowsum(P_recomputed) - 1|
    ``dS_formula``      P * (dP - D) against the softmax Jacobian's product (float64 reference)
    """
    Q, K, V, dO = _problem(n_q, n_k, d, seed=seed)
    scale = 1 / math.sqrt(d)
    P64 = safe_softmax(scale * (Q @ K.T))
    dP64 = dO @ V.T
    D64 = delta_from_P(P64, dP64)
    dS64 = softmax_vjp(P64, dP64)
    rows = []
    for dtype in (np.float64, np.float32):
        q, k, v, do = (x.astype(dtype) for x in (Q, K, V, dO))
        O, L = flash2_forward(q, k, v, B_r, B_c)
        P = recompute_P(q, k, L, B_r, B_c)
        dP = do @ v.T
        D_P, D_O = delta_from_P(P, dP), delta_from_O(O, do)
        rows.append({
            "dtype": np.dtype(dtype).name,
            "D_two_ways": _rel_err(D_P, D_O),
            "D_vs_float64": _rel_err(D_O, D64),
            "P_recomputed": _rel_err(P, P64),
            "row_sums": float(np.max(np.abs(P.astype(np.float64).sum(axis=1) - 1))),
            "dS_formula": _rel_err(P * (dP - D_O[:, None]), dS64),
        })
    return rows


#: The relative step of :func:`central_difference` in float64: eps^(1/3), about 6.1e-6.
FD_STEP = float(np.finfo(np.float64).eps) ** (1 / 3)


def central_difference(f: Callable[[np.ndarray], float], x: np.ndarray,
                       h: float | None = None) -> np.ndarray:
    """The gradient of the scalar function ``f`` at ``x`` by central differences, one entry at
    a time: ``(f(x + h_k e_k) - f(x - h_k e_k)) / (2 h_k)``.  x: any shape, float64 (a copy
    is perturbed; x itself is left alone).  2 x.size calls of f.

    The step.  A central difference is off by about ``h^2 |f'''| / 6`` (the Taylor terms
    that do not cancel) plus the rounding of the two values of f, about ``eps |f| / h``; the
    sum is smallest near ``h = (3 eps |f| / |f'''|)^(1/3)``, that is ``h ~ eps^(1/3)`` for a
    function whose value and derivatives are O(1), which gives an error of about
    ``eps^(2/3) ~ 4e-11`` in float64.  So ``h_k = FD_STEP * max(1, |x_k|)`` by default
    (relative to x_k, so that x_k + h_k differs from x_k in enough bits), and a scalar ``h``
    is used as is.  A forward difference ``(f(x + h) - f(x)) / h`` is off by ``h |f''| / 2``:
    its best step is about ``sqrt(eps) ~ 1.5e-8``, its best error about ``1e-8``.  In float32
    (eps ~ 1.2e-7) the central difference cannot do better than about 1e-5: finite
    differences are taken in float64 (:func:`fd_step_sweep` measures the V shape).
    """
    x = np.array(x, dtype=np.float64)
    grad = np.empty_like(x)
    for k in np.ndindex(x.shape):
        step = FD_STEP * max(1.0, abs(float(x[k]))) if h is None else float(h)
        orig = x[k]
        x[k] = orig + step
        plus = f(x)
        x[k] = orig - step
        minus = f(x)
        x[k] = orig
        grad[k] = (plus - minus) / (2 * step)
    return grad


def attention_loss(Q: np.ndarray, K: np.ndarray, V: np.ndarray, dO: np.ndarray, *,
                   causal: bool | str = False, mask: np.ndarray | None = None) -> float:
    """``sum(dO * O)`` with ``O = naive_attention(Q, K, V, causal, mask)`` in float64: the loss
    whose gradients are the backward's dQ, dK, dV (dO is the upstream gradient)."""
    O = naive_attention(np.asarray(Q, np.float64), np.asarray(K, np.float64),
                        np.asarray(V, np.float64), causal=causal, mask=mask)
    return float(np.sum(np.asarray(dO, np.float64) * O))


def fd_attention_grads(Q: np.ndarray, K: np.ndarray, V: np.ndarray, dO: np.ndarray, *,
                       causal: bool | str = False, mask: np.ndarray | None = None,
                       h: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV of :func:`attention_loss` by :func:`central_difference` (float64)."""
    args = [np.asarray(x, np.float64) for x in (Q, K, V)]
    grads = []
    for which in range(3):
        def f(x: np.ndarray, which: int = which) -> float:
            xs = list(args)
            xs[which] = x
            return attention_loss(*xs, dO, causal=causal, mask=mask)
        grads.append(central_difference(f, args[which], h))
    return tuple(grads)  # type: ignore[return-value]


def fd_step_sweep(h_values: Iterable[float] = tuple(10.0 ** -k for k in range(1, 13)),
                  n: int = 4, d: int = 3, seed: int = 0) -> list[dict[str, float]]:
    """The error of central and forward differences of dQ on the n x d problem, against the
    analytic gradient, for each step h (one scalar h for every entry): the V shape of
    truncation error (falling with h) meeting rounding error (rising as h shrinks)."""
    Q, K, V, dO = _problem(n, n, d, seed=seed)
    dQ = naive_attention_backward(Q, K, V, dO)[0]

    def f(x: np.ndarray) -> float:
        return attention_loss(x, K, V, dO)

    f0 = f(Q)
    rows = []
    for h in h_values:
        central = central_difference(f, Q, h)
        forward = np.empty_like(Q)
        for k in np.ndindex(Q.shape):
            x = Q.copy()
            x[k] += h
            forward[k] = (f(x) - f0) / h
        rows.append({"h": float(h), "central": _rel_err(central, dQ),
                     "forward": _rel_err(forward, dQ)})
    return rows


class LadderCase(NamedTuple):
    """A problem of :func:`gradient_ladder`: a label, shapes, blocks and masks."""

    label: str
    lead: tuple[int, ...]
    n_q: int
    n_k: int
    d: int
    B_r: int
    B_c: int
    causal: bool | str
    padding: int  # keys hidden at the end of every sequence (key padding), 0 for none


#: The ladder's problems: the tiny one a learner can follow by hand, its causal version, a
#: larger one with ragged blocks (n not a multiple of the blocks, n_q != n_k), a ragged
#: bottom-right causal one, and key padding over two heads.
LADDER_CASES = (
    LadderCase("4 x 3", (), 4, 4, 3, 2, 2, False, 0),
    LadderCase("4 x 3, causal", (), 4, 4, 3, 2, 2, True, 0),
    LadderCase("61 x 45 x 16, ragged blocks", (), 61, 45, 16, 32, 16, False, 0),
    LadderCase("37 x 29 x 8, causal bottom-right", (), 37, 29, 8, 16, 8, "bottom_right", 0),
    LadderCase("2 heads, 23 x 31 x 8, last 7 keys padded", (2,), 23, 31, 8, 8, 16, False, 7),
)


def _case_arrays(case: LadderCase, seed: int) -> tuple[np.ndarray, ...]:
    Q, K, V, dO = _problem(case.n_q, case.n_k, case.d, seed=seed, lead=case.lead)
    mask = None
    if case.padding:
        mask = np.ones((*case.lead, 1, case.n_k), dtype=bool)
        mask[..., case.n_k - case.padding :] = False  # key padding: every query ignores them
    return Q, K, V, dO, mask


def gradient_ladder(cases: Sequence[LadderCase] = LADDER_CASES, *,
                    autograd: Callable[..., Any] | None = None,
                    seed: int = 0) -> list[dict[str, Any]]:
    """The gradient-checking ladder: each step's error on each case, against the analytic
    gradient in float64 (:func:`flashlib.naive_attention_backward`, which the first step
    checks).  Errors are ``max|g - ref| / max|ref|``, the largest over dQ, dK and dV.

    Steps (one row each; ``errors`` maps a case label to its error, None where the step does
    not apply):

    ``finite differences (float64)``  :func:`fd_attention_grads`: checks the formula itself
    ``torch autograd (float64)``      ``autograd(q, k, v, do, causal=..., mask=...) -> (dq,
                                      dk, dv)``; when ``autograd`` is None (torch missing)
                                      every error is None and ``note`` says so
    ``tiled backward (float64)``      :func:`flashlib.flash_attention_backward` fed by
                                      :func:`flashlib.flash_attention` (masks, ragged blocks)
    ``naive backward (float32)``      stores P: the plain float32 implementation
    ``tiled backward (float32)``      the same as the tiled float64 row, in float32
    ``flash2_backward (float32)``, ``two_pass_backward (float32)``   the teaching functions
                                      (no masks: None on masked cases)
    """
    steps = ["finite differences (float64)", "torch autograd (float64)",
             "tiled backward (float64)", "naive backward (float32)", "tiled backward (float32)",
             "flash2_backward (float32)", "two_pass_backward (float32)"]
    table: dict[str, dict[str, float | None]] = {s: {} for s in steps}
    for case in cases:
        Q, K, V, dO, mask = _case_arrays(case, seed)
        kw = {"causal": case.causal, "mask": mask}
        ref = naive_attention_backward(Q, K, V, dO, **kw)
        blocks = {"block_q": case.B_r, "block_k": case.B_c}

        def err(grads: Sequence[np.ndarray], ref: Sequence[np.ndarray] = ref) -> float:
            return max(_rel_err(g, r) for g, r in zip(grads, ref, strict=True))

        def tiled(dtype: Any, Q: np.ndarray = Q, K: np.ndarray = K, V: np.ndarray = V,
                  dO: np.ndarray = dO, kw: dict = kw, blocks: dict = blocks
                  ) -> tuple[np.ndarray, ...]:
            q, k, v, do = (x.astype(dtype) for x in (Q, K, V, dO))
            o, lse = flash_attention(q, k, v, **blocks, **kw, return_lse=True)
            return flash_attention_backward(q, k, v, o, lse, do, **blocks, **kw)

        label = case.label
        table[steps[0]][label] = err(fd_attention_grads(Q, K, V, dO, **kw))
        table[steps[1]][label] = None if autograd is None else err(autograd(Q, K, V, dO, **kw))
        table[steps[2]][label] = err(tiled(np.float64))
        q32, k32, v32, do32 = (x.astype(np.float32) for x in (Q, K, V, dO))
        table[steps[3]][label] = err(naive_attention_backward(q32, k32, v32, do32, **kw))
        table[steps[4]][label] = err(tiled(np.float32))
        plain = not case.lead and case.causal is False and mask is None
        for step, fn in ((steps[5], flash2_backward), (steps[6], two_pass_backward)):
            if plain:
                O, L = flash2_forward(q32, k32, v32, case.B_r, case.B_c)
                table[step][label] = err(fn(q32, k32, v32, O, L, do32, case.B_r, case.B_c))
            else:
                table[step][label] = None
    notes = {steps[1]: "torch is not installed: autograd skipped" if autograd is None else "",
             steps[5]: "teaching function: no masks", steps[6]: "teaching function: no masks"}
    return [{"step": s, "errors": table[s], "note": notes.get(s, "")} for s in steps]


class ProgramOrder(LoopTracker):
    """Runs a teaching function on numpy arrays with its outermost loops visiting their
    blocks in a random order, as the programs of a GPU launch finish in a different order from
    one run to the next: ``ProgramOrder(rng).run(flash2_backward, Q, K, ...)``.  Loops inside
    a program keep their order (one program runs its own loop in sequence); a new ``rng``
    state gives a new order.  (One order for every dQ_i here; on a GPU each dQ_i's atomic
    adds may land in an order of their own: more variety, the same effect.)"""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.rng = rng

    def _order(self, r: range, outermost: bool) -> Iterable[int]:
        values = list(r)
        if outermost:
            self.rng.shuffle(values)
        return values


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many representable floats lie between a and b, entry by entry (0 when equal;
    +0 and -0 are 0 apart): the difference of their bit patterns read as ordered integers.
    a, b: float16, float32 or float64 arrays of one dtype and shape -> uint64 array."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.dtype.kind != "f":
        raise TypeError(f"a and b must be float arrays of one dtype, got {a.dtype} and "
                        f"{b.dtype}")
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize]
    sign = np.uint64(1) << np.uint64(8 * a.itemsize - 1)
    ua, ub = (x.view(bits).astype(np.uint64) for x in (a, b))
    ma, mb = ua & (sign - np.uint64(1)), ub & (sign - np.uint64(1))  # magnitudes
    same = (ua & sign) == (ub & sign)
    return np.where(same, np.maximum(ma, mb) - np.minimum(ma, mb), ma + mb)


def determinism_table(n: int = 256, d: int = 64, B_r: int = 32, B_c: int = 32,
                      runs: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    """dQ accumulated in shuffled program orders: each schedule run ``runs`` times with its
    programs in a new random order (:class:`ProgramOrder`), in float32 and float64, on one
    random (n, d) self-attention problem.

    FlashAttention-2's schedule ("backward") adds each key block's contribution into dQ_i in
    the order its programs happen to run: what atomic adds do on a GPU.  Floating-point
    addition is not associative, so the bits of dQ change from run to run; dK and dV, summed
    inside one program, do not.  The two-pass schedule sums dQ_i inside one program too: the
    same bits every run.  One row per (schedule, dtype):

    ``distinct``       distinct bit patterns of dQ among the runs (1: deterministic)
    ``entries_differ`` fraction of dQ's entries whose bits differ from run 0 in some run
    ``ulps``           how many entries differ from run 0 by 0, 1, 2, 3-4, 5-8 and more than
                       8 units in the last place (their own ulp: an entry that cancels to
                       near 0 has tiny ulps, so its count can be large)
    ``max_ulps``       the largest of those counts
    ``max_diff``       the largest |dQ_run - dQ_0| / max|dQ_0|
    ``max_diff_ulps``  the largest |dQ_run - dQ_0| in ulps of max|dQ_0|: the spread on the
                       scale of the result (a few ulps in both dtypes: rounding, and nothing
                       else)
    ``error``          the largest error of any run against the float64 sequential dQ,
                       relative: every order is as accurate as any other
    ``dK_dV_same``     whether dK and dV came out bit-identical in every run

    Both dtypes change bits under the shuffle: float64 is no more deterministic than
    float32; its runs agree to float64 rounding (about 1e-16 of max|dQ|), float32's to
    float32 rounding (about 1e-7).  Determinism is about the order of the additions.
    """
    Q, K, V, dO = _problem(n, n, d, seed=seed)
    O64, L64 = flash2_forward(Q, K, V, B_r, B_c)
    ref = flash2_backward(Q, K, V, O64, L64, dO, B_r, B_c)[0]
    rows = []
    for order, fn in (("backward", flash2_backward), ("two_pass_backward", two_pass_backward)):
        for dtype in (np.float32, np.float64):
            q, k, v, do = (x.astype(dtype) for x in (Q, K, V, dO))
            O, L = flash2_forward(q, k, v, B_r, B_c)
            rng = np.random.default_rng(seed + 1)
            results = [ProgramOrder(rng).run(fn, q, k, v, O, L, do, B_r, B_c)
                       for _ in range(runs)]
            dq0 = results[0][0]
            ulps = np.max([ulp_distance(r[0], dq0) for r in results], axis=0)
            bins = np.digitize(ulps, [1, 2, 3, 5, 9])  # 0, 1, 2, 3-4, 5-8, > 8 ulps
            hist = np.bincount(bins.ravel(), minlength=6).tolist()
            rows.append({
                "schedule": order, "dtype": np.dtype(dtype).name, "runs": runs,
                "distinct": len({r[0].tobytes() for r in results}),
                "entries_differ": float(np.mean(ulps > 0)),
                "max_ulps": int(ulps.max()),
                "ulps": dict(zip(("0", "1", "2", "3-4", "5-8", ">8"), hist, strict=True)),
                "max_diff": max(_rel_err(r[0], dq0) for r in results),
                "max_diff_ulps": max(float(np.max(np.abs(r[0] - dq0))) for r in results)
                / float(np.spacing(np.max(np.abs(dq0)))),
                "error": max(_rel_err(r[0], ref) for r in results),
                "dK_dV_same": all(np.array_equal(r[1], results[0][1]) and
                                  np.array_equal(r[2], results[0][2]) for r in results),
            })
    return rows


SAVE_METHODS = ("standard", "flash")


def saved_bytes(n_q: int, n_k: int, d: int, method: str = "flash", *, d_v: int | None = None,
                dtype: Any = np.float16) -> dict[str, int]:
    """Bytes kept for the backward pass, per head, per array, beyond the inputs Q, K, V (which
    both methods keep).

    "standard": what autograd keeps through ``softmax(S) @ V``: P (n_q x n_k, in ``dtype``;
    keeping S instead and recomputing the softmax costs the same) and the output O.
    "flash": O and the logsumexp L (one value per row, in the statistics' dtype: float32 for
    float16 inputs, :func:`flashlib.core.constants.compute_dtype`), plus D = rowsum(dO * O), which
    the backward computes at its start (same dtype as L).  Sum the values for the total.
    """
    n_q, n_k = check_int(n_q, "n_q", minimum=0), check_int(n_k, "n_k", minimum=0)
    d = check_int(d, "d", minimum=1)
    d_v = d if d_v is None else check_int(d_v, "d_v", minimum=1)
    dt = check_float_dtype(dtype, "dtype")
    stats = compute_dtype(dt).itemsize
    if method == "standard":
        return {"P": n_q * n_k * dt.itemsize, "O": n_q * d_v * dt.itemsize}
    if method == "flash":
        return {"O": n_q * d_v * dt.itemsize, "L": n_q * stats, "D": n_q * stats}
    raise ValueError(f"method must be one of {SAVE_METHODS}, got {method!r}")


def saved_table(n_values: Iterable[int] = tuple(2**k for k in range(9, 18)), d: int = 64,
                dtype: Any = np.float16) -> list[dict[str, Any]]:
    """:func:`saved_bytes` for self-attention over each n: standard, flash and their ratio."""
    rows = []
    for n in n_values:
        standard = sum(saved_bytes(n, n, d, "standard", dtype=dtype).values())
        flash = sum(saved_bytes(n, n, d, "flash", dtype=dtype).values())
        rows.append({"n": int(n), "standard": standard, "flash": flash,
                     "ratio": standard / flash})
    return rows


def backward_flops(n_q: int, n_k: int, d: int, *, d_v: int | None = None,
                   order: str = "backward", causal: bool = False) -> dict[str, float]:
    """Matmul FLOPs of the backward, with the forward's for scale (2 m k n per product).

    forward    Q K^T and P V: 2 n_q n_k (d + d_v) (= 4 n^2 d for self-attention, d_v = d)
    gradients  dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: 2 n_q n_k (2 d + 2 d_v),
               twice the forward
    recompute  what a schedule computes again: "standard" (P stored) nothing; "backward"
               S = Q K^T once (half a forward when d_v = d: the benchmarks' 2.5 = 2.0 + 0.5);
               "two_pass_backward" S twice and dP once more (2 n_q n_k (2 d + d_v): 3.5x)
    total, ratio   gradients + recompute, and total / forward
    causal: halves every count, the benchmarks' accounting (about half the tiles are
    computed; the exact count depends on the blocks).
    """
    n_q, n_k = check_int(n_q, "n_q", minimum=0), check_int(n_k, "n_k", minimum=0)
    d = check_int(d, "d", minimum=1)
    d_v = d if d_v is None else check_int(d_v, "d_v", minimum=1)
    pairs = 2.0 * n_q * n_k * (0.5 if causal else 1.0)  # 2 FLOPs per multiply-add, per (i, j)
    recompute = {"standard": 0, "backward": d, "two_pass_backward": 2 * d + d_v}
    if order not in recompute:
        raise ValueError(f"order must be one of {tuple(recompute)}, got {order!r}")
    forward = pairs * (d + d_v)
    gradients = pairs * (2 * d + 2 * d_v)
    total = gradients + pairs * recompute[order]
    return {"forward": forward, "gradients": gradients, "recompute": pairs * recompute[order],
            "total": total, "ratio": total / forward if forward else math.nan}


def count_matmul_flops(fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """Run ``fn(*args)`` with its array arguments wrapped so that every matrix product
    (``@``, ``np.matmul``) they take part in is counted: ``(result, flops)``, 2 m k n FLOPs
    per (m, k) x (k, n) product (batched products count each matrix).  Elementwise work (exp,
    the row sums of D) is not counted: the benchmarks count matmuls.  The result's arrays
    are returned as plain ndarrays."""
    count = [0]

    class Counted(np.ndarray):
        def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any,
                            **kwargs: Any) -> Any:
            plain = [x.view(np.ndarray) if isinstance(x, Counted) else x for x in inputs]
            if "out" in kwargs:
                kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, Counted) else o
                                      for o in kwargs["out"])
            result = getattr(ufunc, method)(*plain, **kwargs)
            if ufunc is np.matmul and method == "__call__":
                inner = np.shape(plain[0])[-1]  # k of (m, k) x (k, n): 2 k FLOPs per output
                count[0] += 2 * inner * np.size(result)
            if isinstance(result, np.ndarray) and not isinstance(result, Counted):
                return result.view(Counted)
            return result

    wrapped = [x.view(Counted) if isinstance(x, np.ndarray) else x for x in args]
    result = fn(*wrapped)

    def unwrap(x: Any) -> Any:
        if isinstance(x, tuple):
            return tuple(unwrap(y) for y in x)
        return x.view(np.ndarray) if isinstance(x, np.ndarray) else x

    return unwrap(result), count[0]


def lse_base2(S: np.ndarray) -> np.ndarray:
    """What a kernel that uses exp2 saves: ``M_i = m2_i + log2(l2_i)`` with the scores in base
    2, ``S2 = S log2(e)``, ``m2 = rowmax(S2)``, ``l2 = rowsum(exp2(S2 - m2))`` (the Triton
    tutorial stores this M).  Equal to ``L log2(e)``, L the natural logsumexp.
    S: (..., n_k) scaled scores -> M: (...,)."""
    S2 = S * LOG2E
    m2 = np.max(S2, axis=-1)
    return m2 + np.log2(np.sum(np.exp2(S2 - m2[..., None]), axis=-1))


def p_from_lse(S: np.ndarray, lse: np.ndarray, base: str = "e") -> np.ndarray:
    """P recovered from a saved logsumexp, in the base it was saved in: ``exp(S - L)`` for
    base "e", ``exp2(S log2(e) - M)`` (= ``exp(S - M ln 2)``) for base "2".
    S: (..., n_k), lse: (...,) -> P: (..., n_k)."""
    if base == "e":
        return np.exp(S - lse[..., None])
    if base == "2":
        return np.exp2(S * LOG2E - lse[..., None])
    raise ValueError(f"base must be 'e' or '2', got {base!r}")


def base2_trap(n_q: int = 8, n_k: int = 64, d: int = 16, logit: float = 1.0,
               shift: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """P recovered right and wrong from the base-2 logsumexp M of one random problem: scores
    S = Q K^T / sqrt(d) + shift, Q scaled by ``logit`` (a negative ``shift`` makes L < 0).

    Treating M as a natural logsumexp, ``exp(S - M)``, multiplies row i of P by
    ``exp(L_i - M_i) = exp(-L_i (log2(e) - 1))``: a per-row factor, below 1 when L_i > 0
    (rows sum to less than 1), above 1 when L_i < 0.  Returns, over the rows:
    ``L`` and ``M`` (natural and base-2 logsumexp; M / L = log2 e), ``right_row_sums``
    (exp2(S log2 e - M): 1), ``wrong_row_sums`` (exp(S - M)), ``predicted_factor``
    (exp(L - M)) and ``factor_error``, the largest |wrong / right - predicted| / predicted.
    """
    rng = np.random.default_rng(seed)
    Q, K = rng.standard_normal((n_q, d)) * logit, rng.standard_normal((n_k, d))
    S = Q @ K.T / math.sqrt(d) + shift
    L = np.max(S, axis=1) + np.log(np.sum(np.exp(S - np.max(S, axis=1)[:, None]), axis=1))
    M = lse_base2(S)
    right, wrong = p_from_lse(S, M, base="2"), p_from_lse(S, M, base="e")
    factor = np.exp(L - M)
    return {"L": L, "M": M, "M_over_L": M / L, "right_row_sums": right.sum(axis=1),
            "wrong_row_sums": wrong.sum(axis=1), "predicted_factor": factor,
            "factor_error": float(np.max(np.abs(wrong / right - factor[:, None])
                                         / factor[:, None])),
            "ln2": LN2, "log2e": LOG2E}


# --- FlashAttention-1's backward (Algorithm 4) against FlashAttention-2's -------------------


def flash1_backward_traffic(n_q: int, n_k: int, d: int, *, B_r: int, B_c: int,
                            d_v: int | None = None) -> Traffic:
    """Elements of each array that :func:`flashlib.algorithms.flash1_backward` reads from and
    writes to HBM (no mask), with T_c = ceil(n_k / B_c) key blocks: every one of the T_c
    passes over the query blocks reads Q, O, dO, l, m and dQ and writes dQ (T_c n_q rows of
    each); K, V are read once; dQ, dK, dV are initialised to 0 in HBM (one write each) and dK,
    dV written once more at the end.  B_r does not change the counts (the rows of a pass are
    the n_q rows whatever their blocks)."""
    n_q, n_k = check_int(n_q, "n_q", minimum=0), check_int(n_k, "n_k", minimum=0)
    d = check_int(d, "d", minimum=1)
    d_v = d if d_v is None else check_int(d_v, "d_v", minimum=1)
    check_int(B_r, "B_r", minimum=1)
    rows = -(-n_k // check_int(B_c, "B_c", minimum=1)) * n_q  # T_c n_q: rows of all passes
    reads = {"Q": rows * d, "O": rows * d_v, "dO": rows * d_v, "l": rows, "m": rows,
             "dQ": rows * d, "K": n_k * d, "V": n_k * d_v}
    writes = {"dQ": (n_q + rows) * d, "dK": 2 * n_k * d, "dV": 2 * n_k * d_v}
    return Traffic({k: c for k, c in reads.items() if c}, {k: c for k, c in writes.items() if c})


def backward_traffic_table(n_q: int = 256, n_k: int = 256, d: int = 64, *, B_r: int = 64,
                           B_c: int = 64, d_v: int | None = None, seed: int = 0
                           ) -> list[dict[str, Any]]:
    """One row per backward schedule, each run on a counting memory
    (:class:`flashlib.core.hbm.CountingMemory`) and checked against its formula:
    ``schedule`` ("flash1_backward": Algorithm 4; "flash2_backward"; "two_pass_backward"),
    ``reads``, ``writes``, ``total`` (elements, counted), ``formula_total`` (derived:
    :func:`flash1_backward_traffic`, :func:`flashlib.studies.io_model.traffic`), ``dq``
    (elements of dQ read plus written), ``array_reads`` and ``array_writes`` (elements per
    array, counted) and ``dq_extra`` (that minus the n_q d of writing dQ
    once, which is what the two-pass schedule does: 2 T_c n_q d for the single-kernel
    schedules, T_c = ceil(n_k / B_c)).  FlashAttention-2 keeps dQ's read-modify-write (atomic
    adds on a GPU) and changes the rest: it saves L instead of m and l, and computes
    D = rowsum(dO * O) once before the loop instead of reading O_i in every step, which
    saves (T_c - 1) n_q d_v reads of O, against one more pass over dO and D's n_q writes."""
    d_v = d if d_v is None else d_v
    q, k, v, do = _problem(n_q, n_k, d, d_v, seed)
    s = q @ k.T / math.sqrt(d)
    m = s.max(axis=1)  # what Algorithm 1 leaves in HBM: the row maximum and sum
    l = np.exp(s - m[:, None]).sum(axis=1)  # noqa: E741
    o, lse = flash2_forward(q, k, v, B_r, B_c)
    runs = (("flash1_backward", flash1_backward, dict(O=o, l=l, m=m, dO=do),
             flash1_backward_traffic(n_q, n_k, d, B_r=B_r, B_c=B_c, d_v=d_v)),
            ("flash2_backward", flash2_backward, dict(O=o, L=lse, dO=do),
             traffic("backward", n_q, n_k, d, d_v=d_v, B_r=B_r, B_c=B_c)),
            ("two_pass_backward", two_pass_backward, dict(O=o, L=lse, dO=do),
             traffic("two_pass_backward", n_q, n_k, d, d_v=d_v, B_r=B_r, B_c=B_c)))
    rows = []
    for name, fn, extra, formula in runs:
        mem = CountingMemory(key_side=KEY_SIDE, score_tiles=2)
        mem.run(fn, *mem.inputs(Q=q, K=k, V=v, **extra), B_r, B_c)
        counted = mem.traffic
        dq = counted.reads.get("dQ", 0) + counted.writes.get("dQ", 0)
        rows.append({"schedule": name, "reads": counted.total_reads,
                     "writes": counted.total_writes, "total": counted.total,
                     "formula_total": formula.total, "dq": dq, "dq_extra": dq - n_q * d,
                     "array_reads": dict(counted.reads), "array_writes": dict(counted.writes)})
    return rows
