"""The accuracy sweep (``python -m flashlib.bench accuracy``): flash-attn's 2x rule at every
score size, for the forward and each gradient.

For each score magnitude (q multiplied by 1, 30, 300, 3000; then N(0, 1) inputs with a softmax
scale of 1e2, 1e4 and 1e8), each dtype (float32, float16), each tiling (1 x 1 blocks and the
default tile) and each mask (none, causal top-left and bottom-right, a sliding window, random
key padding, an explicit boolean mask with rows that see one key or none), the sweep computes

    ratio = err(flash) / err(plain),   both against a float64 reference (max |difference|),

where "plain" is :func:`flashlib.naive_attention` (and its backward) in the same dtype, the way
PyTorch's math path computes it.  flash-attn's rule accepts ``err <= 2 err(plain) + floor``
(floor: 1e-5 in float32, 1e-3 in float16); the report gives, per magnitude, dtype and output
(o, dq, dk, dv), the largest ratio over the tilings, masks and seeds, and whether the rule
held everywhere.  The backward is fed the forward's own ``o`` and ``lse``, as a training step
does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from flashlib.fast.backward import flash_attention_backward
from flashlib.fast.forward import flash_attention
from flashlib.fast.naive import naive_attention, naive_attention_backward

__all__ = ["MAGNITUDES", "RULE_FLOOR", "Case", "sweep_cases", "run_case", "run_accuracy",
           "format_accuracy"]

#: (label, factor on q, softmax scale or None for 1/sqrt(d)).
MAGNITUDES: list[tuple[str, float, float | None]] = [
    ("x1", 1.0, None), ("x30", 30.0, None), ("x300", 300.0, None), ("x3000", 3000.0, None),
    ("scale=1e2", 1.0, 1e2), ("scale=1e4", 1.0, 1e4), ("scale=1e8", 1.0, 1e8),
]
#: The additive floor of flash-attn's rule, per dtype.
RULE_FLOOR = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-3}
OUTPUTS = ("o", "dq", "dk", "dv")


class Case(NamedTuple):
    """One problem of the sweep."""

    magnitude: str
    factor: float
    scale: float | None
    dtype: str
    blocks: tuple[int, int] | None  # None: the default tile
    mask: str
    seed: int


MASKS = ("none", "causal", "bottom_right", "window", "padding", "explicit")


def _options(mask: str, n_q: int, n_k: int, rng: np.random.Generator, heads: int) -> dict:
    if mask == "causal":
        return {"causal": True}
    if mask == "bottom_right":
        return {"causal": "bottom_right"}
    if mask == "window":
        return {"causal": "bottom_right", "window": (7, 0)}
    if mask == "padding":
        return {"key_lengths": rng.integers(1, n_k + 1, size=heads)}
    if mask == "explicit":  # a boolean mask per head; some rows see one key, some none
        keep = rng.random((heads, n_q, n_k)) < 0.3
        keep[:, ::5] = False
        keep[:, 1::5, 1:] = False
        return {"mask": keep}
    return {}


def run_case(case: Case, shape: tuple[int, int, int, int] = (2, 70, 33, 40)
             ) -> dict[str, tuple[float, float, bool]]:
    """{output: (err(flash), err(plain), rule holds)} of one case.

    shape: (heads, n_q, n_k, d), awkward on purpose (n_q != n_k, neither a multiple of a
    block).  Plain attention that itself overflows (inf) gives no verdict for that case.
    """
    heads, n_q, n_k, d = shape
    rng = np.random.default_rng(case.seed)
    dt = np.dtype(case.dtype)
    q64 = rng.standard_normal((heads, n_q, d)) * case.factor
    k64, v64 = rng.standard_normal((heads, n_k, d)), rng.standard_normal((heads, n_k, d))
    do64 = rng.standard_normal((heads, n_q, d))
    if dt == np.float16:  # q * factor must be a float16 number
        q64 = np.clip(q64, -60000, 60000)
    q, k, v, do = (x.astype(dt) for x in (q64, k64, v64, do64))
    q64, k64, v64, do64 = (x.astype(np.float64) for x in (q, k, v, do))
    opts = _options(case.mask, n_q, n_k, rng, heads)
    blocks = {} if case.blocks is None else {"block_q": case.blocks[0],
                                             "block_k": case.blocks[1]}
    out: dict[str, tuple[float, float, bool]] = {}
    with np.errstate(all="ignore"):
        ref = naive_attention(q64, k64, v64, scale=case.scale, **opts)
        refs = (ref,) + naive_attention_backward(q64, k64, v64, do64, scale=case.scale,
                                                 **opts)
        try:
            plain = (naive_attention(q, k, v, scale=case.scale, **opts),)
            plain += naive_attention_backward(q, k, v, do, scale=case.scale, **opts)
        except ValueError:  # plain attention overflows: no verdict
            return out
    o, lse = flash_attention(q, k, v, scale=case.scale, return_lse=True, **blocks, **opts)
    try:
        grads = flash_attention_backward(q, k, v, o, lse, do, scale=case.scale, **blocks,
                                         **opts)
    except ValueError:  # a backward that refuses what the forward accepted: a failure
        grads = tuple(np.full(x.shape, np.inf) for x in (q, k, v))
    flash = (o,) + grads
    floor = RULE_FLOOR[dt]
    for name, f, pl, r in zip(OUTPUTS, flash, plain, refs, strict=True):
        with np.errstate(all="ignore"):
            err = float(np.max(np.abs(f.astype(np.float64) - r), initial=0.0))
            err_plain = float(np.max(np.abs(pl.astype(np.float64) - r), initial=0.0))
        out[name] = (err, err_plain, bool(err <= 2 * err_plain + floor))
    return out


def sweep_cases(magnitudes: Iterable[str] | None = None, dtypes: Iterable[str] = ("float32",
                "float16"), seeds: Iterable[int] = (0, 1, 2)) -> list[Case]:
    """Every case of the sweep (or of the named magnitudes)."""
    chosen = [m for m in MAGNITUDES if magnitudes is None or m[0] in set(magnitudes)]
    return [Case(label, factor, scale, dtype, blocks, mask, seed)
            for label, factor, scale in chosen for dtype in dtypes
            for blocks in ((1, 1), None) for mask in MASKS for seed in seeds]


def run_accuracy(cases: list[Case] | None = None, progress: Any = None) -> dict[str, Any]:
    """Run the cases; returns {"rows": [...], "failures": [...]}: one row per (magnitude,
    dtype) with the largest ratio err / err(plain) of each output, and every case whose rule
    failed."""
    cases = sweep_cases() if cases is None else cases
    worst: dict[tuple[str, str], dict[str, float]] = {}
    failures = []
    for case in cases:
        res = run_case(case)
        row = worst.setdefault((case.magnitude, case.dtype), {})
        for name, (err, plain, ok) in res.items():
            floor = RULE_FLOOR[np.dtype(case.dtype)]
            # the ratio beyond the floor: err / (plain + floor / 2), so exact plain results
            # with a tiny flash error do not read as an infinite ratio
            ratio = err / (plain + floor / 2)
            row[name] = max(row.get(name, 0.0), ratio)
            if not ok:
                failures.append((case, name, err, plain))
        if progress is not None:
            progress.update(1)
    rows = [{"magnitude": m, "dtype": dt, **{k: worst[m, dt].get(k, math.nan)
                                             for k in OUTPUTS}} for (m, dt) in worst]
    return {"rows": rows, "failures": failures, "cases": len(cases)}


def format_accuracy(res: dict[str, Any]) -> str:
    """The printable table of :func:`run_accuracy`."""
    lines = [f"flash-attn's rule, {res['cases']} cases: err <= 2 err(plain) + floor; the "
             "table gives the largest err / (err(plain) + floor / 2)", ""]
    head = f"{'magnitude':<11} {'dtype':<8}" + "".join(f"{k:>9}" for k in OUTPUTS)
    lines += [head, "-" * len(head)]
    for row in res["rows"]:
        lines.append(f"{row['magnitude']:<11} {row['dtype']:<8}"
                     + "".join(f"{row[k]:9.3g}" for k in OUTPUTS))
    lines.append("")
    if res["failures"]:
        lines.append(f"rule failed in {len(res['failures'])} (case, output) pairs, e.g.:")
        for case, name, err, plain in res["failures"][:12]:
            lines.append(f"  {case}: {name} err {err:.3g} vs plain {plain:.3g}")
    else:
        lines.append("the rule held in every case")
    return "\n".join(lines)
